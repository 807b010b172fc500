"""Chrome Trace Event JSON, as Perfetto UI and chrome://tracing load it.

Ranges become complete events (``"ph": "X"``), instants become thread-scoped instant events
(``"ph": "i"``). Each rank is one process (``pid`` = rank, named ``rank N``), threads keep their
native ids and are named (``thread_name``: the Python thread's name when known, see
:attr:`RankTrace.thread_names <mstx_marks.base.records.RankTrace.thread_names>`, else
``thread T``), and the domain goes in ``cat`` and ``args.domain``.

Chrome and Perfetto nest the complete events of one thread by time, so ranges that overlap
without nesting (asyncio tasks gathered on one thread) would be drawn inside each other:
:func:`thread_tracks` splits such a thread into tracks in each of which ranges nest properly,
the extra ones named ``<thread> (overlap K)``, given thread ids from :data:`OVERLAP_TID` up and
listed in ``otherData.threads`` (``"pid:tid"`` to the real thread), so that
:func:`read_chrome_trace` reads them back onto their thread. The per-rank traces and the merged
job timeline (:mod:`mstx_marks.analysis.render.merge`) both use it. What the user attached to a
range
(``mark(name, args={...})``) goes in the event's ``args`` beside ``domain`` (and ``open``); should
one of the user's keys be ``domain``, ``open`` or ``args``, the user's whole mapping goes under
``args.args`` instead, so nothing is overwritten and :func:`read_chrome_trace` gives it back.
Values JSON cannot hold are written as their ``str()``.

``otherData.clock`` holds a wall/monotonic clock pair (``time.time_ns()``,
``time.monotonic_ns()``) taken when the file is written: the records are on the wall clock
already, and a reader meeting timestamps on a clock since boot can shift them by the pair's
difference (see :mod:`mstx_marks.analysis.render.merge`). Where each process recorded and on which
clock is its own entry's: ``otherData.ranks[R]`` holds the recording process's ``host``,
``boot_id``, ``anchor_ns`` and ``clock_step_ns`` (:class:`~mstx_marks.base.records.Origin`;
those of the spill it was exported from, never the writer's), which
:func:`read_chrome_trace` gives back.

Timestamps are microseconds after ``otherData.origin_ns`` rather than since the epoch: a float
holds an epoch time in microseconds only to a quarter of a microsecond, but offsets under
10^12 us keep every nanosecond, so :func:`read_chrome_trace` gives back exactly what was
recorded. The origin lies on a grid of 10^6 s (:func:`origin_of`), the same for every file of a
job (but one that straddles a line of the grid, every 11.6 days), so that tools that ignore it
(HTA) still line the files up.

The document is built whole by :func:`chrome_trace` (a few events, and the reference) and
written a batch of events at a time, in bounded memory, by :class:`TraceWriter`
(:func:`write_chrome_trace`, and the exports streamed from a spill:
:mod:`mstx_marks.export.stream`): the same JSON values, with times written with three decimals.

>>> from mstx_marks.base.records import RangeRecord
>>> r = RangeRecord("gen", "default", 1_760_000_000_000_000_500, 1_760_000_000_000_001_750, 7, 42)
>>> ev = chrome_trace([RankTrace(0, [r])])["traceEvents"][-1]
>>> ev["ph"], ev["ts"], ev["dur"], ev["tid"]  # (ts: microseconds after the grid's line)
('X', 0.5, 1.25, 7)
"""

from __future__ import annotations

import functools
import json
import os
import pickle
import threading
import time
import zlib
from itertools import chain, groupby, repeat
from operator import itemgetter, mod, sub, truediv
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Iterator, Mapping, NamedTuple, Sequence

from mstx_marks.base.records import (
    InstantRecord,
    Origin,
    RangeRecord,
    RankTrace,
    Record,
    TraceFileError,
)
from mstx_marks.export.files import atomic_path, open_regular, scratch_file
from mstx_marks.export.start_order import (
    ARGS,
    DOMAIN,
    END,
    INSTANT,
    KIND,
    NAME,
    OPEN,
    PID,
    START,
    THREAD,
    Event,
    StartOrder,
    as_record,
)

__all__ = [
    "GENERATOR",
    "MAX_JSON_BYTES",
    "ORIGIN_GRID_NS",
    "OVERLAP_TID",
    "RESERVED_ARGS",
    "JsonTooLarge",
    "Nesting",
    "RecordSink",
    "ThreadTrack",
    "TraceWriter",
    "chrome_trace",
    "dumps",
    "event_args",
    "is_ours",
    "live_thread_names",
    "load_trace_json",
    "nesting_tracks",
    "origin_of",
    "read_chrome_doc",
    "read_chrome_trace",
    "thread_label",
    "thread_tracks",
    "trace_event",
    "trace_us",
    "user_args",
    "write_chrome_trace",
]

#: ``otherData.generator`` of the files this module writes; the reader accepts only those.
GENERATOR = "mstx_marks"
#: The ``args`` keys this module writes itself.
RESERVED_ARGS = frozenset({"domain", "open", "args"})
# The merged job timeline's step track (mstx_marks.analysis.render.merge.STEP_CATEGORY): not
# records.
_STEP_CATEGORY = "mstx_marks.step"


