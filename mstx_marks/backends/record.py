"""An in-process recorder of ranges and instants, for tests, CPU boxes and the exporters.

Records live in fixed-size columns (``array`` chunks of 16 Ki entries: start, end, name key,
thread number), so a range costs 24 bytes whatever its name, and the hot path takes no lock:
a range's slot comes from an atomic counter and each write is a single item store. Names and
domains are interned once, up to ``names`` distinct pairs (65,536; ``MSTX_MARKS_RECORD_NAMES``):
a run making a name per step or request would grow the table for ever (400,000 names held
95 MB), so later new names are recorded as ``(other names)``, said once. When ``capacity``
ranges are held, further ones are dropped and counted.

Times are the monotonic clock's, placed on the wall clock's axis by an anchor taken at import
(:func:`now_ns`): a duration never takes in a step of the wall clock (NTP's, or one set by
hand), and the processes of a job still share one axis. :func:`clock_step_ns` says how far the
wall clock has moved since (the spill writes it down and says it).

A reader that keeps what it drains (the spill, which writes it to disk) hands chunks back with
``drain(..., release=True)``: a chunk whose events were all drained and whose ranges all ended
is freed, and the recording goes on in new chunks, at most ``capacity`` events' worth held at
once. A spilled recording then runs for ever in constant memory, and drops (a whole chunk of
slots at a time, counted) only while the spill is ``capacity`` events behind.

Range ids keep counting across :meth:`Recorder.clear` (and the clear a forked child makes), so
ending a range that was open when the recording was cleared does nothing, instead of ending
whatever took its slot. The one lock (for new names and new chunks) is reentrant: a signal
handler that starts a range while its thread held it does not deadlock.

>>> rec = Recorder(capacity=10)
>>> rec.range_end(rec.range_start("step", "default"), "default")
>>> [(r.name, r.domain, r.kind) for r in rec.records()]
[('step', 'default', 'range')]
"""

from __future__ import annotations

import functools
import itertools
import os
import threading
import weakref
from array import array
from time import monotonic_ns, time_ns
from typing import Any, Callable, Mapping, NamedTuple, Sequence

from mstx_marks.backends.base import Backend, Emitter
from mstx_marks.base import env
from mstx_marks.base.diagnostics import warn_once
from mstx_marks.base.forking import after_fork_in_child, new_lock
from mstx_marks.base.interrupts import users_own
from mstx_marks.base.records import InstantRecord, RangeRecord, Record

__all__ = [
    "NAMES",
    "OTHER_NAMES",
    "Block",
    "DrainCursor",
    "Recorder",
    "anchor_ns",
    "block_records",
    "clock_step_ns",
    "default_recorder",
    "native_thread_ids",
    "now_ns",
    "thread_names",
]

#: Distinct ``(name, domain)`` pairs a recorder keeps by default (``MSTX_MARKS_RECORD_NAMES``).
NAMES = 65_536
#: The name later new names are recorded under, past a recorder's ``names``.
OTHER_NAMES = "(other names)"


