"""Where each RL step's time goes, across every process of the job: the one per-step model that
``summary`` (text, JSON) and ``diff`` render (:func:`analyse` builds it; nothing else computes
these figures).

**Steps.** The process that runs the loop defines the job's steps. Among the processes with
steps of their own (verl's trainer ``step`` timer, or whatever
:mod:`mstx_marks.analysis.steps` recognises), the *loop role* is the role with the fewest such
processes (a driver rather than SPMD ranks; ties to the one with the longest steps, the outer
loop, then by name), and its lowest rank is the *reference*: its steps, in time order, are the
job's.

**Attribution.** Every other process's ranges are attributed to those steps by time: per step
and process, ``busy`` is the time its phase ranges cover inside the step (their union),
``idle`` is the step's length less that (the bubble), and each phase's time is what its ranges
cover inside the step (a union too: a phase running as 64 asyncio tasks at once counts its wall
time). A span over a step's edge is split between the steps (and counted: ``split``); time
outside every step is ``outside_ns``. A process of the loop role with steps of its own (SPMD
ranks, each timing its own ``train_step``) is attributed to its own steps instead, matched to
the reference's by key, as msprof-analyze's ``cluster_time_summary`` joins ranks on (rank,
step): its step length is its own. A process's figures are exact unless it held more ranges
than are kept (:mod:`mstx_marks.analysis.spans`) and a step's edge cut a span joined to bound
memory: ``uncertain_ns`` says by how much they may be off.

**Clocks.** Every file's times are on the wall clock's axis already (a spill's are the
monotonic clock plus the process's anchor, wall less monotonic when it began). On one host the
monotonic clock is one clock: processes whose file gives their host and anchor are moved onto
one anchor per host (the median of theirs), which takes out any step or slew of the wall clock
between their starts; so processes of one host are aligned exactly. Hosts are aligned only by
their wall clocks, which NTP keeps within about a millisecond on a LAN at best (tens of ms
across the Internet, 100 ms and more with asymmetric routes): :class:`ClockNote` says which
holds.

**Critical path** of a step, from the reference's view: its phases inside the step (nested
ones left out: those whose time lies inside another phase's), walked back from the step's end,
each time the one that ended last before the point reached (so, in colocated mode, all of them
in order); for each, the process of another role whose work inside it ended last (what the
reference waited for). **What if** the slowest rank matched the median: for each role and phase
run by several ranks in the step, the step less (slowest rank's time - the median's); the
largest saving is kept. It assumes that phase is on the step's path (the loop waits for its
slowest rank), as in verl's synchronous stages.

**Rollout long tail** of a step (:class:`RolloutTail`): the *engines* are the processes with
vLLM's / SGLang's model-step ranges (:data:`~mstx_marks.analysis.batches.MODEL_STEPS`); an
engine's rollout time in a step is what those ranges cover there. The slowest engine against
the median, and the share of the rollout spent waiting for it, ``(slowest - median) /
slowest``; per engine its model steps, decode steps and their time, and the tokens and
requests of its batches, summed, where every model step there carried them (None: not known,
as from a reader that keeps no args).

>>> from mstx_marks.analysis.spans import ProcessSpans
>>> from mstx_marks.analysis.steps import Step
>>> trainer = ProcessSpans()
>>> trainer.add(0, 40, "gen"); trainer.add(40, 90, "update_actor")
>>> trainer.set_steps([Step(0, 100, "1", 100)])
>>> worker = ProcessSpans()
>>> worker.add(45, 85, "update_actor")
>>> model = analyse([(Member("trainer", 0), trainer.finish()),
...                  (Member("worker", 0), worker.finish())])
>>> row = model.row(Member("worker", 0))
>>> row.busy_ns[0], row.idle_ns(0), [link.phase for link in model.steps[0].path]
(40, 60, ['gen', 'update_actor'])
"""

from __future__ import annotations

import math
import statistics
from array import array
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from typing import Iterable

from mstx_marks.analysis.batches import DECODE, MODEL_STEPS, BatchCounts
from mstx_marks.analysis.spans import ProcessSpans, SpanSet
from mstx_marks.base.records import Member, Span

__all__ = [
    "MAX_STEPS",
    "ClockNote",
    "EngineStep",
    "PathLink",
    "ProcessSteps",
    "RolloutTail",
    "StepAnalysis",
    "StepInfo",
    "WhatIf",
    "analyse",
]

