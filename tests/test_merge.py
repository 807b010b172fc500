"""The merged job timeline: one Chrome/Perfetto trace, a process per rank and role, named
threads, overlapping ranges of one thread on tracks of their own, read back exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.recorded import recorded_rank, rng, synthetic_rank, two_overlapping_tasks

from mstx_marks.analysis.render.merge import STEP_CATEGORY, merged_chrome_trace, nesting_tracks
from mstx_marks.analysis.summary import load_traces, summarize
from mstx_marks.base.records import RangeRecord
from mstx_marks.cli.main import main as cli_main
from mstx_marks.export import RankTrace, export_rank, read_chrome_trace


def _two_tasks() -> RankTrace:
    return two_overlapping_tasks(1, role="trainer")


def _nests(events: list[dict[str, object]]) -> bool:
    spans = sorted((float(e["ts"]), -float(e["dur"])) for e in events)  # type: ignore[arg-type]
    stack: list[float] = []
    for ts, neg in spans:
        end = ts - neg
        while stack and stack[-1] <= ts:
            stack.pop()
        if stack and end > stack[-1] + 1e-9:
            return False
        stack.append(end)
    return True


def test_processes_threads_and_tracks(tmp_path: Path) -> None:
    tasks = _two_tasks()
    other = synthetic_rank(0, steps=2)
    doc = merged_chrome_trace([tasks, other])
    events = doc["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert sorted(procs.values()) == [
        f"rank 0 (pid {other.records[0].pid})",
        f"trainer rank 1 (pid {tasks.records[0].pid})",  # the role leads
    ]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    tid = tasks.records[0].thread
    assert f"thread {tid}" in names.values() and f"thread {tid} (overlap 1)" in names.values()
    ranges = [e for e in events if e["ph"] == "X" and e["cat"] != STEP_CATEGORY]
    by_track: dict[tuple[object, object], list[dict[str, object]]] = {}
    for e in ranges:
        by_track.setdefault((e["pid"], e["tid"]), []).append(e)
        assert (e["pid"], e["tid"]) in names  # every event is on a named thread
    assert all(_nests(evs) for evs in by_track.values())  # what Perfetto needs of one track
    score = next(e for e in ranges if e["name"] == "compute_score")
    assert names[(score["pid"], score["tid"])] == f"thread {tid} (overlap 1)"
    # without the summary's model: no steps (never found here), recorded clocks
    assert not [e for e in events if e.get("cat") == STEP_CATEGORY]
    assert "no cross-rank offset" in doc["otherData"]["alignment"]


def test_the_steps_and_clocks_are_the_summarys_model() -> None:
    """The job's steps (its reference's, by key) on the reference's steps track, and every
    process placed where the model put it: a worker whose anchor says its wall clock ran 5 ms
    ahead is moved back, as in the HTML report."""
    late = 5 * 10**6
    trainer = RankTrace(0, synthetic_rank(0, steps=2).records, role="trainer", host="h",
                        anchor_ns=10**12)  # fmt: skip
    # its update_actor and compute_score overlap (two tasks), each 5 ms late by its clock
    ranges = [
        rng("update_actor", 700 + late, 990 + late),
        rng("compute_score", 800 + late, 1100 + late),
    ]
    worker = RankTrace(1, ranges, role="worker", host="h", anchor_ns=10**12 + late)
    model = summarize([trainer, worker]).per_step
    assert model is not None and model.clock.shifts_ns == {worker.member: -late}
    doc = merged_chrome_trace([trainer, worker], model)
    events = doc["traceEvents"]
    steps = [e for e in events if e.get("cat") == STEP_CATEGORY]
    assert [e["name"] for e in steps] == [f"step {s.key}" for s in model.steps] == [
        "step 1", "step 2"]  # fmt: skip
    procs = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert {procs[e["pid"]] for e in steps} == {f"trainer rank 0 (pid {trainer.records[0].pid})"}
    origin = doc["otherData"]["origin_ns"]
    for e, s in zip(steps, model.steps):
        assert round(e["ts"] * 1000) + origin == s.start_ns
    placed = sorted(round(e["ts"] * 1000) + origin for e in events
                    if e["ph"] == "X" and procs[e["pid"]].startswith("worker"))  # fmt: skip
    assert placed == sorted(r.start_ns - late for r in worker.records)
    assert doc["otherData"]["alignment"] == f"per-step model: {model.clock.text()}"


def test_read_back_gives_every_process_its_own_records(tmp_path: Path) -> None:
    # Both on the real clock: a float keeps every nanosecond of offsets within days
    tasks, other = _two_tasks(), recorded_rank(0, steps=2, tokens=2)
    path = tmp_path / "job.trace.json"
    path.write_text(json.dumps(merged_chrome_trace([tasks, other])))
    back = {t.rank: t for t in read_chrome_trace(path)}
    for t in (tasks, other):
        key = lambda r: (r.start_ns, r.name, r.kind)  # noqa: E731
        assert sorted(back[t.rank].records, key=key) == sorted(t.records, key=key)
        assert back[t.rank].role == t.role


def test_summary_writes_the_merged_trace_and_reads_it_as_a_duplicate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for rank in range(2):
        export_rank(tmp_path, synthetic_rank(rank))
    job = tmp_path / "job.trace.json"
    assert cli_main(["summary", str(tmp_path), "--trace", str(job)]) == 0
    assert f"trace: {job}" in capsys.readouterr().err
    traces, errors, notes = load_traces(tmp_path)  # now in the tree too: a silent duplicate
    assert errors == [] and notes == [] and [t.rank for t in traces] == [0, 1]


def test_nesting_tracks_keeps_nested_ranges_together() -> None:
    r = lambda s, e: RangeRecord("x", "d", s, e, 1, 1)  # noqa: E731
    tracks = nesting_tracks([r(0, 100), r(10, 40), r(20, 30), r(50, 90), r(35, 60)])
    assert [[x.start_ns for x in t] for t in tracks] == [[0, 10, 20, 50], [35]]
