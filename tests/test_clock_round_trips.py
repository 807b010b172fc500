"""Clock round trips to a Ray clock actor (launch/ray_clock.py records them,
analysis/model/clocks.py uses them), checked against truth: synthetic processes whose true times
are known, written as our own spills with the round trips as ray_clock records them (asymmetric
delays each way, so a midpoint is not exact by construction; the actor's own anchor off its
machine's), read back through ``mstx-marks summary --json``: from the spills, after ``mstx-marks
export`` (the databases, then the Chrome traces alone) and in one pass. The real Ray run is in
tests/test_engine_ray.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.clock_jobs import (
    AHEAD_B,
    ANCHOR_A,
    ANCHOR_B,
    MS,
    STEPS,
    WORKER0,
    WORKER1,
    Peer,
    Proc,
    base,
    machine,
    per_step,
    row,
    trainer,
    worker,
    write_job,
)

from mstx_marks.analysis.model.clocks import align
from mstx_marks.analysis.model.spans import ProcessSpans
from mstx_marks.analysis.model.steps import Step
from mstx_marks.analysis.readers import stream
from mstx_marks.base.records import Member, Origin, RoundTrip
from mstx_marks.cli.main import main

#: The clock actor, on the trainer's machine a; its process's anchor 7 ms off the others'.
ACTOR_A = Peer("a", "boot-a", ANCHOR_A, anchor_skew_ns=7 * MS)
#: Each exchange's (way out, way back) in ms: the first bounds theta from below most tightly,
#: the second from above.
DELAYS = [(0.3, 1.1), (0.9, 0.2), (0.5, 0.6)]


def reward_on_b(peer: Peer) -> Proc:
    """A process on host b (250 ms ahead) whose ranges nest in nothing of the trainer's: only
    its round trips to ``peer`` can place it."""
    reward = Proc("RewardManager", 0, "b", 400, "boot-b", ANCHOR_B, ahead=lambda _t: AHEAD_B)
    for s in range(STEPS):
        reward.add("compute_score", base(s) + 600, base(s) + 700)
        out, back = DELAYS[s]
        reward.trip(base(s) + 100, out, back, peer)
    return reward


def true_bounds(ahead_ns: int) -> tuple[int, int]:
    """The intersection of the exchanges' bounds of b's offset (``ahead_ns`` true)."""
    lows = [ahead_ns - round(out * MS) for out, _ in DELAYS]
    highs = [ahead_ns + round(back * MS) for _, back in DELAYS]
    return max(lows), min(highs)


@pytest.mark.parametrize("read", ["spills", "export", "chrome", "one pass"])
def test_round_trips_measure_a_machine_whose_calls_nest_in_nothing(
    read: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without round trips this machine is "not measured" and its ranges read 250 ms late
    (tests/test_clocks.py::test_no_pairs_nothing_applied_not_measured); with them it is
    measured within the exchanges' bound, through every reader."""
    write_job(tmp_path, [trainer(), worker(0, "a", "boot-a", WORKER0), reward_on_b(ACTOR_A)])
    if read in ("export", "chrome"):
        assert main(["export", str(tmp_path)]) == 0
    if read == "chrome":  # (the Chrome traces win once the databases are gone)
        shutil.rmtree(tmp_path / "ascend")
    if read == "one pass":
        monkeypatch.setattr(stream, "MAX_HELD_EVENTS", 0)
    doc = per_step(tmp_path)
    b = machine(doc, "b")
    lo, hi = true_bounds(AHEAD_B)
    assert (b["status"], b["low_ns"], b["high_ns"]) == ("measured", lo, hi)
    assert (b["pairs"], b["round_trips"]) == (0, STEPS)
    assert b["offset_ns"] == (lo + hi) // 2 != AHEAD_B  # (asymmetric: the midpoint is off ...)
    assert abs(b["offset_ns"] - AHEAD_B) <= b["bound_ns"]  # (... within the bound said)
    said = doc["clock"]["accuracy"]
    assert f"b {b['offset_ns'] / 1e6:.3f} ms ahead" in said
    assert "3 round trips to the clock actor" in said
    # placed where it ran: each step's compute_score inside that step, 100 ms of it
    assert row(doc, "RewardManager:0")["busy_ns"] == [100 * MS] * STEPS


def test_a_peer_on_a_machine_of_no_process_links_the_machines_measured_against_it(
    tmp_path: Path,
) -> None:
    """The clock actor on machine c (100 ms ahead), where no process of the job recorded: the
    trainer's machine and b each measure against it, which chains b to the reference."""
    actor_c = Peer("c", "boot-c", ANCHOR_A - 5 * 10**9, ahead_ns=100 * MS)
    t = trainer()
    for s in range(STEPS):
        t.trip(base(s) + 50, 0.4, 0.4, actor_c)
    write_job(tmp_path, [t, worker(0, "a", "boot-a", WORKER0), reward_on_b(actor_c)])
    doc = per_step(tmp_path)
    b = machine(doc, "b")
    assert b["status"] == "measured" and abs(b["offset_ns"] - AHEAD_B) <= b["bound_ns"]
    assert b["bound_ns"] < MS  # (0.4 + 0.4 ms from a's side, 0.5 ms from b's)
    assert not [m for m in doc["clock"]["machines"] if "c" in m["hosts"]]  # (no machine c)
    assert row(doc, "RewardManager:0")["busy_ns"] == [100 * MS] * STEPS