def _wall_less_monotonic() -> int:
    """The wall clock less the monotonic clock, from the tightest of three reads: a thread
    switched out between two reads must not count its wait as a clock step."""
    best = (1 << 62, 0)
    for _ in range(3):
        before = monotonic_ns()
        wall = time_ns()
        after = monotonic_ns()
        best = min(best, (after - before, wall - (before + after) // 2))
    return best[1]


# Every time the recorder keeps is monotonic_ns() + _anchor: a duration is the monotonic
# clock's (an NTP step of the wall clock inside a range does not lengthen it), and the times are
# on the wall clock's axis as it read at import, so the processes of a job line up.
_anchor = _wall_less_monotonic()


def now_ns() -> int:
    """The recorder's clock: monotonic, placed on the wall clock as it read when this process
    began (:func:`anchor_ns`).

    >>> abs(now_ns() - time_ns()) < 10**9  # (unless the wall clock stepped since)
    True
    """
    return monotonic_ns() + _anchor


def anchor_ns() -> int:
    """The wall clock less the monotonic clock when this process began recording: what
    :func:`now_ns` adds to the monotonic clock (the spill's header says it)."""
    return _anchor


def clock_step_ns() -> int:
    """How far the wall clock has moved against the monotonic one since :func:`anchor_ns` was
    taken: an NTP step, a clock set by hand, a suspend; about 0 when none happened. Recorded
    times keep the anchor's axis (they would jump with the wall clock otherwise)."""
    return _wall_less_monotonic() - _anchor


_SHIFT = 14
_CHUNK = 1 << _SHIFT
_MASK = _CHUNK - 1
_OPEN = 0  # end column value of a range that has not ended
_INSTANT = -1  # end column value of an instant event
_GIVEN_UP = -2  # end column value of a slot whose start was interrupted before its key was set
_get_tid = threading.get_native_id
# Placeholders in the chunk lists: a chunk freed after a release (its ends still take a stray
# late write), and a chunk never held because the recorder was full (its slots were dropped).
_GONE: array[int] = array("q")
_GONE_ENDS: array[int] = array("q", bytes(8 * _CHUNK))
_VOID: array[int] = array("q")
_UNLIMITED = 1 << 62
#: Native thread ids by thread number: the columns hold the 4-byte number, not the 8-byte id.
_threads: list[int] = []
#: The name each numbered thread had when it first recorded.
_thread_names: list[str] = []
_threads_lock = new_lock(reentrant=True)  # a signal handler may start a range meanwhile
_new = tuple.__new__
# The native thread id is a system call (~200 ns); each thread asks once and keeps its number.
_tls = threading.local()


def _thread_number() -> int:
    with _threads_lock:
        _threads.append(_get_tid())
        # Its name as it records (``rollout-0``): kept, since a thread that ended before the
        # files are written is no longer there to be asked.
        _thread_names.append(threading.current_thread().name)
        number = _tls.number = len(_threads) - 1
        return number


def _forget_thread_ids() -> None:
    global _tls
    _tls = threading.local()  # a forked child's thread has a new id


after_fork_in_child(_forget_thread_ids)


class Recorder(Backend):
    """Thread-safe, bounded in-memory backend (``backend="record"``).

    >>> rec = Recorder()
    >>> rec.instant("weights_synced", "verl")
    >>> rec.records()[0].kind
    'instant'
    """

    name = "record"

    def __init__(self, capacity: int = 1_000_000, names: int = NAMES) -> None:
        if type(capacity) is not int or capacity < 1:
            raise ValueError(f"capacity must be an int >= 1, got {capacity!r}")
        if type(names) is not int or names < 1:
            raise ValueError(f"names must be an int >= 1, got {names!r}")
        self.capacity = capacity
        #: Distinct ``(name, domain)`` pairs kept per generation; later new names are recorded
        #: as :data:`OTHER_NAMES` (a kept name costs about 200 bytes for the process's life).
        self.names_kept = names
        self._lock = new_lock(reentrant=True)
        self._base = 0
        self._reset()
        # A forked worker must not report its parent's ranges as its own.
        after_fork_in_child(functools.partial(_clear_if_alive, weakref.ref(self)))

    def _reset(self) -> None:
        # Ids of this recording start past every id handed out before, whose ends are ignored.
        if hasattr(self, "_next"):
            self._base += self._issued()
        self._next = itertools.count()
        #: Slots from this one on are dropped (exact, until a release switches to chunks).
        self._limit = self.capacity
        #: Chunks freed after a release, and chunks never held (their slots were dropped).
        self._freed = self._void = 0
        #: User arguments of events that have some (``mark(name, args=...)``), by slot.
        self._args: dict[int, Mapping[str, Any]] = {}
        self._starts: list[array[int]] = []
        self._ends: list[array[int]] = []
        self._keys: list[array[int]] = []
        self._tids: list[array[int]] = []
        # domain -> name -> key; key 0 marks an unwritten slot.
        self._key_of: dict[str, dict[str, int]] = {}
        self._names: list[tuple[str, str]] = [("", "")]
        #: The :data:`OTHER_NAMES` key of each domain known when the table filled up.
        self._others: dict[str, int] = {}
        self._dropped = 0
        #: Starts interrupted by an exception (a signal handler's) before they completed.
        self._given_up = 0
        self._pid = os.getpid()
        self.generation = getattr(self, "generation", 0) + 1

    def clear(self) -> None:
        """Forget everything recorded so far."""
        with self._lock:
            self._reset()

    @property
    def pid(self) -> int:
        """The process whose events these are (a forked child's own, once it cleared)."""
        return self._pid

    def _issued(self) -> int:
        return int(self._next.__reduce__()[1][0])  # itertools.count's state, not consumed

    @property
    def used(self) -> int:
        """How many events were recorded (or are being recorded) so far; O(1)."""
        return min(self._issued(), self._limit) - self._dropped_slots()

    @property
    def held(self) -> int:
        """How many event slots are in memory now: freed and dropped chunks excluded."""
        return (len(self._starts) - self._freed - self._void) * _CHUNK

    def _dropped_slots(self) -> int:
        return self._void * _CHUNK

    @property
    def given_up(self) -> int:
        """How many starts an exception interrupted before they were recorded."""
        return self._given_up

    @property
    def dropped(self) -> int:
        """How many ranges and instants were not recorded because the recorder was full."""
        return self._dropped

    def _new_key(self, name: str, domain: str) -> int:
        with self._lock:
            names = self._key_of.get(domain)
            key = None if names is None else names.get(name)
            if key is not None:
                return key
            if len(self._names) > self.names_kept:
                return self._other_key(domain)
            if names is None:
                names = self._key_of[domain] = {}
            key = names[name] = len(self._names)
            self._names.append((name, domain))
            return key

    def _other_key(self, domain: str) -> int:
        """The key new names take once the table is full: :data:`OTHER_NAMES` in ``domain``
        when the domain was known by then, else in a domain of that name (so neither names nor
        domains grow the table without bound). Not kept in ``_key_of``: such a name comes here
        at each start (a lock, a fraction of a microsecond), never into memory."""
        if domain not in self._key_of:
            domain = OTHER_NAMES
        key = self._others.get(domain)
        if key is None:
            key = self._others[domain] = len(self._names)
            self._names.append((OTHER_NAMES, domain))
            warn_once(
                ("names kept", id(self), self.generation),
                f"more than {self.names_kept} distinct range names were recorded: later new"
                f" names are recorded as {OTHER_NAMES!r} in their domain (a name per step or"
                " request id is better as an argument, mark(name, args=...); or set"
                f" {env.RECORD_NAMES} higher, about 200 bytes a name)",
            )
        return key

    def _grow(self, chunk: int) -> None:
        with self._lock:
            while len(self._starts) <= chunk:
                if self._limit > self.capacity and self._live() >= self._max_chunks():
                    # Released mode and no room: this chunk's slots are dropped, all of them.
                    self._void += 1
                    for column in (self._ends, self._keys, self._tids, self._starts):
                        column.append(_VOID)
                    continue
                zeros = bytes(8 * _CHUNK)
                # range_start checks len(self._starts) without the lock: the other columns must
                # have their chunk before _starts gets it, or a concurrent start indexes past them.
                self._ends.append(array("q", zeros))
                self._keys.append(array("I", bytes(4 * _CHUNK)))
                self._tids.append(array("I", bytes(4 * _CHUNK)))
                self._starts.append(array("q", zeros))

    def _live(self) -> int:
        return len(self._starts) - self._freed - self._void

    def _max_chunks(self) -> int:
        return max(1, -(-self.capacity // _CHUNK))

    def _drop(self) -> int:
        with self._lock:
            self._dropped += 1
        return 0

    # The hot path of the recorder: one Python frame per range start, no lock.
    def range_start(self, name: str, domain: str, _end: int = _OPEN) -> int:
        """Open a range; the returned id (>= 1, or 0 when full) goes to :meth:`range_end`."""
        # An exception may arrive at any line below (a signal handler's, a RecursionError): the
        # slot is then given up, not left unwritten, or every later drain would wait on it. The
        # try costs nothing until something raises (CPython 3.11's zero-cost exceptions).
        i = -1
        try:
            i = next(self._next)
            if i >= self._limit:
                return self._drop()
            chunk, off = i >> _SHIFT, i & _MASK
            try:  # _starts gets a new chunk last, so every column has it once _starts does
                starts = self._starts[chunk]
            except IndexError:
                self._grow(chunk)
                starts = self._starts[chunk]
            if starts is _VOID:
                return self._drop()
            try:
                self._tids[chunk][off] = _tls.number
            except AttributeError:
                self._tids[chunk][off] = _thread_number()
            self._ends[chunk][off] = _end
            starts[off] = monotonic_ns() + _anchor
            try:
                key = self._key_of[domain][name]
            except KeyError:
                key = self._new_key(name, domain)
            self._keys[chunk][off] = key  # last: a slot with a key is complete (drain reads it)
            return self._base + i + 1
        except BaseException:
            if i >= 0:
                self._give_up(i)
            raise

    def _give_up(self, i: int) -> None:
        """Slot ``i``'s start was interrupted: mark it given up (key 0, end ``_GIVEN_UP``), which
        drains step over; or, if its key was already written (the range is recorded, its id
        lost with the exception), end it now so it is not open for ever."""
        if i >= self._limit:
            return
        chunk, off = i >> _SHIFT, i & _MASK
        try:
            if len(self._starts) <= chunk:
                self._grow(chunk)
            if self._keys[chunk] is _VOID or self._keys[chunk] is _GONE:
                return
            if self._keys[chunk][off]:
                if self._ends[chunk][off] == _OPEN:
                    self._ends[chunk][off] = now_ns()
            else:
                self._ends[chunk][off] = _GIVEN_UP
            self._given_up += 1
        except BaseException:  # a second interruption: the drain's stall check still steps over
            return

    def range_end(self, range_id: int, domain: str) -> None:
        """Close a range opened by :meth:`range_start`, from any thread; one opened before the
        last :meth:`clear` is ignored."""
        i = range_id - self._base - 1
        if i >= 0:
            self._ends[i >> _SHIFT][i & _MASK] = monotonic_ns() + _anchor

    def set_args(self, range_id: int, args: Mapping[str, Any]) -> None:
        """Attach a copy of ``args`` to the event ``range_id`` (what :meth:`range_start`
        returned). A copy, taken now: a dict the caller reuses across steps (``args["step"] =
        i``) must record each step's value, not the last one (a shallow copy: about 0.1-0.2 us
        for a few keys; values are kept as they are)."""
        i = range_id - self._base - 1
        if i >= 0:
            try:
                self._args[i] = dict(args)
            except Exception as exc:  # a mapping that cannot be copied: keep it as it is
                if users_own(exc):
                    raise
                self._args[i] = args

    def instant_with_args(
        self, name: str, domain: str, args: Mapping[str, Any], stream: object = None
    ) -> None:
        """Record an instant event carrying ``args``."""
        self.set_args(self.range_start(name, domain, _INSTANT), args)

    def instant(self, name: str, domain: str) -> None:
        """Record an instant event."""
        self.range_start(name, domain, _INSTANT)

    def records_into(self) -> Recorder:
        return self

    def keep_args(self, handle: Any, args: Mapping[str, Any]) -> None:
        if type(handle) is int:
            self.set_args(handle, args)

    def emitter(self, stream: object) -> Emitter:
        return Emitter(self, self.range_start, self.range_end, self.instant)

    def drain(
        self,
        cursor: DrainCursor,
        limit: int = 1 << 62,
        upto: int | None = None,
        *,
        release: bool = False,
    ) -> list[Record]:
        """The events completed since ``cursor`` last looked (ranges that ended, instants), and
        advance it. Ranges still open are kept in the cursor and come out once they end. At
        most about ``limit`` new slots are looked at, so a caller can work in batches; slots
        from ``upto`` on (a :attr:`used` taken earlier) are left for later, so a writer does not
        chase threads still recording. Costs O(new slots + open ranges). With ``release`` the
        chunks drained whole (every range in them ended) are freed for new events: only for a
        caller that keeps what it drained, since :meth:`records` no longer holds them.

        >>> rec, cursor = Recorder(), DrainCursor()
        >>> rec.range_end(rec.range_start("step", "d"), "d")
        >>> [r.name for r in rec.drain(cursor)], rec.drain(cursor)
        (['step'], [])
        """
        blocks, out = self.drain_blocks(cursor, limit, upto, release=release)
        names, pid = self._names, self._pid
        for block in blocks:
            block_records(block, names, _threads, pid, out.append)
        return out

    def drain_blocks(
        self,
        cursor: DrainCursor,
        limit: int = 1 << 62,
        upto: int | None = None,
        *,
        release: bool = False,
    ) -> tuple[list[Block], list[Record]]:
        """What :meth:`drain` gives, as the columns themselves (copied, a block per chunk) and
        the few events that do not fit them as records: ranges that were open at an earlier
        drain and have ended since, and events with user arguments. A slot of a block with key
        0 is not in it (a range still open, or an event given as a record). This is what the
        spill writes: copying columns costs a small fraction of making a record per event.
        Names and thread numbers resolve through :meth:`names` and :func:`native_thread_ids`."""
        if cursor.generation != self.generation:  # cleared (or forked) since: start over
            cursor.reset(self.generation)
        records: list[Record] = []
        names, pid, args = self._names, self._pid, self._args
        still_open = []
        for i in cursor.open:
            chunk, off = i >> _SHIFT, i & _MASK
            end = self._ends[chunk][off]
            if end == _OPEN:
                still_open.append(i)
            else:
                name, domain = names[self._keys[chunk][off]]
                start, tid = self._starts[chunk][off], _threads[self._tids[chunk][off]]
                records.append(RangeRecord(name, domain, start, end, tid, pid, False, args.get(i)))
        first = cursor.next >> _SHIFT
        if release:
            self._limit = _UNLIMITED  # from now on, room is counted in chunks (see _grow)
        i, issued = cursor.next, min(self._issued(), self._limit)
        if upto is not None:
            issued = min(issued, upto)
        blocks: list[Block] = []
        taken = 0
        while i < issued and (chunk := i >> _SHIFT) < len(self._starts):
            off = i & _MASK
            column = self._keys[chunk]
            if column is _VOID or column is _GONE:  # dropped whole, or released after a drain
                i = (chunk + 1) << _SHIFT
                continue
            stop = min(_CHUNK, off + issued - i, off + max(1, limit - taken))
            keys = column[off:stop]
            looked = len(keys)
            if 0 in keys:  # a slot issued, not yet written: the block ends before it
                del keys[self._pending(keys, chunk, off) :]
            stop = off + len(keys)
            block = Block(
                keys, self._starts[chunk][off:stop], self._ends[chunk][off:stop],
                self._tids[chunk][off:stop],
            )  # fmt: skip
            self._take_out(block, i, still_open, records)
            if block.keys.count(0) < len(block.keys):
                blocks.append(block)
            taken += len(keys)
            i += len(keys)
            if len(keys) < looked or taken >= limit:
                break
        cursor.next, cursor.open = i, still_open
        if release:
            self._release(first, i >> _SHIFT, still_open, cursor)
        return blocks, records

    def _pending(self, keys: array[int], chunk: int, off: int) -> int:
        """The index in ``keys`` (slots from ``off`` of ``chunk``) of the first slot still
        being written, stepping over those given up (:meth:`_give_up`); ``len(keys)`` if none."""
        ends = self._ends[chunk]
        j = keys.index(0)
        while ends[off + j] == _GIVEN_UP:
            try:
                j = keys.index(0, j + 1)
            except ValueError:
                return len(keys)
        return j

    def _take_out(
        self, block: Block, first: int, still_open: list[int], records: list[Record]
    ) -> None:
        """Zero the keys of ``block``'s slots that are not its to carry: ranges still open (to
        ``still_open``) and events with arguments (to ``records``)."""
        keys, ends = block.keys, block.ends
        j = -1
        for _ in range(ends.count(_OPEN)):
            j = ends.index(_OPEN, j + 1)
            still_open.append(first + j)
            keys[j] = 0
        args = self._args
        if not args:
            return
        n = len(keys)
        slots = (
            [s for s in args if first <= s < first + n]
            if len(args) < n
            else [s for s in range(first, first + n) if s in args]
        )
        for slot in sorted(slots):
            j = slot - first
            key = keys[j]
            if not key:
                continue  # still open: it comes out, with its arguments, once it ends
            keys[j] = 0
            name, domain = self._names[key]
            start, tid, end = block.starts[j], _threads[block.threads[j]], block.ends[j]
            if end == _INSTANT:
                records.append(InstantRecord(name, domain, start, tid, self._pid, args[slot]))
            else:
                records.append(
                    RangeRecord(name, domain, start, end, tid, self._pid, False, args[slot])
                )

    def names(self, first: int = 1) -> list[tuple[str, str]]:
        """The ``(name, domain)`` of keys ``first``, ``first + 1``, ...: what a block's keys
        mean (keys start at 1 in each :attr:`generation`)."""
        return self._names[first:]

    def _release(self, first: int, stop: int, still_open: list[int], cursor: DrainCursor) -> None:
        """Free chunks ``first`` .. ``stop - 1`` (every slot drained), but those holding a range
        still open; chunks kept for that earlier are tried again."""
        pinned = {j >> _SHIFT for j in still_open}
        with self._lock:
            for chunk in [*cursor.pinned, *range(first, stop)]:
                if chunk in pinned or self._keys[chunk] is _VOID or self._keys[chunk] is _GONE:
                    continue
                for column in (self._keys, self._tids, self._starts):
                    column[chunk] = _GONE
                self._ends[chunk] = _GONE_ENDS  # a stray late end lands here, harmlessly
                self._freed += 1
                base = chunk << _SHIFT
                for slot in [s for s in self._args if base <= s < base + _CHUNK]:
                    del self._args[slot]
            cursor.pinned = sorted(c for c in pinned if c < stop)

    def open_ranges(self, cursor: DrainCursor) -> list[RangeRecord]:
        """The ranges ``cursor`` holds as still open, ended now and flagged ``open``."""
        if cursor.generation != self.generation:
            return []
        now, out = now_ns(), []
        for i in cursor.open:
            chunk, off = i >> _SHIFT, i & _MASK
            if self._ends[chunk][off] == _OPEN:
                name, domain = self._names[self._keys[chunk][off]]
                start, tid = self._starts[chunk][off], _threads[self._tids[chunk][off]]
                out.append(
                    RangeRecord(
                        name,
                        domain,
                        start,
                        max(now, start),
                        tid,
                        self._pid,
                        True,
                        self._args.get(i),
                    )
                )
        return out

    def __len__(self) -> int:
        return sum(1 for keys in self._keys for k in keys if k)

    def records(self) -> list[Record]:
        """Everything recorded, in the order the events started. A range still open is ended
        now and flagged ``open``."""
        out: list[Record] = []
        names, pid, now, args = self._names, self._pid, now_ns(), self._args
        i = -1
        threads = _threads
        for starts, ends, keys, tids in zip(self._starts, self._ends, self._keys, self._tids):
            if keys is _GONE or keys is _VOID:  # freed after a spill drained it, or dropped
                i += _CHUNK
                continue
            for start, end, key, number in zip(starts, ends, keys, tids):
                i += 1
                if not key:
                    continue
                tid = threads[number]
                name, domain = names[key]
                extra = args.get(i) if args else None
                if end == _INSTANT:
                    out.append(_new(InstantRecord, (name, domain, start, tid, pid, extra)))
                elif end == _OPEN:
                    end = max(now, start)
                    out.append(_new(RangeRecord, (name, domain, start, end, tid, pid, True, extra)))
                else:
                    out.append(
                        _new(RangeRecord, (name, domain, start, end, tid, pid, False, extra))
                    )
        return out


class Block(NamedTuple):
    """A run of consecutive slots of one chunk, copied: what :meth:`Recorder.drain_blocks`
    gives. ``keys`` (``array("I")``, 0 for a slot not in the block), ``starts`` and ``ends``
    (``array("q")``; an instant's end is -1) and ``threads`` (``array("I")``, thread numbers:
    see :func:`native_thread_ids`) have one item per slot."""

    keys: array[int]
    starts: array[int]
    ends: array[int]
    threads: array[int]

    @property
    def events(self) -> int:
        """How many events the block carries."""
        return len(self.keys) - self.keys.count(0)


def block_records(
    block: Block,
    names: Sequence[tuple[str, str]] | Mapping[int, tuple[str, str]],
    threads: Sequence[int] | Mapping[int, int],
    pid: int,
    sink: Callable[[Record], object],
) -> int:
    """Hand ``block``'s events to ``sink`` as records, names and native thread ids looked up in
    ``names`` and ``threads``; returns how many could not be (an unknown key or thread number,
    a range that ends before it starts: what a damaged file holds), which are left out.

    >>> got = []
    >>> b = Block(array("I", [1, 0]), array("q", [5, 6]), array("q", [9, -1]), array("I", [0, 0]))
    >>> block_records(b, {1: ("step", "d")}, [42], 7, got.append), [(r.name, r.end_ns) for r in got]
    (0, [('step', 9)])
    """
    bad = 0
    for key, start, end, number in zip(block.keys, block.starts, block.ends, block.threads):
        if not key:
            continue
        try:
            name, domain = names[key]
            tid = threads[number]
        except (IndexError, KeyError):
            bad += 1
            continue
        # tuple.__new__: the NamedTuples' own __new__ is a Python call, the most of the cost
        if end == _INSTANT:
            sink(_new(InstantRecord, (name, domain, start, tid, pid, None)))
        elif end >= start:
            sink(_new(RangeRecord, (name, domain, start, end, tid, pid, False, None)))
        else:
            bad += 1
    return bad


def native_thread_ids(first: int = 0) -> list[int]:
    """The native thread ids of thread numbers ``first``, ``first + 1``, ... (what a block's
    ``threads`` hold: numbers are this process's, and never reused)."""
    return _threads[first:]


def thread_names(first: int = 0) -> list[str]:
    """The names threads ``first``, ``first + 1``, ... had when they first recorded.

    >>> import threading
    >>> rec = Recorder()
    >>> t = threading.Thread(target=lambda: rec.instant("x", "d"), name="rollout-0")
    >>> t.start(); t.join()
    >>> thread_names()[native_thread_ids().index(rec.records()[0].thread)]
    'rollout-0'
    """
    return _thread_names[first:]


class DrainCursor:
    """Where :meth:`Recorder.drain` stopped: the next slot to look at, and the open ranges."""

    __slots__ = ("generation", "next", "open", "pinned")

    def __init__(self) -> None:
        self.reset(0)

    def reset(self, generation: int) -> None:
        self.generation, self.next = generation, 0
        self.open: list[int] = []
        #: Chunks drained whole but kept for a range still open in them (``release``).
        self.pinned: list[int] = []


def _clear_if_alive(ref: weakref.ref[Recorder]) -> None:
    recorder = ref()
    if recorder is not None:
        recorder.clear()


_default: Recorder | None = None
_default_lock = new_lock()


def default_recorder() -> Recorder:
    """The process-wide recorder that ``backend="record"`` uses.

    Its capacity comes from ``MSTX_MARKS_RECORD_CAPACITY`` (default one million events), the
    distinct names it keeps from ``MSTX_MARKS_RECORD_NAMES`` (default 65,536).
    """
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = Recorder(
                    env.positive_int(env.RECORD_CAPACITY, 1_000_000),
                    env.positive_int(env.RECORD_NAMES, NAMES),
                )
    return _default
