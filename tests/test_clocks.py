"""Clock alignment across machines and processes (analysis/model/clocks.py), checked against truth:
synthetic jobs written as our own spills with true nanosecond times, a second machine's clock
250 ms ahead with asymmetric slack (so a midpoint is not exact by construction), read back
through ``mstx-marks summary --json`` and checked within the bound that output states."""

from __future__ import annotations

import contextlib
import io
import json
import sqlite3
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from support.clock_jobs import (
    AHEAD_B,
    ANCHOR_A,
    ANCHOR_B,
    MS,
    STEP_MS,
    STEPS,
    WORKER0,
    WORKER1,
    Proc,
    assert_busy_within_bound,
    base,
    engine,
    machine,
    per_step,
    row,
    summary,
    trainer,
    true_last,
    two_host_job,
    worker,
    write_job,
)

from mstx_marks.analysis.model.clocks import ClockNote, MachineClock, marzullo, match_calls
from mstx_marks.base.records import Member
from mstx_marks.cli.main import main


def test_a_machine_250_ms_ahead_is_measured_applied_and_its_bound_said(tmp_path: Path) -> None:
    procs = two_host_job()
    doc = per_step(write_job(tmp_path, procs))
    b = machine(doc, "b")
    assert b["status"] == "measured" and doc["clock"]["aligned_by"] == "measured"
    # the bound holds the truth, and the midpoint applied is within the bound stated
    assert b["low_ns"] <= AHEAD_B <= b["high_ns"]
    assert b["bound_ns"] == (b["high_ns"] - b["low_ns"] + 1) // 2
    assert abs(b["offset_ns"] - AHEAD_B) <= b["bound_ns"]
    # the least slack is 1 ms at a start, 2 ms at an end: [248, 251] ms, its midpoint 249.5
    assert (b["low_ns"], b["high_ns"]) == (AHEAD_B - 2 * MS, AHEAD_B + 1 * MS)
    assert b["offset_ns"] != AHEAD_B  # (asymmetric: the midpoint is not the truth)
    assert doc["clock"]["shifts_ns"]["WorkerDict:1"] == -b["offset_ns"]
    accuracy = doc["clock"]["accuracy"]
    assert "b 249.500 ms ahead ±1.500 ms (measured from 9 nested calls, applied)" in accuracy
    assert "1 ms on a LAN" not in accuracy
    assert_busy_within_bound(doc, procs)


def test_the_critical_path_names_who_each_link_truly_waited_for(tmp_path: Path) -> None:
    procs = two_host_job()
    doc = per_step(write_job(tmp_path, procs))
    links = {"generate_sequences": (10, 400), "compute_log_prob": (410, 520),
             "update_actor": (530, 990)}  # fmt: skip
    for s, step in enumerate(doc["steps"]):
        got = {link["phase"]: link["waited"]["key"] for link in step["critical_path"]}
        want = {
            phase: true_last(procs, "TaskRunner", base(s) + a, base(s) + b)
            for phase, (a, b) in links.items()
        }
        assert got == want
        assert {e["key"] for e in step["rollout_tail"]["engines"]} == {
            "EngineCore:0", "EngineCore:1",
        }  # fmt: skip


def test_time_within_the_bound_of_a_step_edge_counts_as_uncertain(tmp_path: Path) -> None:
    """A range of the other machine that ends at a step's edge: where it falls is known only
    to within the bound, and the output says by how much each step's figure may be off."""
    procs = two_host_job()
    sync = procs[2]
    for s in range(STEPS):
        sync.add("update_weights", base(s) + 995, base(s) + STEP_MS)
    doc = per_step(write_job(tmp_path, procs))
    got = row(doc, "WorkerDict:1")
    bound = machine(doc, "b")["bound_ns"]
    assert all(0 < u <= 2 * bound for u in got["uncertain_ns"])
    assert_busy_within_bound(doc, procs)
    assert all(u == 0 for u in row(doc, "WorkerDict:0")["uncertain_ns"])  # (the reference's)
    table = io.StringIO()
    with contextlib.redirect_stdout(table), contextlib.redirect_stderr(io.StringIO()):
        main(["summary", str(tmp_path), "--jobs", "1"])
    assert "±" in table.getvalue() and "counted as uncertain" in table.getvalue()


