"""Per-phase statistics, built one process at a time and merged across ranks.

A file is reduced to a :class:`ProcessPart` where it is read (in a worker process, in SQL for a
database): per phase its count, total, extremes, exact p50/p90, a :class:`~.sketch.QuantileSketch`
and, when the phase is short, its sorted durations. The part holds no record, so reading many
ranks costs the memory of one file per worker plus a few numbers per rank and phase.

:func:`combine` turns one part per rank into a :class:`Summary`: per-rank figures are exact;
across ranks, counts, totals, means, maxima and step shares are exact, and p50/p90 are exact
when the ranks' durations add up to at most :data:`POOL_LIMIT` (they are pooled), else read from
the merged sketches within :data:`~.sketch.RELATIVE_ERROR`, which ``Stats.percentile_error``
then says.

**Inclusive and self time.** A phase's ``total_ns`` (and ``step_share``) is inclusive: a phase
nested in another counts in both, so the shares add up to more than the step. Its ``self_ns``
is exclusive: its ranges' time minus the time covered by the ranges they contain on their own
thread (nesting by containment, per process and thread; step ranges are the frame, not a
phase, and stay out of it). In a process whose phases run one at a time inside steps, the self
times and ``Summary.unmarked_ns`` (step time no phase covers) add up to the step time exactly;
ranges concurrent with others (another thread, asyncio tasks gathered on one thread) add
``Summary.concurrent_ns`` beyond it, and ranges outside every step ``Summary.outside_ns``.

**Stages and automatic annotations** (:mod:`mstx_marks.analysis.model.stages`). A range nested
directly
in a range of the same phase of the registry on the same thread counts once, with its parent
(``merged`` says how many, and ``combine`` notes it). PyTorch's own annotations
(``nccl:all_reduce``, ``Optimizer.step#...``, ...) and torch_npu's HCCL ranges are phases marked
``automatic``: counted, but not in the breakdown (no self time, no share of the step), so they
take nothing from the user's phases.

>>> from mstx_marks.base.records import RangeRecord, RankTrace
>>> r = lambda name, s, e: RangeRecord(name, "default", s, e, 1, 1)
>>> part = aggregate_trace(RankTrace(0, [r("step", 0, 100), r("gen", 0, 40)]))
>>> part.phases["generate_sequences"].total_ns, part.step_time_ns
(40, 100)
"""

from __future__ import annotations

from array import array
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from mstx_marks.analysis.model.batches import MODEL_STEPS, Batches
from mstx_marks.analysis.model.mark_pairs import pair_marks
from mstx_marks.analysis.model.quantiles import RELATIVE_ERROR, QuantileSketch, percentile
from mstx_marks.analysis.model.rl_steps import StepAnalysis, analyse
from mstx_marks.analysis.model.spans import ProcessSpans, spans_of_ranges
from mstx_marks.analysis.model.stages import (
    is_automatic,
    merged_note,
    nested_repeats,
    range_name,
    unmarked_method,
    unmarked_note,
)
from mstx_marks.analysis.model.steps import (
    FileTrace,
    Step,
    StepOptions,
    file_notes,
    find_steps,
    fold_name,
    merge_spans,
    step_time_ns,
    step_windows,
)
from mstx_marks.base.phases import MEASURED_ELSEWHERE
from mstx_marks.base.records import Member, RangeRecord, RankTrace, RoundTrip, Span

__all__ = [
    "POOL_LIMIT",
    "SAMPLE_LIMIT",
    "Member",
    "PhaseAgg",
    "PhaseSummary",
    "PoolBudget",
    "ProcessPart",
    "Stats",
    "Summary",
    "aggregate_trace",
    "breakdown",
    "combine",
    "phase_agg",
]

#: A process's phase with at most this many ranges ships its sorted durations with its part.
SAMPLE_LIMIT = 20_000
#: Cross-rank percentiles are exact (durations pooled) up to this many ranges of one phase.
POOL_LIMIT = 200_000


