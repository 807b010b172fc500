"""MSTX_MARKS_OUT: every process records to its own files, spilled at least once a second, so a
process that dies without exit hooks (SIGKILL, Ray's quick exit through os._exit) loses at most
the last interval; open ranges are kept, flagged; a fork gets its own files; nothing recorded,
nothing written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from mstx_marks.export.spill import read_spill

PRELUDE = """
import os, sys, time
from mstx_marks.launch.activate import activate
activate()
from mstx_marks import mark
"""


def _start(code: str, out: Path, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
        env=dict(os.environ, MSTX_MARKS_OUT=str(out), **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _spills(out: Path) -> list[Path]:
    return sorted((out / "spill").glob("*.jsonl")) if (out / "spill").exists() else []


def _names(path: Path) -> list[str]:
    return [r.name for r in read_spill(path).records]


def test_sigkill_loses_at_most_the_last_interval(tmp_path: Path) -> None:
    proc = _start(
        """
        for i in range(5):
            with mark(f"r{i}"):
                pass
        print("ready", flush=True)
        time.sleep(60)
        """,
        tmp_path,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    time.sleep(1.5)  # longer than the spill interval (0.5 s)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    (spill,) = _spills(tmp_path)
    assert _names(spill) == [f"r{i}" for i in range(5)]
    assert read_spill(spill).records[0].pid == proc.pid


def test_os_exit_writes_the_spill_first(tmp_path: Path) -> None:
    """Ray ends actors with a quick exit (os._exit): no atexit hook, nothing lost."""
    proc = _start(
        """
        for i in range(3):
            with mark("actor_step"):
                pass
        os._exit(0)
        """,
        tmp_path,
    )
    assert proc.wait(timeout=30) == 0
    (spill,) = _spills(tmp_path)
    assert _names(spill) == ["actor_step"] * 3


def test_sigterm_keeps_the_open_range_flagged_and_writes_the_exports(tmp_path: Path) -> None:
    proc = _start(
        """
        with mark("done"):
            pass
        step = mark("step").start()
        print("ready", flush=True)
        time.sleep(60)
        """,
        tmp_path,
        RANK="3",
        MSTX_MARKS_ROLE="trainer",
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM
    (spill,) = _spills(tmp_path)
    trace = read_spill(spill)
    assert (trace.rank, trace.role) == (3, "trainer")
    by_name = {r.name: r for r in trace.ranges}
    assert by_name["step"].open and not by_name["done"].open
    (chrome,) = (tmp_path / "chrome").glob("trainer-rank3-*.trace.json")  # role, then rank
    events = json.loads(chrome.read_text())["traceEvents"]
    step = next(e for e in events if e.get("name") == "step")
    assert step["args"]["open"] is True
    assert list(tmp_path.glob("ascend/*/ASCEND_PROFILER_OUTPUT/ascend_pytorch_profiler_3.db"))


def test_a_fork_gets_its_own_files_even_inside_an_open_range(tmp_path: Path) -> None:
    proc = _start(
        """
        with mark("parent_before"):
            pass
        with mark("around_fork"):
            pid = os.fork()
            if pid == 0:
                with mark("child_work"):
                    pass
                os._exit(0)
            os.waitpid(pid, 0)
        with mark("parent_after"):
            pass
        print(pid, flush=True)
        """,
        tmp_path,
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    child_pid = int(out)
    spills = {read_spill(p).records[0].pid: p for p in _spills(tmp_path)}
    assert set(spills) == {proc.pid, child_pid}
    assert _names(spills[child_pid]) == ["child_work"]  # nothing of the parent's
    assert sorted(_names(spills[proc.pid])) == ["around_fork", "parent_after", "parent_before"]


def test_a_process_that_records_nothing_writes_nothing(tmp_path: Path) -> None:
    proc = _start("pass", tmp_path)
    assert proc.wait(timeout=30) == 0
    assert not (tmp_path / "spill").exists() and not (tmp_path / "chrome").exists()


def test_no_variable_no_effect(tmp_path: Path) -> None:
    code = (
        "import sys, mstx_marks.launch.plugins\n"
        "from mstx_marks.core.process import PROCESS\n"
        "print(PROCESS.settings.resolved, 'mstx_marks.export.out' in sys.modules)"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MSTX_MARKS_")}
    proc = subprocess.run(
        [sys.executable, "-c", code], env=clean, capture_output=True, text=True, timeout=60
    )
    assert proc.stdout.split() == ["False", "False"], proc.stderr


def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    proc = _start(
        """
        for i in range(2):
            with mark("kept"):
                pass
        os._exit(0)
        """,
        tmp_path,
    )
    proc.wait(timeout=30)
    (spill,) = _spills(tmp_path)
    with spill.open("a") as f:
        f.write('["r", "torn", "default", 1')  # a crash mid-write
    assert _names(spill) == ["kept", "kept"]


@pytest.mark.parametrize("garbage", [b"", b"not json\n", b'{"other": 1}\n'])
def test_a_file_that_is_not_a_spill_is_named(tmp_path: Path, garbage: bytes) -> None:
    from mstx_marks.base.records import TraceFileError

    bad = tmp_path / "x.jsonl"
    bad.write_bytes(garbage)
    with pytest.raises(TraceFileError, match=r"x\.jsonl"):
        read_spill(bad)


def test_a_range_spilled_open_twice_then_ended_is_read_once(tmp_path: Path) -> None:
    from mstx_marks.backends.record import Recorder
    from mstx_marks.export.spill import Spill, read_spill

    rec = Recorder()
    spill = Spill(tmp_path, rec, rank=0)
    rid = rec.range_start("step", "default")
    left_open = rec.range_start("forever", "default")
    assert left_open
    spill.write_now(final=True)  # a signal's flush
    spill.write_now(final=True)  # then the exit's: both wrote the open ranges
    rec.range_end(rid, "default")
    path = spill.write_now(final=True)
    got = [(r.name, getattr(r, "open", None)) for r in read_spill(path).records]
    assert got == [("step", False), ("forever", True)]


def test_a_final_spill_does_not_chase_threads_still_recording(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ranges recorded while a write is under way wait for the next one: a write that chased
    them would never end under a thread recording as fast as the writer writes. Made exact by
    recording from inside each drain (threads did it by chance, and timing made it flaky)."""
    from mstx_marks.backends.record import Recorder
    from mstx_marks.export.spill import Spill, read_spill

    rec = Recorder(capacity=10_000_000)
    for _ in range(20_000):
        rec.range_end(rec.range_start("before", "d"), "d")
    drain, calls = rec.drain_blocks, []

    def meanwhile(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        assert len(calls) < 100, "the write chases what is recorded meanwhile"
        for _ in range(20_000):  # more than one drain takes
            rec.range_end(rec.range_start("meanwhile", "d"), "d")
        return drain(*args, **kwargs)

    monkeypatch.setattr(rec, "drain_blocks", meanwhile)
    path = Spill(tmp_path, rec, rank=0).write_now(final=True)
    assert {r.name for r in read_spill(path).records} == {"before"}
    assert len(read_spill(path).records) == 20_000


def test_a_spill_of_another_format_says_which_and_what_this_version_reads(
    tmp_path: Path,
) -> None:
    """A spill of the previous format was "not a mstx_marks spill file (no header line)"."""
    from mstx_marks.analysis.summary import summarize_path
    from mstx_marks.backends.record import Recorder
    from mstx_marks.base import VERSION
    from mstx_marks.base.records import TraceFileError
    from mstx_marks.export.spill import Spill

    old = tmp_path / "spill" / "host-1.jsonl"
    old.parent.mkdir()
    old.write_text('{"mstx_marks_spill": 1, "pid": 1, "rank": 0}\n{"n": "step"}\n')
    with pytest.raises(TraceFileError) as caught:
        read_spill(old)
    said = str(caught.value)
    assert "format 1 (from a mstx_marks before" in said and "reads format 2" in said
    assert "no header line" not in said
    summary = summarize_path(tmp_path, jobs=1, progress=False)
    assert any("format 1" in e for e in summary.errors), summary.errors
    # Spills written now say which version wrote them.
    rec = Recorder()
    rec.range_end(rec.range_start("step", "default"), "default")
    path = Spill(tmp_path / "new", rec, rank=0).write_now(final=True)
    assert f'"version": "{VERSION}"' in path.read_text().splitlines()[0]