def test_nested_calls_that_contradict_the_round_trips_are_set_aside(tmp_path: Path) -> None:
    """A worker on b whose last update ran past the trainer's (it did not nest, as an
    asynchronous call does not): that pair alone says b is over 300 ms ahead, which no other
    pair allows. The round trips, causal by construction, win: b is measured from them, the
    nested calls are set aside and said so."""
    calls = [*WORKER1[:2], (WORKER1[2][0], (992, 1050))]
    w = worker(1, "b", "boot-b", calls, AHEAD_B)
    for s, (out, back) in enumerate(DELAYS):
        w.trip(base(s) + 100, out, back, Peer("a", "boot-a", ANCHOR_A))
    doc = per_step(write_job(tmp_path, [trainer(), worker(0, "a", "boot-a", WORKER0), w]))
    b = machine(doc, "b")
    lo, hi = true_bounds(AHEAD_B)
    assert (b["status"], b["low_ns"], b["high_ns"], b["pairs"]) == ("measured", lo, hi, 0)
    assert "6 nested calls that disagree with them set aside" in doc["clock"]["accuracy"]


def test_round_trips_of_a_drifting_clock_bound_it_by_their_hull(tmp_path: Path) -> None:
    """Host b's clock gains 200 ppm: 0.6 ms over the 3 s job, more than a round trip's width,
    so no one offset satisfies every round trip. The offset lay inside their hull all along:
    that is the bound, the movement is said, and every range is placed within it."""
    drifting = Proc("RewardManager", 0, "b", 400, "boot-b", ANCHOR_B)
    drifting.ahead = lambda t: AHEAD_B + t * 200 // 10**6
    for s in range(STEPS):
        drifting.add("compute_score", base(s) + 600, base(s) + 700)
        drifting.trip(base(s) + 100, 0.05, 0.05, ACTOR_A)
    doc = per_step(write_job(tmp_path, [trainer(), worker(0, "a", "boot-a", WORKER0), drifting]))
    b = machine(doc, "b")
    truths = [drifting.ahead(round((base(s) + 100.05) * MS)) for s in range(STEPS)]
    assert b["status"] == "measured" and b["round_trips"] == STEPS
    assert b["low_ns"] <= min(truths) and max(truths) <= b["high_ns"]
    assert b["high_ns"] - b["low_ns"] <= max(truths) - min(truths) + 2 * round(0.1 * MS)
    assert "the offset moved by 0.4" in doc["clock"]["accuracy"]  # (0.4 ms between the trips)
    busy = row(doc, "RewardManager:0")["busy_ns"]
    assert all(abs(got - 100 * MS) <= b["bound_ns"] for got in busy)


@settings(max_examples=80, deadline=None)
@given(
    theta=st.integers(-(10**12), 10**12),
    delays=st.lists(
        st.tuples(st.integers(0, 5 * 10**6), st.integers(0, 5 * 10**6)), min_size=1, max_size=6
    ),
    skew=st.integers(-(10**9), 10**9),
)
def test_round_trips_always_hold_the_true_offset(
    theta: int, delays: list[tuple[int, int]], skew: int
) -> None:
    """Any offset, any delays each way, any anchor of the actor's process: the bound holds the
    true offset and is no wider than the shortest round trip."""
    ref = ProcessSpans().identify(Origin("a", "boot-a", 0), [1], "")
    ref.add(0, 100, "update_actor")
    ref.set_steps([Step(0, 200, "1", 200)])
    far = ProcessSpans().identify(Origin("b", "boot-b", 0), [2], "")
    far.add(5_000 + theta, 6_000 + theta, "compute_score")
    for k, (out, back) in enumerate(delays):
        sent = 10**9 * k
        peer = sent + out + skew  # (the actor's process reads on its own anchor)
        far.round_trips.append(RoundTrip(sent + theta, sent + out + back + theta, peer, "a",
                                         "boot-a", skew))  # fmt: skip
    trainer_, other = Member("trainer", 0), Member("reward", 0)
    placed = align([(trainer_, ref.finish()), (other, far.finish())], lambda _: ("t", trainer_))
    b = placed.clock.machines[1]
    assert b.status == "measured" and b.round_trips == len(delays)
    assert b.low_ns is not None and b.high_ns is not None
    assert b.low_ns <= theta <= b.high_ns
    assert b.high_ns - b.low_ns <= min(out + back for out, back in delays)