@dataclass
class Stats:
    """Durations of one phase (nanoseconds); ``step_share`` is ``total_ns`` over step time
    (inclusive; None for an automatic annotation, which may run on other threads and outside
    steps); ``percentile_error`` bounds the relative error of ``p50_ns``/``p90_ns`` (0:
    exact); ``self_ns`` is the exclusive time and ``self_share`` it over step time (both None
    for the step phase itself: it is the frame the others are shares of; and for automatic
    annotations, which are not in the breakdown)."""

    count: int
    total_ns: int
    mean_ns: float
    p50_ns: float
    p90_ns: float
    max_ns: int
    step_share: float | None
    percentile_error: float = 0.0
    self_ns: int | None = None
    self_share: float | None = None


@dataclass
class PhaseSummary:
    """One phase of one role: across that role's ranks (``overall``) and on each of its ranks;
    ``imbalance`` is the slowest rank's total over the fastest's, among the role's ranks that ran
    the phase. A phase two roles both ran (the trainer's ``gen`` timer and the agent loop's
    ``generate_sequences``) is two of these: roles are never summed together."""

    name: str
    overall: Stats
    per_rank: dict[int, Stats]
    imbalance: float | None
    slowest_rank: int
    role: str = ""
    #: Whether this phase's ranges are the steps (``step``, ``train_step``, ``--step-name``).
    is_step: bool = False
    #: Whether this phase is an annotation the frameworks make by themselves (PyTorch's
    #: ``nccl:all_reduce``, ``Optimizer.step#...``; torch_npu's HCCL ranges), not the user's:
    #: see :mod:`mstx_marks.analysis.model.stages`.
    automatic: bool = False

    def member(self, rank: int) -> Member:
        return Member(self.role, rank)


@dataclass
class Summary:
    """Everything ``summary`` reports, per :class:`~mstx_marks.base.records.Member` (role, then
    rank); ``phases`` are grouped by role; ``errors`` name the files that were left out."""

    phases: list[PhaseSummary]
    step_time_ns: dict[Member, int]
    step_count: dict[Member, int]
    sources: dict[Member, str]
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: Per member, the keys of its steps in order (see :mod:`mstx_marks.analysis.model.steps`), for
    #: those whose steps are not simply numbered 1, 2, ... (an empty list: numbered in order).
    step_keys: dict[Member, list[str]] = field(default_factory=dict)
    #: Per member, step time no phase covers (on any thread): the breakdown's "unmarked" row.
    unmarked_ns: dict[Member, int] = field(default_factory=dict)
    #: Per member, self time beyond wall time: ranges concurrent with others (threads, asyncio).
    concurrent_ns: dict[Member, int] = field(default_factory=dict)
    #: Per member, time of phases outside every step (counted in shares, not in step time).
    outside_ns: dict[Member, int] = field(default_factory=dict)
    #: The run read when the folder holds several (its id; ``"all"``: every one, summed), and
    #: the ids of the others there, newest first (see :mod:`mstx_marks.analysis.readers.copies`).
    run: str = ""
    other_runs: list[str] = field(default_factory=list)
    #: Where each step's time goes across the processes (None: no process has steps, or
    #: ``StepOptions.per_step`` was off): see :mod:`mstx_marks.analysis.model.rl_steps`.
    per_step: StepAnalysis | None = None
    #: Per member whose steps are the job's (attributed to them by time, see ``per_step``),
    #: the process whose steps they are: its role's table counts them (not its own, if any).
    steps_of: dict[Member, Member] = field(default_factory=dict)
    #: What ``per_step`` was built from, each process's spans (by member): where in each step
    #: its time lay, which the pictures draw (:mod:`mstx_marks.analysis.model.step_bins`).
    step_spans: list[tuple[Member, ProcessSpans]] = field(default_factory=list)

    @property
    def roles(self) -> list[str]:
        """The roles, sorted (``""``: no role known)."""
        return sorted({m.role for m in self.step_time_ns})

    def members(self, role: str | None = None) -> list[Member]:
        """The members (of ``role``), by role, then rank."""
        return sorted(m for m in self.step_time_ns if role is None or m.role == role)

    def phases_of(self, role: str, automatic: bool | None = None) -> list[PhaseSummary]:
        """The phases of ``role`` (only the automatic annotations, or only the others, when
        ``automatic`` says which)."""
        return [
            p
            for p in self.phases
            if p.role == role and (automatic is None or p.automatic == automatic)
        ]


