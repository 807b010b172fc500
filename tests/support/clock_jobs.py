"""Synthetic jobs with true times, written as our own spill files: processes on hosts whose
clocks are off by a known amount, for the clock-alignment and process-identity tests.

A process's ranges are given in TRUE milliseconds after the job's start (the reference host's
clock); each is written as its host's clock read it: ``T0 + true + ahead(true)`` ns, where
``ahead`` is how far that host's clock runs ahead of the reference's at that moment (a
constant, or growing: drift). Exact in nanoseconds, so every expected figure is known.
"""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from mstx_marks.base.records import CLOCK_DOMAIN, ROUND_TRIP, RoundTrip
from mstx_marks.cli.main import main

MS = 10**6
#: The job's start, true time (epoch ns).
T0 = 1_760_000_000_000_000_000
#: Host a's clock anchor (wall less monotonic): booted about a day before the job.
ANCHOR_A = T0 - 86_400 * 10**9
#: Host b: booted two days before the job.
ANCHOR_B = T0 - 2 * 86_400 * 10**9
#: How far host b's clock runs ahead of host a's in the two-host jobs.
AHEAD_B = 250 * MS
#: The reference's steps: 3, each 1000 ms, back to back.
STEP_MS = 1000
STEPS = 3


@dataclass
class Peer:
    """A clock actor: its host and boot id, its machine's anchor (that of the job's processes
    there), how far its own process's anchor lies from that one (each process takes its own:
    the reader must put the actor's readings on the machine's axis) and how far its machine's
    clock runs ahead of true time."""

    host: str
    boot_id: str
    machine_anchor_ns: int
    anchor_skew_ns: int = 0
    ahead_ns: int = 0

    @property
    def anchor_ns(self) -> int:
        return self.machine_anchor_ns + self.anchor_skew_ns

    def read(self, t_ms: float) -> int:
        """Its clock on its own axis at a true time (ms)."""
        return T0 + round(t_ms * MS) + self.ahead_ns + self.anchor_skew_ns


@dataclass
class Proc:
    """One process as it ran: who it is, where, and its ranges in true ms ``(name, start,
    end)`` (floats: sub-millisecond times allowed)."""

    role: str
    rank: int
    host: str
    pid: int
    boot_id: str = ""
    anchor_ns: int | None = ANCHOR_A
    instance: str = ""
    #: How far its host's clock is ahead of true time at a true time (ns -> ns).
    ahead: Callable[[int], int] = lambda _t: 0
    ranges: list[tuple[str, float, float]] = field(default_factory=list)
    #: Its clock round trips to a peer: (true ms it sent, the peer read its clock, it received;
    #: the peer).
    trips: list[tuple[float, float, float, Peer]] = field(default_factory=list)

    def add(self, name: str, start_ms: float, end_ms: float) -> Proc:
        self.ranges.append((name, start_ms, end_ms))
        return self

    def trip(self, sent_ms: float, out_ms: float, back_ms: float, peer: Peer) -> Proc:
        """A round trip sent at ``sent_ms`` (true), ``out_ms`` on the way to ``peer`` and
        ``back_ms`` on the way back (asymmetric delays: its midpoint is not the truth)."""
        self.trips.append((sent_ms, sent_ms + out_ms, sent_ms + out_ms + back_ms, peer))
        return self

    def recorded(self, t_ms: float) -> int:
        """A true time (ms) as this process's clock recorded it (epoch ns)."""
        true = round(t_ms * MS)
        return T0 + true + self.ahead(true)


def write_spill(folder: Path, proc: Proc, run: str = "r1") -> Path:
    """``proc`` as the flight recorder's spill under ``folder/spill`` (one line a range), its
    header saying its host, boot id and clock anchor."""
    header = {
        "mstx_marks_spill": 2, "pid": proc.pid, "host": proc.host, "rank": proc.rank,
        "role": proc.role, "run": run, "instance": proc.instance, "wall_ns": 0, "mono_ns": 0,
        "anchor_ns": proc.anchor_ns, "boot_id": proc.boot_id,
    }  # fmt: skip
    if not proc.boot_id:
        del header["boot_id"]  # (as an older spill, which names none)
    lines = [json.dumps(header)]
    for name, start, end in sorted(proc.ranges, key=lambda r: r[1]):
        lines.append(
            json.dumps(["r", name, "default", proc.recorded(start), proc.recorded(end), 1])
        )
    for sent, at, received, peer in proc.trips:  # (as ray_clock records them)
        trip = RoundTrip(proc.recorded(sent), proc.recorded(received), peer.read(at), peer.host,
                         peer.boot_id, peer.anchor_ns)  # fmt: skip
        item = ["i", ROUND_TRIP, CLOCK_DOMAIN, trip.received_ns, None, 1, trip.args()]
        lines.append(json.dumps(item))
    lines.append(json.dumps({"complete": True}))
    path = folder / "spill" / f"{proc.host}-{proc.pid}-{proc.instance or 'x'}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def write_job(folder: Path, procs: list[Proc]) -> Path:
    for p in procs:
        write_spill(folder, p)
    return folder


def base(step: int) -> int:
    return step * STEP_MS


