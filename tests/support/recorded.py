"""Recordings for the exporter, summary and timeline tests: synthetic GRPO-shaped steps with
known timestamps, a Hypothesis strategy of arbitrary recordings, and a real Recorder run."""

from __future__ import annotations

import asyncio

from hypothesis import strategies as st

from mstx_marks.backends.record import Recorder
from mstx_marks.base.records import InstantRecord, RangeRecord, Record
from mstx_marks.export import RankTrace

T0 = 1_700_000_000_000_000_000  # epoch ns, as time.time_ns() gives
PID = 4242
TID = 777


def rng(
    name: str, start: int, end: int, domain: str = "default", open: bool = False
) -> RangeRecord:
    return RangeRecord(name, domain, T0 + start, T0 + end, TID, PID, open)


def synthetic_rank(rank: int, steps: int = 3, tokens: int = 4, slow: int = 0) -> RankTrace:
    """Steps of 1000 ns (+ ``slow`` on update_actor): gen with ``tokens`` decode ranges, then
    update_actor; one instant per step. Durations are exact, so expected values are known."""
    recs: list[Record] = []
    t = 0
    for _ in range(steps):
        step_end = t + 1000 + slow
        recs.append(rng("step", t, step_end))
        recs.append(rng("gen", t + 10, t + 10 + 50 * tokens))
        for i in range(tokens):
            recs.append(rng("vllm_one_step", t + 10 + 50 * i, t + 50 + 50 * i, "vllm_one_step"))
        recs.append(InstantRecord("weights_synced", "default", T0 + t + 600, TID, PID))
        recs.append(rng("update_actor", t + 700, t + 990 + slow))
        t = step_end + 5
    return RankTrace(rank, recs)


names = st.sampled_from(["step", "gen", "update_actor", "ref", "é_unicode", "a::b"])
domains = st.sampled_from(["default", "vllm_one_step", "verl"])


@st.composite
def records(draw: st.DrawFn) -> list[Record]:
    """Arbitrary ranges (some flagged open) and instants."""
    out: list[Record] = []
    for _ in range(draw(st.integers(0, 25))):
        start = T0 + draw(st.integers(0, 10**12))
        kind = draw(st.sampled_from(["range", "range", "instant"]))
        tid = draw(st.integers(1, 2**31 - 1))
        pid = draw(st.integers(1, 2**22))
        if kind == "instant":
            out.append(InstantRecord(draw(names), draw(domains), start, tid, pid))
        else:
            end = start + draw(st.integers(0, 10**10))
            out.append(
                RangeRecord(draw(names), draw(domains), start, end, tid, pid, draw(st.booleans()))
            )
    return sorted(out, key=lambda r: r.start_ns)


def recorded_rank(rank: int, steps: int, tokens: int) -> RankTrace:
    """A real :class:`Recorder` run of the synthetic shape (real clock, real thread ids)."""
    rec = Recorder()
    for _ in range(steps):
        step = rec.range_start("step", "default")
        gen = rec.range_start("gen", "default")
        for _ in range(tokens):
            one = rec.range_start("vllm_one_step", "vllm_one_step")
            sum(range(2000 * (rank + 1)))
            rec.range_end(one, "vllm_one_step")
        rec.range_end(gen, "default")
        rec.instant("weights_synced", "default")
        upd = rec.range_start("update_actor", "default")
        sum(range(20000 * (rank + 1)))
        rec.range_end(upd, "default")
        rec.range_end(step, "default")
    return RankTrace(rank, rec.records())


def two_overlapping_tasks(rank: int = 0, role: str = "") -> RankTrace:
    """A real Recorder run: inside ``step``, two asyncio tasks on one thread whose ranges
    overlap without nesting (compute_score starts inside update_actor and ends after it)."""
    rec = Recorder()

    async def task(name: str, seconds: float) -> None:
        handle = rec.range_start(name, "default")
        await asyncio.sleep(seconds)
        rec.range_end(handle, "default")

    async def step() -> None:
        handle = rec.range_start("step", "default")
        await asyncio.gather(task("update_actor", 0.02), task("compute_score", 0.04))
        rec.range_end(handle, "default")

    asyncio.run(step())
    return RankTrace(rank, rec.records(), role=role)