@dataclass
class PhaseAgg:
    """One phase of one process: exact figures, a sketch, and the durations when few."""

    count: int
    total_ns: int
    max_ns: int
    p50_ns: float
    p90_ns: float
    first_start_ns: int
    sketch: QuantileSketch
    sample: array[int] | None
    self_ns: int = 0
    #: The relative error of ``p50_ns``/``p90_ns``: 0 when exact, else read from ``sketch``
    #: (a phase of a file summarised in one pass, :mod:`mstx_marks.analysis.readers.stream`).
    percentile_error: float = 0.0


def phase_agg(ordered: Sequence[int], first_start_ns: int, self_ns: int = 0) -> PhaseAgg:
    """The aggregate of one phase from its durations, sorted.

    >>> a = phase_agg([1, 2, 3, 10], 5)
    >>> a.count, a.total_ns, a.p50_ns, a.max_ns, list(a.sample or [])
    (4, 16, 2.5, 10, [1, 2, 3, 10])
    """
    sketch = QuantileSketch()
    sketch.add_many(ordered)
    sample = array("q", ordered) if len(ordered) <= SAMPLE_LIMIT else None
    return PhaseAgg(
        count=len(ordered),
        total_ns=sum(ordered),
        max_ns=ordered[-1],
        p50_ns=percentile(ordered, 0.5),
        p90_ns=percentile(ordered, 0.9),
        first_start_ns=first_start_ns,
        sketch=sketch,
        sample=sample,
        self_ns=self_ns,
    )


@dataclass
class ProcessPart:
    """What ``summary`` keeps of one process (or of one rank once its processes are joined)."""

    rank: int
    pids: frozenset[int]
    source: Path | None
    role: str = ""
    n_records: int = 0
    #: (earliest start, latest end) of its ranges, None when it has none.
    span: Span | None = None
    first_ns: int | None = None  # earliest timestamp of any record (which clock it is on)
    step_count: int = 0
    step_time_ns: int = 0  # time inside steps, or the whole span when there are none
    #: The steps' keys when they are not 1, 2, ... (kept small: a part holds no list per step).
    step_keys: list[str] = field(default_factory=list)
    phases: dict[str, PhaseAgg] = field(default_factory=dict)
    #: As :class:`~mstx_marks.base.records.RankTrace` says: its run, its instance, the events
    #: its recorder dropped, the lines or rows skipped as unreadable, whether its file is whole.
    run: str = ""
    instance: str = ""
    dropped: int = 0
    skipped: int = 0
    complete: bool = True
    #: The phases whose ranges are the steps, and :func:`breakdown`'s figures.
    step_phases: frozenset[str] = frozenset()
    unmarked_ns: int = 0
    concurrent_ns: int = 0
    outside_ns: int = 0
    #: Summarised in one pass, its records never held (a spill too large: see
    #: :mod:`mstx_marks.analysis.readers.stream`): self times and the breakdown are not known.
    streamed: bool = False
    #: Per phase, its ranges counted once with the range of the same phase around them: how
    #: many, and their time (not in its figures).
    merged: dict[str, int] = field(default_factory=dict)
    merged_ns: dict[str, int] = field(default_factory=dict)
    #: Its file recorded no MSTX range (a torch_npu database without ``MSTX_EVENTS``).
    no_mstx: bool = False
    #: What its file's reader could not use, each naming the file (the summary's notes).
    notes: list[str] = field(default_factory=list)
    #: The hot-path methods its process ran unmarked (``<module>:<Class>.<method>``, sorted):
    #: see :func:`~mstx_marks.analysis.model.stages.unmarked_method`.
    unmarked: list[str] = field(default_factory=list)
    #: What its phases' ranges cover, for the per-step analysis (None when it is off).
    spans: ProcessSpans | None = None
    #: When it joins several processes (one role and rank): each one's, which the per-step
    #: analysis keeps apart (a process is its own lane, on its own clock).
    lanes: list[ProcessSpans] = field(default_factory=list)

    @property
    def member(self) -> Member:
        return Member(self.role, self.rank)

    def set_breakdown(
        self, ranges: list[tuple[Any, int, int, str]], windows: Sequence[Span]
    ) -> ProcessPart:
        """Self times, unmarked, concurrent and outside time from the phases' ``(thread, start,
        -end, name)`` (step ranges left out) and the steps' ``windows`` (see :func:`breakdown`)."""
        if not windows and self.span is not None:
            windows = [self.span]  # no steps: step time is the recorded span
        selfs, self.unmarked_ns, self.concurrent_ns, self.outside_ns = breakdown(ranges, windows)
        for name, agg in self.phases.items():
            agg.self_ns = selfs.get(name, 0)
        return self

    def set_steps(self, steps: list[Step]) -> ProcessPart:
        """Keep what the summary needs of ``steps``: their number, time and unusual keys."""
        self.step_count = len(steps)
        self.step_time_ns = step_time_ns(steps, self.span)
        ordinal = all(s.key == str(i) for i, s in enumerate(steps, start=1))
        self.step_keys = [] if ordinal else [s.key for s in steps]
        return self


