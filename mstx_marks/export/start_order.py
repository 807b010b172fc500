"""Records in start order, in bounded memory: the order a process's exports are written in.

The Chrome trace splits each thread into tracks of ranges that nest, which needs each thread's
ranges in start order, and the database numbers its events in start order. A spill is already
nearly in that order: blocks come in slot order, and a slot is taken when a range starts. What
is out of place is little and of two kinds: a few thousand events between threads racing for
slots, and events written as lines of their own (user arguments, a range that outlived a
write: a ``step`` can start hundreds of thousands of events before it is written).

So :class:`StartOrder` keeps a window of the latest events sorted (a merge of two sorted runs,
done by ``list.sort``, in C) and lets out everything older than the window; an event that
comes after its place was let out (an outlived range) is put aside as *late*. The let-out
stream is written to a scratch file beside the exports, the late events, sorted, in runs of
their own; :meth:`StartOrder.batches` reads the stream back and merges the late events into
it. Memory is a window, a chunk and a batch of events, whatever the file holds, and the cost is
a few C sorts of nearly sorted lists and one pickle round trip per event (a k-way merge of
sorted runs would pay a Python step per event). Events at the same start keep the order they
came in.

An event is a plain tuple (pickled fast, unlike a named tuple): ``(start, end, thread, name,
domain, pid, kind, args)``, ``kind`` one of :data:`RANGE`, :data:`OPEN` (a range still running
when it was written, ended then) and :data:`INSTANT` (whose ``end`` is its start).

>>> from mstx_marks.base.records import InstantRecord, RangeRecord
>>> order = StartOrder(lambda: None)
>>> order.extend([RangeRecord("b", "d", 20, 30, 1, 9), InstantRecord("a", "d", 10, 1, 9)])
>>> [(e[START], e[NAME], e[KIND]) for batch in order.batches() for e in batch]
[(10, 'a', 2), (20, 'b', 0)]
"""

from __future__ import annotations

import heapq
import pickle
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping
from operator import itemgetter
from typing import IO, Any, Final, Optional, Tuple

from mstx_marks.base.records import InstantRecord, RangeRecord, Record

__all__ = [
    "ARGS",
    "DOMAIN",
    "END",
    "INSTANT",
    "KIND",
    "NAME",
    "OPEN",
    "PID",
    "RANGE",
    "START",
    "THREAD",
    "Event",
    "StartOrder",
    "as_record",
    "events",
]

Event = Tuple[int, int, int, str, str, int, int, Optional[Mapping[str, Any]]]
# The fields of an event (Final: mypy then knows each field's type).
START: Final = 0
END: Final = 1
THREAD: Final = 2
NAME: Final = 3
DOMAIN: Final = 4
PID: Final = 5
KIND: Final = 6
ARGS: Final = 7
#: ``kind``: a range, a range still open when written (ended then), an instant.
RANGE: Final = 0
OPEN: Final = 1
INSTANT: Final = 2

_by_start = itemgetter(START)
#: Events sorted at a time, and events kept sorted in the window (see the module's docstring:
#: the window holds the spill's usual disorder, a few thousand events between threads).
CHUNK = 16384
WINDOW = 16384
#: Late events per pickle of a run, and runs merged at once (what a merge holds: their product).
_RUN_PIECE = 1024
_FAN_IN = 32


def events(records: Iterable[Record]) -> list[Event]:
    """``records`` as events (see the module's docstring).

    >>> events([RangeRecord("gen", "d", 5, 9, 1, 7, True)])
    [(5, 9, 1, 'gen', 'd', 7, 1, None)]
    """
    # A RangeRecord has 8 fields, an InstantRecord 6: len() tells them apart at C speed.
    return [
        (r[2], r[3], r[4], r[0], r[1], r[5], OPEN if r[6] else RANGE, r[7])
        if len(r) == 8
        else (r[2], r[2], r[3], r[0], r[1], r[4], INSTANT, r[5])
        for r in records
    ]