def trace_us(ns: int) -> float:
    """Nanoseconds as a Chrome trace's microseconds (to the nanosecond)."""
    return round(ns / 1000, 3)


def _ns(us: Any) -> int:
    return round(float(us) * 1000)


#: Every file's ``origin_ns`` lies on this grid (10^6 s, 11.6 days): the files of one job share
#: it, so a tool that reads several as one job (HTA, which ignores ``otherData``) places them on
#: one axis; and ``ts`` stays under 10^12 us, where a float still holds every nanosecond.
ORIGIN_GRID_NS = 10**15


def origin_of(first_ns: int) -> int:
    """The ``origin_ns`` of a file whose earliest event starts at ``first_ns``.

    >>> origin_of(1_760_000_123_456_789_012)
    1760000000000000000
    """
    return first_ns // ORIGIN_GRID_NS * ORIGIN_GRID_NS


def _default_origin(traces: Sequence[RankTrace]) -> int:
    starts = [r.start_ns for t in traces for r in t.records]
    return origin_of(min(starts)) if starts else 0


def event_args(rec: Record) -> dict[str, Any]:
    """The ``args`` of ``rec``'s event: its domain, and what the user attached.

    >>> from mstx_marks.base.records import RangeRecord
    >>> event_args(RangeRecord("gen", "verl", 0, 1, 1, 1, args={"tokens": 8}))
    {'tokens': 8, 'domain': 'verl'}
    """
    user = rec.args
    if not user:
        return {"domain": rec.domain}
    if RESERVED_ARGS.isdisjoint(user):
        return {**user, "domain": rec.domain}
    return {"args": dict(user), "domain": rec.domain}


def user_args(args: Any) -> Mapping[str, Any] | None:
    """What the user attached, from an event's ``args`` (the inverse of :func:`event_args`).

    >>> user_args({"tokens": 8, "domain": "verl"}), user_args({"domain": "verl"})
    ({'tokens': 8}, None)
    """
    if not isinstance(args, dict):
        return None
    nested = args.get("args")
    if isinstance(nested, dict):
        return nested or None
    mine = {k: v for k, v in args.items() if k not in RESERVED_ARGS}
    return mine or None


def trace_event(rec: Record, pid: int, origin_ns: int, tid: int | None = None) -> dict[str, Any]:
    """``rec`` as one Chrome trace event of process ``pid`` (and thread ``tid``, default the
    record's own), its times relative to ``origin_ns``."""
    ev: dict[str, Any] = {
        "name": rec.name,
        "cat": rec.domain,
        "ts": trace_us(rec.start_ns - origin_ns),
        "pid": pid,
        "tid": rec.thread if tid is None else tid,
        "args": event_args(rec),
    }
    if isinstance(rec, InstantRecord):
        ev.update(ph="i", s="t")
    else:
        ev.update(ph="X", dur=trace_us(rec.end_ns - rec.start_ns))
        if rec.open:
            ev["args"]["open"] = True  # still running when recorded: ends at the flush
    return ev


#: Tracks split off a thread (ranges overlapping without nesting) get thread ids from here up,
#: far above any real one.
OVERLAP_TID = 1 << 40


class Nesting:
    """The tracks of one thread's ranges so far, fed in order of start, the longest first at
    one start: :meth:`place` puts a range on the first track where it nests in or follows
    every range of it still open, opening a track when none fits. The one rule of the split,
    for a whole thread at once (:func:`nesting_tracks`) and for a stream (:class:`TraceWriter`).

    >>> n = Nesting()
    >>> [n.place(s, e) for s, e in ((0, 10), (2, 5), (4, 12), (11, 13))], n.tracks
    ([0, 0, 1, 0], 2)
    """

    __slots__ = ("_ends",)

    def __init__(self) -> None:
        # Per track, the ends of its ranges still open at the latest start (innermost last).
        self._ends: list[list[int]] = [[]]

    def place(self, start: int, end: int) -> int:
        """The track of the range ``start``-``end``, placed after those placed before."""
        return self.place_all([(start, end)]).get(0, 0)

    def place_all(self, spans: Iterable[tuple[int, int]]) -> dict[int, int]:
        """Place each ``(start, end)`` in turn; the tracks of those that did not go to the
        first track, by their index in ``spans`` (the usual: none, nothing made per range)."""
        tracks = self._ends
        first = tracks[0]
        pop, push = first.pop, first.append
        off: dict[int, int] = {}
        for i, (start, end) in enumerate(spans):
            while first and first[-1] <= start:
                pop()
            if not first or end <= first[-1]:
                push(end)
                continue
            for k in range(1, len(tracks)):
                ends = tracks[k]
                while ends and ends[-1] <= start:
                    ends.pop()
                if not ends or end <= ends[-1]:
                    ends.append(end)
                    off[i] = k
                    break
            else:
                tracks.append([end])
                off[i] = len(tracks) - 1
        return off

    @property
    def tracks(self) -> int:
        """How many tracks the thread has (one at least: a thread of instants has one)."""
        return len(self._ends)