def aggregate_trace(
    trace: RankTrace,
    fold: Callable[[str], str] = fold_name,
    steps: StepOptions | None = None,
) -> ProcessPart:
    """The :class:`ProcessPart` of an in-memory trace (``X_start``/``X_stop`` marks paired)."""
    records = pair_marks(trace.records)
    paired = replace(trace, records=records)  # (a FileTrace keeps its step ids)
    options = (steps or StepOptions()).resolved(
        r.name for r in records if isinstance(r, RangeRecord)
    )
    step_phases: set[str] = set()
    nested: list[tuple[Any, int, int, str]] = []  # the stages, for the breakdown
    batches = Batches(options.fences)
    durations: dict[str, list[int]] = {}
    first: dict[str, int] = {}
    lo = hi = None
    backwards = 0
    unmarked: set[str] = set()
    trips: list[RoundTrip] = []
    for r in records:
        if not isinstance(r, RangeRecord):
            method = unmarked_method(r.name, r.domain)
            if method is not None:
                unmarked.add(method)
            trip = RoundTrip.of(r.name, r.domain, r.args)
            if trip is not None:
                trips.append(trip)
            continue
        if r.end_ns < r.start_ns:  # ends before it starts: no duration to count
            backwards += 1
            continue
        raw = range_name(r.name, r.domain)
        name = fold(raw)
        if options.is_step(raw, fold):
            step_phases.add(name)
            durations.setdefault(name, []).append(r.end_ns - r.start_ns)
        elif is_automatic(name):
            durations.setdefault(name, []).append(r.end_ns - r.start_ns)
        else:
            nested.append(((r.pid, r.thread), r.start_ns, -r.end_ns, name))
            if name in MODEL_STEPS:  # (with its batch's reqs and tokens)
                batches.add(r.start_ns, r.end_ns, name, r.args)
        if name not in first or r.start_ns < first[name]:
            first[name] = r.start_ns
        lo = r.start_ns if lo is None else min(lo, r.start_ns)
        hi = r.end_ns if hi is None else max(hi, r.end_ns)
    repeats = set(nested_repeats(nested))
    merged: Counter[str] = Counter()
    merged_ns: Counter[str] = Counter()
    for i, (_, start, neg_end, name) in enumerate(nested):
        if i in repeats:
            merged[name] += 1
            merged_ns[name] += -neg_end - start
        else:
            durations.setdefault(name, []).append(-neg_end - start)
    found = find_steps(paired, steps, fold)
    part = (
        ProcessPart(
            rank=trace.rank,
            pids=frozenset(r.pid for r in records),
            source=trace.source,
            role=trace.role,
            n_records=len(records),
            span=None if lo is None or hi is None else (lo, hi),
            first_ns=min((r.start_ns for r in records), default=None),
            phases={name: phase_agg(sorted(d), first[name]) for name, d in durations.items()},
            run=trace.run,
            instance=trace.instance,
            dropped=trace.dropped,
            skipped=trace.skipped + backwards,
            complete=trace.complete,
            step_phases=frozenset(step_phases),
            merged=dict(merged),
            merged_ns=dict(merged_ns),
            no_mstx=isinstance(trace, FileTrace) and trace.no_mstx,
            notes=list(file_notes(trace)),
            unmarked=sorted(unmarked),
        )
        .set_steps(found)
        .set_breakdown(nested, step_windows(paired, steps, fold))
    )
    if options.per_step:  # (nested now sorted by thread, then start)
        part.spans = spans_of_ranges(nested, found, batches=batches, fences=options.fences)
        part.spans.identify(trace.origin, part.pids, trace.instance).round_trips = trips
        lives = (aggregate_trace(life, fold, steps).spans for life in trace.lives)
        part.lanes = [s for s in lives if s is not None]
    return part


