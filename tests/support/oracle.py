"""Synthetic RL jobs whose true figures are known: the oracle the per-step model is checked
against (``tests/test_oracle.py``).

A :class:`Job` is its processes (:class:`Proc`: role, rank, pid, host, clock) with their ranges
in **true time** (ns from the job's origin), and its :class:`Truth`: every figure ``summary``
reports of it (steps, per process and step busy and phase time, spans split by an edge, time
outside steps, the critical path, the what-if, the rollout long tail, each process's steps in
its role's table). Each builder lays the ranges out from a few numbers and states the truth as
arithmetic on the same numbers, by hand (commented where it is not plain): never by running
mstx_marks' analysis. :func:`write_spills` writes the job as the flight recorder's spills.

**Clocks.** A process records ``true + offset_ns`` (its clock reads that far ahead; 0 by
default), and its spill header says its ``host``, ``boot_id`` and ``anchor_ns`` (wall less
monotonic when it began). A job on two hosts is one whose processes of the second host have
another host and boot, an ``offset_ns`` and an anchor of their own (:func:`on_host`); the truth
stays in true time.

**Checking.** :func:`mismatches` compares what ``summary --json`` printed with the truth and says
every difference beyond a tolerance (processes matched by role and rank, several of one role
and rank as a multiset, so that a process's key may change).

>>> job = SHAPES["edges"]()
>>> [(p.role, p.rank) for p in job.procs]
[('TaskRunner', 0), ('WorkerDict', 0)]
>>> job.truth.process("WorkerDict", 0).busy == [30 * MS, 30 * MS, 100 * MS]
True
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

US = 10**3
MS = 10**6
#: The wall clock's reading at the job's origin (epoch ns), plus an odd part: no figure is
#: right by a round number alone.
T0 = 1_750_000_000_000_000_000 + 123_457
#: The host every process runs on unless a builder says otherwise, its boot (the domain of its
#: monotonic clock) and its clock anchor (wall less monotonic: it booted an hour before the job).
HOST = "oracle-a"
BOOT = "boot-oracle-a"
ANCHOR = T0 - 3_600 * 10**9

Args = Optional[dict[str, int]]
Member = tuple[str, int]


@dataclass
class Proc:
    """One process: its ranges ``(name, start, end, args, thread)`` in true time."""

    role: str
    rank: int
    pid: int
    ranges: list[tuple[str, int, int, Args, int]] = field(default_factory=list)
    host: str = HOST
    boot_id: str = BOOT
    anchor_ns: int = ANCHOR
    #: How far ahead of true time its clock reads (what it records is true + this).
    offset_ns: int = 0

    def add(self, name: str, start: int, end: int, args: Args = None, thread: int = 1) -> None:
        self.ranges.append((name, start, end, args, thread))


@dataclass
class Link:
    """One link of a step's critical path (times true; ``waited`` as (role, rank))."""

    phase: str
    start: int
    end: int
    time: int
    waited: Member | None = None
    waited_phase: str = ""


@dataclass
class WhatIf:
    role: str
    phase: str
    rank: int
    slowest: int
    median: float
    saving: int


@dataclass
class Engine:
    """One engine in a step's rollout long tail (``tokens``/``reqs`` None: not known)."""

    role: str
    rank: int
    rollout: int
    model_steps: int
    decode_steps: int
    decode_ns: int
    tokens: int | None
    reqs: int | None


@dataclass
class Tail:
    slowest: Member
    slowest_ns: int
    median_ns: float
    engines: list[Engine]

    @property
    def waiting_share(self) -> float:
        return (self.slowest_ns - self.median_ns) / self.slowest_ns if self.slowest_ns else 0.0


@dataclass
class StepTruth:
    key: str
    start: int
    end: int
    path: list[Link]
    what_if: WhatIf | None = None
    tail: Tail | None = None


@dataclass
class ProcTruth:
    """One process's true figures, one value per step (``length`` -1: it has no figures for
    that step, an SPMD rank without that step); ``steps``/``step_time``/``unmarked`` are its
    role table's (the job's steps unless it has its own)."""

    role: str
    rank: int
    length: list[int]
    busy: list[int]
    phases: dict[str, list[int]]
    split: dict[str, int] = field(default_factory=dict)
    outside: int = 0
    #: Its role table's figures; by default those of the steps it has figures for: how many,
    #: their time, the time of them it ran no phase.
    steps: int = -1
    step_time: int = -1
    unmarked: int = -1

    def __post_init__(self) -> None:
        here = [(n, b) for n, b in zip(self.length, self.busy) if n >= 0]
        if self.steps < 0:
            self.steps = len(here)
        if self.step_time < 0:
            self.step_time = sum(n for n, _ in here)
        if self.unmarked < 0:
            self.unmarked = sum(n - b for n, b in here)

    @property
    def idle(self) -> list[int]:
        return [-1 if n < 0 else n - b for n, b in zip(self.length, self.busy)]


@dataclass
class Truth:
    reference: Member
    steps: list[StepTruth]
    processes: list[ProcTruth]

    def process(self, role: str, rank: int) -> ProcTruth:
        """The (first) process of ``role`` and ``rank``."""
        return next(p for p in self.processes if (p.role, p.rank) == (role, rank))


@dataclass
class Job:
    name: str
    procs: list[Proc]
    truth: Truth


def write_spills(job: Job, folder: Path) -> list[Path]:
    """``job`` as the flight recorder's spills under ``folder/spill``, one per process (times
    as its clock read them: true + its offset, on the wall clock's axis from :data:`T0`)."""
    out = []
    for p in job.procs:
        header = {
            "mstx_marks_spill": 2,
            "pid": p.pid,
            "host": p.host,
            "rank": p.rank,
            "role": p.role,
            "run": "r1",
            "instance": "",
            "wall_ns": 0,
            "mono_ns": 0,
            "anchor_ns": p.anchor_ns,
            "boot_id": p.boot_id,
        }
        lines = [json.dumps(header)]
        for name, start, end, args, thread in sorted(p.ranges, key=lambda r: r[1]):
            at = T0 + p.offset_ns
            item: list[Any] = ["r", name, "default", at + start, at + end, thread]
            if args:
                item.append(args)
            lines.append(json.dumps(item))
        lines.append(json.dumps({"complete": True}))
        path = folder / "spill" / f"{p.host}-{p.pid}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
        out.append(path)
    return out