def nesting_tracks(ranges: Sequence[RangeRecord]) -> list[list[RangeRecord]]:
    """``ranges`` split into tracks in each of which every two ranges nest or do not overlap
    (:class:`Nesting`), each track in order of start, the longest first at one start.

    >>> r = lambda s, e: RangeRecord("x", "d", s, e, 1, 1)
    >>> [[x.start_ns for x in t] for t in nesting_tracks([r(0, 10), r(2, 5), r(4, 12)])]
    [[0, 2], [4]]
    """
    ordered = sorted(ranges, key=lambda r: (r.start_ns, -r.end_ns))
    off = Nesting().place_all((r.start_ns, r.end_ns) for r in ordered)
    tracks: list[list[RangeRecord]] = [[] for _ in range(max(off.values(), default=0) + 1)]
    for i, r in enumerate(ordered):
        tracks[off.get(i, 0)].append(r)
    return tracks if ordered else []


class ThreadTrack(NamedTuple):
    """One Chrome thread track: its ``tid`` in the file, the ``thread`` it belongs to, its
    ``label`` (``thread_name``) and its records (the first track of a thread has its instants)."""

    tid: int
    thread: int
    label: str
    records: list[Record]


def thread_label(thread: int, names: Mapping[int, str] | None = None) -> str:
    """What a thread is called: its Python name when known, else ``thread T``.

    >>> thread_label(7, {7: "MainThread"}), thread_label(8, {7: "MainThread"})
    ('MainThread', 'thread 8')
    """
    name = (names or {}).get(thread)
    return name if name else f"thread {thread}"


def thread_tracks(
    records: Iterable[Record], names: Mapping[int, str] | None = None, next_tid: int = OVERLAP_TID
) -> list[ThreadTrack]:
    """``records`` (of one Chrome process) as thread tracks, by thread id: each thread's ranges
    split by :func:`nesting_tracks`, the tracks past the first given ids from ``next_tid`` up.

    >>> r = lambda s, e: RangeRecord("gen", "d", s, e, 5, 1)
    >>> [(t.tid, t.label, len(t.records)) for t in thread_tracks([r(0, 10), r(5, 15)])]
    [(5, 'thread 5', 1), (1099511627776, 'thread 5 (overlap 1)', 1)]
    """
    by_tid: dict[int, list[Record]] = {}
    for r in records:
        by_tid.setdefault(r.thread, []).append(r)
    out = []
    for tid in sorted(by_tid):
        recs = by_tid[tid]
        tracks = nesting_tracks([r for r in recs if isinstance(r, RangeRecord)]) or [[]]
        label = thread_label(tid, names)
        for k, track in enumerate(tracks):
            if k == 0:
                marks = sorted(
                    (r for r in recs if not isinstance(r, RangeRecord)), key=lambda r: r.start_ns
                )
                out.append(ThreadTrack(tid, tid, label, [*track, *marks]))
            else:
                out.append(ThreadTrack(next_tid, tid, f"{label} (overlap {k})", list(track)))
                next_tid += 1
    return out


def live_thread_names(pid: int) -> dict[int, str]:
    """The names of this process's live threads by native id, when ``pid`` is this process
    (a trace written by the process that recorded it); else none.

    >>> live_thread_names(os.getpid())[threading.get_native_id()]
    'MainThread'
    """
    if pid != os.getpid():
        return {}
    return {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}


def _names_of(known: Mapping[int, str], pids: Iterable[int]) -> dict[int, str]:
    """The thread names of a process's trace: those it carries (``known``), and this
    process's live threads' when the trace is of this process (``pids``, its records')."""
    names = dict(known)
    me = os.getpid()
    if me in pids:
        for tid, name in live_thread_names(me).items():
            names.setdefault(tid, name)
    return names


def _thread_events(rank: int, tracks: Sequence[ThreadTrack]) -> list[dict[str, Any]]:
    """The metadata events that name and order a rank's thread tracks."""
    events: list[dict[str, Any]] = []
    for order, t in enumerate(tracks, start=1):
        events.append(
            {"ph": "M", "name": "thread_name", "pid": rank, "tid": t.tid, "args": {"name": t.label}}
        )
        events.append(
            {"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": t.tid,
             "args": {"sort_index": order}}
        )  # fmt: skip
    return events


def _split(tracks: Sequence[ThreadTrack], rank: int) -> dict[str, int]:
    """``otherData.threads`` of split tracks: ``"pid:tid"`` to the real thread."""
    return {f"{rank}:{t.tid}": t.thread for t in tracks if t.tid != t.thread}