#: At most this many steps are analysed; a job with more has every k-th analysed (a loop
#: marked per iteration rather than per RL step), which a note says.
MAX_STEPS = 1024
#: A per-step figure of a step a process has no figures for (its own steps lack that key).
ABSENT = -1


@dataclass
class ClockNote:
    """How the processes' clocks were put on one axis, and how far to trust it: ``hosts`` the
    hosts the files named, ``unknown`` the processes whose file names none (a database, a
    Chrome trace), ``shifts_ns`` how far each process was moved onto its host's monotonic
    clock (only those moved)."""

    hosts: list[str]
    unknown: list[Member]
    shifts_ns: dict[Member, int] = field(default_factory=dict)

    @property
    def aligned_by(self) -> str:
        """``monotonic`` when every process is on one host that says so; ``wall`` otherwise."""
        return "monotonic" if len(self.hosts) == 1 and not self.unknown else "wall"

    def text(self) -> str:
        """The accuracy, in words.

        >>> print(ClockNote(["a", "b"], []).text())
        ... # doctest: +ELLIPSIS
        2 hosts aligned by wall clock: NTP-level, about 1 ms on a LAN at best ...
        """
        where = f"{len(self.hosts)} hosts" if len(self.hosts) != 1 else "1 host"
        if len(self.hosts) > 1:
            text = (
                f"{where} aligned by wall clock: NTP-level, about 1 ms on a LAN at best (tens"
                " of ms across the Internet): a range that near a step's edge on another host"
                " may fall in the next step; processes of one host by its monotonic clock"
                " (exact)"
            )
        elif self.hosts:
            text = f"{where} ({self.hosts[0]}): processes aligned by its monotonic clock (exact)"
        else:
            text = "hosts not known: processes placed by the wall clock their files hold"
        if self.unknown and self.hosts:
            text += (
                f"; {len(self.unknown)} process(es) whose file names no host placed by the wall"
                " clock it holds (exact on one host unless the clock was set meanwhile,"
                " NTP-level across hosts)"
            )
        return text


@dataclass
class PathLink:
    """One phase on a step's critical path: its time in the step (``time_ns``, what its ranges
    cover), its first start and last end there, and the process of another role whose work
    inside it ended last (``waited``, its phase and end; None when none ran then)."""

    phase: str
    start_ns: int
    end_ns: int
    time_ns: int
    waited: Member | None = None
    waited_phase: str = ""
    waited_end_ns: int = 0


@dataclass
class WhatIf:
    """The step had its ``role``'s slowest rank in ``phase`` taken the median rank's time:
    ``step_ns`` long instead (``saving_ns`` less)."""

    role: str
    phase: str
    slowest_rank: int
    slowest_ns: int
    median_ns: float
    saving_ns: int
    step_ns: int


@dataclass
class EngineStep:
    """One rollout engine's model steps in a step: ``rollout_ns`` what they cover, how many
    (``model_steps``, of them ``decode_steps`` taking ``decode_ns``), and their batches'
    ``tokens`` and ``reqs`` summed (None: not every model step there carried them)."""

    member: Member
    rollout_ns: int
    model_steps: int
    decode_steps: int
    decode_ns: int
    tokens: int | None
    reqs: int | None


@dataclass
class RolloutTail:
    """A step's rollout long tail (see the module's docstring): every engine that ran in it
    (by role and rank), the slowest and the median engine's rollout time, and
    ``waiting_share``, the share of the slowest's rollout the others were done and waited
    (``(slowest_ns - median_ns) / slowest_ns``, 0 with one engine)."""

    engines: list[EngineStep]
    slowest: Member
    slowest_ns: int
    median_ns: float
    waiting_share: float


@dataclass
class StepInfo:
    """One of the job's steps, as the reference had it (times on the aligned axis)."""

    key: str
    start_ns: int
    end_ns: int
    path: list[PathLink] = field(default_factory=list)
    what_if: WhatIf | None = None
    tail: RolloutTail | None = None

    @property
    def length_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass
