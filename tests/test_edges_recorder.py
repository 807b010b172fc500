"""Issue 27: the recorder over a long run (mstx_marks/backends/record.py, export/spill.py): a name
table that stays bounded however many distinct names a run makes, and durations a step of the
wall clock (NTP's) cannot stretch, said when it happens."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tracemalloc
import warnings
from pathlib import Path

import pytest

from mstx_marks.backends import record
from mstx_marks.backends.record import OTHER_NAMES, Recorder
from mstx_marks.base import env
from mstx_marks.base.records import RangeRecord
from mstx_marks.export.spill import Spill, read_spill

# --- 13: a bounded name table -----------------------------------------------------------------


def test_past_the_names_kept_new_names_are_recorded_as_other_names_said_once(
    tmp_path: Path,
) -> None:
    rec = Recorder(names=3)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for i in range(6):
            rec.range_end(rec.range_start(f"request-{i}", "serve"), "serve")
        rec.instant("request-1", "serve")  # a name kept before: still its own
        rec.range_end(rec.range_start("x", "new_domain"), "new_domain")
    assert len(w) == 1 and env.RECORD_NAMES in str(w[0].message)
    expected = [
        ("request-0", "serve"),
        ("request-1", "serve"),
        ("request-2", "serve"),
        *[(OTHER_NAMES, "serve")] * 3,
        ("request-1", "serve"),
        (OTHER_NAMES, OTHER_NAMES),  # a domain first seen after: neither grows the table
    ]
    assert [(r.name, r.domain) for r in rec.records()] == expected
    assert len(rec.names()) == 5  # three names and two overflow keys
    # The spill's tables hold the overflow keys like any other: read back the same.
    path = Spill(tmp_path, rec, rank=0).write_now()
    assert [(r.name, r.domain) for r in read_spill(path).records] == expected


def test_a_long_run_of_distinct_names_holds_the_table_not_every_name() -> None:
    rec = Recorder(capacity=10_000_000, names=1000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(1000):  # the table's worth, and a chunk of columns made
            rec.range_end(rec.range_start(f"request-{i}", "d"), "d")
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for i in range(1000, 11_000):  # 10,000 more names, in the same chunk of columns
                rec.range_end(rec.range_start(f"request-{i}", "d"), "d")
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
    # Kept, they cost about 190 bytes each (1.9 MB here); bounded, nothing but noise.
    assert grown < 100_000, grown
    assert len(rec.names()) == 1001


def test_the_default_recorder_reads_its_names_from_the_environment() -> None:
    code = (
        "import mstx_marks; mstx_marks.configure(backend='record')\n"
        "for i in range(4):\n"
        "    with mstx_marks.mark(f'n{i}'):\n"
        "        pass\n"
        "print(sorted({r.name for r in mstx_marks.default_recorder().records()}))\n"
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith("MSTX_MARKS_")}
    proc = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],  # a warning in the hot path never raises
        env={**base, env.RECORD_NAMES: "2"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(sorted([OTHER_NAMES, "n0", "n1"]))
    assert proc.stderr.count(env.RECORD_NAMES) == 1


# --- 16: durations from the monotonic clock ---------------------------------------------------


class _Clocks:
    """A wall clock and a monotonic clock that tests move by hand."""

    def __init__(self) -> None:
        self.wall = 1_800_000_000 * 10**9
        self.mono = 5_000 * 10**9

    def step_wall(self, seconds: float) -> None:
        self.wall += int(seconds * 1e9)

    def advance(self, seconds: float) -> None:
        self.wall += int(seconds * 1e9)
        self.mono += int(seconds * 1e9)


@pytest.fixture
def clocks(monkeypatch: pytest.MonkeyPatch) -> _Clocks:
    fake = _Clocks()
    monkeypatch.setattr(record, "time_ns", lambda: fake.wall)
    monkeypatch.setattr(record, "monotonic_ns", lambda: fake.mono)
    monkeypatch.setattr(record, "_anchor", fake.wall - fake.mono)  # as taken at import
    return fake


@pytest.mark.parametrize("step_s", [-2.0, 3600.0])
def test_a_wall_clock_step_inside_a_range_does_not_change_its_duration(
    clocks: _Clocks, tmp_path: Path, step_s: float
) -> None:
    rec = Recorder()
    spill = Spill(tmp_path, rec, rank=0)
    began = clocks.wall
    rid = rec.range_start("step", "d")
    clocks.advance(0.5)
    clocks.step_wall(step_s)  # NTP steps the wall clock mid-range
    clocks.advance(0.5)
    rec.range_end(rid, "d")
    (got,) = rec.records()
    assert isinstance(got, RangeRecord)
    assert (got.start_ns, got.end_ns - got.start_ns) == (began, 10**9)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        path = spill.write_now()
        spill.write_now(final=True)  # the step is written and said once
    (said,) = [str(x.message) for x in w]
    assert f"{step_s:+.3f} s" in said and "durations are unaffected" in said
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0]["anchor_ns"] == began - 5_000 * 10**9
    assert [x for x in lines if isinstance(x, dict) and "clock_step_ns" in x] == [
        {"clock_step_ns": int(step_s * 1e9)}
    ]
    (read,) = read_spill(path).records
    assert isinstance(read, RangeRecord)
    assert (read.start_ns, read.end_ns - read.start_ns) == (began, 10**9)


def test_no_step_no_word(clocks: _Clocks, tmp_path: Path) -> None:
    rec = Recorder()
    spill = Spill(tmp_path, rec, rank=0)
    rec.range_end(rec.range_start("step", "d"), "d")
    clocks.advance(3600)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        path = spill.write_now(final=True)
    assert w == [] and "clock_step_ns" not in path.read_text()


def test_an_open_range_ends_on_the_recorders_clock(clocks: _Clocks) -> None:
    rec = Recorder()
    rec.range_start("still_open", "d")
    clocks.advance(2)
    clocks.step_wall(-3600)
    (got,) = rec.records()
    assert isinstance(got, RangeRecord)
    assert got.open and got.end_ns - got.start_ns == 2 * 10**9