def _process_events(rank: int) -> list[dict[str, Any]]:
    """The metadata events that name and order a rank's process."""
    return [
        {"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}},
        {"ph": "M", "name": "process_sort_index", "pid": rank, "args": {"sort_index": rank}},
    ]


def _process_info(t: RankTrace) -> dict[str, Any]:
    """What a trace says of its process beyond rank and role, when it says anything: where it
    recorded and on which clock, its run, its instance (two processes with one host and pid),
    the events its recorder dropped."""
    info: dict[str, Any] = t.origin.fields()
    if t.run:
        info["run"] = t.run
    if t.instance:
        info["instance"] = t.instance
    if t.dropped:
        info["dropped"] = t.dropped
    return info


def _other_data(
    processes: Sequence[tuple[RankTrace, Iterable[int]]],
    origin: int,
    threads: dict[str, int] | None = None,
) -> dict[str, Any]:
    """``otherData`` for ``processes``: each a trace (its records are not read) and the pids
    of its records."""
    ranks = {str(t.rank): {**_process_info(t), "pids": sorted(set(pids)),
                           "steps": [[s, e] for s, e in t.steps], "role": t.role}
             for t, pids in processes}  # fmt: skip
    clock = {"wall_ns": time.time_ns(), "mono_ns": time.monotonic_ns()}
    other = {"generator": GENERATOR, "origin_ns": origin, "ranks": ranks, "clock": clock}
    if threads:
        other["threads"] = threads
    return other


def chrome_trace(traces: Iterable[RankTrace], origin_ns: int | None = None) -> dict[str, Any]:
    """Build the trace document for ``traces`` (one per rank), ready for :func:`json.dumps`:
    in memory, for a few events (:func:`write_chrome_trace` writes the same document, a batch
    of events at a time).

    ``origin_ns`` defaults to :func:`origin_of` the earliest event.
    """
    traces = list(traces)
    origin = _default_origin(traces) if origin_ns is None else origin_ns
    events: list[dict[str, Any]] = []
    threads: dict[str, int] = {}
    for t in traces:
        pids = {r.pid for r in t.records}
        tracks = thread_tracks(t.records, _names_of(t.thread_names, pids))
        threads.update(_split(tracks, t.rank))
        events += _process_events(t.rank) + _thread_events(t.rank, tracks)
        for track in tracks:
            events.extend(trace_event(rec, t.rank, origin, track.tid) for rec in track.records)
    processes = [(t, [r.pid for r in t.records]) for t in traces]
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": _other_data(processes, origin, threads),
    }


def write_chrome_trace(
    path: str | Path, traces: Iterable[RankTrace], origin_ns: int | None = None
) -> Path:
    """Write :func:`chrome_trace` of ``traces`` to ``path`` atomically and return the path:
    the same document, made by :class:`TraceWriter` a batch of events at a time.

    Name files ``*.trace.json`` so that ``python -m mstx_marks summary DIR`` finds them.
    """
    traces = list(traces)
    origin = _default_origin(traces) if origin_ns is None else origin_ns
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        scratch = functools.partial(scratch_file, Path(tmp).parent)
        writer = TraceWriter(f, origin, scratch)
        for t in traces:
            with StartOrder(scratch) as order:
                order.extend(t.records)
                writer.add_process(t, order.batches())
        writer.close()
        f.flush()
        os.fsync(f.fileno())
    return Path(path)


#: Events of a process whose text waits in memory before it goes to its scratch file.
_SPOOL_EVENTS = 16384
#: Event texts kept per track (a run naming a range per step has as many names as steps).
_MAX_TEMPLATES = 4096


class _Track:
    """The events of one track (or of one thread's instants) so far: their text (or, for a
    split-off track, whose thread id is known only at the end, the events themselves) in
    memory, and the pieces already in the scratch file (offset, size)."""

    __slots__ = ("pending", "pieces")

    def __init__(self) -> None:
        self.pending: list[Any] = []
        self.pieces: list[tuple[int, int]] = []


class _Thread:
    """One thread of a process being written: its :class:`Nesting`, its first track's ranges,
    its instants, and its split-off tracks."""

    __slots__ = ("first", "instants", "nesting", "split")

    def __init__(self) -> None:
        self.nesting = Nesting()
        self.first, self.instants = _Track(), _Track()
        self.split: list[_Track] = []


_by_thread, _by_start, _by_end = itemgetter(THREAD), itemgetter(START), itemgetter(END)
_by_name, _by_kind, _by_args = itemgetter(NAME, DOMAIN), itemgetter(KIND), itemgetter(ARGS)


