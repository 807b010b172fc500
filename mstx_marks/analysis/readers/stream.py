"""Spills (and large Chrome traces) too large to hold in memory, summarised in one pass: a few
numbers per phase.

A spill (the flight recorder's file, :mod:`mstx_marks.export.spill`) grows as long as its
process records: tens of millions of events make a file of a gigabyte or two, and holding them
as records for :func:`~mstx_marks.analysis.model.aggregate.aggregate_trace` takes about 600 bytes
each. ``summary`` therefore holds a spill's records only up to :data:`MAX_HELD_EVENTS`, and only
when its file is at most :data:`MAX_SPILL_BYTES` (:func:`aggregate_spill`); past either, its
records go through a :class:`StreamAggregator` as they are read, and are dropped.

The aggregator keeps, per phase, its count, total, maximum, first start and a
:class:`~mstx_marks.analysis.model.quantiles.QuantileSketch` (and its durations while there are at
most :data:`~mstx_marks.analysis.model.aggregate.SAMPLE_LIMIT`, so a short phase's p50/p90 stay
exact
and poolable across ranks); the start and end of the ranges that may be steps (steps are few:
16 bytes each, and their ``--step-key`` values when they have one); and the ``X_start`` /
``X_stop`` instants (rare: 9 bytes each), paired at the end as
:mod:`~mstx_marks.analysis.model.mark_pairs` pairs them. Counts, totals, maxima, steps and step time
are then exact, and p50/p90 within :data:`~mstx_marks.analysis.model.quantiles.RELATIVE_ERROR`.

**One pass.** Which default step name a trace uses (:meth:`StepOptions.resolved`) depends on
every range name it holds, so the ranges of each of
:data:`~mstx_marks.analysis.model.steps.DEFAULT_STEP_NAMES` are kept until the end, and those of the
name chosen then make the steps: the file is read once.

**Chrome traces.** A Chrome trace too large to parse whole
(:data:`~mstx_marks.analysis.readers.chrome_json.WHOLE_JSON_BYTES`) is read one event at a time
(:class:`~mstx_marks.analysis.readers.chrome_json.JsonEvents`), and its records go through a
:class:`HoldOrStream`: held while the file has at most :data:`MAX_HELD_EVENTS` of them (then
aggregated exactly, as a spill is), else each of its processes (ours hold one per rank) through
a :class:`StreamAggregator`. Timelines take such a file only while it holds at most as many
(:func:`read_held`).

**Stages marked twice** (a range nested directly in one of the same phase on its thread, counted
once: :mod:`~mstx_marks.analysis.model.stages`) are found as the ranges are read, by a
:class:`~mstx_marks.analysis.model.stages.NestFrontier` per thread, which holds only the ranges a
later one may still nest in or around: a stage range is counted once that is known. Ranges come
in the order their file holds them: a spill's as they ended, a Chrome trace's as they started;
both are placed exactly.

**What it cannot give:** the breakdown (self times, unmarked, concurrent and outside-step time)
nests each thread's ranges, which takes all of them at once. The part says ``streamed``; the
summary shows those figures as not known (``-``) and a note names the file.

>>> from mstx_marks.base.records import RangeRecord, RankTrace
>>> agg = StreamAggregator()
>>> for s in (0, 100):
...     agg.add(RangeRecord("step", "default", s, s + 90, 1, 7))
...     agg.add(RangeRecord("gen", "default", s, s + 40, 1, 7))
>>> part = agg.part(RankTrace(0, []))
>>> part.step_count, part.step_time_ns, part.phases["generate_sequences"].total_ns, part.streamed
(2, 180, 80, True)
"""

from __future__ import annotations

import os
from array import array
from pathlib import Path
from typing import Any, Callable, Mapping