class ProcessSteps:
    """One process's figures in each step analysed (index ``i`` of the arrays is
    ``StepAnalysis.steps[i]``; :data:`ABSENT` where it has none: its own steps lack the key)."""

    member: Member
    host: str
    #: Attributed to its own steps, matched by key (an SPMD rank), rather than by time.
    own: bool
    length_ns: array[int]
    busy_ns: array[int]
    phases: dict[str, array[int]]
    #: How far each step's figures may be off (see the module's docstring): 0 when exact.
    uncertain_ns: array[int]
    #: Per phase, how many of its spans a step's edge cut (split between steps).
    split: dict[str, int]
    #: Time its phases covered outside every step analysed.
    outside_ns: int
    #: How far its busy time may be off in all, beyond ``uncertain_ns``: joined spans of
    #: its phases that overlapped, their union estimated (a process read in one pass).
    slack_ns: int = 0
    #: Its model steps counted per step (a rollout engine's; None for another process).
    batches: BatchCounts | None = None

    def idle_ns(self, i: int) -> int:
        """The step's time this process had no phase running (the bubble), or :data:`ABSENT`."""
        length = self.length_ns[i]
        return ABSENT if length == ABSENT else max(0, length - self.busy_ns[i])

    def present(self, i: int) -> bool:
        return self.length_ns[i] != ABSENT

    def top_phases(self, i: int, n: int | None = None) -> list[tuple[str, int]]:
        """Its phases in step ``i`` with time there, most first (the first ``n``)."""
        found = [(name, t[i]) for name, t in self.phases.items() if t[i] > 0]
        found.sort(key=lambda item: (-item[1], item[0]))
        return found if n is None else found[:n]


@dataclass
class StepAnalysis:
    """The per-step model (see the module's docstring): the steps analysed, every process's
    figures in them, how clocks were aligned, and what the reader should know."""

    reference: Member
    loop_role: str
    steps: list[StepInfo]
    processes: list[ProcessSteps]
    clock: ClockNote
    #: The reference's steps in all; ``every`` is k when only every k-th is analysed.
    total_steps: int
    every: int = 1
    notes: list[str] = field(default_factory=list)

    def row(self, member: Member) -> ProcessSteps:
        """The figures of ``member``."""
        for p in self.processes:
            if p.member == member:
                return p
        raise KeyError(member)

    @property
    def split(self) -> int:
        """Phase spans a step's edge cut, every process together."""
        return sum(sum(p.split.values()) for p in self.processes)

    def roles(self) -> list[str]:
        """The roles, the loop role first, then by name."""
        return sorted(
            {p.member.role for p in self.processes}, key=lambda r: (r != self.loop_role, r)
        )

    def series(self, role: str, phase: str | None) -> list[int]:
        """Per step where ``role`` has figures, the time the step waited for: ``phase``'s time
        on the role's slowest rank; for ``phase`` None, the busiest rank's busy time.

        >>> from mstx_marks.analysis.spans import ProcessSpans
        >>> from mstx_marks.analysis.steps import Step
        >>> t = ProcessSpans(); t.add(0, 30, "gen"); t.set_steps([Step(0, 50, "1", 50)])
        >>> analyse([(Member("trainer", 0), t.finish())]).series("trainer", "gen")
        [30]
        """
        rows = [p for p in self.processes if p.member.role == role]
        out = []
        for i in range(len(self.steps)):
            here = [p for p in rows if p.present(i)]
            if not here:
                continue
            if phase is None:
                out.append(max(p.busy_ns[i] for p in here))
            else:
                out.append(max((p.phases[phase][i] for p in here if phase in p.phases), default=0))
        return out

    def idle_series(self, role: str) -> list[int]:
        """Per step where ``role`` has figures, its busiest rank's idle time: the bubble no rank
        of the role filled."""
        rows = [p for p in self.processes if p.member.role == role]
        out = []
        for i in range(len(self.steps)):
            here = [p.idle_ns(i) for p in rows if p.present(i)]
            if here:
                out.append(min(here))
        return out


def _clock(procs: list[tuple[Member, ProcessSpans]]) -> ClockNote:
    """One anchor per host (the median of its processes'): each process's shift onto it."""
    anchors: dict[str, list[int]] = {}
    for _, s in procs:
        if s.host and s.anchor_ns is not None:
            anchors.setdefault(s.host, []).append(s.anchor_ns)
    shared = {host: statistics.median_low(found) for host, found in anchors.items()}
    shifts = {
        m: shared[s.host] - s.anchor_ns
        for m, s in procs
        if s.host in shared and s.anchor_ns is not None and shared[s.host] != s.anchor_ns
    }
    unknown = [m for m, s in procs if not s.host]
    return ClockNote(sorted({s.host for _, s in procs if s.host}), unknown, shifts)