class TraceWriter:
    """Writes a Chrome trace document to the binary file ``f``, a process at a time, from its
    events in start order (:class:`~mstx_marks.export.start_order.StartOrder`), in bounded
    memory: a process's thread names go before its events, and which tracks its threads split
    into is known only at its end, so each track's events wait in a scratch file (``scratch()``
    makes one, when more than a few thousand events wait) and are copied out at the end.

    >>> import io
    >>> from mstx_marks.export.start_order import events
    >>> f = io.BytesIO()
    >>> w = TraceWriter(f, 0, lambda: io.BytesIO())
    >>> w.add_process(RankTrace(3, []), [events([RangeRecord("gen", "d", 1500, 2000, 7, 9)])])
    >>> w.close()
    >>> ev = json.loads(f.getvalue())["traceEvents"][-1]
    >>> ev["name"], ev["ts"], ev["dur"], ev["pid"], ev["tid"]
    ('gen', 1.5, 0.5, 3, 7)
    """

    def __init__(self, f: IO[bytes], origin: int, scratch: Callable[[], IO[bytes]]) -> None:
        self.f, self.origin, self._scratch = f, origin, scratch
        f.write(b'{"traceEvents":[')
        self._sep = b""
        #: ``otherData.threads`` so far: the split-off tracks (``"pid:tid"`` to their thread).
        self.threads: dict[str, int] = {}
        self._processes: list[tuple[RankTrace, set[int]]] = []

    def add_process(self, trace: RankTrace, batches: Iterable[list[Event]]) -> None:
        """Write one Chrome process: ``trace`` says its rank, role, run, steps and thread names
        (its records are not read), ``batches`` its events in start order, never one start in
        two batches (:meth:`StartOrder.batches`)."""
        process = _Process(trace.rank, self.origin, self._scratch)
        try:
            for batch in batches:
                process.add(batch)
            names = _names_of(trace.thread_names, process.pids)
            tracks = process.tracks(names)
            self.threads.update(_split(tracks, trace.rank))
            meta = _process_events(trace.rank) + _thread_events(trace.rank, tracks)
            self.f.write(self._sep + ",".join(dumps(ev) for ev in meta).encode())
            self._sep = b","
            process.copy(self.f, tracks)
        finally:
            process.close()
        self._processes.append((trace, process.pids))

    def close(self) -> None:
        """End the document (``otherData``)."""
        tail = {"displayTimeUnit": "ms",
                "otherData": _other_data(self._processes, self.origin, self.threads)}  # fmt: skip
        self.f.write(b"]," + dumps(tail)[1:].encode())


class _Templates(dict):  # type: ignore[type-arg]
    """(name, domain) -> the text of such an event of one track, but for its times (``%.3f``:
    its ``ts``, and a range's ``dur``): the JSON of a name is made once."""

    def __init__(self, rank: int, tid: int, instant: bool) -> None:
        super().__init__()
        self.rank, self.tid, self.instant = rank, tid, instant

    def __missing__(self, key: tuple[str, str]) -> str:
        name, cat = (json.dumps(s).replace("%", "%%") for s in key)
        text = (
            f',{{"name":{name},"cat":{cat},"ts":%.3f,"pid":{self.rank},"tid":{self.tid},'
            f'"args":{{"domain":{cat}}},'
        ) + ('"ph":"i","s":"t"}' if self.instant else '"ph":"X","dur":%.3f}')
        self[key] = text
        return text


def _pieces(f: IO[bytes], pieces: list[tuple[int, int]]) -> Iterator[bytes]:
    for offset, size in pieces:
        f.seek(offset)
        yield f.read(size)


