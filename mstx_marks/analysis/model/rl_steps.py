"""Where each RL step's time goes, across every process of the job: the one per-step model that
``summary`` (text, JSON) and ``diff`` render (:func:`analyse` builds it; nothing else computes
these figures).

**Steps.** The process that runs the loop defines the job's steps. Among the processes with
steps of their own (verl's trainer ``step`` timer, or whatever
:mod:`mstx_marks.analysis.model.steps` recognises), the *loop role* is the role with the fewest such
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
than are kept (:mod:`mstx_marks.analysis.model.spans`) and a step's edge cut a span joined to bound
memory: ``uncertain_ns`` says by how much they may be off. Such a process is read a second
time, its spans never joined across the job's step edges (:func:`fences_needed`: ``summary``
does it), so that only a process with more steps than are kept needs it.

**Clocks and processes** (:mod:`mstx_marks.analysis.model.clocks`). A process is its own lane (four
engines of one role and rank are four; a restarted worker's lives are one lane, each placed by
its own clock, and the restart is said). Processes of one machine (one boot id) share its
monotonic clock and are aligned exactly; each other machine's offset is measured from the calls
the reference blocks on, which nest the workers' (NTP-style bounds, intersected), applied, and
its bound stated: a process's time within that bound of a step's edge is counted in
``uncertain_ns``. :class:`ClockNote` says how each machine was placed.

**Critical path** of a step, from the reference's view: its phases inside the step, each
occurrence of one its own link (``update_weights > gen > update > update_weights`` is four;
occurrences nested in another phase's left out), walked back from the step's end, each time the
one that ended last before the point reached (so, in colocated mode, all of them in order; two
occurrences of one phase next to each other on the path are one link); for each, what the
reference waited for: the process of another role running the same phase inside it whose work
there ended last (the call it blocks on: the FSDP ranks' ``compute_log_prob`` inside the
trainer's, not an engine generating the next batch meanwhile), else the process of another
role whose work inside it ended last. **What if** the slowest rank matched the median: only
time on the path can be saved, so for each link, the ranks of the role it waited on that ran
the phase it waited for in the step: the link less ``min(slowest - median, slowest's end - the
next latest end)`` of their time inside it (the link then ends when the next latest rank ends:
[100, 120, 130, 140] saves 10, not 15; a rank done before the link began counts 0 there). The
largest saving of the step is kept.

**Rollout long tail** of a step (:class:`RolloutTail`): the *engines* are the processes with
vLLM's / SGLang's model-step ranges (:data:`~mstx_marks.analysis.model.batches.MODEL_STEPS`); an
engine's rollout time in a step is what those ranges cover there (their union: a prefill that
overlaps a decode counts once). The slowest engine against
the median, and the share of the rollout spent waiting for it, ``(slowest - median) /
slowest``; per engine its model steps, decode steps and their time, and the tokens and
requests of its batches, summed, where every model step there carried them (None: not known,
as from a reader that keeps no args).

>>> from mstx_marks.analysis.model.spans import ProcessSpans
>>> from mstx_marks.analysis.model.steps import Step
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
from operator import add
from typing import Iterable

from mstx_marks.analysis.model.batches import DECODE, MODEL_STEPS, BatchCounts
from mstx_marks.analysis.model.clocks import ClockNote, align, edge_doubt
from mstx_marks.analysis.model.spans import ProcessSpans, SpanSet
from mstx_marks.base.diagnostics import counted
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
    "fences_needed",
]

#: At most this many steps are analysed; a job with more has every k-th analysed (a loop
#: marked per iteration rather than per RL step), which a note says.
MAX_STEPS = 1024
#: A per-step figure of a step a process has no figures for (its own steps lack that key).
ABSENT = -1


@dataclass
class PathLink:
    """One occurrence of a phase on a step's critical path: its time (``time_ns``, what its
    ranges cover), its first start and last end, and what it waited for (``waited``, its phase
    and end, see the module's docstring; None when no process of another role ran then)."""

    phase: str
    start_ns: int
    end_ns: int
    time_ns: int
    waited: Member | None = None
    waited_phase: str = ""
    waited_end_ns: int = 0


@dataclass
class WhatIf:
    """The step had the rank of ``role`` a link of its path waited for (``slowest_rank``,
    ``slowest_ns`` of ``phase`` inside the link) taken the median rank's time there:
    ``step_ns`` long instead (``saving_ns`` less; see the module's docstring)."""

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
    #: What its model-step ranges cover per step, all phases together (an engine's; None for
    #: another process): its rollout time.
    rollout_ns: array[int] | None = None

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
    #: Per member (role and rank) of several processes attributed to these steps by time (four
    #: engines that all say rank 0): what their busy time covers together in each step, and
    #: outside every step (see :meth:`job_steps`).
    joined: dict[Member, tuple[array[int], int]] = field(default_factory=dict)

    def job_steps(self, member: Member) -> tuple[int, int, int, int] | None:
        """``member``'s figures on the job's steps (all its processes together, by role and
        rank), as its role's table gives them: the steps analysed, their time, the time of them
        it ran no phase (its idle), its phases' time outside them; None when it is attributed
        to steps of its own, or has no figures.

        >>> from mstx_marks.analysis.model.spans import ProcessSpans
        >>> from mstx_marks.analysis.model.steps import Step
        >>> t = ProcessSpans(); t.add(0, 30, "gen"); t.set_steps([Step(0, 50, "1", 50)])
        >>> w = ProcessSpans(); w.add(10, 20, "update_actor"); w.add(60, 70, "update_actor")
        >>> model = analyse([(Member("trainer", 0), t.finish()), (Member("worker", 0), w.finish())])
        >>> model.job_steps(Member("worker", 0)), model.job_steps(Member("trainer", 0))
        ((1, 50, 40, 10), None)
        """
        key = Member(member.role, member.rank)
        rows = [p for p in self.processes if Member(p.member.role, p.member.rank) == key]
        if not rows or any(p.own for p in rows):
            return None
        time = sum(st.length_ns for st in self.steps)
        busy, outside = self.joined.get(key) or (rows[0].busy_ns, rows[0].outside_ns)
        return len(self.steps), time, time - sum(busy), outside

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

        >>> from mstx_marks.analysis.model.spans import ProcessSpans
        >>> from mstx_marks.analysis.model.steps import Step
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


def analyse(processes: Iterable[tuple[Member, ProcessSpans]]) -> StepAnalysis | None:
    """The per-step model of the processes' finished spans (one per process: several of one
    member, role and rank, are kept apart or joined as :func:`~.clocks.align` says); None when
    no process has steps."""
    placed = align(processes, _reference)
    procs, found, clock = placed.lanes, placed.found, placed.clock
    if found is None:
        return None
    loop_role, reference = found
    spans_of = dict(procs)
    total, every, steps = _job_steps(spans_of[reference], clock.shifts_ns.get(reference, 0))
    windows = [(st.start_ns, st.end_ns) for st in steps]
    rows = []
    for m, s in procs:
        if m.role == loop_role and len(s.step_starts):
            rows.append(_own_row(m, s, [st.key for st in steps]))
        else:
            shift = clock.shifts_ns.get(m, 0)
            own = [(a - shift, b - shift) for a, b in windows]
            rows.append(_row(m, s, own, False))
            bound = clock.bound_ns.get(m, 0)
            if bound:  # (time that near an edge may lie on its other side)
                doubt = edge_doubt(s, own, bound)
                rows[-1].uncertain_ns = array("q", map(add, rows[-1].uncertain_ns, doubt))
    model = StepAnalysis(reference, loop_role, steps, rows, clock, total, every)
    model.joined = _joined_busy(model, procs, windows)
    for i, st in enumerate(steps):
        st.path = _path(model, spans_of, i)
    for st, what_if in zip(steps, _what_ifs(model, spans_of)):
        st.what_if = what_if
    for st, tail in zip(steps, _tails(model)):
        st.tail = tail
    model.notes = clock.notes + _notes(model)
    return model


def _joined_busy(
    model: StepAnalysis, procs: list[tuple[Member, ProcessSpans]], windows: list[Span]
) -> dict[Member, tuple[array[int], int]]:
    """Per member (role and rank) of several processes not on steps of their own, what their
    busy time covers together in ``windows`` (aligned) and outside them."""
    own = {p.member for p in model.processes if p.own}
    groups: dict[Member, list[tuple[Member, ProcessSpans]]] = {}
    for m, s in procs:
        if m not in own:
            groups.setdefault(Member(m.role, m.rank), []).append((m, s))
    out = {}
    for key, lanes in groups.items():
        if len(lanes) > 1:
            union = SpanSet()
            for m, s in lanes:
                union.merge(s.busy.moved(model.clock.shifts_ns.get(m, 0)))
            clipped = union.clip(windows)
            out[key] = (clipped.cover, clipped.outside)
    return out


def _job_steps(ref: ProcessSpans, shift: int) -> tuple[int, int, list[StepInfo]]:
    """The reference's steps in all, every how many one is analysed, and those analysed (on
    the aligned axis: its own moved by ``shift``)."""
    total = len(ref.step_starts)
    every = max(1, math.ceil(total / MAX_STEPS))
    steps = []
    for i in range(0, total, every):
        start, end = ref.step_window(i)
        steps.append(StepInfo(ref.step_key(i), start + shift, end + shift))
    return total, every, steps


def fences_needed(
    processes: Iterable[tuple[Member, ProcessSpans]],
) -> list[tuple[ProcessSpans, list[int]]]:
    """The processes (their spans, as given to :func:`analyse`) that bounding memory joined
    across one of the job's step edges, each with those edges on its own clock: read again
    with them as fences (``StepOptions.fences``, see :mod:`mstx_marks.analysis.model.spans`), their
    figures are exact. The second pass ``summary`` makes; nothing when every process is exact
    (the common case: no more ranges than are kept), and not a process attributed to its own
    steps (they fence it already) nor the lives of one that restarted (joined by the clocks).

    >>> from mstx_marks.analysis.model.steps import Step
    >>> trainer, engine = ProcessSpans(), ProcessSpans()
    >>> trainer.set_steps([Step(0, 1000, "1", 1000), Step(1000, 2000, "2", 1000)])
    >>> for i in range(200):
    ...     engine.add(10 * i, 10 * i + 4, "decode_batch")
    >>> _ = engine.finish(limit=128)  # every gap alike: joined over the edge at 1000
    >>> [(s is engine, f) for s, f in fences_needed([(Member("t", 0), trainer.finish()),
    ...                                                 (Member("e", 0), engine)])]
    [(True, [0, 1000, 2000])]
    """
    given = list(processes)
    if all(s.exact for _, s in given):
        return []
    placed = align(given, _reference)
    if placed.found is None:
        return []
    loop_role, reference = placed.found
    lanes, shifts = dict(placed.lanes), placed.clock.shifts_ns
    steps = _job_steps(lanes[reference], shifts.get(reference, 0))[2]
    edges = sorted({t for st in steps for t in (st.start_ns, st.end_ns)})
    mine = {id(s) for _, s in given}
    out = []
    for m, s in placed.lanes:
        if (m.role == loop_role and len(s.step_starts)) or id(s) not in mine:
            continue
        own = [t - shifts.get(m, 0) for t in edges]
        if s.joined_across(own):
            out.append((s, own))
    return out


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
    counted = rollout = None
    if len(spans.batches) or MODEL_STEPS.intersection(spans.phases):
        counted = spans.batches.clip(windows)
        rollout = _model_steps(spans).clip(windows).cover
    return ProcessSteps(
        member, spans.host, own, length, busy.cover, phases, busy.uncertain, split,
        busy.outside, spans.busy.slack, counted, rollout,
    )  # fmt: skip


def _model_steps(spans: ProcessSpans) -> SpanSet:
    """What the process's model-step ranges cover, every such phase together."""
    sets = [s for name, s in sorted(spans.phases.items()) if name in MODEL_STEPS]
    if len(sets) == 1:
        return sets[0]
    union = SpanSet()
    for s in sets:
        union.merge(s)
    return union


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
    if row.rollout_ns is not None:
        row.rollout_ns = spread(row.rollout_ns, 0)
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
    """The reference's phases inside ``[a, b)`` (its own clock), each occurrence (a span of a
    phase's union) a link of its own, those nested in another phase's left out."""
    found: list[tuple[int, str, int, int]] = []  # (time, phase, start, end)
    for name, s in spans.phases.items():
        s.settle()
        starts, ends, covers = s.starts, s.ends, s.covers
        for k in range(bisect_right(ends, a), bisect_left(starts, b)):
            lo, hi = max(starts[k], a), min(ends[k], b)
            solid = covers[k] == ends[k] - starts[k]
            time = hi - lo if solid else s.cover_in(lo, hi)
            if time > 0:
                found.append((time, name, lo, hi))
    # the longest first: one is left out when one kept before holds it. Only the longest
    # PATH_PHASES can set the step's length; the rest would make this quadratic (a loop of
    # 50,000 phase names took minutes).
    found.sort(key=lambda f: (-f[0], f[1], f[2]))
    kept: list[tuple[int, str, int, int]] = []
    for f in found[:PATH_PHASES]:
        if not any(k[2] <= f[2] and f[3] <= k[3] for k in kept):
            kept.append(f)
    return [PathLink(name, lo, hi, time) for time, name, lo, hi in kept]


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
    joined: list[PathLink] = []
    for link in chain:  # (occurrences of one phase next to each other: one link)
        if joined and joined[-1].phase == link.phase:
            joined[-1].end_ns = max(joined[-1].end_ns, link.end_ns)
            joined[-1].time_ns += link.time_ns
        else:
            joined.append(link)
    others = [(m, s) for m, s in spans_of.items() if m.role != ref.role and len(s.busy.starts)]
    for link in joined:
        link.start_ns, link.end_ns = link.start_ns + shift, link.end_ns + shift  # aligned
        _waited(link, others, shifts)
    return joined


def _waited(
    link: PathLink, others: list[tuple[Member, ProcessSpans]], shifts: dict[Member, int]
) -> None:
    """Set who ``link`` waited for (see the module's docstring) among ``others``."""
    lo, hi = link.start_ns, link.end_ns
    # Ranked by the end inside the link, then by where that work really ended: two processes
    # both busy to the link's end (a clock offset's bound may shift one past it) are told
    # apart by their own ends, whose order on one machine is exact.
    best: tuple[int, int, Member, ProcessSpans] | None = None
    same: tuple[int, int, Member] | None = None  # (of those running the link's phase)
    for m, s in others:
        d = shifts.get(m, 0)
        extent = s.busy.extent(lo - d, hi - d)
        if extent is None:
            continue
        rank = (extent[1] + d, (s.busy.end_of_last(lo - d, hi - d) or 0) + d)
        if best is None or rank > best[:2]:
            best = (*rank, m, s)
        mine = s.phases.get(link.phase)
        found = None if mine is None else mine.extent(lo - d, hi - d)
        if found is not None and mine is not None:
            rank = (found[1] + d, (mine.end_of_last(lo - d, hi - d) or 0) + d)
            if same is None or rank > same[:2]:
                same = (*rank, m)
    if same is not None:
        link.waited_end_ns, _, link.waited = same
        link.waited_phase = link.phase
    elif best is not None:
        end, _, m, s = best
        d = shifts.get(m, 0)
        ends = {
            name: ext[1]
            for name, ss in s.phases.items()
            if (ext := ss.extent(lo - d, hi - d)) is not None
        }
        link.waited, link.waited_end_ns = m, end
        link.waited_phase = max(sorted(ends), key=ends.__getitem__, default="")


def _what_ifs(model: StepAnalysis, spans_of: dict[Member, ProcessSpans]) -> list[WhatIf | None]:
    """Per step, what it had taken had the slowest rank of the role a link of its path waited
    on matched the median, for the link with the most to gain (see the module's docstring)."""
    by_role: dict[str, list[tuple[Member, ProcessSpans]]] = {}
    for m, s in spans_of.items():
        by_role.setdefault(m.role, []).append((m, s))
    out: list[WhatIf | None] = []
    for step in model.steps:
        best: WhatIf | None = None
        for link in step.path:
            if link.waited is None:
                continue
            ranks = by_role[link.waited.role]
            found = _saving(link, step, link.waited, ranks, model.clock.shifts_ns)
            if found is not None and (best is None or found.saving_ns > best.saving_ns):
                best = found
        if best is not None:
            best.step_ns = max(0, step.length_ns - best.saving_ns)
        out.append(best)
    return out


def _saving(
    link: PathLink,
    step: StepInfo,
    waited: Member,
    ranks: list[tuple[Member, ProcessSpans]],
    shifts: dict[Member, int],
) -> WhatIf | None:
    """What ``link`` saves had ``waited`` matched the median of the ``ranks`` of its role that
    ran the phase it waited for in ``step`` (their time inside the link, and when it ended
    there)."""
    phase = link.waited_phase
    lo, hi = link.start_ns, link.end_ns
    times: dict[Member, int] = {}
    ends: dict[Member, int] = {}
    for m, s in ranks:
        ss = s.phases.get(phase)
        d = shifts.get(m, 0)
        if ss is None or not ss.cover_in(step.start_ns - d, step.end_ns - d):
            continue  # (not a rank of this step's: dead, not yet started, or idle through it)
        times[m] = ss.cover_in(lo - d, hi - d)
        extent = ss.extent(lo - d, hi - d)
        ends[m] = lo if extent is None else extent[1] + d
    if len(times) < 2 or waited not in times:
        return None
    median = statistics.median(times.values())
    later = max((e for m, e in ends.items() if m != waited), default=lo)
    saving = int(min(times[waited] - median, ends[waited] - max(later, lo)))
    if saving <= 0:
        return None
    return WhatIf(waited.role, phase, waited.rank, times[waited], median, saving, 0)


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
            rollout = 0 if p.rollout_ns is None else p.rollout_ns[i]
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
            f"{counted(len(own), 'process', 'processes')} of {model.loop_role or 'the loop role'}"
            " with steps of their own: attributed to their own steps, matched by key"
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