def test_one_side_only_is_said_as_at_least(tmp_path: Path) -> None:
    """Engines that start before the trainer's rollout range does (on its own machine too) bound
    the offset by their ends only: the smallest shift that satisfies it, said as "at least"."""
    procs = [trainer(), engine(0, "a", "boot-a", 5), engine(1, "b", "boot-b", 5, AHEAD_B)]
    doc = per_step(write_job(tmp_path, procs))
    b = machine(doc, "b")
    last_end = 5 + 37 * 10 + 8  # the engines' last model step ends there, the rollout at 400
    assert b["status"] == "at least" and b["high_ns"] is None
    assert b["low_ns"] == b["offset_ns"] == AHEAD_B - (400 - last_end) * MS <= AHEAD_B
    assert f"b at least {b['offset_ns'] / 1e6:.3f} ms ahead" in doc["clock"]["accuracy"]
    assert doc["clock"]["aligned_by"] == "wall"


def test_a_trainer_alone_on_its_machine_trusts_the_calls_it_awaits_unchecked(
    tmp_path: Path,
) -> None:
    """The trainer's machine runs none of the workers' phases (nothing to check them on): the
    workers' compute_log_prob and update_actor, the very calls it awaits, still bound host b's
    offset, and the output says they went unchecked; engines' model steps do not (only the
    check tells a synchronous rollout from an asynchronous one)."""
    procs = [
        trainer(),
        worker(1, "b", "boot-b", WORKER1, AHEAD_B),
        engine(1, "b", "boot-b", 16, AHEAD_B),
    ]
    doc = per_step(write_job(tmp_path, procs))
    b = machine(doc, "b")
    assert b["status"] == "measured"
    assert b["low_ns"] <= AHEAD_B <= b["high_ns"] and b["offset_ns"] != AHEAD_B
    assert abs(b["offset_ns"] - AHEAD_B) <= b["bound_ns"]
    assert b["pairs"] == 2 * STEPS  # (the worker's calls only: no engine's rollout)
    assert "compute_log_prob/update_actor unchecked" in doc["clock"]["accuracy"]
    assert_busy_within_bound(doc, procs)


def test_an_unchecked_call_longer_than_the_trainers_is_not_trusted(tmp_path: Path) -> None:
    """A worker's range longer than the trainer's range of that phase cannot be the call the
    trainer awaited (whatever the offset): with nothing to check it on, it bounds nothing."""
    long = [((405, 517), (534, 986)), *WORKER1[1:]]  # (its first compute_log_prob: 112 > 110)
    procs = [trainer(), worker(1, "b", "boot-b", long, AHEAD_B)]
    doc = per_step(write_job(tmp_path, procs))
    b = machine(doc, "b")
    assert b["status"] == "measured" and b["pairs"] == STEPS  # (update_actor's alone)
    assert "update_actor unchecked" in doc["clock"]["accuracy"]
    assert abs(b["offset_ns"] - AHEAD_B) <= b["bound_ns"]


def test_no_pairs_nothing_applied_not_measured(tmp_path: Path) -> None:
    reward = Proc("RewardManager", 0, "b", 400, "boot-b", ANCHOR_B, ahead=lambda _t: AHEAD_B)
    for s in range(STEPS):
        reward.add("compute_score", base(s) + 600, base(s) + 700)
    procs = [trainer(), worker(0, "a", "boot-a", WORKER0), reward]
    doc = per_step(write_job(tmp_path, procs))
    b = machine(doc, "b")
    assert (b["status"], b["offset_ns"], b["low_ns"], b["high_ns"]) == (
        "not measured",
        0,
        None,
        None,
    )
    assert "RewardManager:0" not in doc["clock"]["shifts_ns"]
    assert "b: not measured (no nested calls), placed by its wall clock" in doc["clock"]["accuracy"]
    # placed by its wall clock, as recorded: 250 ms late
    assert row(doc, "RewardManager:0")["busy_ns"][0] == 100 * MS