class _Process:
    """One process's events as :class:`TraceWriter` takes them in."""

    def __init__(self, rank: int, origin: int, scratch: Callable[[], IO[bytes]]) -> None:
        self.rank, self.origin, self._scratch = rank, origin, scratch
        self.threads: dict[int, _Thread] = {}
        self.pids: set[int] = set()
        self._file: IO[bytes] | None = None
        self._waiting = 0
        self._templates: dict[tuple[int, bool], _Templates] = {}

    def add(self, batch: list[Event]) -> None:
        self.pids.update(map(itemgetter(PID), batch))
        for tid, group in groupby(sorted(batch, key=_by_thread), key=_by_thread):
            thread = self.threads.get(tid)
            if thread is None:
                thread = self.threads[tid] = _Thread()
            evs = list(group)
            ranges = [e for e in evs if e[KIND] != INSTANT]
            if len(ranges) < len(evs):
                instants = [e for e in evs if e[KIND] == INSTANT]
                thread.instants.pending += self._texts(instants, tid, True)
            if not ranges:
                continue
            # In order of start, the longest first at one start (two stable sorts, in C).
            ranges.sort(key=_by_end, reverse=True)
            ranges.sort(key=_by_start)
            off = thread.nesting.place_all(zip(map(_by_start, ranges), map(_by_end, ranges)))
            if off:
                split = thread.split
                for i, k in off.items():
                    while len(split) < k:
                        split.append(_Track())
                    split[k - 1].pending.append(ranges[i])  # (its thread id: known at the end)
                ranges = [e for i, e in enumerate(ranges) if i not in off]
            thread.first.pending += self._texts(ranges, tid, False)
        self._waiting += len(batch)
        if self._waiting >= _SPOOL_EVENTS:
            self._spool()
            self._waiting = 0

    def _texts(self, evs: list[Event], tid: int, instant: bool) -> list[str]:
        """The JSON of ``evs`` as events of track ``tid``, each after a comma. The usual event
        (no user args, not open) is its (name, domain)'s text with its times put in by
        ``%.3f`` (the same float as :func:`trace_us`, at a third of its cost), a C loop of
        ``map`` over the batch: this is the exporter's per-event work."""
        key = (tid, instant)
        templates = self._templates.get(key)
        if templates is None or len(templates) > _MAX_TEMPLATES:  # (a cache: names unbounded)
            templates = self._templates[key] = _Templates(self.rank, tid, instant)
        origin = self.origin
        starts = list(map(_by_start, evs))
        times: Iterable[Any] = map(truediv, map(sub, starts, repeat(origin)), repeat(1000))
        if not instant:
            durations = map(truediv, map(sub, map(_by_end, evs), starts), repeat(1000))
            times = zip(times, durations)
        out = list(map(mod, map(templates.__getitem__, map(_by_name, evs)), times))
        if any(map(_by_args, evs)) or (not instant and OPEN in map(_by_kind, evs)):
            for i, e in enumerate(evs):
                if e[ARGS] or e[KIND] == OPEN:
                    out[i] = "," + dumps(trace_event(as_record(e), self.rank, origin, tid))
        return out

    def _all_tracks(self) -> Iterator[_Track]:
        for thread in self.threads.values():
            yield thread.first
            yield thread.instants
            yield from thread.split

    def _spool(self) -> None:
        """Move what waits in memory to the scratch file."""
        if self._file is None:
            self._file = self._scratch()
        f = self._file
        f.seek(0, 2)
        for track in self._all_tracks():
            if not track.pending:
                continue
            if isinstance(track.pending[0], str):
                data = "".join(track.pending).encode()
            else:
                data = pickle.dumps(track.pending, pickle.HIGHEST_PROTOCOL)
            track.pieces.append((f.tell(), len(data)))
            f.write(data)
            track.pending = []

    def tracks(self, names: Mapping[int, str]) -> list[ThreadTrack]:
        """The Chrome tracks, in the order :func:`thread_tracks` gives them (records left out)."""
        out, next_tid = [], OVERLAP_TID
        for tid in sorted(self.threads):
            label = thread_label(tid, names)
            out.append(ThreadTrack(tid, tid, label, []))
            for k in range(1, self.threads[tid].nesting.tracks):
                out.append(ThreadTrack(next_tid, tid, f"{label} (overlap {k})", []))
                next_tid += 1
        return out

    def copy(self, out: IO[bytes], tracks: list[ThreadTrack]) -> None:
        """Write every event to ``out``, track after track (``tracks``: :meth:`tracks`)."""
        split_tids = iter([t.tid for t in tracks if t.tid != t.thread])
        for tid in sorted(self.threads):
            thread = self.threads[tid]
            self._copy(out, thread.first)
            self._copy(out, thread.instants)
            for track in thread.split:
                self._copy(out, track, next(split_tids))

    def _copy(self, out: IO[bytes], track: _Track, split_tid: int | None = None) -> None:
        """Write ``track``'s events: their text, or, for a split-off track, the text of its
        events (pickled) as events of ``split_tid``."""
        pieces: Iterator[list[Any] | bytes] = iter([])
        if track.pieces:
            assert self._file is not None
            pieces = _pieces(self._file, track.pieces)
        for piece in chain(pieces, [track.pending]):  # a piece at a time in memory
            if split_tid is not None:
                events = pickle.loads(piece) if isinstance(piece, bytes) else piece
                piece = self._texts(events, split_tid, False)
            out.write(piece if isinstance(piece, bytes) else "".join(piece).encode())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def dumps(doc: Any) -> str:
    """Compact JSON of a trace document; values JSON cannot hold become their ``str()``."""
    return json.dumps(doc, separators=(",", ":"), default=str)


def load_trace_json(path: str | Path, max_bytes: int | None = None) -> Any:
    """The JSON document in ``path`` (gzip-compressed when it ends in ``.gz``), parsed whole.

    Raises :class:`TraceFileError`, naming the file, for a file that cannot be read, is not
    JSON, or nests too deeply for the parser; :class:`JsonTooLarge` past ``max_bytes`` of text
    (default :data:`MAX_JSON_BYTES`; ``summary`` reads a file past its own, smaller, bound a
    piece at a time: :mod:`mstx_marks.analysis.readers.chrome_json`).
    """
    path = Path(path)
    try:
        raw = _read_bounded(path, MAX_JSON_BYTES if max_bytes is None else max_bytes)
        return json.loads(raw)
    except TraceFileError:
        raise
    except (OSError, zlib.error) as e:
        why = getattr(e, "strerror", None) or e
        raise TraceFileError(path, f"cannot be read ({why})") from e
    except (UnicodeDecodeError, json.JSONDecodeError, EOFError) as e:
        raise TraceFileError(path, f"is not valid JSON (truncated or corrupt?): {e}") from e
    except MemoryError:
        raise TraceFileError(path, "is too large to read in the memory here") from None
    except RecursionError:
        raise TraceFileError(path, "is JSON nested too deeply to be a trace") from None