def _reference(procs: list[tuple[Member, ProcessSpans]]) -> tuple[str, Member] | None:
    """The loop role and the reference process (see the module's docstring)."""
    by_role: dict[str, list[tuple[Member, ProcessSpans]]] = {}
    for m, s in procs:
        if len(s.step_starts):
            by_role.setdefault(m.role, []).append((m, s))
    if not by_role:
        return None

    def mean_step(r: str) -> float:
        ps = [p for _, p in by_role[r]]
        total = sum(sum(p.step_ends) - sum(p.step_starts) for p in ps)
        return total / sum(len(p.step_starts) for p in ps)

    # the fewest processes (a driver, not SPMD ranks), then the longest steps (the outer loop:
    # a trainer's step holds the steps a worker's profiler may count inside it)
    role = min(by_role, key=lambda r: (len(by_role[r]), -mean_step(r), r))
    return role, min(m for m, _ in by_role[role])


def _merged(processes: Iterable[tuple[Member, ProcessSpans]]) -> list[tuple[Member, ProcessSpans]]:
    """One entry per member, sorted (two parts of one member merged): the model does not
    depend on the order the parts came in."""
    by_member: dict[Member, list[ProcessSpans]] = {}
    for m, s in processes:
        by_member.setdefault(m, []).append(s)
    out = []
    for m in sorted(by_member):
        found = by_member[m]
        if len(found) > 1:
            whole = ProcessSpans()
            # (merged in a fixed order: by their own first times)
            for s in sorted(found, key=_order_key):
                whole.merge(s)
            found = [whole.finish()]
        out.append((m, found[0]))
    return out


def _order_key(s: ProcessSpans) -> tuple[int, int, str]:
    first = min((ss.starts[0] for ss in s.phases.values() if len(ss.starts)), default=0)
    return first, len(s.step_starts), s.host


def analyse(processes: Iterable[tuple[Member, ProcessSpans]]) -> StepAnalysis | None:
    """The per-step model of the processes' finished spans (one per member: role and rank);
    None when no process has steps."""
    procs = _merged(processes)
    found = _reference(procs)
    if found is None:
        return None
    loop_role, reference = found
    spans_of = dict(procs)
    clock = _clock(procs)
    ref = spans_of[reference]
    shift_ref = clock.shifts_ns.get(reference, 0)
    total = len(ref.step_starts)
    every = max(1, math.ceil(total / MAX_STEPS))
    steps = []
    for i in range(0, total, every):
        start, end = ref.step_window(i)
        steps.append(StepInfo(ref.step_key(i), start + shift_ref, end + shift_ref))
    windows = [(st.start_ns, st.end_ns) for st in steps]
    rows = []
    for m, s in procs:
        if m.role == loop_role and len(s.step_starts):
            rows.append(_own_row(m, s, [st.key for st in steps]))
        else:
            shift = clock.shifts_ns.get(m, 0)
            rows.append(_row(m, s, [(a - shift, b - shift) for a, b in windows], False))
    model = StepAnalysis(reference, loop_role, steps, rows, clock, total, every)
    for i, st in enumerate(steps):
        st.path = _path(model, spans_of, i)
    for st, what_if in zip(steps, _what_ifs(model)):
        st.what_if = what_if
    for st, tail in zip(steps, _tails(model)):
        st.tail = tail
    model.notes = _notes(model)
    return model


def _row(member: Member, spans: ProcessSpans, windows: list[Span], own: bool) -> ProcessSteps:
    """``member``'s figures in ``windows`` (on its own clock; sorted, disjoint)."""
    busy = spans.busy.clip(windows)
    phases = {}
    split = {}
    for name, s in sorted(spans.phases.items()):
        clipped = s.clip(windows)
        phases[name] = clipped.cover
        if clipped.split:
            split[name] = clipped.split
        for i, doubt in enumerate(clipped.uncertain):
            if doubt > busy.uncertain[i]:
                busy.uncertain[i] = doubt
    length = array("q", (b - a for a, b in windows))
    counted = None
    if len(spans.batches) or MODEL_STEPS.intersection(spans.phases):
        counted = spans.batches.clip(windows)
    return ProcessSteps(
        member, spans.host, own, length, busy.cover, phases, busy.uncertain, split,
        busy.outside, spans.busy.slack, counted,
    )  # fmt: skip