from mstx_marks.analysis.model.aggregate import (
    SAMPLE_LIMIT,
    PhaseAgg,
    ProcessPart,
    aggregate_trace,
)
from mstx_marks.analysis.model.mark_pairs import START_SUFFIX, STOP_SUFFIX
from mstx_marks.analysis.model.quantiles import RELATIVE_ERROR, QuantileSketch, percentile
from mstx_marks.analysis.model.spans import ProcessSpans
from mstx_marks.analysis.model.stages import (
    UNCOVERED_DOMAIN,
    NestFrontier,
    is_automatic,
    range_name,
    unmarked_method,
)
from mstx_marks.analysis.model.steps import (
    DEFAULT_STEP_NAMES,
    Step,
    StepOptions,
    file_notes,
    fold_name,
    steps_from_ranges,
    steps_from_spans,
    with_notes,
)
from mstx_marks.base.records import (
    CLOCK_DOMAIN,
    InstantRecord,
    RangeRecord,
    RankTrace,
    Record,
    RoundTrip,
    Span,
    TraceFileError,
)
from mstx_marks.export.chrome import RecordSink
from mstx_marks.export.spill import read_spill

__all__ = [
    "MAX_HELD_EVENTS",
    "MAX_SPILL_BYTES",
    "HoldOrStream",
    "StreamAggregator",
    "TooLargeToHold",
    "aggregate_spill",
    "aggregate_spill_stream",
    "read_held",
    "read_spill_held",
    "spill_trace",
]

#: A spill's records are held (for self times and timelines) up to this many events. Measured
#: (``benchmarks/summary_memory.py 1e6 --in-memory``, Python 3.11): the in-memory summary of a
#: spill of a million events peaks at 576 MB of RSS (records, their sorted copies and the
#: per-thread nesting; about 18 times the 31 MB file), so one file's reading stays near
#: 600 MB, under the 1 GB a summary may use, with a margin for what else it holds. A Chrome
#: trace of a million events read an event at a time, the same: 544 to 664 MB.
MAX_HELD_EVENTS = 1_000_000
#: A spill file larger than this is streamed from its first event (and never drawn). Events in
#: blocks take about 32 bytes each on disk, so this is past two million of them, which
#: :data:`MAX_HELD_EVENTS` refuses anyway; it bounds the events written as JSON lines with user
#: arguments: measured, 143 bytes each on disk and 1160 in memory (581 MB for 500 000), so the
#: most this lets through (about 470 000) take about 550 MB.
MAX_SPILL_BYTES = 64 << 20
#: Durations wait in a list until this many, then are counted at once (a C-speed ``sum`` and
#: ``max`` and one sketch loop per batch, not a Python call per event).
_BATCH = 8192
_NEVER = 1 << 63  # past every int64 timestamp


class TooLargeToHold(TraceFileError):
    """A spill or Chrome trace with more events (or bytes) than are read whole here; the message
    names it."""


class _Full(Exception):
    """Raised from a sink to stop reading (never a ValueError: the reader would skip it)."""


class _Phase:
    """One phase's running figures; its durations wait in ``pending`` (see :data:`_BATCH`)."""

    __slots__ = ("count", "first", "max", "pending", "sample", "sketch", "total")

    def __init__(self) -> None:
        self.count = self.total = self.max = 0
        self.first = _NEVER  # the earliest start (a name seen only ending before it starts: none)
        self.pending: list[int] = []
        self.sketch = QuantileSketch()
        #: Every duration while there are at most SAMPLE_LIMIT (then None).
        self.sample: array[int] | None = array("q")

    def flush(self) -> None:
        d = self.pending
        if not d:
            return
        self.count += len(d)
        self.total += sum(d)
        self.max = max(self.max, max(d))
        self.sketch.add_many(d)
        if self.sample is not None:
            if self.count <= SAMPLE_LIMIT:
                self.sample.extend(d)
            else:
                self.sample = None
        self.pending = []

    def merge(self, other: _Phase) -> None:
        self.flush()
        other.flush()
        self.count += other.count
        self.total += other.total
        self.max = max(self.max, other.max)
        self.first = min(self.first, other.first)
        self.sketch.merge(other.sketch)
        if self.sample is None or other.sample is None or self.count > SAMPLE_LIMIT:
            self.sample = None
        else:
            self.sample.extend(other.sample)

    def agg(self) -> PhaseAgg:
        self.flush()
        if self.sample is not None:  # few: exact, as phase_agg gives them
            ordered = sorted(self.sample)
            p50, p90, error = percentile(ordered, 0.5), percentile(ordered, 0.9), 0.0
            sample: array[int] | None = array("q", ordered)
        else:
            p50, p90 = self.sketch.quantile(0.5), self.sketch.quantile(0.9)
            error, sample = RELATIVE_ERROR, None
        return PhaseAgg(
            self.count, self.total, self.max, p50, p90, self.first, self.sketch, sample,
            percentile_error=error,
        )  # fmt: skip


