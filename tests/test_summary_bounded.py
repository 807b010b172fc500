"""Issue 20, item 14 ("Memory is not bounded"): a spill too large to hold is summarised in one
pass (:mod:`mstx_marks.analysis.stream`) with the figures the in-memory path gives, says what
it cannot give, is refused by the timelines with its name, and stays in bounded memory.

The limits are patched down so that small spills (written by the real writer) take the
streaming path; the last test builds a real large spill and measures the command's peak RSS.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mstx_marks.analysis import stream
from mstx_marks.analysis.aggregate import SAMPLE_LIMIT, ProcessPart
from mstx_marks.analysis.quantiles import RELATIVE_ERROR
from mstx_marks.analysis.readers import part_of_file, read_trace_file
from mstx_marks.analysis.summary import (
    format_json,
    format_table,
    load_traces,
    run_summary,
    summarize_path,
)
from mstx_marks.backends.record import Recorder
from mstx_marks.base.records import Member, TraceFileError
from mstx_marks.export.spill import Spill, read_spill

#: Ranges of the one phase that passes SAMPLE_LIMIT (its p50/p90 then come from the sketch).
DECODES = 90
STEPS = 300


def write_spill(
    out: Path, *, keyed: bool = False, rank: int = 0, role: str = "trainer", steps: int = STEPS
) -> Path:
    """A spill by the real writer: ``steps`` train steps (two ranges per step key when
    ``keyed``), each a gen range of DECODES decode ranges and a ``sync_start``/``sync_stop``
    pair of marks; and one stop mark with no start."""
    rec = Recorder(capacity=1 << 20)
    spill = Spill(out, rec, rank=rank, role=role)
    start, end = rec.range_start, rec.range_end
    for k in range(steps):
        step = start("train_step", "default")
        if keyed:
            rec.set_args(step, {"step": k // 2})
        gen = start("gen", "default")
        for _ in range(DECODES):
            end(start("vllm_one_step", "vllm"), "vllm")
        end(gen, "default")
        rec.instant("sync_start", "default")
        rec.instant("sync_stop", "default")
        end(step, "default")
    rec.instant("lonely_stop", "default")
    return spill.write_now(final=True)


def limit(monkeypatch: pytest.MonkeyPatch, events: int, size: int = stream.MAX_SPILL_BYTES) -> None:
    monkeypatch.setattr(stream, "MAX_HELD_EVENTS", events)
    monkeypatch.setattr(stream, "MAX_SPILL_BYTES", size)


def assert_same(held: ProcessPart, streamed: ProcessPart) -> None:
    """Every figure of the in-memory part but the breakdown: exact, p50/p90 within the sketch's
    bound where they come from it (and exact where the phase is short)."""
    assert not held.streamed and streamed.streamed
    for field in (
        "rank", "role", "pids", "source", "n_records", "span", "first_ns", "step_count",
        "step_time_ns", "step_keys", "step_phases", "run", "instance", "dropped", "skipped",
        "complete",
    ):  # fmt: skip
        assert getattr(streamed, field) == getattr(held, field), field
    assert streamed.phases.keys() == held.phases.keys()
    for name, a in held.phases.items():
        b = streamed.phases[name]
        assert (b.count, b.total_ns, b.max_ns, b.first_start_ns) == (
            a.count, a.total_ns, a.max_ns, a.first_start_ns,
        ), name  # fmt: skip
        if a.count <= SAMPLE_LIMIT:
            assert (b.p50_ns, b.p90_ns, b.percentile_error) == (a.p50_ns, a.p90_ns, 0), name
        else:
            assert b.percentile_error == RELATIVE_ERROR and b.sample is None
            for got, exact in ((b.p50_ns, a.p50_ns), (b.p90_ns, a.p90_ns)):
                assert abs(got - exact) <= RELATIVE_ERROR * exact + 1e-9, (name, got, exact)
    assert held.phases["vllm_one_step"].count == STEPS * DECODES > SAMPLE_LIMIT
    assert held.phases["sync"].count == STEPS  # the marks paired, in both


@pytest.mark.parametrize("keyed", [False, True], ids=["numbered", "keyed"])
def test_a_spill_past_the_limits_is_streamed_with_the_same_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keyed: bool
) -> None:
    path = write_spill(tmp_path, keyed=keyed)
    (held,) = part_of_file(path)
    assert held.step_count == (STEPS // 2 if keyed else STEPS)
    assert held.step_keys == ([str(k) for k in range(STEPS // 2)] if keyed else [])
    assert held.phases["generate_sequences"].self_ns > 0  # the breakdown, held
    assert_same(held, stream.aggregate_spill_stream(path))
    limit(monkeypatch, events=1000)  # held, then past the count: streamed from there
    (past_count,) = part_of_file(path)
    assert_same(held, past_count)
    limit(monkeypatch, events=10**9, size=path.stat().st_size - 1)  # past the size: from the start
    (past_size,) = part_of_file(path)
    assert_same(held, past_size)
    assert past_size.unmarked_ns == past_size.concurrent_ns == 0
    assert all(a.self_ns == 0 for a in past_size.phases.values())  # not known, never a guess


def test_b_the_summary_says_what_a_streamed_process_lacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_spill(tmp_path)
    member = Member("trainer", 0)
    normal = summarize_path(tmp_path, jobs=1, progress=False)
    assert not normal.notes and member in normal.unmarked_ns
    gen = next(p for p in normal.phases if p.name == "generate_sequences")
    assert gen.per_rank[0].self_share is not None and gen.overall.self_share is not None

    limit(monkeypatch, events=1000)
    streamed = summarize_path(tmp_path, jobs=1, progress=False)
    (note,) = streamed.notes
    assert str(path) in note and "summarised in one pass" in note and "self times" in note
    assert member not in streamed.unmarked_ns
    gen = next(p for p in streamed.phases if p.name == "generate_sequences")
    assert gen.per_rank[0].self_share is None and gen.overall.self_share is None  # not "0 %"
    assert gen.overall.count == STEPS and streamed.step_count[member] == STEPS
    table = format_table(streamed)
    (row,) = [line for line in table.splitlines() if line.startswith("generate_sequences")]
    assert row.split()[9] == "-", row  # the self % column
    (unmarked,) = [line for line in table.splitlines() if line.startswith("(unmarked)")]
    assert unmarked.split()[2:] == ["-", "-", "-"], unmarked
    assert "not known for trainer rank 0" in table
    doc = format_json(streamed)
    assert doc["ranks"]["trainer:0"]["unmarked_ns"] is None and doc["notes"] == [note]


def test_b_one_process_in_two_large_spills_is_joined_in_one_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two spills of one role and rank (two processes: same host and pid, two instances) are
    read again to be summed (``_rank_job``); past the limits, in one pass, with the same sums."""
    write_spill(tmp_path, steps=200)
    write_spill(tmp_path, steps=100)
    assert len(list((tmp_path / "spill").iterdir())) == 2
    member = Member("trainer", 0)
    held = summarize_path(tmp_path, jobs=1, progress=False)
    limit(monkeypatch, events=1000)
    streamed = summarize_path(tmp_path, jobs=1, progress=False)
    assert not held.errors and not streamed.errors, streamed.errors
    assert held.step_count[member] == streamed.step_count[member] == 300
    assert held.step_time_ns[member] == streamed.step_time_ns[member]
    for a, b in zip(held.phases, streamed.phases):
        assert (a.name, a.overall.count, a.overall.total_ns, a.overall.max_ns) == (
            b.name, b.overall.count, b.overall.total_ns, b.overall.max_ns,
        )  # fmt: skip
    assert member in held.unmarked_ns and member not in streamed.unmarked_ns
    (note,) = streamed.notes  # one process of two files: every event of both counted
    assert f"{300 * (DECODES + 3) + 2} events" in note, note