def on_host(job: Job, host: str, offset_ns: int, anchor_ns: int, roles: set[str]) -> Job:
    """``job`` with the processes of ``roles`` on ``host`` (boot ``boot-<host>``), whose clock
    reads ``offset_ns`` ahead of true time, booted at ``anchor_ns``: the same truth.

    >>> moved = on_host(SHAPES["edges"](), "b", 250 * MS, ANCHOR, {"WorkerDict"})
    >>> [(p.host, p.boot_id, p.offset_ns // MS) for p in moved.procs]
    [('oracle-a', 'boot-oracle-a', 0), ('b', 'boot-b', 250)]
    """
    boot = f"boot-{host}"
    procs = [
        replace(p, host=host, boot_id=boot, offset_ns=offset_ns, anchor_ns=anchor_ns)
        if p.role in roles
        else p
        for p in job.procs
    ]
    return replace(job, name=f"{job.name}@{host}", procs=procs)


def covered(ranges: Iterable[tuple[int, int]], start: int, end: int) -> int:
    """The time the union of ``ranges`` (any overlap) covers inside ``[start, end)``, by hand:
    the truth the tests hold a union or an outside tool's figure to.

    >>> covered([(0, 10), (5, 20), (30, 40), (45, 60)], 2, 50)  # 8 + 10 + 10 + 5
    33
    """
    total, reach = 0, start
    for a, b in sorted(ranges):
        a, b = max(a, reach), min(b, end)
        if b > a:
            total += b - a
            reach = b
    return total


def _clip(ranges: list[tuple[int, int]], a: int, b: int) -> int:
    """What disjoint ``ranges`` cover inside ``[a, b)``: plain sums (they never overlap)."""
    ordered = sorted(ranges)
    assert all(e <= s for (_, e), (s, _) in zip(ordered, ordered[1:])), "ranges overlap"
    return sum(max(0, min(e, b) - max(s, a)) for s, e in ordered)


def _phase_ranges(p: Proc, name: str) -> list[tuple[int, int]]:
    return [(s, e) for n, s, e, _, _ in p.ranges if n == name]


def _each(n: int, **times: int) -> dict[str, list[int]]:
    """Each phase's time, the same in each of ``n`` steps."""
    return {name: [t] * n for name, t in times.items()}