class _StepRanges:
    """The ranges of one name that may be steps: starts, ends, and their step-key values."""

    __slots__ = ("ends", "keys", "starts")

    def __init__(self) -> None:
        self.starts, self.ends = array("q"), array("q")
        self.keys: dict[int, Any] = {}  # index -> value of args[key] (only those that have it)

    def add(self, start: int, end: int, value: Any) -> None:
        if value is not None:
            self.keys[len(self.starts)] = value
        self.starts.append(start)
        self.ends.append(end)

    def extend(self, other: _StepRanges) -> None:
        base = len(self.starts)
        self.keys.update((base + i, v) for i, v in other.keys.items())
        self.starts.extend(other.starts)
        self.ends.extend(other.ends)


class _Marks:
    """The ``X_start``/``X_stop`` instants of one (pid, thread, X), in the order read."""

    __slots__ = ("is_start", "keys", "times")

    def __init__(self) -> None:
        self.times = array("q")
        self.is_start = bytearray()
        self.keys: dict[int, Any] = {}  # index -> a start mark's step-key value

    def extend(self, other: _Marks) -> None:
        base = len(self.times)
        self.keys.update((base + i, v) for i, v in other.keys.items())
        self.times.extend(other.times)
        self.is_start.extend(other.is_start)


class StreamAggregator:
    """A :class:`~mstx_marks.analysis.model.aggregate.ProcessPart` built one record at a time (see
    the
    module's docstring): :meth:`add` each record, in any order, then :meth:`part`.
    (:class:`HoldOrStream` holds a file's records while they are few enough to aggregate
    exactly, and hands them to aggregators past that.)
    """

    def __init__(
        self,
        fold: Callable[[str], str] = fold_name,
        steps: StepOptions | None = None,
    ) -> None:
        self.fold = fold
        self.options = steps or StepOptions()
        self.n_records = 0
        self.backwards = 0  # ranges that end before they start: skipped, as aggregate_trace does
        self.pids: set[int] = set()
        self.first_ns: int | None = None
        self.hi: int | None = None
        #: Per range name as written: its phase, when it may be a step its step ranges, and
        #: its phase's name when it is one of the stages (not a step nor an automatic one).
        self.names: dict[str, tuple[_Phase, _StepRanges | None, str | None]] = {}
        self.phases: dict[str, _Phase] = {}
        self.marks: dict[tuple[int, int, str], _Marks] = {}
        #: Steps the files list (a Chrome trace's, a database's), as find_steps prefers them,
        #: and their ids where the file gives them.
        self.file_steps: set[Span] = set()
        self.file_step_keys: dict[Span, str] = {}
        #: Per thread, its stage ranges a later one may still nest in or around.
        self.frontiers: dict[tuple[int, int], NestFrontier] = {}
        #: Per phase, its ranges counted once with the range of the same phase around them,
        #: and their time.
        self.merged: dict[str, int] = {}
        self.merged_ns: dict[str, int] = {}
        #: The hot-path methods the process ran unmarked (its ``uncovered`` instants).
        self.unmarked: set[str] = set()
        #: What its stage ranges cover, for the per-step analysis (in bounded memory).
        self.spans = ProcessSpans(fences=self.options.fences) if self.options.per_step else None

    def may_be_step(self, name: str) -> bool:
        """Whether ranges called ``name`` may turn out to be steps (before the names are all
        known: every default step name may)."""
        o = self.options
        if o.name is None and o.default is None:
            return name in DEFAULT_STEP_NAMES
        return o.is_step(name, self.fold)

    def add(self, rec: Record) -> None:
        """Count one record (what :func:`~mstx_marks.export.spill.read_spill` hands its sink)."""
        self.n_records += 1
        self.pids.add(rec.pid)
        start = rec.start_ns
        if self.first_ns is None or start < self.first_ns:
            self.first_ns = start
        if isinstance(rec, RangeRecord):
            self._range(
                range_name(rec.name, rec.domain), start, rec.end_ns, rec.args,
                (rec.pid, rec.thread),
            )  # fmt: skip
        elif rec.name.endswith((START_SUFFIX, STOP_SUFFIX)):
            self._mark(rec)
        elif rec.domain == UNCOVERED_DOMAIN:
            method = unmarked_method(rec.name, rec.domain)
            if method is not None:
                self.unmarked.add(method)
        elif rec.domain == CLOCK_DOMAIN and self.spans is not None:
            trip = RoundTrip.of(rec.name, rec.domain, rec.args)
            if trip is not None:
                self.spans.round_trips.append(trip)

    def add_file_steps(self, steps: list[Step]) -> None:
        """Steps the file lists (a database's ``STEP_TIME``), with their ids."""
        for s in steps:
            self.file_steps.add((s.start_ns, s.end_ns))
            self.file_step_keys[(s.start_ns, s.end_ns)] = s.key

    def _range(
        self,
        name: str,
        start: int,
        end: int,
        args: Mapping[str, Any] | None,
        thread: tuple[int, int],
    ) -> None:
        entry = self.names.get(name)
        if entry is None:
            entry = self._name(name)
        phase, steps, stage = entry
        if steps is not None:  # (find_steps takes one that ends before it starts too)
            steps.add(start, end, args.get(self.options.key) if args else None)
        if end < start:
            self.backwards += 1
            return
        if start < phase.first:
            phase.first = start
        if self.hi is None or end > self.hi:
            self.hi = end
        if stage is not None:  # counted once whether it repeats the stage around it is known
            if self.spans is not None:
                self.spans.add(start, end, stage, args)
            frontier = self.frontiers.get(thread)
            if frontier is None:
                frontier = self.frontiers[thread] = NestFrontier(self._settle)
            frontier.add(start, end, stage, (phase, end - start, stage))
            return
        phase.pending.append(end - start)
        if len(phase.pending) >= _BATCH:
            phase.flush()

    def _settle(self, payload: tuple[_Phase, int, str], repeat: bool) -> None:
        phase, duration, name = payload
        if repeat:
            self.merged[name] = self.merged.get(name, 0) + 1
            self.merged_ns[name] = self.merged_ns.get(name, 0) + duration
            return
        phase.pending.append(duration)
        if len(phase.pending) >= _BATCH:
            phase.flush()

    def _settle_all(self) -> None:
        frontiers, self.frontiers = self.frontiers, {}
        for frontier in frontiers.values():
            frontier.close()

    def _name(self, name: str) -> tuple[_Phase, _StepRanges | None, str | None]:
        folded = self.fold(name)
        phase = self.phases.get(folded)
        if phase is None:
            phase = self.phases[folded] = _Phase()
        may_be_step = self.may_be_step(name)
        stage = None if may_be_step or is_automatic(folded) else folded
        entry = (phase, _StepRanges() if may_be_step else None, stage)
        self.names[name] = entry
        return entry

    def _mark(self, rec: InstantRecord) -> None:
        start = rec.name.endswith(START_SUFFIX)
        base = rec.name[: -len(START_SUFFIX if start else STOP_SUFFIX)]
        key = (rec.pid, rec.thread, base)
        marks = self.marks.get(key)
        if marks is None:
            marks = self.marks[key] = _Marks()
        if start and rec.args and self.may_be_step(base):
            value = rec.args.get(self.options.key)
            if value is not None:
                marks.keys[len(marks.times)] = value
        marks.times.append(rec.start_ns)
        marks.is_start.append(start)

    def _pair_marks(self) -> None:
        """Each stop closes the latest unmatched start of its pid, thread and name, in time
        order (ties in the order read), as :func:`~mstx_marks.analysis.model.mark_pairs.pair_marks`
        does; a pair counts as one range, and unmatched marks stay instants."""
        marks, self.marks = self.marks, {}
        for (pid, tid, base), m in marks.items():
            times = m.times
            order: Any = range(len(times))
            if any(times[i] > times[i + 1] for i in range(len(times) - 1)):
                order = sorted(order, key=times.__getitem__)
            open_: list[int] = []
            for i in order:
                if m.is_start[i]:
                    open_.append(i)
                elif open_:
                    j = open_.pop()
                    value = m.keys.get(j)
                    args = None if value is None else {self.options.key: value}
                    self.n_records -= 1  # two marks make one range
                    self._range(base, times[j], times[i], args, (pid, tid))

    def merge(self, other: StreamAggregator) -> StreamAggregator:
        """Add ``other``'s records (another process of the same rank and role) to these."""
        self._settle_all()
        other._settle_all()
        self.n_records += other.n_records
        self.backwards += other.backwards
        self.pids |= other.pids
        self.unmarked |= other.unmarked
        if self.spans is not None and other.spans is not None:
            self.spans.merge(other.spans)
        self.file_steps |= other.file_steps
        self.file_step_keys.update(other.file_step_keys)
        for name, n in other.merged.items():
            self.merged[name] = self.merged.get(name, 0) + n
            self.merged_ns[name] = self.merged_ns.get(name, 0) + other.merged_ns.get(name, 0)
        if other.first_ns is not None and (self.first_ns is None or other.first_ns < self.first_ns):
            self.first_ns = other.first_ns
        if other.hi is not None and (self.hi is None or other.hi > self.hi):
            self.hi = other.hi
        for folded, phase in other.phases.items():
            if folded in self.phases:
                self.phases[folded].merge(phase)
            else:
                self.phases[folded] = phase
        for name, (_, steps, stage) in other.names.items():
            mine = self.names.get(name)
            if mine is None:  # (whether a name may be a step depends on the options alone)
                self.names[name] = (self.phases[self.fold(name)], steps, stage)
            elif mine[1] is not None and steps is not None:
                mine[1].extend(steps)
        for key, m in other.marks.items():
            if key in self.marks:
                self.marks[key].extend(m)
            else:
                self.marks[key] = m
        return self

    def part(self, trace: RankTrace) -> ProcessPart:
        """The part of the records added, with ``trace``'s rank, role, source and what its
        reader counted (dropped, skipped, complete); ends this aggregator's use."""
        self._pair_marks()
        self._settle_all()
        options = self.options.resolved(self.names)
        step_names = [n for n in self.names if options.is_step(n, self.fold)]
        for p in self.phases.values():
            p.flush()
        phases = {name: p.agg() for name, p in self.phases.items() if p.count}
        lo = min((a.first_start_ns for a in phases.values()), default=None)
        part = ProcessPart(
            rank=trace.rank,
            pids=frozenset(self.pids),
            source=trace.source,
            role=trace.role,
            n_records=self.n_records,
            span=None if lo is None or self.hi is None else (lo, self.hi),
            first_ns=self.first_ns,
            phases=phases,
            run=trace.run,
            instance=trace.instance,
            dropped=trace.dropped,
            skipped=trace.skipped + self.backwards,
            complete=trace.complete,
            step_phases=frozenset(self.fold(n) for n in step_names),
            streamed=True,
            merged=dict(self.merged),
            merged_ns=dict(self.merged_ns),
            notes=list(file_notes(trace)),
            unmarked=sorted(self.unmarked),
            spans=self.spans,
        )
        if self.spans is not None:
            self.spans.identify(trace.origin, self.pids, trace.instance)
        file_steps = sorted(self.file_steps | set(trace.steps))
        if self.options.name is None and file_steps:
            keys = [self.file_step_keys.get(s) for s in file_steps]
            listed = [k for k in keys if k is not None]
            found = steps_from_spans(file_steps, listed)
            if self.spans is not None:
                self.spans.set_steps(found)
            part.set_steps(found)
        else:
            stores = [s for n in step_names if (s := self.names[n][1]) is not None]
            _set_steps(part, stores, options.key)
        if self.spans is not None:
            self.spans.finish()
        return part