def _measure(spans: Sequence[Span]) -> int:
    return sum(e - s for s, e in spans)


def _overlap(a: Sequence[Span], b: Sequence[Span]) -> int:
    """The time two sorted lists of disjoint spans share."""
    i = j = total = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def breakdown(
    ranges: list[tuple[Any, int, int, str]], windows: Sequence[Span]
) -> tuple[dict[str, int], int, int, int]:
    """``(self time per phase, unmarked, concurrent, outside)`` of one process's phases, given
    as ``(thread, start, -end, name)`` (step ranges left out; the end negated so that plain
    tuple order puts a range before what it contains; sorted here, in place), in steps covering
    ``windows`` (sorted, disjoint).

    A range's self time is its duration minus the union of the ranges it contains on its
    thread; *unmarked* is the time of ``windows`` no range covers; *concurrent* is how much the
    self times add beyond the time the ranges cover (0 when they run one at a time), and
    *outside* the covered time outside ``windows``. So ``sum(self) + unmarked`` is the windows'
    time plus ``concurrent + outside``.

    >>> t = [(1, 0, -100, "gen"), (1, 10, -40, "one"), (1, 50, -90, "one"), (1, 60, -70, "x")]
    >>> selfs, unmarked, concurrent, outside = breakdown(t, [(0, 120)])
    >>> sorted(selfs.items()), unmarked, concurrent, outside
    ([('gen', 30), ('one', 60), ('x', 10)], 20, 0, 0)
    >>> breakdown([(1, 0, -10, "a"), (1, 5, -15, "a")], [(0, 15)])  # two tasks on one thread
    ({'a': 20}, 0, 5, 0)
    """
    selfs: dict[str, int] = {}
    spans: list[Span] = []  # per thread, the time its ranges cover, as disjoint spans
    # [end, start, name, covered, covered_end] of the ranges that may hold a later one, outer
    # first, each inside the one below it
    stack: list[list[Any]] = []
    nothing = thread = object()
    lo = hi = 0

    def close(x: list[Any]) -> None:
        selfs[x[2]] = selfs.get(x[2], 0) + (x[0] - x[1] - x[3])

    ranges.sort()
    for key, s, neg_end, name in ranges:
        e = -neg_end
        if key != thread:
            for x in stack:
                close(x)
            if thread is not nothing:  # the previous thread's last covered span
                spans.append((lo, hi))
            stack, thread, lo, hi = [], key, s, e
        elif s > hi:
            spans.append((lo, hi))
            lo, hi = s, e
        elif e > hi:
            hi = e
        # The stack is a chain, each range inside the one below it. One that ends before this
        # one does cannot hold it nor any later range (this one would hold that one, and starts
        # later): it is done. So only the top is ever popped, and staggered overlaps (asyncio
        # tasks) cost no rescans.
        while stack and stack[-1][0] < e:
            close(stack.pop())
        if stack:  # the innermost range that contains this one
            x = stack[-1]
            if s >= x[4]:
                x[3] += e - s
                x[4] = e
            elif e > x[4]:
                x[3] += e - x[4]
                x[4] = e
        stack.append([e, s, name, 0, s])
    for x in stack:
        close(x)
    if ranges:
        spans.append((lo, hi))
    for name in selfs:
        selfs[name] = max(selfs[name], 0)
    covered = merge_spans(spans)
    inside = _overlap(covered, windows)
    concurrent = max(0, sum(selfs.values()) - _measure(covered))
    return selfs, _measure(windows) - inside, concurrent, _measure(covered) - inside


class PoolBudget:
    """Keeps the parts' sorted durations only while they can still be pooled.

    A phase whose durations across the parts seen pass :data:`POOL_LIMIT` (or of which one
    part had too many to ship) will be read from sketches: its durations are dropped from every
    part at once, so the parts held stay a few numbers each, however many ranks there are.
    """

    def __init__(self) -> None:
        self.pooled: dict[str, int] = {}
        self.over: set[str] = set()
        self.parts: list[ProcessPart] = []

    def admit(self, part: ProcessPart) -> None:
        self.parts.append(part)
        for name, agg in part.phases.items():
            if name in self.over:
                agg.sample = None
                continue
            self.pooled[name] = self.pooled.get(name, 0) + agg.count
            if agg.sample is None or self.pooled[name] > POOL_LIMIT:
                self.over.add(name)
                for other in self.parts:
                    if name in other.phases:
                        other.phases[name].sample = None