def as_record(e: Event) -> Record:
    """The record an event was made from (:func:`events`)."""
    if e[KIND] == INSTANT:
        return InstantRecord(e[NAME], e[DOMAIN], e[START], e[THREAD], e[PID], e[ARGS])
    return RangeRecord(
        e[NAME], e[DOMAIN], e[START], e[END], e[THREAD], e[PID], e[KIND] == OPEN, e[ARGS]
    )


class _Runs:
    """Sorted runs of events in one scratch file, each a list of pickles read back lazily."""

    def __init__(self, file: IO[bytes]) -> None:
        self.file = file
        self.runs: list[list[int]] = []  # per run, the offsets of its pickles

    def write(self, evs: Iterable[Event]) -> None:
        """Add a run (``evs`` sorted by start: they may be read from this file's runs)."""
        offsets: list[int] = []
        piece: list[Event] = []
        for e in evs:
            piece.append(e)
            if len(piece) >= _RUN_PIECE:
                offsets.append(self._dump(piece))
                piece = []
        if piece:
            offsets.append(self._dump(piece))
        self.runs.append(offsets)

    def _dump(self, piece: list[Event]) -> int:
        f = self.file
        offset = f.seek(0, 2)  # (reading runs moves the file's position)
        pickle.dump(piece, f, pickle.HIGHEST_PROTOCOL)
        return offset

    def read(self, offsets: list[int]) -> Iterator[Event]:
        f = self.file
        for offset in offsets:
            f.seek(offset)
            yield from pickle.load(f)

    def merged(self) -> Iterator[Event]:
        """All runs as one sorted stream; ties in run order (the order the events came in).
        Past :data:`_FAN_IN` runs, the first ones are merged into one run first, so a merge
        never holds more than that many pieces."""
        while len(self.runs) > _FAN_IN:
            first, self.runs = self.runs[:_FAN_IN], self.runs[_FAN_IN:]
            self.write(heapq.merge(*(self.read(r) for r in first), key=_by_start))
            # (the new run holds the oldest events: it goes first, ties then keep their order)
            self.runs.insert(0, self.runs.pop())
        return heapq.merge(*(self.read(r) for r in self.runs), key=_by_start)