def _set_steps(part: ProcessPart, stores: list[_StepRanges], key: str) -> ProcessPart:
    """The steps of the ranges in ``stores``, as :func:`~.steps.steps_from_ranges` makes them;
    without step-key values each range is a step of its own, counted without a list of them."""
    if any(s.keys for s in stores):
        ranges = [
            (s, e, {key: st.keys[i]} if i in st.keys else None)
            for st in stores
            for i, (s, e) in enumerate(zip(st.starts, st.ends))
        ]
        found = steps_from_ranges(ranges, key)
        if part.spans is not None:
            part.spans.set_steps(found)
        return part.set_steps(found)
    if part.spans is not None:  # (each range a step of its own, numbered in order)
        if len(stores) == 1:  # (its arrays taken, not copied: they may hold millions)
            part.spans.set_step_spans(stores[0].starts, stores[0].ends)
        else:
            part.spans.set_step_spans(
                (s for st in stores for s in st.starts), (e for st in stores for e in st.ends)
            )
    count = sum(len(st.starts) for st in stores)
    if not count:
        return part.set_steps([])
    part.step_count = count
    part.step_time_ns = sum(sum(st.ends) - sum(st.starts) for st in stores)
    part.step_keys = []  # numbered 1, 2, ... in order
    return part


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0  # the reader names the file and why