def trainer(host: str = "a", boot_id: str = "boot-a", gen: bool = True) -> Proc:
    """The driver: ``step``, then ``gen`` (the rollout it blocks on), ``old_log_prob`` and
    ``update_actor``, in each of the 3 steps."""
    t = Proc("TaskRunner", 0, host, 100, boot_id)
    for s in range(STEPS):
        b = base(s)
        t.add("step", b, b + STEP_MS)
        if gen:
            t.add("gen", b + 10, b + 400)
        t.add("old_log_prob", b + 410, b + 520)
        t.add("update_actor", b + 530, b + 990)
    return t


#: Actor rank 0 (on the trainer's host): its compute_log_prob and update_actor per step.
WORKER0 = [((413, 514), (533, 985))] * STEPS
#: Actor rank 1 (on host b): the slack to the trainer's range differs call by call and side by
#: side (the least: 1 ms at a start, 2 ms at an end), so a midpoint is not exact.
WORKER1 = [((411, 517), (534, 986)), ((414, 516), (532, 988)), ((412, 515), (533, 987))]


def worker(rank: int, host: str, boot_id: str, calls: list, ahead_ns: int = 0) -> Proc:
    w = Proc("WorkerDict", rank, host, 200 + rank, boot_id, ahead=lambda _t: ahead_ns)
    if host != "a":
        w.anchor_ns = ANCHOR_B
    for s, ((cs, ce), (us, ue)) in enumerate(calls):
        b = base(s)
        w.add("compute_log_prob", b + cs, b + ce)
        w.add("update_actor", b + us, b + ue)
    return w


def engine(rank: int, host: str, boot_id: str, first: int, ahead_ns: int = 0, pid: int = 0) -> Proc:
    """A rollout engine: 38 decode steps of 8 ms, 10 ms apart, from ``first`` ms in each step
    (the trainer's gen runs from 10 to 400)."""
    e = Proc("EngineCore", rank, host, pid or 300 + rank, boot_id, ahead=lambda _t: ahead_ns)
    if host != "a":
        e.anchor_ns = ANCHOR_B
    for s in range(STEPS):
        for k in range(38):
            start = base(s) + first + 10 * k
            e.add("decode_batch", start, start + 8)
    return e


def two_host_job() -> list[Proc]:
    """The GRPO job of the clock tests: host a holds the trainer, actor rank 0 and engine 0;
    host b (250 ms ahead) actor rank 1 and engine 1."""
    return [
        trainer(),
        worker(0, "a", "boot-a", WORKER0),
        worker(1, "b", "boot-b", WORKER1, AHEAD_B),
        engine(0, "a", "boot-a", 20),
        engine(1, "b", "boot-b", 16, AHEAD_B),
    ]


def true_busy_ms(proc: Proc, step: int) -> float:
    """What ``proc``'s ranges cover inside the reference's step ``step``, true time (their
    union)."""
    lo, hi = base(step), base(step) + STEP_MS
    spans = sorted((max(s, lo), min(e, hi)) for _, s, e in proc.ranges if e > lo and s < hi)
    total, end = 0.0, float("-inf")
    for s, e in spans:
        if e > end:
            total += e - max(s, end)
            end = e
    return total


def true_last(procs: list[Proc], role: str, start_ms: float, end_ms: float) -> str:
    """The key (``role:rank``) of the process not of ``role`` whose ranges inside ``[start,
    end)`` ended last, true time: what a critical-path link waited for."""
    best: tuple[float, str] | None = None
    for p in procs:
        if p.role == role:
            continue
        ends = [min(e, end_ms) for _, s, e in p.ranges if e > start_ms and s < end_ms]
        if ends and (best is None or max(ends) > best[0]):
            best = (max(ends), f"{p.role}:{p.rank}")
    return "" if best is None else best[1]


def summary(folder: Path, *more: str) -> tuple[dict[str, Any], str]:
    """``mstx-marks summary FOLDER --json`` as a user runs it: its JSON and its stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["summary", str(folder), "--json", "--jobs", "1", *more])
    assert code == 0, err.getvalue()
    return json.loads(out.getvalue()), err.getvalue()


def per_step(folder: Path) -> dict[str, Any]:
    doc = summary(folder)[0]["per_step"]
    assert doc is not None
    return doc


def machine(doc: dict[str, Any], host: str) -> dict[str, Any]:
    return next(m for m in doc["clock"]["machines"] if host in m["hosts"])


def row(doc: dict[str, Any], key: str) -> dict[str, Any]:
    return next(p for p in doc["processes"] if p["key"] == key)


def assert_busy_within_bound(doc: dict[str, Any], procs: list[Proc]) -> None:
    """Every process's busy time per step is its true one, within what the output says it may
    be off (``uncertain_ns``)."""
    for p in procs:
        if p.role == "TaskRunner":
            continue
        got = row(doc, f"{p.role}:{p.rank}")
        for s in range(STEPS):
            truth = round(true_busy_ms(p, s) * MS)
            assert abs(got["busy_ns"][s] - truth) <= got["uncertain_ns"][s], (p.role, p.rank, s)
