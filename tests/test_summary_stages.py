"""One stage marked twice is counted once; the frameworks' own annotations are kept apart from the
user's phases (:mod:`mstx_marks.analysis.model.stages`).

verl's discrete profiling puts its own MSTX range (``actor_compute_log_prob``, from
``DistProfiler.annotate``) and ours (``compute_log_prob``) directly around one stage call on one
thread: both fold to ``compute_log_prob``, which a 40 ms stage must not show as two ranges and
78 ms, in any path the summary reads (held in memory, in SQL, in one pass) nor from a torch_npu
capture read back (its database and its trace_view.json).
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
from support.recorded import PID, T0, TID

from mstx_marks.analysis.model.aggregate import PhaseSummary, aggregate_trace
from mstx_marks.analysis.model.stages import NestFrontier, nested_repeats
from mstx_marks.analysis.readers import chrome_json, part_of_file, read_trace_file, stream
from mstx_marks.analysis.readers.stream import StreamAggregator
from mstx_marks.analysis.summary import format_table, load_traces, summarize, summarize_path
from mstx_marks.backends.record import Recorder
from mstx_marks.base.records import Member, RangeRecord, Record
from mstx_marks.export import RankTrace, write_ascend_db, write_chrome_trace
from mstx_marks.export.spill import Spill

MS = 1_000_000
STEPS = 3


def r(name: str, start_ms: float, end_ms: float, tid: int = TID, domain: str = "default") -> Record:
    return RangeRecord(name, domain, T0 + int(start_ms * MS), T0 + int(end_ms * MS), tid, PID)


def discrete(steps: int = STEPS) -> list[Record]:
    """verl's discrete mode, ``steps`` times: the step; inside it, verl's range and ours around
    one 40 ms compute_log_prob call (ours 1 ms inside verl's), then an update_actor."""
    out = []
    for k in range(steps):
        t = 100 * k
        out += [
            r("step", t, t + 90),
            r("actor_compute_log_prob", t + 1, t + 41),
            r("compute_log_prob", t + 2, t + 40),
            r("update_actor", t + 50, t + 80),
        ]
    return out


def assert_once(phases: list[PhaseSummary], notes: list[str], steps: int = STEPS) -> None:
    (lp,) = [p for p in phases if p.name == "compute_log_prob"]
    assert lp.overall.count == steps and lp.overall.total_ns == steps * 40 * MS
    assert lp.overall.max_ns == 40 * MS
    (note,) = [n for n in notes if "nested directly" in n]  # once, with how many were merged
    assert f"compute_log_prob ({steps}, {steps * 38:.3f} ms)" in note


def test_verl_and_our_range_around_one_stage_count_once_in_memory() -> None:
    s = summarize([RankTrace(0, discrete())])
    assert_once(s.phases, s.notes)
    (lp,) = [p for p in s.phases if p.name == "compute_log_prob"]
    assert lp.overall.self_ns == STEPS * 40 * MS  # self times add up as before: 2 + 38
    assert s.unmarked_ns[Member("", 0)] == STEPS * (90 - 40 - 30) * MS
    two = summarize([RankTrace(0, discrete()), RankTrace(1, discrete())])
    (lp,) = [p for p in two.phases if p.name == "compute_log_prob"]
    assert lp.overall.count == 2 * STEPS
    assert len([n for n in two.notes if "nested directly" in n]) == 1  # one note for all ranks


def test_only_a_direct_parent_of_the_same_phase_merges() -> None:
    recs = [
        r("step", 0, 100),
        r("compute_log_prob", 1, 50),
        r("update_actor", 2, 40),
        r("compute_log_prob", 3, 30),  # inside update_actor: a stage of its own
        r("compute_log_prob", 60, 70, tid=TID + 1),  # another thread
        r("compute_log_prob", 61, 69),  # beside, not inside, the first
    ]
    s = summarize([RankTrace(0, recs)])
    (lp,) = [p for p in s.phases if p.name == "compute_log_prob"]
    assert lp.overall.count == 4 and not [n for n in s.notes if "nested directly" in n]


@pytest.mark.parametrize("order", ["start", "end"])
def test_the_one_pass_frontier_places_ranges_read_in_either_order(order: str) -> None:
    recs = [x for x in discrete(50) if isinstance(x, RangeRecord) and x.name != "step"]
    recs += [
        r("decode", 100 * k + 51 + i, 100 * k + 51 + i + 0.5) for k in range(50) for i in range(9)
    ]
    recs.sort(key=(lambda x: (x.start_ns, -x.end_ns)) if order == "start" else
              (lambda x: (x.end_ns, -x.start_ns)))  # fmt: skip
    rows = [((x.pid, x.thread), x.start_ns, -x.end_ns, x.name) for x in recs]
    rows = [(k, s, e, "compute_log_prob" if n.endswith("compute_log_prob") else n)
            for k, s, e, n in rows]  # fmt: skip
    held = set(nested_repeats(rows))
    got: dict[int, bool] = {}
    frontier = NestFrontier(lambda i, repeat: got.setdefault(i, repeat), window=8)
    for i, (_, s, neg_e, name) in enumerate(rows):
        frontier.add(s, -neg_e, name, i)
    frontier.close()
    assert len(got) == len(rows) and {i for i, rep in got.items() if rep} == held
    assert len(held) == 50


def test_the_database_counts_once_in_sql(tmp_path: Path) -> None:
    db = write_ascend_db(tmp_path / "ascend_pytorch_profiler_0.db", RankTrace(0, discrete()))
    (part,) = part_of_file(db)
    assert part.merged == {"compute_log_prob": STEPS}
    s = summarize_path(tmp_path, jobs=1)
    assert_once(s.phases, s.notes)
    traces, _, _ = load_traces(tmp_path)  # the timelines' path: held, then aggregated
    held = summarize(traces)
    assert_once(held.phases, held.notes)


def _spill(out: Path, steps: int = STEPS) -> Path:
    """The flight recorder's spill of the discrete shape, by the real recorder (ranges written
    as they end: ours before verl's)."""
    rec = Recorder()
    spill = Spill(out, rec, rank=0)
    for _ in range(steps):
        step = rec.range_start("step", "default")
        verl = rec.range_start("actor_compute_log_prob", "default")
        ours = rec.range_start("compute_log_prob", "default")
        rec.range_end(ours, "default")
        rec.range_end(verl, "default")
        rec.range_end(rec.range_start("update_actor", "default"), "default")
        rec.range_end(step, "default")
    return spill.write_now(final=True)


def test_a_spill_and_a_chrome_trace_summarised_in_one_pass_count_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _spill(tmp_path / "spill")
    (held,) = part_of_file(path)
    assert held.merged == {"compute_log_prob": STEPS} and not held.streamed
    chrome = write_chrome_trace(tmp_path / "c" / "r0.trace.json", [RankTrace(0, discrete())])
    (held_chrome,) = part_of_file(chrome)
    monkeypatch.setattr(stream, "MAX_HELD_EVENTS", 2)  # past it: each read in one pass
    monkeypatch.setattr(chrome_json, "WHOLE_JSON_BYTES", 64)  # (an event at a time)
    (streamed,) = part_of_file(path)
    (streamed_chrome,) = part_of_file(chrome)
    for a, b in ((held, streamed), (held_chrome, streamed_chrome)):
        assert b.streamed and b.merged == a.merged == {"compute_log_prob": STEPS}
        assert b.merged_ns == a.merged_ns
        for name, agg in a.phases.items():
            assert (b.phases[name].count, b.phases[name].total_ns) == (agg.count, agg.total_ns)
    s = summarize_path(tmp_path / "c", jobs=1)
    assert_once(s.phases, s.notes)


def test_a_name_the_registry_does_not_know_nested_in_itself_counts_every_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A recursive record_function (or msprof's operator strings) is not one stage marked twice.
    recs = [r("step", 0, 90), r("walk", 1, 41), r("walk", 2, 40), r("walk", 3, 30)]
    recs += [r("actor_compute_log_prob", 50, 80), r("compute_log_prob", 51, 79)]
    db = write_ascend_db(tmp_path / "db" / "ascend_pytorch_profiler_0.db", RankTrace(0, recs))
    chrome = write_chrome_trace(tmp_path / "c" / "r0.trace.json", [RankTrace(0, recs)])
    parts = [aggregate_trace(RankTrace(0, recs)), *part_of_file(db), *part_of_file(chrome)]
    monkeypatch.setattr(stream, "MAX_HELD_EVENTS", 2)  # past it: in one pass
    monkeypatch.setattr(chrome_json, "WHOLE_JSON_BYTES", 64)
    (streamed,) = part_of_file(chrome)
    assert streamed.streamed
    for part in (*parts, streamed):
        walk = part.phases["walk"]
        assert walk.count == 3 and walk.total_ns == (40 + 38 + 27) * MS
        assert part.merged == {"compute_log_prob": 1}  # the registry's stage still merges
    assert not [n for n in summarize([RankTrace(0, recs)]).notes if "walk" in n]


def test_records_in_start_or_end_order_through_the_stream_aggregator() -> None:
    recs = discrete()
    for ordered in (sorted(recs, key=lambda x: x.start_ns), sorted(recs, key=lambda x: x.end_ns)):
        agg = StreamAggregator()
        for rec in ordered:
            agg.add(rec)
        part = agg.part(RankTrace(0, []))
        assert part.phases["compute_log_prob"].count == STEPS
        assert part.merged == {"compute_log_prob": STEPS}


def torch_npu_steps() -> list[Record]:
    """The discrete shape as torch_npu records it: each step its MSTX range ProfilerStep#N
    (``N`` from 50), as torch_npu's profiler marks it with a schedule."""
    return [
        x._replace(name=f"ProfilerStep#{50 + (x.start_ns - T0) // (100 * MS)}")
        if x.name == "step" else x
        for x in discrete()
        if isinstance(x, RangeRecord)
    ]  # fmt: skip


def _torch_npu_db(folder: Path) -> Path:
    """torch_npu's database of the discrete shape: STEP_TIME ids are ProfilerStep numbers."""
    recs = torch_npu_steps()
    spans = [(x.start_ns, x.end_ns) for x in recs if x.name.startswith("ProfilerStep#")]
    db = write_ascend_db(
        folder / "x_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "ascend_pytorch_profiler_0.db",
        RankTrace(0, recs, spans),
    )
    with closing(sqlite3.connect(db)) as c:
        c.execute("UPDATE STEP_TIME SET id = id + 49")
        c.commit()
    return db


def _trace_view(folder: Path) -> Path:
    """A torch_npu text capture of the discrete shape: its MSTX ranges as msprof writes them
    (no ``cat``; ``args.event_type`` and ``args.domain``), each ProfilerStep#N twice (its CPU
    op, and torch_npu's MSTX range of it)."""
    out = folder / "host_1_20250101000000000_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(parents=True)
    (out.parent / "profiler_info_0.json").write_text("{}")
    us = lambda ns: f"{ns // 1000}.{ns % 1000:03d}"  # noqa: E731
    events: list[dict[str, object]] = [
        {"name": "process_name", "pid": 223, "tid": 0, "ph": "M", "args": {"name": "python"}},
    ]
    for x in torch_npu_steps():
        assert isinstance(x, RangeRecord)
        times = {"ts": us(x.start_ns), "dur": (x.end_ns - x.start_ns) / 1000}
        if x.name.startswith("ProfilerStep#"):
            events.append({"name": x.name, "pid": PID, "tid": TID, "ph": "X", "cat": "cpu_op",
                           "args": {}, **times})  # fmt: skip
        events.append({"name": x.name, "pid": 223, "tid": TID, "ph": "X", **times,
                       "args": {"event_type": "start/end", "domain": "default"}})  # fmt: skip
    path = out / "trace_view.json"
    path.write_text(json.dumps(events))
    return path


def test_a_torch_npu_capture_read_back_counts_once(tmp_path: Path) -> None:
    db = _torch_npu_db(tmp_path / "db")
    view = _trace_view(tmp_path / "text")
    for where in (db.parent.parent, view.parent.parent):
        for s in (summarize_path(where, jobs=1), summarize(load_traces(where)[0])):
            assert s.errors == [] and s.step_count == {Member("", 0): STEPS}
            assert s.step_keys == {Member("", 0): ["50", "51", "52"]}
            assert_once(s.phases, s.notes)
            (steps,) = [p for p in s.phases if p.is_step]  # one step phase, each step once
            assert steps.name == "ProfilerStep" and steps.overall.count == STEPS


def test_pytorchs_own_annotations_take_nothing_from_the_users_phases() -> None:
    recs = [
        r("ProfilerStep#1", 0, 100),
        r("## forward ##", 1, 41),
        r("DistributedDataParallel.forward", 2, 40),
        r("nccl:all_reduce", 50, 60),
        r("Optimizer.step#AdamW.step", 70, 80),
        r("gloo:all_reduce", 0, 1000, tid=TID + 1),  # a background thread, past the step
    ]
    trace = RankTrace(0, [x._replace(name="ProfilerStep", args={"step": 1})
                          if x.name.startswith("ProfilerStep") else x for x in recs])  # fmt: skip
    s = summarize([trace])
    member = Member("", 0)
    fwd = next(p for p in s.phases if p.name == "## forward ##")
    assert not fwd.automatic and fwd.overall.self_ns == 40 * MS  # DDP's range takes none of it
    auto = {p.name: p for p in s.phases if p.automatic}
    assert set(auto) == {"DistributedDataParallel.forward", "nccl:all_reduce",
                         "Optimizer.step#AdamW.step", "gloo:all_reduce"}  # fmt: skip
    assert all(p.overall.step_share is None and p.overall.self_ns is None for p in auto.values())
    assert s.unmarked_ns[member] == 60 * MS and s.outside_ns[member] == s.concurrent_ns[member] == 0
    table = format_table(s)
    users, _, apart = table.partition("automatic annotations (")
    assert "## forward ##" in users and "gloo:all_reduce" not in users
    assert "gloo:all_reduce" in apart and "nccl:all_reduce" in apart


def test_hccls_communication_ranges_are_one_automatic_phase_per_operator(tmp_path: Path) -> None:
    def hccl(op: str, count: int, start: float) -> Record:
        message = json.dumps({"opName": op, "groupName": "group_name_29", "dataType": "bfp16",
                              "count": str(count), "streamId": "9"})  # fmt: skip
        return r(message, start, start + 1, domain="communication")

    recs = [r("step", 0, 100), r("update_actor", 1, 90)]
    recs += [hccl("HcclAllreduce", 8 * (i + 1), 2 + 2 * i) for i in range(10)]
    recs += [hccl("HcclBroadcast", 3, 40), r("my_sync", 50, 51, domain="communication")]
    db = write_ascend_db(tmp_path / "ascend_pytorch_profiler_0.db", RankTrace(0, recs))
    for s in (summarize_path(tmp_path, jobs=1), summarize([read_trace_file(db)[0]])):
        names = {p.name: p for p in s.phases}
        assert set(names) == {"step", "update_actor", "hccl:HcclAllreduce", "hccl:HcclBroadcast",
                              "my_sync"}  # fmt: skip
        assert names["hccl:HcclAllreduce"].overall.count == 10
        assert names["hccl:HcclAllreduce"].automatic and not names["my_sync"].automatic
        assert names["update_actor"].overall.self_ns == 88 * MS  # the collectives take none