def spill_trace(path: str | Path, sink: Callable[[Record], object]) -> RankTrace:
    """:func:`~mstx_marks.export.spill.read_spill` with ``sink``: the spill's trace, with a note
    naming the file and the field for each header value that could not be used (a rank of
    ``Infinity``, a negative pid: read as 0, which the summary should not take without a word).

    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "h-1.jsonl"
    >>> _ = path.write_text('{"mstx_marks_spill": 2, "pid": 7, "rank": Infinity}\\n')
    >>> t = spill_trace(path, print)
    >>> t.rank, [n.partition(": ")[2] for n in file_notes(t)]
    (0, ["its header's rank is Infinity, not an int >= 0: read as 0"])
    """
    unusable: list[str] = []
    found = read_spill(path, sink=sink, unusable=unusable)
    return with_notes(found, [f"{path}: {why}" for why in unusable])


def aggregate_spill_stream(
    path: str | Path,
    fold: Callable[[str], str] = fold_name,
    steps: StepOptions | None = None,
) -> ProcessPart:
    """The part of the spill at ``path``, read in one pass without holding its records (memory:
    a few numbers per phase, plus the step ranges and start/stop marks).

    >>> import tempfile
    >>> from mstx_marks.backends.record import Recorder
    >>> from mstx_marks.export.spill import Spill
    >>> rec = Recorder()
    >>> for _ in range(3):
    ...     rec.range_end(rec.range_start("train_step", "default"), "default")
    >>> part = aggregate_spill_stream(Spill(tempfile.mkdtemp(), rec, rank=2).write_now())
    >>> part.rank, part.step_count, part.phases["train_step"].count, part.streamed
    (2, 3, 3, True)
    """
    agg = StreamAggregator(fold, steps)
    return agg.part(spill_trace(path, agg.add))


