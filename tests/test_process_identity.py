"""A process is (boot id, pid, instance): processes of one role and rank that run at once are
as many lanes of the per-step analysis; one that restarted is one lane whose lives keep each
its own host and clock, and the restart is said. Checked against synthetic jobs with true
times written as our own spills, through ``mstx-marks summary --json``
(analysis/model/clocks.py)."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from support.clock_jobs import (
    AHEAD_B,
    ANCHOR_A,
    MS,
    STEPS,
    WORKER0,
    WORKER1,
    Proc,
    assert_busy_within_bound,
    engine,
    per_step,
    row,
    trainer,
    true_busy_ms,
    worker,
    write_job,
)

from mstx_marks.analysis.model.clocks import align
from mstx_marks.analysis.model.spans import ProcessSpans
from mstx_marks.analysis.render.rl_steps_text import steps_json
from mstx_marks.analysis.summary import load_traces, summarize
from mstx_marks.base.records import Member, Origin


def _four_engines() -> list[Proc]:
    """Four engine processes that all say EngineCore rank 0, at once; the last 40 % slower."""
    engines = [engine(0, "a", "boot-a", 20, pid=300 + k) for k in range(4)]
    slow = engines[-1]
    slow.ranges = [(n, s, s + (e - s) * 1.4) for n, s, e in slow.ranges]
    return [trainer(), *engines]


def test_four_engines_of_one_role_and_rank_are_four_lanes(tmp_path: Path) -> None:
    procs = _four_engines()
    doc = per_step(write_job(tmp_path, procs))
    keys = sorted(p["key"] for p in doc["processes"] if p["role"] == "EngineCore")
    assert keys == [f"EngineCore:0:pid {300 + k}" for k in range(4)]
    assert set(keys) <= set(doc["clock"]["machines"][0]["processes"])
    for p in procs[1:]:
        got = row(doc, f"EngineCore:0:pid {p.pid}")
        assert got["busy_ns"] == [round(true_busy_ms(p, s) * MS) for s in range(STEPS)]
    tail = doc["steps"][0]["rollout_tail"]
    assert len(tail["engines"]) == 4 and tail["slowest"]["process"] == "pid 303"
    fast, slow = true_busy_ms(procs[1], 0), true_busy_ms(procs[4], 0)
    assert abs(tail["waiting_share"] - (slow - fast) / slow) < 1e-9
    assert any("EngineCore rank 0: 4 processes at once" in n for n in doc["notes"])


def _restarted() -> list[Proc]:
    """Actor rank 1 ran steps 1 and 2 on host a, died, and came back for step 3 on host b (its
    clock 250 ms ahead); actor rank 0 started after host a's clock was stepped 40 ms."""
    first = worker(1, "a", "boot-a", WORKER1[:2])
    second = worker(1, "b", "boot-b", [((0, 0), (0, 0))] * 2 + WORKER1[2:], AHEAD_B)
    second.pid, second.ranges = 211, second.ranges[4:]  # (its step 3 only)
    stepped = worker(0, "a", "boot-a", WORKER0)
    stepped.anchor_ns, stepped.ahead = ANCHOR_A + 40 * MS, lambda _t: 40 * MS
    lives = [first, second]
    return [trainer(), stepped, *lives, engine(1, "b", "boot-b", 16, AHEAD_B)]


def test_a_restarted_worker_is_one_lane_each_life_on_its_own_clock(tmp_path: Path) -> None:
    procs = _restarted()
    doc = per_step(write_job(tmp_path, procs))
    actors = [p for p in doc["processes"] if p["role"] == "WorkerDict"]
    assert sorted(p["key"] for p in actors) == ["WorkerDict:0", "WorkerDict:1"]
    whole = Proc("WorkerDict", 1, "", 0, ranges=procs[2].ranges + procs[3].ranges)
    assert_busy_within_bound(doc, [procs[1], whole])
    assert row(doc, "WorkerDict:1")["busy_ns"][:2] == [558 * MS, 558 * MS]  # (on host a: exact)
    assert any("WorkerDict rank 1 restarted: 2 processes one after another (pids 201, 211)" in n
               for n in doc["notes"])  # fmt: skip


def test_read_into_memory_the_model_is_the_same(tmp_path: Path) -> None:
    """``load_traces`` joins a member's processes into one trace (for the timelines); the
    per-step model of it keeps them apart as the summary does."""
    write_job(tmp_path, _restarted() + _four_engines()[1:])
    want = per_step(tmp_path)
    traces, errors, _ = load_traces(tmp_path)
    assert errors == []
    model = summarize(traces).per_step
    assert model is not None
    assert json.loads(json.dumps(steps_json(model))) == want
    # a picture of the joined trace moves each record by its own process's shift
    b = next(m for m in want["clock"]["machines"] if m["hosts"] == ["b"])
    actor = Member("WorkerDict", 1)
    assert (model.clock.shift_of(actor, 201), model.clock.shift_of(actor, 211)) == (
        0, -b["offset_ns"],
    )  # fmt: skip


def _process(pid: int, start: int, end: int) -> ProcessSpans:
    s = ProcessSpans().identify(Origin("a", "boot-a", 0), [pid], "")
    s.add(start, end, "decode_batch")
    return s.finish()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 100), st.integers(1, 50)), min_size=1, max_size=8))
def test_processes_at_once_get_as_many_lanes_as_run_together(lives: list[tuple[int, int]]) -> None:
    """Processes of one member: as few lanes as hold them without two at once in one lane (as
    many as ever ran together); every process in exactly one lane, none lost."""
    member = Member("EngineCore", 0)
    procs = [(member, _process(100 + i, s, s + d)) for i, (s, d) in enumerate(lives)]
    placed = align(procs, lambda lanes: None)
    at_once = max(sum(s <= t < s + d for s, d in lives) for t in range(0, 151))
    assert len(placed.lanes) == at_once
    # (the lives joined in a lane never overlap: their time adds up, none lost)
    assert sum(s.busy.cover_ns for _, s in placed.lanes) == sum(d for _, d in lives)
    names = [m for m, _ in placed.lanes]
    assert len(set(names)) == len(names)