class StartOrder:
    """Takes records in any order (:meth:`add`, :meth:`extend`), gives them back as events in
    start order (:meth:`batches`), holding a bounded number at once (see the module's
    docstring). ``scratch()`` makes a scratch file, called only once more than a window's worth
    has come; ``check(count)`` is called after each chunk (a deadline's check: it may raise).
    A context manager: leaving it closes the scratch files."""

    def __init__(
        self,
        scratch: Callable[[], IO[bytes] | None],
        *,
        check: Callable[[int], object] | None = None,
        chunk: int | None = None,
        window: int | None = None,
    ) -> None:
        self._scratch, self._check = scratch, check
        self._chunk, self._window = chunk or CHUNK, window or WINDOW
        self._new: list[Record] = []
        self._held: list[Event] = []  # the window, sorted
        self._floor: int | None = None  # the start of the last event let out
        self._stream: IO[bytes] | None = None  # the events let out, in order (pickles)
        self._late: list[Event] = []
        self._late_runs: _Runs | None = None
        self._count = 0
        self._first: int | None = None
        new, size, take = self._new, self._chunk, self._take

        def add(rec: Record) -> None:
            new.append(rec)
            if len(new) >= size:
                take()

        #: Take one record (a sink for :func:`~mstx_marks.export.spill.read_spill`).
        self.add = add

    def extend(self, records: Iterable[Record]) -> None:
        """Take many records at once."""
        records = records if isinstance(records, list) else list(records)
        for lo in range(0, len(records), self._chunk):
            self._new += records[lo : lo + self._chunk]
            self._take()

    @property
    def count(self) -> int:
        """Records taken so far."""
        return self._count + len(self._new)

    @property
    def first(self) -> int | None:
        """The earliest start of the records taken (None: none)."""
        self._take()
        return self._first

    def __enter__(self) -> StartOrder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the scratch files (their space is freed: they have no name)."""
        if self._stream is not None:
            self._stream.close()
        if self._late_runs is not None:
            self._late_runs.file.close()
        self._stream = self._late_runs = None

    def _take(self) -> None:
        evs = events(self._new)
        self._new.clear()
        if not evs:
            return
        self._count += len(evs)
        evs.sort(key=_by_start)  # stable: the same start keeps the order it came in
        if self._first is None or evs[0][START] < self._first:
            self._first = evs[0][START]
        floor = self._floor
        if floor is not None and evs[0][START] < floor:
            cut = bisect_left(evs, floor, key=_by_start)
            self._put_late(evs[:cut])
            del evs[:cut]
        held = self._held
        held += evs
        held.sort(key=_by_start)  # two sorted runs, the window's first: a linear merge
        over = len(held) - self._window
        if over > 0:
            out = held[:over]
            del held[:over]
            self._floor = out[-1][START]
            self._let_out(out)
        if self._check is not None:
            self._check(self._count)

    def _let_out(self, out: list[Event]) -> None:
        if self._stream is None:
            self._stream = self._new_scratch()
        pickle.dump(out, self._stream, pickle.HIGHEST_PROTOCOL)

    def _new_scratch(self) -> IO[bytes]:
        f = self._scratch()
        if f is None:
            raise RuntimeError("StartOrder: more events than a window, and no scratch file")
        return f

    def _put_late(self, evs: list[Event]) -> None:
        late = self._late
        late += evs
        if len(late) >= self._chunk:
            if self._late_runs is None:
                self._late_runs = _Runs(self._new_scratch())
            late.sort(key=_by_start)
            self._late_runs.write(late)
            late.clear()

    def batches(self) -> Iterator[list[Event]]:
        """Every event taken, in start order (those of one start in the order they came), in
        batches that never split one start between two (but past four chunks of events at one
        start)."""
        self._take()
        stream = self._let_out_again()
        late = self._late_stream()
        if late is not None:
            stream = _merged(stream, late)
        return _whole_starts(stream, 4 * self._chunk)

    def _let_out_again(self) -> Iterator[list[Event]]:
        f = self._stream
        if f is not None:
            f.flush()
            end = f.tell()
            f.seek(0)
            while f.tell() < end:
                yield pickle.load(f)
        if self._held:
            yield self._held
            self._held = []

    def _late_stream(self) -> Iterator[Event] | None:
        late = self._late
        late.sort(key=_by_start)
        if self._late_runs is None:
            return iter(late) if late else None
        self._late_runs.write(late)
        late.clear()
        return self._late_runs.merged()


def _merged(stream: Iterator[list[Event]], late: Iterator[Event]) -> Iterator[list[Event]]:
    """The let-out ``stream`` with the ``late`` events in their places. An event let out came
    before any late one of the same start (the late one's start was below the window's floor
    when it came, so a let-out one of that start had come before), so at one start the let-out
    events go first: the order they came in."""
    pending = next(late, None)
    for batch in stream:
        last = batch[-1][START]
        if pending is not None and pending[START] < last:
            taken = []
            while pending is not None and pending[START] < last:
                taken.append(pending)
                pending = next(late, None)
            batch = batch + taken
            batch.sort(key=_by_start)
        yield batch
    rest = [] if pending is None else [pending]
    for e in late:
        rest.append(e)
        if len(rest) >= CHUNK:
            yield rest
            rest = []
    if rest:
        yield rest


def _whole_starts(stream: Iterator[list[Event]], most: int) -> Iterator[list[Event]]:
    """``stream``'s batches, the events of a batch's last start moved to the next batch: the
    track splitting sorts each start's ranges by end (see :mod:`.chrome`), which needs them
    together. Only past ``most`` events at one start are they split (memory stays bounded)."""
    carry: list[Event] = []
    for batch in stream:
        if carry:
            batch = carry + batch
        cut = bisect_left(batch, batch[-1][START], key=_by_start)
        if cut == 0:  # all of one start
            if len(batch) < most:
                carry = batch
                continue
            carry = []
            yield batch
            continue
        carry = batch[cut:]
        del batch[cut:]
        yield batch
    if carry:
        yield carry