def aggregate_spill(
    path: str | Path,
    fold: Callable[[str], str] = fold_name,
    steps: StepOptions | None = None,
) -> ProcessPart:
    """The part of the spill at ``path``: aggregated in memory, self times and all, when it
    holds at most :data:`MAX_HELD_EVENTS` events in at most :data:`MAX_SPILL_BYTES`; else as
    :func:`aggregate_spill_stream` (``streamed``), in the same single read."""
    path = Path(path)
    sink = HoldOrStream(fold, steps, MAX_HELD_EVENTS if _size(path) <= MAX_SPILL_BYTES else 0)
    holder = RankTrace(0, [])
    found = spill_trace(path, lambda rec: sink.add(holder, rec))
    if sink.streaming:
        return sink.stream_of(holder).part(found)
    found.records = sorted(holder.records, key=lambda r: r.start_ns)  # as read_spill sorts them
    return aggregate_trace(found, fold, steps)


def _spill_traces(path: Path, sink: RecordSink) -> list[RankTrace]:
    """The spill's trace, its records handed to ``sink``, which :func:`read_held` keeps in a
    trace of them: sorted by start, as :func:`~mstx_marks.export.spill.read_spill` sorts."""
    trace = RankTrace(0, [])
    found = spill_trace(path, lambda rec: sink(trace, rec))
    found.records = trace.records
    found.records.sort(key=lambda r: r.start_ns)  # as read_spill sorts what it keeps
    return [found]