#: The most JSON text (after gunzip) :func:`read_chrome_trace` and :func:`load_trace_json` parse
#: whole. A parse takes many times its text in memory: measured (Python 3.11, peak RSS), 8 times
#: for our own traces (907 MB for the 115 MB of a million events; :func:`read_chrome_trace` of
#: it, records and all, 915 MB), and up to 30 times for the worst text (``[{"a":{}}, ...]``:
#: 1.3 GB for 42 MB). At 96 MB one of our traces (850 000 events) is read in 830 MB (192 MB,
#: the bound before, took about 1.6 GB). ``summary`` and the timelines never parse
#: more than :data:`~mstx_marks.analysis.readers.chrome_json.WHOLE_JSON_BYTES` whole: they
#: read a larger file an event at a time, whatever its size, our exporter's largest included.
MAX_JSON_BYTES = 96 << 20


class JsonTooLarge(TraceFileError):
    """More JSON text than a reader parses whole (:func:`load_trace_json`)."""


def _read_bounded(path: Path, limit: int) -> bytes:
    """The file's bytes (gunzipped for ``.gz``), refused past ``limit`` (a gzip that inflates
    to gigabytes is stopped there) and when it is not a regular file (a FIFO)."""
    with open_regular(path, gunzip=True) as source:
        raw = source.read(limit + 1)
    if len(raw) > limit:
        raise JsonTooLarge(
            path, f"holds more than {limit >> 20} MB of JSON, more than is read here"
        )
    return bytes(raw)


def is_ours(doc: Any) -> bool:
    """Whether a loaded JSON document is a Chrome trace this module wrote."""
    other = doc.get("otherData") if isinstance(doc, dict) else None
    return isinstance(other, dict) and other.get("generator") == GENERATOR


def _load(path: Path) -> dict[str, Any]:
    return _check(path, load_trace_json(path))


def _check(path: Path, doc: Any) -> dict[str, Any]:
    other = doc.get("otherData") if isinstance(doc, dict) else None
    if not isinstance(other, dict) or other.get("generator") != GENERATOR:
        raise TraceFileError(path, "is not a Chrome trace written by mstx_marks")
    if not _is_events(doc.get("traceEvents")):
        raise TraceFileError(path, "has no traceEvents list")
    checked: dict[str, Any] = doc
    return checked


def _is_events(events: Any) -> bool:
    """Whether ``events`` is a list, or the events of a file read a piece at a time (an iterable
    that JSON never makes: not a string, bytes or object)."""
    if isinstance(events, list):
        return True
    return isinstance(events, Iterable) and not isinstance(events, (str, bytes, dict))


def read_chrome_trace(path: str | Path) -> list[RankTrace]:
    """Read a file written by :func:`write_chrome_trace`: one :class:`RankTrace` per rank.

    Raises :class:`TraceFileError`, naming the file, for anything else (a truncated file, JSON
    that is not one of ours, events missing their fields).
    """
    path = Path(path)
    return read_chrome_doc(path, _load(path))


_INT64 = 1 << 63


def _checked_int(value: Any) -> int:
    """An int64 from a JSON value: NaN, infinities, strings that are not ints and values past
    int64 raise ValueError."""
    if isinstance(value, float) and not value.is_integer():
        raise ValueError(f"not an int: {value!r}")
    number = int(value)
    if not -_INT64 <= number < _INT64:
        raise ValueError("past int64")
    return number


#: Names shared by the records of one file read (JSON makes a string per event: 100 bytes a
#: record), up to this many different ones (so reading a file of unique names, its records
#: not held, does not hold them all either).
_SHARED_NAMES = 4096


def _shared(name: str, names: dict[str, str]) -> str:
    """``name``, as the first record read with it has it (while ``names`` has room)."""
    known = names.get(name)
    if known is not None:
        return known
    if len(names) < _SHARED_NAMES:
        names[name] = name
    return name


def _record(
    ev: Any,
    origin: int,
    processes: dict[str, Any],
    threads: dict[str, Any],
    names: dict[str, str] | None = None,
) -> tuple[Record | None, int]:
    """One event of our trace as a record (None: not a record), and its Chrome pid; its name
    and domain shared through ``names`` (see :func:`_shared`)."""
    ph = ev.get("ph")
    if ph not in ("X", "i") or ev.get("cat") == _STEP_CATEGORY:
        return None, 0
    cpid = _checked_int(ev["pid"])
    pid = _checked_int(processes.get(str(cpid), {}).get("pid", 0))
    start = _checked_int(origin + _ns(ev["ts"]))
    args = ev.get("args", {})
    domain = str(args.get("domain", ev.get("cat", "default")))
    name = str(ev["name"])
    if names is not None:
        name, domain = _shared(name, names), _shared(domain, names)
    tid = _checked_int(threads.get(f"{cpid}:{ev['tid']}", ev["tid"]))
    attached = user_args(args)
    if ph == "X":
        end, is_open = _checked_int(start + _ns(ev["dur"])), bool(args.get("open", False))
        if end < start:
            raise ValueError("ends before it starts")
        return RangeRecord(name, domain, start, end, tid, pid, is_open, attached), cpid
    return InstantRecord(name, domain, start, tid, pid, attached), cpid