def _pair_what_if(role: str, phase: str, times: list[int]) -> WhatIf:
    """Two ranks that start a link together, rank 1 the slower: it saves half the difference
    (to the median), less than the difference of their ends."""
    return WhatIf(role, phase, 1, times[1], (times[0] + times[1]) / 2, (times[1] - times[0]) // 2)


def _engine(
    rank: int, rollout: int, prefills: int, decodes: int, decode_ns: int, reqs: int, prompt: int
) -> Engine:
    """An engine in a step's long tail whose model steps each carried ``reqs`` requests (a
    prefill ``reqs * prompt`` tokens, a decode ``reqs``); none there: tokens not known."""
    steps = prefills + decodes
    tokens = reqs * prompt * prefills + reqs * decodes if steps else None
    return Engine("EngineCore", rank, rollout, steps, decodes, decode_ns, tokens,
                  reqs * steps if steps else None)  # fmt: skip


def sync_grpo() -> Job:
    """Synchronous GRPO: a trainer (TaskRunner) whose step is gen > old_log_prob > update_actor >
    update_weights; 4 engines decoding inside gen, decode steps of 10/12/13/14 ms (the last 40 %
    slower than the first); 2 FSDP ranks (WorkerDict) inside each stage, rank 1 the slower."""
    period, length = 1000 * MS, 900 * MS + 7
    gen, logp, upd, sync = 640 * MS, 100 * MS, 120 * MS, 25 * MS
    prefill, n, gap = 20 * MS, 40, 1 * MS
    decode = [10 * MS, 12 * MS, 13 * MS, 14 * MS]
    logp_w, upd_w, sync_w = [80 * MS, 90 * MS], [100 * MS, 110 * MS], [20 * MS, 22 * MS]
    reqs, prompt = 8, 128
    trainer = Proc("TaskRunner", 0, 1000)
    engines = [Proc("EngineCore", k, 1100 + k) for k in range(4)]
    workers = [Proc("WorkerDict", r, 1200 + r) for r in range(2)]
    rollout = [prefill + n * d for d in decode]  # prefill, then the decodes: disjoint
    steps = []
    for k in range(3):
        s = k * period
        t1, t2, t3 = s + gen, s + gen + logp, s + gen + logp + upd
        trainer.add("step", s, s + length)
        trainer.add("gen", s, t1)
        trainer.add("old_log_prob", t1, t2)
        trainer.add("update_actor", t2, t3)
        trainer.add("update_weights", t3, t3 + sync)
        for e, d in zip(engines, decode):
            e.add("prefill_batch", s + 2 * MS, s + 2 * MS + prefill,
                  {"reqs": reqs, "tokens": reqs * prompt})  # fmt: skip
            for j in range(n):
                start = s + 2 * MS + prefill + gap + j * (d + gap)
                e.add("decode_batch", start, start + d, {"reqs": reqs, "tokens": reqs})
        for w, a, b, c in zip(workers, logp_w, upd_w, sync_w):
            w.add("compute_log_prob", t1 + MS, t1 + MS + a)
            w.add("update_actor", t2 + MS, t2 + MS + b)
            w.add("update_weights", t3 + MS, t3 + MS + c)
        w1 = ("WorkerDict", 1)
        path = [
            Link("generate_sequences", s, t1, gen, ("EngineCore", 3), "decode_batch"),
            Link("compute_log_prob", t1, t2, logp, w1, "compute_log_prob"),
            Link("update_actor", t2, t3, upd, w1, "update_actor"),
            Link("update_weights", t3, t3 + sync, sync, w1, "update_weights"),
        ]
        # the decodes inside gen: 400/480/520/560 ms, median 500: the slowest 60 above it,
        # but its end only n * (14 - 13) = 40 ms after the next latest
        what = WhatIf("EngineCore", "decode_batch", 3, n * decode[3],
                      (n * decode[1] + n * decode[2]) / 2, n * (decode[3] - decode[2]))  # fmt: skip
        engines_ = [_engine(e, rollout[e], 1, n, n * decode[e], reqs, prompt) for e in range(4)]
        tail = Tail(("EngineCore", 3), rollout[3], (rollout[1] + rollout[2]) / 2, engines_)
        steps.append(StepTruth(str(k + 1), s, s + length, path, what, tail))
    lengths = [length] * 3
    truths = [
        ProcTruth("TaskRunner", 0, lengths, [gen + logp + upd + sync] * 3,
                  _each(3, generate_sequences=gen, compute_log_prob=logp, update_actor=upd,
                        update_weights=sync)),
        *(ProcTruth("EngineCore", k, lengths, [rollout[k]] * 3,
                    _each(3, prefill_batch=prefill, decode_batch=n * decode[k]))
          for k in range(4)),
        *(ProcTruth("WorkerDict", r, lengths, [logp_w[r] + upd_w[r] + sync_w[r]] * 3,
                    _each(3, compute_log_prob=logp_w[r], update_actor=upd_w[r],
                          update_weights=sync_w[r]))
          for r in range(2)),
    ]  # fmt: skip
    truth = Truth(("TaskRunner", 0), steps, truths)
    return Job("sync_grpo", [trainer, *engines, *workers], truth)


def one_step_off() -> Job:
    """One-step-off async GRPO: the trainer waits (``gen``) for the rollout launched in the
    step before, launches the next one, and trains meanwhile. Engines 0-2 finish a rollout in
    220 ms, engine 3 in 270 ms; training takes 260 ms, so from step 2 on the trainer waits
    10 ms for engine 3, whose last decode step of each rollout crosses the step's edge."""
    n, prefill, gap = 10, 10 * MS, 1 * MS
    decode = [20 * MS, 20 * MS, 20 * MS, 25 * MS]
    logp, upd, sync = 100 * MS, 140 * MS, 20 * MS
    logp_w, upd_w, sync_w = [90 * MS, 96 * MS], [120 * MS, 130 * MS], [15 * MS, 18 * MS]
    reqs, prompt = 4, 64
    trainer = Proc("TaskRunner", 0, 2000)
    engines = [Proc("EngineCore", k, 2100 + k) for k in range(4)]
    workers = [Proc("WorkerDict", r, 2200 + r) for r in range(2)]

    def rollout(launch: int) -> int:
        """Each engine's prefill 1 ms after the launch, then its decodes; when the last ends."""
        for e, d in zip(engines, decode):
            e.add("prefill_batch", launch + MS, launch + MS + prefill,
                  {"reqs": reqs, "tokens": reqs * prompt})  # fmt: skip
            for j in range(n):
                start = launch + MS + prefill + j * (d + gap)
                e.add("decode_batch", start, start + d, {"reqs": reqs, "tokens": reqs})
        return launch + MS + prefill + (n - 1) * (decode[3] + gap) + decode[3]

    # step 1 waits for the first rollout whole; each step launches the next once it has its
    # batch (none in the last step)
    starts, waits, ends = [], [], []
    s, ready = 0, rollout(0)
    for k in range(3):
        starts.append(s)
        waits.append(ready - s)
        s = ready + logp + upd + sync
        ends.append(s)
        if k < 2:
            ready = rollout(ready)
    assert [w // MS for w in waits] == [270, 10, 10] and ends == [530 * MS, 800 * MS, 1070 * MS]
    steps = []
    for k, (s, w) in enumerate(zip(starts, waits)):
        t1, t2, t3 = s + w, s + w + logp, s + w + logp + upd
        trainer.add("step", s, ends[k])
        trainer.add("gen", s, t1)
        trainer.add("old_log_prob", t1, t2)
        trainer.add("update_actor", t2, t3)
        trainer.add("update_weights", t3, ends[k])
        for wk, a, b, c in zip(workers, logp_w, upd_w, sync_w):
            wk.add("compute_log_prob", t1 + MS, t1 + MS + a)
            wk.add("update_actor", t2 + MS, t2 + MS + b)
            wk.add("update_weights", t3 + MS, t3 + MS + c)
    windows = list(zip(starts, ends))
    lengths = [b - a for a, b in windows]
    # Per step, by hand: engines 0-2 run rollouts 1 and 2 in step 1 and rollout 3 in step 2,
    # whole; engine 3's last decode of rollout 2 is [515, 540) ms: 15 ms in step 1, 10 in step 2
    # (counted in step 1, which holds its middle), of rollout 3 [785, 810): 15 in step 2, 10 in
    # step 3 (counted in step 2).
    fast = [2 * n * decode[0], n * decode[0], 0]
    slow = [(2 * n - 1) * decode[3] + 15 * MS, 10 * MS + (n - 1) * decode[3] + 15 * MS, 10 * MS]
    pre = [2 * prefill, prefill, 0]
    prefills, decodes = [2, 1, 0], [2 * n, n, 0]  # model steps per step, every engine
    for k, e in enumerate(engines):  # (the hand figures agree with the layout)
        want = slow if k == 3 else fast
        assert [_clip(_phase_ranges(e, "decode_batch"), a, b) for a, b in windows] == want
    truths = [
        ProcTruth("TaskRunner", 0, lengths, lengths,
                  {"generate_sequences": waits,
                   **_each(3, compute_log_prob=logp, update_actor=upd, update_weights=sync)}),
        *(ProcTruth("EngineCore", k, lengths, [p + d for p, d in zip(pre, dec)],
                    {"prefill_batch": pre, "decode_batch": dec},
                    split={"decode_batch": 2} if k == 3 else {})
          for k, dec in enumerate([fast, fast, fast, slow])),
        *(ProcTruth("WorkerDict", r, lengths, [logp_w[r] + upd_w[r] + sync_w[r]] * 3,
                    _each(3, compute_log_prob=logp_w[r], update_actor=upd_w[r],
                          update_weights=sync_w[r]))
          for r in range(2)),
    ]  # fmt: skip
    for k, (s, w) in enumerate(zip(starts, waits)):
        t1, t2, t3 = s + w, s + w + logp, s + w + logp + upd
        w1 = ("WorkerDict", 1)
        path = [
            Link("generate_sequences", s, t1, w, ("EngineCore", 3), "decode_batch"),
            Link("compute_log_prob", t1, t2, logp, w1, "compute_log_prob"),
            Link("update_actor", t2, t3, upd, w1, "update_actor"),
            Link("update_weights", t3, ends[k], sync, w1, "update_weights"),
        ]
        # Only the wait is on the path: in step 1 the rollout whole (decodes 200/200/200/250,
        # engine 3 ending 50 ms after the others); in step 2 the 10 ms the trainer waited,
        # which the others (done before it began, decoding later in the step) spent on
        # nothing. In step 3 engine 3 is the only one decoding: the most to gain is then
        # update_actor's, 120/130 ms.
        if k == 0:
            what = WhatIf("EngineCore", "decode_batch", 3, n * decode[3], n * decode[0],
                          n * (decode[3] - decode[0]))  # fmt: skip
        elif k == 1:
            what = WhatIf("EngineCore", "decode_batch", 3, w, 0, w)
        else:
            what = _pair_what_if("WorkerDict", "update_actor", upd_w)
        engines_ = []
        for rank in range(4):
            dec = slow if rank == 3 else fast
            if dec[k] + pre[k]:  # (engine 3's 10 ms in step 3: no model step of its own)
                engines_.append(_engine(rank, dec[k] + pre[k], prefills[k], decodes[k], dec[k],
                                        reqs, prompt))  # fmt: skip
        rollouts = sorted(x.rollout for x in engines_)
        median = (rollouts[1] + rollouts[2]) / 2 if len(rollouts) == 4 else rollouts[0]
        tail = Tail(("EngineCore", 3), engines_[-1].rollout, median, engines_)
        steps.append(StepTruth(str(k + 1), s, ends[k], path, what, tail))
    truth = Truth(("TaskRunner", 0), steps, truths)
    return Job("one_step_off", [trainer, *engines, *workers], truth)


def fully_async() -> Job:
    """Fully async: the engines generate through the trainer's steps (a decode crosses each
    step's edge, generation overlaps training) and stop only for the weight sync; each engine's
    prefill of new requests overlaps its running decode by 50 ms (its rollout time is the
    union: 50 ms less than the phases' sum)."""
    length = 400 * MS
    gen, logp, upd, sync = 20 * MS, 100 * MS, 240 * MS, 30 * MS
    logp_w, upd_w, sync_w = [90 * MS, 96 * MS], [200 * MS, 230 * MS], [20 * MS, 25 * MS]
    second_end = [345 * MS, 355 * MS]  # each engine's second decode ends there in a step
    carry = [48 * MS, 18 * MS]  # its decode after the sync, from 392 ms on (not in step 3)
    sync_e = [26 * MS, 25 * MS]
    reqs, prompt = 4, 256
    trainer = Proc("TaskRunner", 0, 3000)
    engines = [Proc("EngineCore", k, 3100 + k) for k in range(2)]
    workers = [Proc("WorkerDict", r, 3200 + r) for r in range(2)]
    decode_args = {"reqs": reqs, "tokens": reqs}
    for k in range(3):
        s = k * length
        t1, t2, t3 = s + gen, s + gen + logp, s + gen + logp + upd
        trainer.add("step", s, s + length)
        trainer.add("gen", s, t1)
        trainer.add("old_log_prob", t1, t2)
        trainer.add("update_actor", t2, t3)
        trainer.add("update_weights", t3, t3 + sync)
        for w, a, b, c in zip(workers, logp_w, upd_w, sync_w):
            w.add("compute_log_prob", t1 + MS, t1 + MS + a)
            w.add("update_actor", t2 + MS, t2 + MS + b)
            w.add("update_weights", t3 + MS, t3 + MS + c)
        for e, eng in enumerate(engines):
            eng.add("prefill_batch", s + 50 * MS, s + 150 * MS,
                    {"reqs": reqs, "tokens": reqs * prompt}, thread=2)  # fmt: skip
            eng.add("decode_batch", s + 100 * MS, s + 250 * MS, decode_args)
            eng.add("decode_batch", s + 251 * MS, s + second_end[e], decode_args)
            eng.add("update_weights", s + 362 * MS, s + 362 * MS + sync_e[e])
            if k < 2:
                eng.add("decode_batch", s + 392 * MS, s + 392 * MS + carry[e], decode_args)
    lengths = [length] * 3
    truths = [
        ProcTruth("TaskRunner", 0, lengths, [gen + logp + upd + sync] * 3,
                  _each(3, generate_sequences=gen, compute_log_prob=logp, update_actor=upd,
                        update_weights=sync)),
        *(ProcTruth("WorkerDict", r, lengths, [logp_w[r] + upd_w[r] + sync_w[r]] * 3,
                    _each(3, compute_log_prob=logp_w[r], update_actor=upd_w[r],
                          update_weights=sync_w[r]))
          for r in range(2)),
    ]  # fmt: skip
    tails: list[list[Engine]] = [[], [], []]
    for e in range(2):
        second = second_end[e] - 251 * MS
        into = carry[e] - 8 * MS  # the part of the carried decode in the next step
        # decode per step: 150 + second + 8 ms (not in step 3) + what was carried in (not in 1)
        dec = [150 * MS + second + 8 * MS, into + 150 * MS + second + 8 * MS,
               into + 150 * MS + second]  # fmt: skip
        # the rollout: prefill [50, 150) and decode [100, 250) are [50, 250) together
        roll = [d + 50 * MS for d in dec]
        phases = {"prefill_batch": [100 * MS] * 3, "decode_batch": dec}
        phases.update(_each(3, update_weights=sync_e[e]))
        busy = [r + sync_e[e] for r in roll]
        truths.append(ProcTruth("EngineCore", e, lengths, busy, phases, {"decode_batch": 2}))
        decodes = [2, 3, 3]  # a carried decode holds its middle in the next step
        for k in range(3):
            tails[k].append(_engine(e, roll[k], 1, decodes[k], dec[k], reqs, prompt))
    steps = []
    for k in range(3):
        s = k * length
        t1, t2, t3 = s + gen, s + gen + logp, s + gen + logp + upd
        # the wait: engine 0's carried decode runs through it (from step 2 on), engine 1's
        # ends 10 ms into it; the weight sync: engine 0's ends last (388 ms)
        path = [
            Link("generate_sequences", s, t1, gen, None if k == 0 else ("EngineCore", 0),
                 "" if k == 0 else "decode_batch"),
            Link("compute_log_prob", t1, t2, logp, ("WorkerDict", 1), "compute_log_prob"),
            Link("update_actor", t2, t3, upd, ("WorkerDict", 1), "update_actor"),
            Link("update_weights", t3, t3 + sync, sync, ("EngineCore", 0), "update_weights"),
        ]  # fmt: skip
        # the most to gain: update_actor, 200/230 ms (its end 30 ms after rank 0's)
        what = _pair_what_if("WorkerDict", "update_actor", upd_w)
        slowest = max(tails[k], key=lambda x: x.rollout)
        median = sum(x.rollout for x in tails[k]) / 2
        tail = Tail(("EngineCore", slowest.rank), slowest.rollout, median, tails[k])
        steps.append(StepTruth(str(k + 1), s, s + length, path, what, tail))
    truth = Truth(("TaskRunner", 0), steps, truths)
    return Job("fully_async", [trainer, *engines, *workers], truth)


def spmd() -> Job:
    """SPMD ranks (no role, no driver), each timing its own ``train_step`` at its own pace
    (100/110/120 ms); rank 2 stopped after two steps. Each is attributed to its own steps,
    matched by number; its length is its own."""
    procs = [Proc("", r, 4000 + r) for r in range(3)]
    truths = []
    for r, p in enumerate(procs):
        pace, fwd, bwd = (100 + 10 * r) * MS, (40 + r) * MS, (50 + r) * MS
        mine = 3 if r < 2 else 2
        for k in range(mine):
            s = k * pace
            p.add("train_step", s, s + pace - 5 * MS)
            p.add("fwd", s, s + fwd)
            p.add("bwd", s + fwd, s + fwd + bwd)
        none = [0] * (3 - mine)  # (no figures where it has no step: length -1, time 0)
        length = [pace - 5 * MS] * mine + [-1] * (3 - mine)
        phases = {"fwd": [fwd] * mine + none, "bwd": [bwd] * mine + none}
        truths.append(ProcTruth("", r, length, [fwd + bwd] * mine + none, phases))
    steps = []
    for k in range(3):
        s = k * 100 * MS
        fwd_link = Link("fwd", s, s + 40 * MS, 40 * MS)
        path = [fwd_link, Link("bwd", s + 40 * MS, s + 90 * MS, 50 * MS)]
        steps.append(StepTruth(str(k + 1), s, s + 95 * MS, path))
    return Job("spmd", procs, Truth(("", 0), steps, truths))


def edges() -> Job:
    """Ranges over step edges: steps [0, 100), [120, 220), [220, 320) ms; a worker's range
    across the gap between steps 1 and 2 (10 + 10 ms in them, 20 in the gap), one across the
    edge of steps 2 and 3 and the end of the last (20 + 100 ms, 20 after), one before the
    first step."""
    trainer, worker = Proc("TaskRunner", 0, 5000), Proc("WorkerDict", 0, 5100)
    for s in (0, 120 * MS, 220 * MS):
        trainer.add("step", s, s + 100 * MS)
        trainer.add("gen", s, s + 60 * MS)
        trainer.add("update_actor", s + 60 * MS, s + 95 * MS)
    worker.add("update_weights", -50 * MS, -10 * MS)
    worker.add("update_actor", 60 * MS, 80 * MS)
    worker.add("compute_log_prob", 90 * MS, 130 * MS)
    worker.add("update_actor", 200 * MS, 340 * MS)
    lengths = [100 * MS] * 3
    truths = [
        ProcTruth("TaskRunner", 0, lengths, [95 * MS] * 3,
                  _each(3, generate_sequences=60 * MS, update_actor=35 * MS)),
        ProcTruth("WorkerDict", 0, lengths, [30 * MS, 30 * MS, 100 * MS],
                  {"update_weights": [0, 0, 0], "update_actor": [20 * MS, 20 * MS, 100 * MS],
                   "compute_log_prob": [10 * MS, 10 * MS, 0]},
                  split={"compute_log_prob": 1, "update_actor": 1}, outside=(40 + 20 + 20) * MS),
    ]  # fmt: skip
    w = ("WorkerDict", 0)
    # who the trainer waited for: in step 1's gen no one (the worker's first range ended
    # before), then the worker's update_actor (the same phase) in update_actor, and in gen
    # whatever of the worker's ended last there
    in_gen = ["", "compute_log_prob", "update_actor"]
    steps = []
    for k, s in enumerate((0, 120 * MS, 220 * MS)):
        path = [
            Link("generate_sequences", s, s + 60 * MS, 60 * MS, w if in_gen[k] else None,
                 in_gen[k]),
            Link("update_actor", s + 60 * MS, s + 95 * MS, 35 * MS, w, "update_actor"),
        ]  # fmt: skip
        steps.append(StepTruth(str(k + 1), s, s + 100 * MS, path))
    return Job("edges", [trainer, worker], Truth(("TaskRunner", 0), steps, truths))


def recurring() -> Job:
    """A phase recurring in a step: update_weights > gen > update > update_weights."""
    period, length = 1000 * MS, 870 * MS
    sync1, upd, sync2 = [15 * MS, 18 * MS], [250 * MS, 290 * MS], [20 * MS, 26 * MS]
    n, reqs = 10, 2
    trainer = Proc("TaskRunner", 0, 6000)
    engine = Proc("EngineCore", 0, 6100)
    workers = [Proc("WorkerDict", r, 6200 + r) for r in range(2)]
    rollout = 20 * MS + n * 40 * MS
    steps = []
    for k in range(3):
        s = k * period
        trainer.add("step", s, s + length)
        trainer.add("update_weights", s, s + 20 * MS)
        trainer.add("gen", s + 20 * MS, s + 520 * MS)
        trainer.add("update", s + 520 * MS, s + 820 * MS)
        trainer.add("update_weights", s + 820 * MS, s + 850 * MS)
        for r, w in enumerate(workers):
            w.add("update_weights", s + MS, s + MS + sync1[r])
            w.add("update_actor", s + 521 * MS, s + 521 * MS + upd[r])
            w.add("update_weights", s + 821 * MS, s + 821 * MS + sync2[r])
        engine.add("prefill_batch", s + 25 * MS, s + 45 * MS, {"reqs": reqs, "tokens": 50 * reqs})
        for j in range(n):
            start = s + 46 * MS + j * 45 * MS
            engine.add("decode_batch", start, start + 40 * MS, {"reqs": reqs, "tokens": reqs})
        w1 = ("WorkerDict", 1)
        path = [
            Link("update_weights", s, s + 20 * MS, 20 * MS, w1, "update_weights"),
            Link("generate_sequences", s + 20 * MS, s + 520 * MS, 500 * MS, ("EngineCore", 0),
                 "decode_batch"),
            Link("update_actor", s + 520 * MS, s + 820 * MS, 300 * MS, w1, "update_actor"),
            Link("update_weights", s + 820 * MS, s + 850 * MS, 30 * MS, w1, "update_weights"),
        ]  # fmt: skip
        what = _pair_what_if("WorkerDict", "update_actor", upd)
        tail = Tail(("EngineCore", 0), rollout, rollout,
                    [_engine(0, rollout, 1, n, n * 40 * MS, reqs, 50)])  # fmt: skip
        steps.append(StepTruth(str(k + 1), s, s + length, path, what, tail))
    lengths = [length] * 3
    truths = [
        ProcTruth("TaskRunner", 0, lengths, [850 * MS] * 3,
                  _each(3, update_weights=50 * MS, generate_sequences=500 * MS,
                        update_actor=300 * MS)),
        ProcTruth("EngineCore", 0, lengths, [rollout] * 3,
                  _each(3, prefill_batch=20 * MS, decode_batch=40 * n * MS)),
        *(ProcTruth("WorkerDict", r, lengths, [sync1[r] + upd[r] + sync2[r]] * 3,
                    _each(3, update_weights=sync1[r] + sync2[r], update_actor=upd[r]))
          for r in range(2)),
    ]  # fmt: skip
    return Job("recurring", [trainer, engine, *workers], Truth(("TaskRunner", 0), steps, truths))


def concurrent_engines() -> Job:
    """Four engines that all report role EngineCore, rank 0 (four processes, four pids), with
    20/25/30/35 decode steps of 10 ms, 1 ms apart, inside the trainer's gen."""
    length, gen = 500 * MS, 400 * MS
    counts = [20, 25, 30, 35]
    trainer = Proc("TaskRunner", 0, 7000)
    engines = [Proc("EngineCore", 0, 7100 + k) for k in range(4)]
    rollouts = [10 * MS * c for c in counts]
    steps = []
    for k in range(2):
        s = k * 1000 * MS
        trainer.add("step", s, s + length)
        trainer.add("gen", s, s + gen)
        trainer.add("update_actor", s + gen, s + 480 * MS)
        for e, count in zip(engines, counts):
            for j in range(count):
                start = s + 10 * MS + j * 11 * MS
                e.add("decode_batch", start, start + 10 * MS, {"reqs": 1, "tokens": 1})
        path = [
            Link("generate_sequences", s, s + gen, gen, ("EngineCore", 0), "decode_batch"),
            Link("update_actor", s + gen, s + 480 * MS, 80 * MS),
        ]
        # 200/250/300/350 ms, median 275; the slowest ends 5 decode steps (55 ms) after the next
        what = WhatIf("EngineCore", "decode_batch", 0, rollouts[3], 275 * MS, 55 * MS)
        engines_ = [_engine(0, r, 0, c, r, 1, 0) for r, c in zip(rollouts, counts)]
        tail = Tail(("EngineCore", 0), rollouts[3], 275 * MS, engines_)
        steps.append(StepTruth(str(k + 1), s, s + length, path, what, tail))
    # (its role's table has one line for the four: together they cover what the longest does,
    # the others' decode steps falling on its own)
    truths = [
        ProcTruth("TaskRunner", 0, [length] * 2, [480 * MS] * 2,
                  _each(2, generate_sequences=gen, update_actor=80 * MS)),
        *(ProcTruth("EngineCore", 0, [length] * 2, [r] * 2, _each(2, decode_batch=r),
                    unmarked=2 * (length - rollouts[3]))
          for r in rollouts),
    ]  # fmt: skip
    return Job("concurrent_engines", [trainer, *engines], Truth(("TaskRunner", 0), steps, truths))


def restart(clock_step_ns: int = 0) -> Job:
    """A worker (WorkerDict rank 1) that died after step 2 and was restarted (another pid) in
    the gap before step 3, where it loads a checkpoint; with ``clock_step_ns``, the wall clock
    was stepped that far before the new process began (its anchor and its times that far on)."""
    period, length = 500 * MS, 450 * MS
    upd, sync = [150 * MS, 180 * MS], [20 * MS, 25 * MS]
    trainer = Proc("TaskRunner", 0, 8000)
    worker0, first = Proc("WorkerDict", 0, 8100), Proc("WorkerDict", 1, 8101)
    second = Proc("WorkerDict", 1, 8102, anchor_ns=ANCHOR + clock_step_ns, offset_ns=clock_step_ns)
    second.add("load_checkpoint", 2 * period - 40 * MS, 2 * period - 10 * MS)
    steps = []
    for k in range(4):
        s = k * period
        trainer.add("step", s, s + length)
        trainer.add("gen", s, s + 200 * MS)
        trainer.add("update_actor", s + 200 * MS, s + 400 * MS)
        trainer.add("update_weights", s + 400 * MS, s + 430 * MS)
        for r, w in enumerate([worker0, first if k < 2 else second]):
            w.add("update_actor", s + 201 * MS, s + 201 * MS + upd[r])
            w.add("update_weights", s + 401 * MS, s + 401 * MS + sync[r])
        w1 = ("WorkerDict", 1)
        path = [
            Link("generate_sequences", s, s + 200 * MS, 200 * MS),
            Link("update_actor", s + 200 * MS, s + 400 * MS, 200 * MS, w1, "update_actor"),
            Link("update_weights", s + 400 * MS, s + 430 * MS, 30 * MS, w1, "update_weights"),
        ]
        what = _pair_what_if("WorkerDict", "update_actor", upd)
        steps.append(StepTruth(str(k + 1), s, s + length, path, what))
    lengths = [length] * 4
    truths = [
        ProcTruth("TaskRunner", 0, lengths, [430 * MS] * 4,
                  _each(4, generate_sequences=200 * MS, update_actor=200 * MS,
                        update_weights=30 * MS)),
        ProcTruth("WorkerDict", 0, lengths, [upd[0] + sync[0]] * 4,
                  _each(4, update_actor=upd[0], update_weights=sync[0])),
        ProcTruth("WorkerDict", 1, lengths, [upd[1] + sync[1]] * 4,
                  _each(4, update_actor=upd[1], update_weights=sync[1], load_checkpoint=0),
                  outside=30 * MS),
    ]  # fmt: skip
    name = "restart" + ("_clock_step" if clock_step_ns else "")
    return Job(name, [trainer, worker0, first, second], Truth(("TaskRunner", 0), steps, truths))


def periodic() -> Job:
    """Periodic model steps beyond the memory bound: one engine's 3,101 decode steps, 200 us
    each, every 300 us, through three back-to-back trainer steps whose edges fall between two
    decode steps: 1,034 / 1,034 / 1,033 of them per step (more runs than a process ships)."""
    every, decode, reqs = 300 * US, 200 * US, 16
    counts = [1034, 1034, 1033]
    edges_ = [0, counts[0] * every, (counts[0] + counts[1]) * every, sum(counts) * every]
    trainer, engine = Proc("TaskRunner", 0, 9000), Proc("EngineCore", 0, 9100)
    for a, b in zip(edges_, edges_[1:]):
        trainer.add("step", a, b)
        trainer.add("gen", a, b)
    for j in range(sum(counts)):
        engine.add("decode_batch", j * every, j * every + decode, {"reqs": reqs, "tokens": reqs})
    steps = []
    for k, (a, b) in enumerate(zip(edges_, edges_[1:])):
        rollout = counts[k] * decode
        tail = Tail(("EngineCore", 0), rollout, rollout,
                    [_engine(0, rollout, 0, counts[k], rollout, reqs, 0)])  # fmt: skip
        path = [Link("generate_sequences", a, b, b - a, ("EngineCore", 0), "decode_batch")]
        steps.append(StepTruth(str(k + 1), a, b, path, None, tail))
    lengths = [b - a for a, b in zip(edges_, edges_[1:])]
    truths = [
        ProcTruth("TaskRunner", 0, lengths, lengths, {"generate_sequences": lengths}),
        ProcTruth("EngineCore", 0, lengths, [c * decode for c in counts],
                  {"decode_batch": [c * decode for c in counts]}),
    ]  # fmt: skip
    return Job("periodic", [trainer, engine], Truth(("TaskRunner", 0), steps, truths))


#: Every shape, by name.
SHAPES: dict[str, Callable[[], Job]] = {
    "sync_grpo": sync_grpo,
    "one_step_off": one_step_off,
    "fully_async": fully_async,
    "spmd": spmd,
    "edges": edges,
    "recurring": recurring,
    "concurrent_engines": concurrent_engines,
    "restart": restart,
    "restart_clock_step": lambda: restart(37 * MS),
    "periodic": periodic,
}


# --- checking ------------------------------------------------------------------------------


def _near(got: Any, want: Any, tol: int) -> bool:
    if want is None or got is None:
        return got is want
    return bool(abs(got - want) <= tol)


def _by_member(items: list[dict[str, Any]]) -> dict[Member, list[dict[str, Any]]]:
    out: dict[Member, list[dict[str, Any]]] = {}
    for item in items:
        out.setdefault((item["role"], item["rank"]), []).append(item)
    return out


def _pairs(
    got: list[dict[str, Any]],
    want: list[Any],
    key: Callable[[Any], Any],
    what: str,
    said: list[str],
) -> list[tuple[dict[str, Any], Any]]:
    """``got`` and ``want`` matched by role and rank (several of one: each sorted by ``key``)."""
    mine = _by_member(got)
    truths: dict[Member, list[Any]] = {}
    for w in want:
        truths.setdefault((w.role, w.rank), []).append(w)
    pairs: list[tuple[dict[str, Any], Any]] = []
    for member in sorted(set(mine) | set(truths)):
        g, w = mine.get(member, []), truths.get(member, [])
        if len(g) != len(w):
            said.append(f"{what} {member}: {len(g)} read, {len(w)} true")
            continue
        pairs += zip(sorted(g, key=key), sorted(w, key=lambda t: key(vars(t))))
    return pairs


def mismatches(doc: dict[str, Any], truth: Truth, tol: int = US, held: bool = True) -> list[str]:
    """Every figure of ``summary --json``'s ``doc`` that differs from ``truth`` by more than
    ``tol`` ns (counts exactly, the tokens and requests the engines' model steps carried
    too); ``held``: also each role table's unmarked and outside time (not known of a
    process summarised in one pass, which must then say null). Empty: all agree."""
    said: list[str] = []
    per = doc.get("per_step")
    if per is None:
        return ["no per-step model"]
    origin = T0

    def check(what: str, got: Any, want: Any, exact: bool = False) -> None:
        if not (got == want if exact else _near(got, want, tol)):
            said.append(f"{what}: read {got}, true {want}")

    ref = per["reference"]
    check("reference", (ref["role"], ref["rank"]), truth.reference, exact=True)
    check("steps", len(per["steps"]), len(truth.steps), exact=True)
    for got, want in zip(per["steps"], truth.steps):
        at = f"step {want.key}"
        check(f"{at} key", got["key"], want.key, exact=True)
        check(f"{at} start", got["start_ns"] - origin, want.start)
        check(f"{at} end", got["end_ns"] - origin, want.end)
        path = got["critical_path"]
        read = [
            (
                x["phase"],
                None if x["waited"] is None else (x["waited"]["role"], x["waited"]["rank"]),
                "" if x["waited"] is None else x["waited"]["phase"],
            )
            for x in path
        ]
        true = [(x.phase, x.waited, x.waited_phase) for x in want.path]
        check(f"{at} critical path", read, true, exact=True)
        if len(path) == len(want.path):
            for x, w in zip(path, want.path):
                check(f"{at} {w.phase} link start", x["start_ns"] - origin, w.start)
                check(f"{at} {w.phase} link end", x["end_ns"] - origin, w.end)
                check(f"{at} {w.phase} link time", x["time_ns"], w.time)
        _what_if(at, got["what_if"], want, check)
        _tail(at, got["rollout_tail"], want.tail, check, said)
    for got, want in _pairs(per["processes"], truth.processes, _busy_key, "processes", said):
        at = f"{want.role or '-'}:{want.rank} (pid order {got['key']})"
        for name, values in (("length", want.length), ("busy", want.busy), ("idle", want.idle)):
            read = got[f"{name}_ns"]
            if len(read) != len(values) or not all(
                map(lambda a, b: _near(a, b, tol), read, values)
            ):
                said.append(f"{at} {name}: read {read}, true {values}")
        for name in sorted(set(want.phases) | set(got["phases"])):
            read = got["phases"].get(name, [0] * len(want.length))
            true = want.phases.get(name, [0] * len(want.length))
            if not all(map(lambda a, b: _near(a, b, tol), read, true)) or len(read) != len(true):
                said.append(f"{at} phase {name}: read {read}, true {true}")
        check(f"{at} uncertain", max(got["uncertain_ns"], default=0), 0)
        check(f"{at} split", got["split"], want.split, exact=True)
        check(f"{at} outside", got["outside_ns"], want.outside)
    _table(doc, truth, check, said, held)
    return said


def _busy_key(p: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(p["busy_ns"] if "busy_ns" in p else p["busy"])


def _what_if(at: str, got: dict[str, Any] | None, want: StepTruth, check: Any) -> None:
    w = want.what_if
    if w is None or got is None:
        check(f"{at} what-if", got, w, exact=True)
        return
    check(
        f"{at} what-if",
        (got["role"], got["phase"], got["slowest_rank"]),
        (w.role, w.phase, w.rank),
        exact=True,
    )
    check(f"{at} what-if slowest", got["slowest_ns"], w.slowest)
    check(f"{at} what-if median", got["median_ns"], w.median)
    check(f"{at} what-if saving", got["saving_ns"], w.saving)
    check(f"{at} what-if step", got["step_ns"], want.end - want.start - w.saving)


def _tail(
    at: str,
    got: dict[str, Any] | None,
    want: Tail | None,
    check: Any,
    said: list[str],
) -> None:
    if want is None or got is None:
        check(f"{at} rollout tail", got is None, want is None, exact=True)
        return
    slowest = got["slowest"]
    check(f"{at} slowest engine", (slowest["role"], slowest["rank"]), want.slowest, exact=True)
    check(f"{at} slowest rollout", got["slowest_ns"], want.slowest_ns)
    check(f"{at} median rollout", got["median_ns"], want.median_ns)
    if abs(got["waiting_share"] - want.waiting_share) > 1e-6:
        said.append(f"{at} waiting share: read {got['waiting_share']}, true {want.waiting_share}")
    key = lambda e: (e["rollout_ns"] if "rollout_ns" in e else e["rollout"],)  # noqa: E731
    for g, w in _pairs(got["engines"], want.engines, key, f"{at} engines", said):
        where = f"{at} engine {w.role}:{w.rank}"
        check(f"{where} rollout", g["rollout_ns"], w.rollout)
        check(f"{where} decode time", g["decode_ns"], w.decode_ns)
        check(f"{where} model steps", g["model_steps"], w.model_steps, exact=True)
        check(f"{where} decode steps", g["decode_steps"], w.decode_steps, exact=True)
        check(f"{where} tokens", g["tokens"], w.tokens, exact=True)
        check(f"{where} reqs", g["reqs"], w.reqs, exact=True)


def _table(doc: dict[str, Any], truth: Truth, check: Any, said: list[str], held: bool) -> None:
    """Each member's line of its role's table (one per role and rank, its processes together):
    its steps (the job's unless its own), their time, the time of them it ran no phase, its
    phases' time outside them."""
    ranks = list(doc["ranks"].values())
    members = {(p.role, p.rank): p for p in reversed(truth.processes)}  # (the first of each)
    key = lambda r: (r["unmarked_ns"] if "unmarked_ns" in r else r["unmarked"],)  # noqa: E731
    for got, want in _pairs(ranks, list(members.values()), key, "role table", said):
        at = f"role table {want.role or '-'}:{want.rank}"
        check(f"{at} steps", got["steps"], want.steps, exact=True)
        check(f"{at} step time", got["step_time_ns"], want.step_time)
        check(f"{at} unmarked", got["unmarked_ns"], want.unmarked if held else None)
        check(f"{at} outside", got["outside_steps_ns"], want.outside if held else None)