def read_spill_held(path: str | Path, max_events: int | None = None) -> RankTrace:
    """The spill at ``path`` with every record, as :func:`~mstx_marks.export.spill.read_spill`
    gives it, when it holds at most ``max_events`` (default :data:`MAX_HELD_EVENTS`) events in
    at most :data:`MAX_SPILL_BYTES`; else raises :class:`TooLargeToHold` naming it, as soon as
    it is known (the rest is not read).

    >>> import tempfile
    >>> from mstx_marks.backends.record import Recorder
    >>> from mstx_marks.export.spill import Spill
    >>> rec = Recorder()
    >>> for _ in range(3):
    ...     rec.instant("tick", "default")
    >>> path = Spill(tempfile.mkdtemp(), rec, rank=0).write_now()
    >>> len(read_spill_held(path).records)
    3
    >>> read_spill_held(path, max_events=2)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    mstx_marks.analysis.readers.stream.TooLargeToHold: ...: holds more than 2 events...
    """
    path = Path(path)
    limit = MAX_HELD_EVENTS if max_events is None else max_events
    size = _size(path)
    if size > MAX_SPILL_BYTES:
        raise TooLargeToHold(path, _too_large(f"is a spill of {size >> 20} MB", limit, True))
    (trace,) = read_held(path, lambda sink: _spill_traces(path, sink), limit, spill=True)
    return trace


def read_held(
    path: str | Path,
    read: Callable[[RecordSink], list[RankTrace]],
    max_events: int | None = None,
    *,
    spill: bool = False,
) -> list[RankTrace]:
    """``read(sink)``: the traces a reader makes of the file at ``path``, handing their records
    to ``sink`` (:data:`~mstx_marks.export.chrome.RecordSink`), with every record when there
    are at most ``max_events`` (default :data:`MAX_HELD_EVENTS`) in all; else raises
    :class:`TooLargeToHold` naming it, as soon as it is known (the rest is not read).

    >>> from mstx_marks.base.records import InstantRecord
    >>> def read(sink):
    ...     t = RankTrace(0, [])
    ...     for s in range(3):
    ...         sink(t, InstantRecord("tick", "default", s, 1, 1))
    ...     return [t]
    >>> len(read_held("a.trace.json", read)[0].records)
    3
    >>> read_held("a.trace.json", read, max_events=2)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    mstx_marks.analysis.readers.stream.TooLargeToHold: a.trace.json: holds more than 2 events...
    """
    limit = MAX_HELD_EVENTS if max_events is None else max_events
    count = 0

    def sink(trace: RankTrace, rec: Record) -> None:
        nonlocal count
        if count >= limit:
            raise _Full
        count += 1
        trace.records.append(rec)

    try:
        return read(sink)
    except _Full:
        why = _too_large(f"holds more than {limit} events", limit, spill)
        raise TooLargeToHold(path, why) from None


