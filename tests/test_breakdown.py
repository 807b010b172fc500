"""A summary that adds up (steps without flags, inclusive and self time, the unmarked row), the
per-rank Chrome trace drawing overlapping ranges of one thread on tracks of their own, named
threads, and the HTML report's data (lane groups per role and rank, instants, stable colours)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.recorded import PID, T0, TID, rng, synthetic_rank

from mstx_marks.analysis.model.aggregate import aggregate_trace
from mstx_marks.analysis.readers.ascend_sql import aggregate_db
from mstx_marks.analysis.render.merge import merged_chrome_trace
from mstx_marks.analysis.render.report_html import phase_color, report_data
from mstx_marks.analysis.render.summary_text import format_json, format_table
from mstx_marks.analysis.summary import load_traces, summarize, summarize_path
from mstx_marks.base.records import InstantRecord, RangeRecord, RankTrace
from mstx_marks.export import read_chrome_trace, write_ascend_db, write_chrome_trace
from mstx_marks.export.chrome import OVERLAP_TID, chrome_trace


def _nested_steps() -> RankTrace:
    """Two ``train_step`` ranges of 1000 ns: forward 0-300 (backward 100-200 inside it), then
    gen 400-900; 100 ns of each step is in no phase."""
    recs = []
    for k in range(2):
        t = k * 1000
        recs += [
            rng("train_step", t, t + 1000),
            rng("forward", t, t + 300),
            rng("backward", t + 100, t + 200),
            rng("gen", t + 400, t + 900),
        ]
    return RankTrace(0, recs)


@pytest.mark.parametrize("name", ["step", "train_step", "training_step", "global_step"])
def test_the_usual_step_names_are_steps_without_a_flag(name: str) -> None:
    trace = RankTrace(0, [rng(name, 0, 100), rng("gen", 10, 50), rng(name, 200, 300)])
    summary = summarize([trace])
    (member,) = summary.step_count
    assert summary.step_count[member] == 2 and summary.step_time_ns[member] == 200
    assert "rank 0: 2 steps" in format_table(summary)


def test_profiler_steps_are_steps() -> None:
    trace = RankTrace(0, [RangeRecord("ProfilerStep", "d", T0, T0 + 10, 1, 1, args={"step": 4})])
    assert summarize([trace]).step_count == {trace.member: 1}


def test_without_steps_the_table_says_shares_are_of_the_span() -> None:
    text = format_table(summarize([RankTrace(0, [rng("gen", 0, 10**6)])]))
    assert "no steps, span 1.000 ms" in text and "0 steps" not in text


def test_self_time_and_unmarked_add_up_to_the_step_time() -> None:
    summary = summarize([_nested_steps()])
    phases = {p.name: p for p in summary.phases}
    assert phases["train_step"].is_step and phases["train_step"].overall.self_ns is None
    assert phases["forward"].overall.total_ns == 600 and phases["forward"].overall.self_ns == 400
    assert phases["backward"].overall.self_ns == 200
    assert phases["generate_sequences"].overall.self_ns == 1000
    (member,) = summary.step_time_ns
    assert summary.unmarked_ns[member] == 400  # 0-1000 less 0-300 and 400-900, twice
    selves = sum(p.overall.self_share or 0 for p in summary.phases)
    unmarked = summary.unmarked_ns[member] / summary.step_time_ns[member]
    assert selves + unmarked == pytest.approx(1.0)
    assert summary.concurrent_ns[member] == 0 and summary.outside_ns[member] == 0
    text = format_table(summary)
    assert "(unmarked)" in text and "self %" in text and "inclusive" in text
    assert "beyond 100 %" not in text  # nothing concurrent here: no such line
    doc = format_json(summary)
    assert doc["ranks"]["0"]["unmarked_ns"] == 400
    forward = next(p for p in doc["phases"] if p["name"] == "forward")
    assert forward["all"]["self_ns"] == 400 and forward["all"]["self_share"] == pytest.approx(0.2)


def test_concurrent_asyncio_ranges_are_explained() -> None:
    """Four generate ranges gathered on one thread: inclusive time passes the step's, and the
    footnote says by how much and why."""
    tasks = [rng("gen", 100_000 + 10_000 * i, 300_000 + 200_000 * i) for i in range(4)]
    summary = summarize([RankTrace(0, [rng("step", 0, 1_000_000), *tasks])])
    gen = next(p for p in summary.phases if p.name == "generate_sequences")
    assert gen.overall.step_share == pytest.approx(1.94)  # 200+390+580+770 us over 1 ms
    assert gen.overall.self_share == pytest.approx(1.94)  # none inside another
    (member,) = summary.step_time_ns
    assert summary.unmarked_ns[member] == 200_000  # 0-100 and 900-1000 us
    assert summary.concurrent_ns[member] == 1_940_000 - 800_000
    text = format_table(summary)
    assert "rank 0: beyond 100 % by 1.140 ms concurrent" in text and "asyncio" in text


def test_phases_outside_steps_are_counted_apart() -> None:
    recs = [rng("step", 100, 200), rng("init", 0, 50), rng("gen", 120, 180)]
    summary = summarize([RankTrace(0, recs)])
    (member,) = summary.step_time_ns
    assert summary.outside_ns[member] == 50 and summary.unmarked_ns[member] == 40


def test_the_database_reader_gives_the_same_breakdown(tmp_path: Path) -> None:
    trace = _nested_steps()
    trace.records.append(rng("gen", 450, 950))  # concurrent with the other gen
    db = write_ascend_db(tmp_path / "ascend_pytorch_profiler_0.db", trace)
    sql, mem = aggregate_db(db), aggregate_trace(trace)
    assert {n: a.self_ns for n, a in sql.phases.items()} == {
        n: a.self_ns for n, a in mem.phases.items()
    }
    assert (sql.unmarked_ns, sql.concurrent_ns, sql.outside_ns, sql.step_phases) == (
        mem.unmarked_ns, mem.concurrent_ns, mem.outside_ns, mem.step_phases,
    )  # fmt: skip
    streamed = summarize_path(tmp_path, jobs=1, progress=False)
    assert list(streamed.unmarked_ns.values()) == [mem.unmarked_ns]


def _overlapping(pid: int = PID) -> RankTrace:
    """Four asyncio tasks' ranges on one thread, each overlapping the next without nesting,
    inside a step; and an instant."""
    recs: list[RangeRecord | InstantRecord] = [RangeRecord("step", "d", T0, T0 + 10_000, TID, pid)]
    recs += [
        RangeRecord("gen", "d", T0 + 100 * i, T0 + 100 * i + 2000 + 500 * i, TID, pid,
                    args={"task": i})
        for i in range(4)
    ]  # fmt: skip
    recs.append(InstantRecord("tick", "d", T0 + 50, TID, pid))
    return RankTrace(0, recs)


def test_the_per_rank_chrome_trace_puts_overlapping_ranges_on_tracks_of_their_own(
    tmp_path: Path,
) -> None:
    trace = _overlapping()
    doc = chrome_trace([trace])
    events = doc["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert names[TID] == f"thread {TID}"
    assert sorted(n for t, n in names.items() if t >= OVERLAP_TID) == [
        f"thread {TID} (overlap {k})" for k in (1, 2, 3)
    ]
    # in every track, any two complete events nest or do not overlap: Perfetto draws it right
    for tid in names:
        spans = sorted(
            (
                (e["ts"], e["ts"] + e["dur"])
                for e in events
                if e.get("ph") == "X" and e["tid"] == tid
            ),
            key=lambda se: (se[0], -se[1]),
        )
        for (_, e1), (s2, e2) in zip(spans, spans[1:]):
            assert e1 <= s2 or e2 <= e1
    assert doc["otherData"]["threads"] == {f"0:{t}": TID for t in names if t != TID}
    path = write_chrome_trace(tmp_path / "r.trace.json", [trace])
    assert json.loads(path.read_text())["traceEvents"] == json.loads(json.dumps(events))
    (back,) = read_chrome_trace(path)
    assert sorted(back.records, key=repr) == sorted(trace.records, key=repr)


def test_thread_names_are_written_read_back_and_shown(tmp_path: Path) -> None:
    me, main = os.getpid(), threading.get_native_id()
    trace = RankTrace(0, [RangeRecord("step", "d", T0, T0 + 10, main, me)])
    path = write_chrome_trace(tmp_path / "rank0.trace.json", [trace])  # this process's threads
    (back,) = read_chrome_trace(path)
    assert back.thread_names == {main: threading.current_thread().name}
    # a database copy of the process keeps no names: the Chrome copy's are used
    write_ascend_db(tmp_path / "ascend_pytorch_profiler_0.db", trace)
    (loaded,), errors, _ = load_traces(tmp_path)
    assert errors == [] and loaded.thread_names == back.thread_names
    merged = merged_chrome_trace([loaded])["traceEvents"]
    assert {e["args"]["name"] for e in merged if e["name"] == "thread_name"} >= {"MainThread"}
    data = report_data([loaded], summarize([loaded]))
    assert data["groups"][0]["tracks"][0]["name"] == "MainThread"


def test_the_report_data_groups_lanes_by_role_and_rank_with_instants() -> None:
    a, b = synthetic_rank(0), synthetic_rank(1, slow=100)
    b.records.append(RangeRecord("gen", "d", T0, T0 + 5, TID + 1, PID + 1))  # a second process
    traces = [a, b]
    data = report_data(traces, summarize(traces))
    assert [(g["rank"], g["role"], g["pids"]) for g in data["groups"]] == [
        (0, "", [PID]),
        (1, "", [PID, PID + 1]),
    ]
    assert [t["name"] for t in data["groups"][1]["tracks"]] == [
        f"thread {TID} (pid {PID})",
        f"thread {TID + 1} (pid {PID + 1})",
    ]
    assert len(data["marks"]) == 6 and {data["names"][m[2]] for m in data["marks"]} == {
        "weights_synced"
    }
    assert data["colors"] == [phase_color(n) for n in data["names"]]
    update = next(p for p in data["phases"] if p["name"] == "update_actor")
    assert [r["rank"] for r in update["per_rank"]] == [0, 1] and update["self"] is not None
    assert data["unmarked"][0]["ranks"][0]["rank"] == 0


def test_phase_colours_depend_on_the_name_alone() -> None:
    assert phase_color("update_actor") != phase_color("generate_sequences")
    assert phase_color("some_phase") == phase_color("some_phase")
    data1 = report_data([synthetic_rank(0)], summarize([synthetic_rank(0)]))
    only = RankTrace(0, [rng("update_actor", 0, 5)])
    data2 = report_data([only], summarize([only]))
    c1 = dict(zip(data1["names"], data1["colors"]))
    assert c1["update_actor"] == dict(zip(data2["names"], data2["colors"]))["update_actor"]


def _innermost(ranges: list[tuple[int, int, int, str]], by_name: bool) -> dict[int, int]:
    """By the definition: each range's parent, the latest (in start order, longest first; equal
    spans by name for the breakdown, as given for the repeats) of the earlier ranges of its
    thread that contain it."""

    def key(i: int) -> tuple[int, int, int, str, int]:
        t, s, e, name = ranges[i]
        return t, s, -e, name if by_name else "", i

    order = sorted(range(len(ranges)), key=key)
    parent = {}
    for k, i in enumerate(order):
        t, s, e, _ = ranges[i]
        for j in reversed(order[:k]):
            if ranges[j][0] == t and ranges[j][1] <= s and ranges[j][2] >= e:
                parent[i] = j
                break
    return parent


def _union(spans: list[tuple[int, int]]) -> int:
    total, hi = 0, None
    for s, e in sorted(spans):
        if hi is None or s > hi:
            total, hi = total + e - s, e
        elif e > hi:
            total, hi = total + e - hi, e
    return total


_NAMES = ["compute_log_prob", "update_actor", "fib"]  # two stages of the registry, one not


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 1), st.integers(0, 60), st.integers(0, 40), st.sampled_from(_NAMES)
        ),
        max_size=40,
    )
)
def test_self_times_and_repeats_follow_the_innermost_container(
    drawn: list[tuple[int, int, int, str]],
) -> None:
    """Any ranges on two threads (nested, staggered like asyncio tasks, equal, empty): the
    summary's JSON says each phase's count and self time as the definitions give them, where
    the open-range stacks keep only what may still hold a later range."""
    ranges = [(t, s, s + d, name) for t, s, d, name in drawn]
    outer = _innermost(ranges, by_name=False)
    repeat = {i for i, j in outer.items() if ranges[j][3] == ranges[i][3] != "fib"}
    children: dict[int, list[tuple[int, int]]] = {}
    for i, j in _innermost(ranges, by_name=True).items():
        children.setdefault(j, []).append(ranges[i][1:3])
    selfs: dict[str, int] = {}
    counts: dict[str, int] = {}
    for i, (_, s, e, name) in enumerate(ranges):
        selfs[name] = selfs.get(name, 0) + e - s - _union(children.get(i, []))
        counts[name] = counts.get(name, 0) + (i not in repeat)
    recs = [RangeRecord(n, "default", T0 + s, T0 + e, TID + t, PID) for t, s, e, n in ranges]
    recs.append(RangeRecord("step", "default", T0, T0 + 200, TID, PID))
    doc = format_json(summarize([RankTrace(0, recs)]))
    got = {p["name"]: p for p in doc["phases"] if not p["is_step"]}
    assert {n: p["all"]["count"] for n, p in got.items()} == {n: c for n, c in counts.items() if c}
    assert {n: p["all"]["self_ns"] for n, p in got.items()} == {
        n: max(v, 0) for n, v in selfs.items() if counts[n]
    }