def _thread_name(ev: Any, threads: Any, names: dict[int, dict[int, str]]) -> None:
    """Keep the name a ``thread_name`` event gives a thread (not a split track's, nor the
    ``thread T`` written for a thread with no name)."""
    try:
        cpid, tid, name = _checked_int(ev["pid"]), _checked_int(ev["tid"]), ev["args"]["name"]
        if isinstance(name, str) and name != f"thread {tid}" and f"{cpid}:{tid}" not in threads:
            names.setdefault(cpid, {})[tid] = name[:256]
    except (KeyError, TypeError, ValueError, OverflowError):
        return


#: Where a reader hands each record as it reads it, with the trace of its process (whose
#: ``records`` it leaves to the sink), instead of keeping it.
RecordSink = Callable[[RankTrace, Record], None]


def _keep(trace: RankTrace, rec: Record) -> None:
    trace.records.append(rec)


def _processes_of(
    processes: dict[str, Any],
) -> tuple[dict[int, tuple[int, list[tuple[int, int]], str, Any]], int]:
    """What ``otherData`` says of each Chrome process (rank, steps, role, the rest), and how
    many of its entries are malformed."""
    info = {}
    bad = 0
    for k, v in processes.items():
        try:
            cpid = int(k)
            info[cpid] = (
                _checked_int(v.get("rank", k)),
                [(_checked_int(s), _checked_int(e)) for s, e in v.get("steps", [])],
                str(v.get("role", "")),
                v,
            )
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
            bad += 1
    return info, bad


def _process_trace(path: Path, cpid: int, info: dict[int, Any]) -> RankTrace:
    """The (empty) trace of Chrome process ``cpid``."""
    rank, steps, role, more = info.get(cpid, (cpid, [], "", {}))
    trace = RankTrace(rank, [], steps, path, role)
    trace.run, trace.instance = str(more.get("run") or ""), str(more.get("instance") or "")
    trace.origin = Origin.of(more)
    dropped = more.get("dropped")
    trace.dropped = dropped if type(dropped) is int and dropped > 0 else 0
    return trace


def read_chrome_doc(path: Path, doc: Any, sink: RecordSink | None = None) -> list[RankTrace]:
    """:func:`read_chrome_trace` of a document already loaded from ``path``.

    A merged job timeline (:mod:`mstx_marks.analysis.render.merge`) lists its processes in
    ``otherData.processes`` (Chrome pid to rank, pid, role, steps) and the threads it split into
    tracks in ``otherData.threads``; it reads back as one trace per process.

    ``doc["traceEvents"]`` may be any iterable of events (a large file's, parsed one at a
    time). With ``sink``, each record goes to ``sink(trace, record)`` as it is read, and the
    traces come back with the records the sink put in them (sorted by start).

    >>> doc = chrome_trace([RankTrace(3, [RangeRecord("gen", "d", 10**9, 10**9 + 5, 1, 9)])])
    >>> seen = []
    >>> sink = lambda t, r: seen.append((t.rank, r.name))
    >>> (t,) = read_chrome_doc(Path("r3.trace.json"), doc, sink)
    >>> seen, t.rank, t.records
    ([(3, 'gen')], 3, [])
    """
    doc = _check(path, doc)
    other = doc["otherData"]
    add = _keep if sink is None else sink
    try:
        origin = int(other.get("origin_ns", 0))
        processes = other.get("processes")
        if not isinstance(processes, dict):  # one Chrome process per rank
            processes = {
                k: {"rank": k, "pid": (v.get("pids") or [0])[0], **v}
                for k, v in other.get("ranks", {}).items()
                if isinstance(v, dict)
            }
        threads = other.get("threads", {})
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
        raise TraceFileError(path, f"has malformed otherData ({type(e).__name__}: {e})") from e
    info, skipped = _processes_of(processes)
    by_process: dict[int, RankTrace] = {}
    names: dict[int, dict[int, str]] = {}  # Chrome pid -> thread -> its Python name
    shared: dict[str, str] = {}
    first_error: Exception | None = None
    for ev in doc["traceEvents"]:
        try:
            rec, cpid = _record(ev, origin, processes, threads, shared)
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
            skipped += 1  # one bad event (NaN, a string pid, past int64): the rest is read
            first_error = first_error or e
            continue
        if rec is not None:
            trace = by_process.get(cpid)
            if trace is None:
                trace = by_process[cpid] = _process_trace(path, cpid, info)
            add(trace, rec)
        elif ev.get("ph") == "M" and ev.get("name") == "thread_name":
            _thread_name(ev, threads, names)
    if first_error is not None and not by_process:  # nothing readable at all: the file is bad
        why = f"{type(first_error).__name__}: {first_error}"
        raise TraceFileError(path, f"has a malformed event ({why})")
    for cpid, trace in by_process.items():
        trace.records.sort(key=lambda r: r.start_ns)
        trace.skipped = skipped
        trace.thread_names = names.get(cpid, {})
    return sorted((by_process[k] for k in sorted(by_process)), key=lambda t: t.rank)