def test_contradicting_pairs_apply_nothing_name_the_pairs_and_suspect_drift(tmp_path: Path) -> None:
    """Host b's clock runs fast: 20 ms further ahead at each step. No one offset satisfies every
    pair: nothing is applied and the pairs that disagree are named."""
    drifting = worker(1, "b", "boot-b", WORKER1)
    drifting.ahead = lambda t: AHEAD_B + 20 * MS * (t // (STEP_MS * MS))
    doc = per_step(write_job(tmp_path, [trainer(), worker(0, "a", "boot-a", WORKER0), drifting]))
    b = machine(doc, "b")
    assert (b["status"], b["offset_ns"]) == ("contradicting", 0)
    assert "WorkerDict:1" not in doc["clock"]["shifts_ns"]
    assert any("drift" in n for n in doc["notes"])
    named = " ".join(b["conflicts"])
    assert "call 1 says at most" in named and "call 3 says at least" in named


def test_a_workers_mini_batches_inside_one_call_are_that_call(tmp_path: Path) -> None:
    """Actor rank 1 marks each of its 4 mini-batches ``update_actor``: together they are the
    call the trainer's ``update_actor`` holds (matched as one, not as 4 calls)."""
    procs = two_host_job()
    split = procs[2]
    for s in range(STEPS):
        (_, _), (us, ue) = WORKER1[s]
        split.ranges.remove(("update_actor", base(s) + us, base(s) + ue))
        quarter = (ue - us - 6) / 4
        for k in range(4):
            a = us + k * (quarter + 2)
            split.add("update_actor", base(s) + a, base(s) + a + quarter)
    doc = per_step(write_job(tmp_path, procs))
    b = machine(doc, "b")
    assert b["status"] == "measured" and b["low_ns"] <= AHEAD_B <= b["high_ns"]
    assert (b["low_ns"], b["high_ns"]) == (AHEAD_B - 2 * MS, AHEAD_B + 1 * MS)
    assert_busy_within_bound(doc, procs)


def test_machines_that_meet_only_through_a_third_are_chained(tmp_path: Path) -> None:
    """Host c's engine runs inside a rollout driven from host b, which meets the trainer's
    machine by its update_actor: c's offset is b's plus c's from b, its bounds the sum."""
    ahead_c = 500 * MS
    t = trainer(gen=False)
    driver = worker(1, "b", "boot-b", WORKER1, AHEAD_B)
    for s in range(STEPS):
        driver.add("generate_sequences", base(s) + 10, base(s) + 400)
    procs = [
        t, worker(0, "a", "boot-a", WORKER0), driver,
        engine(1, "b", "boot-b", 16, AHEAD_B), engine(2, "c", "boot-c", 20, ahead_c),
    ]  # fmt: skip
    procs[-1].anchor_ns = ANCHOR_B - 10**12
    doc = per_step(write_job(tmp_path, procs))
    b, c = machine(doc, "b"), machine(doc, "c")
    assert b["status"] == c["status"] == "measured"
    assert c["low_ns"] <= ahead_c <= c["high_ns"]
    assert abs(c["offset_ns"] - ahead_c) <= c["bound_ns"]
    # c's bound is b's plus what c's rollout says of c against b
    assert c["high_ns"] - c["low_ns"] > b["high_ns"] - b["low_ns"]
    assert_busy_within_bound(doc, procs)


def test_two_machines_of_one_host_name_are_told_apart_by_boot_id(tmp_path: Path) -> None:
    """Both are ``localhost``; the worker's machine booted 9 days before the trainer's. By the
    host name alone it would be moved 9 days onto the trainer's anchor (busy 0)."""
    days = 9 * 86_400 * 10**9
    t = trainer(host="localhost", boot_id="boot-1")
    w = worker(0, "localhost", "boot-2", WORKER0)
    w.anchor_ns = ANCHOR_A - days
    doc = per_step(write_job(tmp_path, [t, w]))
    assert len(doc["clock"]["machines"]) == 2
    names = {m["name"] for m in doc["clock"]["machines"]}
    assert names == {"localhost (boot boot-1)", "localhost (boot boot-2)"}
    assert_busy_within_bound(doc, [w])
    assert row(doc, "WorkerDict:0")["busy_ns"][0] == (101 + 452) * MS


def test_without_boot_ids_anchors_far_apart_are_two_machines(tmp_path: Path) -> None:
    days = 9 * 86_400 * 10**9
    t, w = trainer(host="localhost", boot_id=""), worker(0, "localhost", "", WORKER0)
    w.anchor_ns = ANCHOR_A - days
    doc = per_step(write_job(tmp_path, [t, w]))
    assert len(doc["clock"]["machines"]) == 2
    assert row(doc, "WorkerDict:0")["busy_ns"][0] == (101 + 452) * MS


def test_one_boot_with_a_large_clock_step_stays_one_machine(tmp_path: Path) -> None:
    """A worker started after the wall clock was stepped by 90 s (its anchor 90 s from the
    trainer's, its recorded times 90 s ahead): one boot, one monotonic clock, aligned exactly."""
    step = 90 * 10**9
    t = trainer()
    w = worker(0, "a", "boot-a", WORKER0)
    w.anchor_ns, w.ahead = ANCHOR_A + step, lambda _t: step
    doc = per_step(write_job(tmp_path, [t, w]))
    assert [m["status"] for m in doc["clock"]["machines"]] == ["reference"]
    assert doc["clock"]["shifts_ns"] == {"WorkerDict:0": -step}
    assert row(doc, "WorkerDict:0")["busy_ns"] == [(101 + 452) * MS] * STEPS


def _export(folder: Path) -> None:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["export", str(folder)]) == 0