def _too_large(what: str, max_events: int, spill: bool) -> str:
    size = f", {MAX_SPILL_BYTES >> 20} MB" if spill else ""
    return (
        f"{what}, more than is read whole here (at most {max_events} events{size}); not drawn"
        " (--html, --svg, --trace read every event): `mstx-marks summary` without them"
        " summarises it in one pass"
    )


class HoldOrStream:
    """The records of the processes in one file, as its reader hands them to :meth:`add`
    (a :data:`~mstx_marks.export.chrome.RecordSink`): kept in their traces while the file has
    at most ``hold`` (default :data:`MAX_HELD_EVENTS`) of them, as :func:`aggregate_spill` keeps
    a spill's; from the one past that on, each process's go through a
    :class:`StreamAggregator` (those held first) and are dropped.

    >>> from mstx_marks.base.records import RangeRecord
    >>> t = RankTrace(0, [])
    >>> sink = HoldOrStream(hold=2)
    >>> for s in range(3):
    ...     sink.add(t, RangeRecord("step", "default", s * 10, s * 10 + 5, 1, 7))
    >>> sink.streaming, t.records
    (True, [])
    >>> (part,) = sink.parts([t], exact=lambda t: aggregate_trace(t))
    >>> part.step_count, part.streamed
    (3, True)
    """

    def __init__(
        self,
        fold: Callable[[str], str] = fold_name,
        steps: StepOptions | None = None,
        hold: int | None = None,
    ) -> None:
        self.fold, self.steps = fold, steps
        self.hold = MAX_HELD_EVENTS if hold is None else hold
        self.count = 0
        self.held: dict[int, RankTrace] = {}  # by id(): the traces holding records
        self.streams: dict[int, StreamAggregator] = {}
        self.streaming = self.hold <= 0

    def add(self, trace: RankTrace, rec: Record) -> None:
        """Hold or count ``rec``, a record of ``trace``'s process."""
        if self.streaming:
            self.stream_of(trace).add(rec)
            return
        trace.records.append(rec)
        self.held[id(trace)] = trace
        self.count += 1
        if self.count > self.hold:
            self._let_go()

    def _let_go(self) -> None:
        """Past ``hold``: what is held goes through the aggregators, and is dropped."""
        self.streaming = True
        held, self.held = self.held, {}
        for trace in held.values():
            stream = self.stream_of(trace)
            records, trace.records = trace.records, []
            for rec in records:
                stream.add(rec)

    def stream_of(self, trace: RankTrace) -> StreamAggregator:
        """The aggregator of ``trace``'s process (made the first time)."""
        stream = self.streams.get(id(trace))
        if stream is None:
            stream = self.streams[id(trace)] = StreamAggregator(self.fold, self.steps)
        return stream

    def parts(
        self, traces: list[RankTrace], exact: Callable[[RankTrace], ProcessPart]
    ) -> list[ProcessPart]:
        """The part of each of ``traces`` (what the reader returned): ``exact(trace)`` of its
        records when they were held, else its aggregator's (``streamed``)."""
        if not self.streaming:
            return [exact(t) for t in traces]
        return [self.stream_of(t).part(t) for t in traces]