def _stats(count: int, total: int, max_ns: int, p50: float, p90: float, step: int) -> Stats:
    return Stats(count, total, total / count, p50, p90, max_ns, total / step if step else None)


def _with_self(stats: Stats, self_ns: int | None, step: int) -> Stats:
    if self_ns is not None:
        stats.self_ns = self_ns
        stats.self_share = self_ns / step if step else None
    return stats


def _overall(aggs: list[PhaseAgg], step_time: int) -> Stats:
    count = sum(a.count for a in aggs)
    total = sum(a.total_ns for a in aggs)
    max_ns = max(a.max_ns for a in aggs)
    if len(aggs) == 1:
        a = aggs[0]
        stats = _stats(count, total, max_ns, a.p50_ns, a.p90_ns, step_time)
        stats.percentile_error = a.percentile_error
        return stats
    samples = [a.sample for a in aggs]
    if count <= POOL_LIMIT and all(s is not None for s in samples):
        pooled = sorted(v for s in samples if s is not None for v in s)
        return _stats(
            count, total, max_ns, percentile(pooled, 0.5), percentile(pooled, 0.9), step_time
        )
    merged = QuantileSketch()
    for a in aggs:
        merged.merge(a.sketch)
    stats = _stats(count, total, max_ns, merged.quantile(0.5), merged.quantile(0.9), step_time)
    stats.percentile_error = RELATIVE_ERROR
    return stats


def combine(parts: Iterable[ProcessPart]) -> Summary:
    """The summary of one part per member (role and rank): per role, its phases in order of
    first start, each across that role's ranks and on each of them; its notes say what the
    files' readers could not use, which ranges were counted once with the range around them,
    which hot-path methods ran unmarked, and which members' files recorded no MSTX range."""
    by_member = {p.member: p for p in sorted(parts, key=lambda p: p.member)}
    spans = [(m, s) for m, p in by_member.items() for s in _lanes(p)]
    per_step = analyse(spans)
    step_time = {m: p.step_time_ns for m, p in by_member.items()}
    known = {m: p for m, p in by_member.items() if not p.streamed}  # breakdown known
    summary = Summary(
        phases=[],
        step_time_ns=step_time,
        step_count={m: p.step_count for m, p in by_member.items()},
        sources={m: str(p.source) for m, p in by_member.items()},
        step_keys={m: p.step_keys for m, p in by_member.items()},
        unmarked_ns={m: p.unmarked_ns for m, p in known.items()},
        concurrent_ns={m: p.concurrent_ns for m, p in known.items()},
        outside_ns={m: p.outside_ns for m, p in known.items()},
        notes=_notes(by_member),
        per_step=per_step,
        step_spans=spans,
    )
    if per_step is not None:
        _on_job_steps(summary, per_step)
    for role in sorted({m.role for m in by_member}):
        ranks = {m.rank: p for m, p in by_member.items() if m.role == role}
        summary.phases += _role_phases(role, ranks, {r: step_time[Member(role, r)] for r in ranks})
    return summary


def _on_job_steps(summary: Summary, model: StepAnalysis) -> None:
    """Each member with no steps of its own, which the per-step model attributes to the job's
    steps by time, has them in its role's table too (not the span of its ranges): their number,
    time, the time of them it ran no phase, and its phases' time outside them. One job, one set
    of steps (a process that counts steps of its own keeps them there)."""
    keys = [st.key for st in model.steps]
    ordinal = all(k == str(i) for i, k in enumerate(keys, start=1))
    for m in summary.members():
        figures = None if summary.step_count[m] else model.job_steps(m)
        if figures is None:
            continue
        summary.step_count[m], summary.step_time_ns[m], idle, outside = figures
        summary.step_keys[m] = [] if ordinal else keys
        summary.steps_of[m] = model.reference
        if m in summary.unmarked_ns:  # (not known of a process summarised in one pass)
            summary.unmarked_ns[m], summary.outside_ns[m] = idle, outside


def _lanes(part: ProcessPart) -> list[ProcessSpans]:
    """The spans of each process of ``part`` (one, unless it joins several; none when the
    per-step analysis is off)."""
    return part.lanes or ([] if part.spans is None else [part.spans])