def _stepped_job() -> list[Proc]:
    """The two-machine job, with actor rank 0 started after host a's clock was stepped 30 ms."""
    procs = two_host_job()
    procs[1].anchor_ns, procs[1].ahead = ANCHOR_A + 30 * MS, lambda _t: 30 * MS
    return procs


def _model_of(doc: dict[str, Any]) -> dict[str, Any]:
    """The summary but which file each figure was read from."""
    ranks = {k: {**v, "source": None} for k, v in doc["ranks"].items()}
    return {**doc, "ranks": ranks}


def test_export_does_not_change_the_model(tmp_path: Path) -> None:
    """The database and Chrome trace exported from each spill carry its host, boot id and
    anchor (not the exporter's), so the model read from them is the one read from the spills."""
    procs = _stepped_job()
    write_job(tmp_path, procs)
    before, _ = summary(tmp_path)
    _export(tmp_path)
    after, _ = summary(tmp_path)
    assert any(".db" in r["source"] for r in after["ranks"].values())  # (read from the database)
    assert _model_of(after) == _model_of(before)
    assert after["per_step"]["clock"]["shifts_ns"]["WorkerDict:0"] == -30 * MS
    dbs = {p.parent.parent.name.split("_")[1]: p for p in tmp_path.glob("ascend/*/*/*.db")}
    hosts = {k: sqlite3.connect(db).execute("SELECT hostName FROM HOST_INFO").fetchall()
             for k, db in dbs.items()}  # fmt: skip
    assert hosts["b-201"] == [("b",)] and hosts["a-100"] == [("a",)]
    chrome = json.loads(next(tmp_path.glob("chrome/WorkerDict-rank1-*.json")).read_text())
    assert {k: chrome["otherData"]["ranks"]["1"][k] for k in ("host", "boot_id", "anchor_ns")} == {
        "host": "b", "boot_id": "boot-b", "anchor_ns": ANCHOR_B,
    }  # fmt: skip