def test_c_timelines_name_a_spill_too_large_and_draw_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    big = write_spill(tmp_path, rank=0, role="trainer")
    small = write_spill(tmp_path, rank=1, role="trainer", steps=2)
    small_events = len(read_spill(small).records)
    limit(monkeypatch, events=small_events)
    with pytest.raises(TraceFileError, match="more than is read whole here") as refused:
        read_trace_file(big)
    assert refused.value.path == big
    assert len(read_trace_file(small)[0].records) == small_events - 2  # a pair made one range

    traces, errors, _ = load_traces(tmp_path)
    assert [t.rank for t in traces] == [1] and len(errors) == 1 and str(big) in errors[0]
    html, trace = tmp_path / "report.html", tmp_path / "job.trace.json"
    code = run_summary(str(tmp_path), html=str(html), trace=str(trace))
    err = capsys.readouterr().err
    assert code == 1  # an error: the big spill is not in the pictures
    assert f"error: {big}" in err and "without them summarises it in one pass" in err
    assert html.is_file() and "vllm_one_step" in html.read_text(encoding="utf-8")
    events = json.loads(trace.read_text(encoding="utf-8"))["traceEvents"]
    ranks = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert ranks and all("rank 1" in r for r in ranks), ranks

    assert run_summary(str(tmp_path), jobs=1) == 0  # without pictures: both, the big one streamed
    out, err = capsys.readouterr()
    assert "rank 0:" in out and "rank 1:" in out and "summarised in one pass" in err


# A real large spill: the command's peak RSS (the wrapper's only child is the command).
_BUILD = """
import sys
from mstx_marks.backends.record import Recorder
from mstx_marks.export.spill import Spill
rec = Recorder(capacity=1 << 20)
spill = Spill(sys.argv[1], rec, rank=0, role="trainer")
start, end = rec.range_start, rec.range_end
for n in range(int(sys.argv[2]) // 10):
    step = start("step", "default")
    for _ in range(9):
        end(start("vllm_one_step", "vllm"), "vllm")
    end(step, "default")
    if n % 20_000 == 19_999:
        spill.write_now()
spill.write_now(final=True)
"""
_MEASURE = """
import resource, subprocess, sys
done = subprocess.run([sys.executable, "-m", "mstx_marks", "summary", sys.argv[1], "--json"],
                      capture_output=True, text=True)
sys.stderr.write(done.stderr)
print(done.stdout)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)
"""
EVENTS = 3_000_000


def test_d_a_large_spill_is_summarised_in_bounded_memory(tmp_path: Path) -> None:
    """3e6 events (about 90 MB of spill): holding them would take about 1.7 GB (590 MB per
    million, measured); the streamed summary takes a fraction of it."""
    run = [sys.executable, "-c"]
    subprocess.run(
        [*run, textwrap.dedent(_BUILD), str(tmp_path), str(EVENTS)], check=True, timeout=300
    )
    proc = subprocess.run(
        [*run, textwrap.dedent(_MEASURE), str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    *doc, peak_mb = proc.stdout.strip().splitlines()
    summary = json.loads("\n".join(doc))
    assert sum(p["all"]["count"] for p in summary["phases"]) == EVENTS, proc.stderr
    assert summary["ranks"]["trainer:0"]["steps"] == EVENTS // 10
    assert "summarised in one pass" in proc.stderr
    # ~55 MB measured (read_spill's batches are cut at a few MB); 1.7 GB held, and ~300 MB
    # when read_spill took a file of block lines as one batch (~3x the file).
    assert int(peak_mb) < 200, peak_mb