def _notes(by_member: dict[Member, ProcessPart]) -> list[str]:
    notes = [note for p in by_member.values() for note in p.notes]
    merged: Counter[str] = Counter()
    merged_ns: Counter[str] = Counter()
    for p in by_member.values():
        merged.update(p.merged)
        merged_ns.update(p.merged_ns)
    if merged:
        notes.append(merged_note(dict(merged), dict(merged_ns)))
    unmarked = {m.label: p.unmarked for m, p in by_member.items() if p.unmarked}
    if unmarked:
        notes.append(unmarked_note(unmarked))
    notes += _measured_elsewhere(by_member)
    bare = [f"{m.label} ({p.source})" for m, p in by_member.items() if p.no_mstx]
    if bare:
        notes.append(
            "no MSTX range was recorded in "
            + ", ".join(bare)
            + " (the database has no MSTX_EVENTS table: torch_npu creates it only when a range"
            " was recorded); only the steps are read"
        )
    return notes


def _measured_elsewhere(by_member: dict[Member, ProcessPart]) -> list[str]:
    """A note for each range that ends after the work it times (the one-step-off trainer's
    ``generate_async``), naming the phase that measures that work and where it ran."""
    notes = []
    for late, real in MEASURED_ELSEWHERE.items():
        found = [(m, p.phases[late]) for m, p in by_member.items() if late in p.phases]
        if not found:
            continue
        # Elsewhere: not the processes timing it late (the trainer's `gen` folds to the same
        # phase, and is only its wait).
        elsewhere = {
            m: p for m, p in by_member.items() if real in p.phases and late not in p.phases
        }
        measuring = [p.phases[real] for p in elsewhere.values()]
        where = sorted({m.label for m in elsewhere})
        late_ms = max(a.p50_ns for _, a in found) / 1e6
        text = (
            f"{late} ({', '.join(sorted({m.label for m, _ in found}))}, median {late_ms:.1f} ms)"
            f" ends when its process's event loop next runs after the work it times ended: it"
            f" overstates that work; {real} measures it"
        )
        if where:
            real_ms = max(a.p50_ns for a in measuring) / 1e6
            text += f" in {', '.join(where)} (median {real_ms:.1f} ms)"
        notes.append(text)
    return notes


def _role_phases(
    role: str, by_rank: dict[int, ProcessPart], step_time: dict[int, int]
) -> list[PhaseSummary]:
    names: dict[str, int] = {}
    for p in by_rank.values():
        for name, a in p.phases.items():
            names[name] = min(names.get(name, a.first_start_ns), a.first_start_ns)
    result = []
    for name in sorted(names, key=names.__getitem__):
        aggs = {rank: p.phases[name] for rank, p in by_rank.items() if name in p.phases}
        is_step = any(name in by_rank[rank].step_phases for rank in aggs)
        automatic = not is_step and is_automatic(name)
        # Self time: none for the step phase (the frame) nor for an automatic annotation (not
        # in the breakdown); not known on a rank summarised in one pass, nor then across the
        # role's ranks (a sum of the rest would be too small).
        unknown = {rank for rank in aggs if is_step or automatic or by_rank[rank].streamed}
        per_rank = {
            rank: _with_self(
                _stats(a.count, a.total_ns, a.max_ns, a.p50_ns, a.p90_ns, step_time[rank]),
                None if rank in unknown else a.self_ns,
                step_time[rank],
            )
            for rank, a in aggs.items()
        }
        for rank, a in aggs.items():
            per_rank[rank].percentile_error = a.percentile_error
        step_sum = sum(step_time[rank] for rank in aggs)
        overall = _with_self(
            _overall(list(aggs.values()), step_sum),
            None if unknown else sum(a.self_ns for a in aggs.values()),
            step_sum,
        )
        if automatic:  # on any thread, inside steps or not: no share of them
            for stats in (overall, *per_rank.values()):
                stats.step_share = None
        totals = {rank: s.total_ns for rank, s in per_rank.items()}
        slowest = max(totals, key=totals.__getitem__)
        fastest = min(totals.values())
        imbalance = totals[slowest] / fastest if fastest else None
        result.append(
            PhaseSummary(name, overall, per_rank, imbalance, slowest, role, is_step, automatic)
        )
    return result