def test_a_database_that_names_no_host_takes_the_spills(tmp_path: Path) -> None:
    """An older database (no origin in META_DATA) beside the spill it was exported from: the
    spill lends its host and anchor to the database that is read."""
    write_job(tmp_path, _stepped_job())
    before, _ = summary(tmp_path)
    _export(tmp_path)
    for db in tmp_path.glob("ascend/*/*/*.db"):
        with sqlite3.connect(db) as conn:
            conn.execute("DELETE FROM META_DATA WHERE name LIKE 'mstx_marks_%' AND name NOT IN"
                         " ('mstx_marks_run', 'mstx_marks_instance')")  # fmt: skip
    for chrome in tmp_path.glob("chrome/*.json"):
        doc = json.loads(chrome.read_text())
        for info in doc["otherData"]["ranks"].values():
            for k in ("host", "boot_id", "anchor_ns"):
                info.pop(k, None)
        chrome.write_text(json.dumps(doc))
    after, _ = summary(tmp_path)
    assert _model_of(after) == _model_of(before)


def test_a_clock_step_is_said_not_applied(tmp_path: Path) -> None:
    procs = two_host_job()
    path = write_job(tmp_path, procs) / "spill" / "a-200-x.jsonl"
    lines = path.read_text().splitlines()
    lines.insert(1, json.dumps({"clock_step_ns": 150 * MS}))
    path.write_text("\n".join(lines) + "\n")
    doc = per_step(tmp_path)
    assert any("WorkerDict rank 0 (pid 200): its wall clock moved +150.000 ms" in n
               for n in doc["notes"])  # fmt: skip
    assert row(doc, "WorkerDict:0")["busy_ns"] == [(101 + 452) * MS] * STEPS


# --- the estimator's parts, against brute force -------------------------------------------

bounds = st.lists(
    st.tuples(st.integers(-50, 50), st.integers(0, 30)).map(lambda t: (t[0], t[0] + t[1])),
    min_size=1, max_size=12,
)  # fmt: skip


@given(bounds)
def test_marzullo_finds_the_most_intervals_that_agree(intervals: list[tuple[int, int]]) -> None:
    count, lo, hi = marzullo(intervals)
    points = {x for a, b in intervals for x in (a, b)}
    depth = {x: sum(a <= x <= b for a, b in intervals) for x in points}
    assert count == max(depth.values())
    assert depth[lo] == depth[hi] == count and lo <= hi


@settings(max_examples=60, deadline=None)
@given(
    theta=st.integers(-400, 400),
    slack=st.lists(st.tuples(st.integers(0, 9), st.integers(0, 9)), min_size=3, max_size=8),
    late=st.integers(0, 2),
)
def test_calls_are_matched_and_bound_the_true_offset(
    theta: int, slack: list[tuple[int, int]], late: int
) -> None:
    """Calls 1000 apart, nested with any slack, on a clock ``theta`` ahead; the held process
    may have joined ``late`` calls late: matched by order, their bounds always hold theta."""
    outer = [(1000 * k, 1000 * k + 300) for k in range(len(slack))]
    inner = [(a + s + theta, b - e + theta) for (a, b), (s, e) in zip(outer, slack)][late:]
    pairs = match_calls(outer, inner)
    assert pairs == [(k + late, k) for k in range(len(inner))]
    count, lo, hi = marzullo([(inner[j][1] - outer[i][1], inner[j][0] - outer[i][0])
                              for i, j in pairs])  # fmt: skip
    assert count == len(pairs) and lo <= theta <= hi


@given(st.integers(1, 5))
def test_the_processes_without_a_host_are_counted_in_words(n: int) -> None:
    machines = [MachineClock("a", ["a"], "boot-a", [Member("TaskRunner", 0)], "reference")]
    text = ClockNote(["a"], [Member("worker", r) for r in range(n)], machines=machines).text()
    said = "1 process whose" if n == 1 else f"{n} processes whose"
    assert f"; {said} file names no host" in text, text