def _own_row(member: Member, spans: ProcessSpans, keys: list[str]) -> ProcessSteps:
    """``member``'s figures in its own steps of the reference's ``keys`` (absent where it has no
    step of that key)."""
    # (keyed steps looked up in a dict made once, not by a search of their list each)
    index = None if spans.step_keys is None else {k: j for j, k in enumerate(spans.step_keys)}
    present = []
    for i, key in enumerate(keys):
        j = spans.step_index(key) if index is None else index.get(key)
        if j is not None:
            present.append((spans.step_window(j), i))
    present.sort()
    row = _row(member, spans, [w for w, _ in present], True)
    n = len(keys)

    def spread(values: array[int], missing: int) -> array[int]:
        out = array("q", [missing]) * n
        for (_, i), v in zip(present, values):
            out[i] = v
        return out

    row.length_ns = spread(row.length_ns, ABSENT)
    row.busy_ns = spread(row.busy_ns, 0)
    row.uncertain_ns = spread(row.uncertain_ns, 0)
    row.phases = {name: spread(v, 0) for name, v in row.phases.items()}
    if row.batches is not None:
        b = row.batches
        row.batches = BatchCounts(
            spread(b.model_steps, 0), spread(b.decode, 0), spread(b.tokens, 0),
            spread(b.reqs, 0), spread(b.known, 0), b.cut,
        )  # fmt: skip
    return row


#: The reference's longest phases of a step that its critical path is chosen from.
PATH_PHASES = 256


def _children(spans: ProcessSpans, a: int, b: int) -> list[PathLink]:
    """The reference's phases inside ``[a, b)`` (its own clock), nested ones left out."""
    found = []
    for name, s in spans.phases.items():
        extent = s.extent(a, b)
        if extent is not None:
            time = s.cover_in(a, b)
            if time > 0:
                found.append((name, s, extent, time))
    # the longest first: a phase is left out when one kept before holds all its time. Only
    # the longest PATH_PHASES can set the step's length; the rest would make this quadratic
    # (a loop of 50,000 phase names took minutes).
    found.sort(key=lambda f: (-f[3], f[0]))
    kept: list[tuple[str, SpanSet, tuple[int, int], int]] = []
    for f in found[:PATH_PHASES]:
        if not any(_inside(f[1], k[1], a, b) for k in kept):
            kept.append(f)
    return [PathLink(name, lo, hi, time) for name, _, (lo, hi), time in kept]


def _inside(inner: SpanSet, outer: SpanSet, a: int, b: int) -> bool:
    """Whether every span of ``inner`` inside ``[a, b)`` lies within a span of ``outer``."""
    i = bisect_right(inner.ends, a)
    j = bisect_left(inner.starts, b)
    for k in range(i, j):
        s, e = max(inner.starts[k], a), min(inner.ends[k], b)
        m = bisect_right(outer.starts, s) - 1
        if m < 0 or outer.ends[m] < e:
            return False
    return True


def _path(model: StepAnalysis, spans_of: dict[Member, ProcessSpans], i: int) -> list[PathLink]:
    """Step ``i``'s critical path (see the module's docstring)."""
    step = model.steps[i]
    shifts = model.clock.shifts_ns
    ref = model.reference
    shift = shifts.get(ref, 0)
    a, b = step.start_ns - shift, step.end_ns - shift  # (the reference's own step)
    links = _children(spans_of[ref], a, b)
    chain: list[PathLink] = []
    t = b
    todo = list(links)
    while todo:
        before = [x for x in todo if x.start_ns < t]
        if not before:
            break
        last = max(before, key=lambda x: (min(x.end_ns, t), x.start_ns))
        chain.append(last)
        todo = [x for x in todo if x is not last]
        t = last.start_ns
    chain.reverse()
    others = [(m, s) for m, s in spans_of.items() if m.role != ref.role and len(s.busy.starts)]
    for link in chain:
        lo, hi = link.start_ns + shift, link.end_ns + shift  # aligned
        best: tuple[int, Member, ProcessSpans] | None = None
        for m, s in others:
            d = shifts.get(m, 0)
            extent = s.busy.extent(lo - d, hi - d)
            if extent is not None and (best is None or extent[1] + d > best[0]):
                best = (extent[1] + d, m, s)
        if best is not None:
            end, m, s = best
            d = shifts.get(m, 0)
            ends = {
                name: ext[1]
                for name, ss in s.phases.items()
                if (ext := ss.extent(lo - d, hi - d)) is not None
            }
            link.waited, link.waited_end_ns = m, end
            link.waited_phase = max(sorted(ends), key=ends.__getitem__, default="")
        link.start_ns, link.end_ns = lo, hi
    return chain


def _what_ifs(model: StepAnalysis) -> list[WhatIf | None]:
    """Per step, what it had taken had the slowest rank of the role's phase with the most to
    gain matched the median (see the module's docstring)."""
    best: list[WhatIf | None] = [None] * len(model.steps)
    groups: dict[tuple[str, str], list[ProcessSteps]] = {}
    for p in model.processes:
        for name in p.phases:
            groups.setdefault((p.member.role, name), []).append(p)
    for (role, name), rows in sorted(groups.items()):
        if len(rows) < 2:
            continue
        ranks = [p.member.rank for p in rows]
        for i, column in enumerate(zip(*(p.phases[name] for p in rows))):
            values = [v for v in column if v > 0]  # (0: the rank did not run it in this step)
            if len(values) < 2:
                continue
            slowest = max(values)
            saving = int(slowest - statistics.median(values))
            if saving > 0 and (best[i] is None or saving > best[i].saving_ns):  # type: ignore[union-attr]
                length = model.steps[i].length_ns
                best[i] = WhatIf(
                    role, name, ranks[column.index(slowest)], slowest,
                    statistics.median(values), saving, max(0, length - saving),
                )  # fmt: skip
    return best


def _tails(model: StepAnalysis) -> list[RolloutTail | None]:
    """Per step, its rollout long tail (see the module's docstring); None where no engine
    ran."""
    engines = [p for p in model.processes if p.batches is not None]
    out: list[RolloutTail | None] = []
    for i in range(len(model.steps)):
        found = []
        for p in engines:
            b = p.batches
            assert b is not None
            rollout = sum(t[i] for name, t in p.phases.items() if name in MODEL_STEPS)
            if rollout <= 0 and b.model_steps[i] <= 0:
                continue
            steps = b.model_steps[i]
            whole = steps > 0 and b.known[i] == steps
            decode = p.phases.get(DECODE)
            found.append(
                EngineStep(
                    p.member, rollout, steps, b.decode[i], 0 if decode is None else decode[i],
                    b.tokens[i] if whole else None, b.reqs[i] if whole else None,
                )
            )  # fmt: skip
        if not found:
            out.append(None)
            continue
        slowest = max(found, key=lambda e: e.rollout_ns)  # (a tie: the first, by role and rank)
        median = statistics.median(e.rollout_ns for e in found)
        share = (slowest.rollout_ns - median) / slowest.rollout_ns if slowest.rollout_ns else 0.0
        out.append(RolloutTail(found, slowest.member, slowest.rollout_ns, median, share))
    return out


def _notes(model: StepAnalysis) -> list[str]:
    notes = []
    if model.every > 1:
        notes.append(
            f"{model.reference.label} has {model.total_steps} steps: every {model.every}th is"
            f" analysed (at most {MAX_STEPS})"
        )
    own = [p for p in model.processes if p.own and p.member != model.reference]
    if own:
        notes.append(
            f"{len(own)} process(es) of {model.loop_role or 'the loop role'} with steps of their"
            " own: attributed to their own steps, matched by key"
        )
    cut = sum(p.batches.cut for p in model.processes if p.batches is not None)
    if cut:
        notes.append(
            f"{cut} run(s) of model steps joined to bound memory crossed a step's edge: each"
            " counted in the step holding its middle"
        )
    rough = [
        (p, max(p.uncertain_ns, default=0) + p.slack_ns)
        for p in model.processes
        if max(p.uncertain_ns, default=0) + p.slack_ns
    ]
    if rough:
        said = ", ".join(f"{p.member.label} (±{u / 1e6:.3f} ms)" for p, u in rough[:5])
        more = f" and {len(rough) - 5} more" if len(rough) > 5 else ""
        notes.append(
            "per-step figures estimated where a step's edge cut spans joined to bound memory"
            f" (more ranges than are kept per process): {said}{more}"
        )
    return notes
