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
whatever took its slot.

The contract with interruptions. A signal handler may run, and raise, between any two calls
of the recording thread (CPython runs handlers and delivers asynchronous exceptions at calls,
function entries and backward jumps), and may record ranges of its own there; so may another
thread at the same points. So:

- **A start is reserve-then-commit, and no reader waits on it.** A slot comes from an atomic
  counter; its key is written last, and a slot with a key is complete. A drain steps past a
  slot without its key and keeps it (its chunk kept, as for an open range): it comes out once
  its key appears, and is counted as given up only after :data:`UNFINISHED_NS`. So a start cut
  short anywhere, a RecursionError inside the clean-up itself included, holds back nothing
  recorded after it. The clean-up after an exception (``_give_up``) only makes the count exact
  sooner.
- **Nothing on the recording path waits on a lock that the interrupted code may hold.** New
  names and thread numbers take none: each step is one atomic operation, none depends on the
  previous having run, and a step cut short leaves an unused entry, never a wrong one. New
  chunks take a reentrant lock held for memory work only, and are appended with no call in
  between (where no handler can run), so a handler that grows the columns meanwhile is seen.
- **The reader never waits on the recording thread.** Freeing drained chunks takes the lock
  without blocking; when it is busy the chunks are freed by a later drain. A freed chunk's
  columns are scratch arrays, so a write still in flight lands harmlessly.

>>> rec = Recorder(capacity=10)
>>> rec.range_end(rec.range_start("step", "default"), "default")
>>> [(r.name, r.domain, r.kind) for r in rec.records()]
[('step', 'default', 'range')]
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from array import array
from time import monotonic_ns, time_ns
from typing import Any, Callable, Mapping, NamedTuple, Sequence, Tuple

from mstx_marks.backends.base import Backend, Emitter
from mstx_marks.base import env
from mstx_marks.base.diagnostics import warn_once
from mstx_marks.base.forking import after_fork_in_child, new_lock
from mstx_marks.base.interrupts import users_own
from mstx_marks.base.records import InstantRecord, RangeRecord, Record

__all__ = [
    "NAMES",
    "OTHER_NAMES",
    "UNKNOWN_NAME",
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
#: The name and domain a reader gives an event whose name its file does not define.
UNKNOWN_NAME = "(unknown name)"
UNKNOWN = (UNKNOWN_NAME, "default")


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
# A freed chunk's columns are these shared scratch arrays, full size: a start or an end still
# in flight when its chunk was freed (a start the drain gave up on) lands here, harmlessly,
# instead of raising into the user's code.
_GONE_KEYS: array[int] = array("I", bytes(4 * _CHUNK))
_GONE_TIDS: array[int] = array("I", bytes(4 * _CHUNK))
_GONE_STARTS: array[int] = array("q", bytes(8 * _CHUNK))
_GONE_ENDS: array[int] = array("q", bytes(8 * _CHUNK))
_VOID: array[int] = array("q")
_UNLIMITED = 1 << 62
#: How long a drain keeps looking at a slot whose start has not completed before giving it up
#: (a start takes microseconds; one a signal handler interrupted waits for the handler, which
#: may save a checkpoint for minutes).
UNFINISHED_NS = 10 * 10**9
#: Native thread ids by thread number: the columns hold the 4-byte number, not the 8-byte id.
_threads: list[int] = []
#: The name each numbered thread had when it first recorded, by thread number.
_thread_names: dict[int, str] = {}
_new = tuple.__new__
# The native thread id is a system call (~200 ns); each thread asks once and keeps its number.
_tls = threading.local()


_Chunk = Tuple[Tuple["array[int]"], Tuple["array[int]"], Tuple["array[int]"], Tuple["array[int]"]]


def _new_chunk() -> _Chunk:
    """A chunk's four columns (ends, keys, thread numbers, starts), each in a 1-tuple: what
    ``_grow`` appends to the column lists with ``+=``, which calls nothing."""
    wide, narrow = bytes(8 * _CHUNK), bytes(4 * _CHUNK)
    return (array("q", wide),), (array("I", narrow),), (array("I", narrow),), (array("q", wide),)


def _thread_number() -> int:
    # No lock: a signal handler that records on this thread may run between any two calls here
    # (a lock would deadlock it, a reentrant one would let it pair our id with its number).
    # list.append is atomic, and the number is found again by value: an id equal to ours at or
    # after where we appended is ours, or a dead thread's whose id the system reused (same id).
    tid = _get_tid()
    before = len(_threads)
    _threads.append(tid)
    number = _threads.index(tid, before)
    # Its name as it records (``rollout-0``): kept, since a thread that ended before the
    # files are written is no longer there to be asked.
    _thread_names.setdefault(number, threading.current_thread().name)
    _tls.number = number
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
        # Held only for memory work, never across a wait, so whoever waits on it waits a few
        # microseconds; reentrant for a signal handler's grow (see _grow).
        self._lock = new_lock(reentrant=True)
        #: Called (from the recording thread, without blocking, never raising) when half the
        #: room is taken, once per new chunk: the spill's writer sets it to be woken early.
        self.wake_reader: Callable[[], None] | None = None
        self._base = 0
        self._reset()
        # A forked worker must not report its parent's ranges as its own.
        after_fork_in_child(self.clear)  # held weakly: a dropped recorder is freed

    def _reset(self) -> None:
        # The next chunk's columns, made ahead (_grow); here too, kept across a clear, so that
        # the first range's grow allocates nothing: a signal handler that records, landing in
        # that allocation, needed the same chunk, made its own, was interrupted in turn by the
        # next signal, and so on to the recursion limit (a 0.5 ms timer, CI's loaded machine).
        # Made first: a clear cut short here has reset nothing.
        spare = getattr(self, "_spare", None) or _new_chunk()
        # Ids of this recording start past every id handed out before, whose ends are ignored.
        if hasattr(self, "_next"):
            self._base += self._issued()
        self._next = itertools.count()
        #: Slots from this one on are dropped (exact, until a release switches to chunks).
        self._limit = self.capacity
        #: Chunks freed after a release, and chunks never held (their slots were dropped).
        self._freed = self._void = self._held_back = 0
        #: Slots dropped by the exact limit before the first release (see drain_blocks).
        self._dropped_span = (0, 0)
        #: User arguments of events that have some (``mark(name, args=...)``), by slot.
        self._args: dict[int, Mapping[str, Any]] = {}
        self._starts: list[array[int]] = []
        self._chunks = 0  # len(self._starts), kept where no call is needed to read it (_grow)
        self._spare: _Chunk | None = spare
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
        # No lock (see the module's contract): a signal handler may record a new name on this
        # thread between any two calls here. Each step is one atomic operation under the GIL,
        # and none depends on the previous one having run: the entry is appended, then found
        # again by value at or after where it went (another thread's append of the same pair
        # in between is the same name, so its key is as good), then published. Interrupted
        # before the publication, the entry is only unused (the next start appends another).
        names = self._key_of.get(domain)
        key = None if names is None else names.get(name)
        if key is not None:
            return key
        table = self._names
        before = len(table)
        if before > self.names_kept:
            return self._other_key(domain)
        entry = (name, domain)
        table.append(entry)
        key = table.index(entry, before)
        self._key_of.setdefault(domain, {})[name] = key
        return key

    def _other_key(self, domain: str) -> int:
        """The key new names take once the table is full: :data:`OTHER_NAMES` in ``domain``
        when the domain was known by then, else in a domain of that name (so neither names nor
        domains grow the table without bound). Not kept in ``_key_of``: such a name comes here
        at each start (a dict lookup), never into memory."""
        if domain not in self._key_of:
            domain = OTHER_NAMES
        key = self._others.get(domain)
        if key is None:
            table = self._names
            before = len(table)
            entry = (OTHER_NAMES, domain)
            table.append(entry)  # lock-free as in _new_key
            key = self._others.setdefault(domain, table.index(entry, before))
            warn_once(
                ("names kept", id(self), self.generation),
                f"more than {self.names_kept} distinct range names were recorded: later new"
                f" names are recorded as {OTHER_NAMES!r} in their domain (a name per step or"
                " request id is better as an argument, mark(name, args=...); or set"
                f" {env.RECORD_NAMES} higher, about 200 bytes a name)",
            )
        return key

    def _grow(self, chunk: int) -> None:
        """Give every column its chunks up to ``chunk`` (or mark them dropped, in released mode
        with no room); then, once per chunk, wake the reader when half the room is taken."""
        with self._lock:  # reentrant: a signal handler on this thread may grow meanwhile
            while (n := self._chunks) <= chunk:
                void = self._limit > self.capacity and self._live() >= self._max_chunks()
                columns = (_VOID,), (_VOID,), (_VOID,), (_VOID,)
                if not void:
                    # The spare made ahead (see _reset): no allocation here, where a signal
                    # handler needing this chunk too would make its own, be interrupted by the
                    # next signal, and so on (handlers every 0.5 ms nested to the recursion
                    # limit on a loaded machine).
                    columns = self._spare or _new_chunk()
                ends, keys, tids, starts = columns
                # From this check to the last store there is no call, so no signal handler can
                # run in between (CPython runs them only at calls, function entries and backward
                # jumps), and nothing allocates a tracked object (no garbage collection, whose
                # finalizers run Python code): a handler that grew the columns while the arrays
                # above were made is seen here, and no column gets a chunk twice. _starts gets
                # it last: range_start indexes _starts without the lock.
                if self._chunks == n:
                    self._ends += ends
                    self._keys += keys
                    self._tids += tids
                    self._starts += starts
                    self._void += void
                    self._chunks = n + 1
                    if columns is self._spare:
                        self._spare = None
            if self._spare is None:
                self._spare = _new_chunk()  # for the next grow (a chunk's worth of memory)
        wake = self.wake_reader
        if wake is not None and 2 * self._live() >= self._max_chunks():
            wake()
            if 4 * self._live() >= 3 * self._max_chunks():
                # Three quarters full and the reader still behind: a millisecond for it, once a
                # chunk (16,384 events), rather than dropping. On a loaded machine the system
                # may not run the reader's thread at all while this one holds the interpreter
                # (15,000 of 200,000 dropped); a disk slower than the program still drops.
                time.sleep(0.001)

    def _live(self) -> int:
        return len(self._starts) - self._freed - self._void - self._held_back

    def _max_chunks(self) -> int:
        return max(1, -(-self.capacity // _CHUNK))

    def _drop(self) -> int:
        # No lock, and no call between the read and the store: atomic under the GIL, and
        # nothing a signal handler on this thread could interleave with.
        self._dropped += 1
        return 0

    # The hot path of the recorder: one Python frame per range start, no lock.
    def range_start(self, name: str, domain: str, _end: int = _OPEN) -> int:
        """Open a range; the returned id (>= 1, or 0 when full) goes to :meth:`range_end`."""
        # An exception may arrive at any call below (a signal handler's, a RecursionError): the
        # slot is then left unwritten (key 0), which no reader waits on (see drain_blocks); the
        # give-up only makes the count exact at once, and may itself be cut short. The try
        # costs nothing until something raises (CPython 3.11's zero-cost exceptions).
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
            if len(self._starts) <= chunk:  # never made: nothing to mark (drains step over)
                return
            if self._keys[chunk] is _VOID or self._keys[chunk] is _GONE_KEYS:
                return
            if self._keys[chunk][off]:
                if self._ends[chunk][off] == _OPEN:
                    self._ends[chunk][off] = now_ns()
            else:
                self._ends[chunk][off] = _GIVEN_UP
            self._given_up += 1
        except BaseException:  # a second interruption: the drain steps over the slot anyway
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
        self._recheck_unfinished(cursor, still_open, records)
        first = cursor.next >> _SHIFT
        if release and self._limit != _UNLIMITED:
            # From now on, room is counted in chunks (see _grow). The slots taken past the
            # exact limit until now were dropped (counted): no start will write them, so no
            # drain must take them for unfinished. (A start between taking its slot and
            # comparing it with the limit, a few bytecodes, may yet write it: if the drain
            # has passed it by then, that one event is lost uncounted.)
            old, self._limit = self._limit, _UNLIMITED
            self._dropped_span = (old, self._issued())
        i, issued = cursor.next, min(self._issued(), self._limit)
        if upto is not None:
            issued = min(issued, upto)
        blocks: list[Block] = []
        taken = 0
        while i < issued and (chunk := i >> _SHIFT) < len(self._starts):
            off = i & _MASK
            column = self._keys[chunk]
            if column is _VOID or column is _GONE_KEYS:  # dropped whole, or freed after a drain
                i = (chunk + 1) << _SHIFT
                continue
            stop = min(_CHUNK, off + issued - i, off + max(1, limit - taken))
            keys = column[off:stop]
            block = Block(
                keys, self._starts[chunk][off:stop], self._ends[chunk][off:stop],
                self._tids[chunk][off:stop],
            )  # fmt: skip
            if 0 in keys:  # slots issued and not written yet: stepped over, never waited on
                self._note_unfinished(block, i, cursor)
            self._take_out(block, i, still_open, records)
            if block.keys.count(0) < len(block.keys):
                blocks.append(block)
            taken += len(keys)
            i += len(keys)
            if taken >= limit:
                break
        cursor.next, cursor.open = i, still_open
        if release:
            self._release(first, i >> _SHIFT, cursor)
        return blocks, records

    def _note_unfinished(self, block: Block, first: int, cursor: DrainCursor) -> None:
        """Keep the slots of ``block`` whose start has not written its key (a thread between
        two of its statements, or a start an exception cut short) in ``cursor.unfinished``, for
        later drains to look at again: a drain steps past them rather than waiting, so an
        interrupted start never holds back what other ranges recorded. Those given up already
        (:meth:`_give_up`) are left out."""
        keys, ends, now = block.keys, block.ends, monotonic_ns()
        low, high = self._dropped_span
        j = -1
        for _ in range(keys.count(0)):
            j = keys.index(0, j + 1)
            if ends[j] != _GIVEN_UP and not low <= first + j < high:
                cursor.unfinished.setdefault(first + j, now)

    def _recheck_unfinished(
        self, cursor: DrainCursor, still_open: list[int], records: list[Record]
    ) -> None:
        """Hand out the unfinished slots whose start has completed since (as records: few), drop
        those given up, and give up those unfinished for longer than :data:`UNFINISHED_NS`."""
        if not cursor.unfinished:
            return
        names, pid, args, now = self._names, self._pid, self._args, monotonic_ns()
        for i, since in list(cursor.unfinished.items()):
            chunk, off = i >> _SHIFT, i & _MASK
            key, end = self._keys[chunk][off], self._ends[chunk][off]
            if key:
                del cursor.unfinished[i]
                if end == _OPEN:
                    still_open.append(i)
                    continue
                name, domain = names[key]
                start, tid = self._starts[chunk][off], _threads[self._tids[chunk][off]]
                if end == _INSTANT:
                    records.append(InstantRecord(name, domain, start, tid, pid, args.get(i)))
                else:
                    records.append(
                        RangeRecord(name, domain, start, end, tid, pid, False, args.get(i))
                    )
            elif end == _GIVEN_UP:
                del cursor.unfinished[i]
            elif now - since > UNFINISHED_NS:
                # Its start has not finished in all that time: an exception cut it short with no
                # give-up (a RecursionError that the give-up call itself hit, or a signal right
                # after the slot was taken). Counted; its chunk may be freed from now on (a
                # late write lands in the freed chunk's scratch columns).
                self._ends[chunk][off] = _GIVEN_UP
                self._given_up += 1
                del cursor.unfinished[i]

    def unfinished(self, cursor: DrainCursor) -> int:
        """How many slots ``cursor`` steps over whose start has not completed (yet)."""
        return len(cursor.unfinished) if cursor.generation == self.generation else 0

    def _take_out(
        self, block: Block, first: int, still_open: list[int], records: list[Record]
    ) -> None:
        """Zero the keys of ``block``'s slots that are not its to carry: ranges still open (to
        ``still_open``) and events with arguments (to ``records``)."""
        keys, ends = block.keys, block.ends
        j = -1
        for _ in range(ends.count(_OPEN)):
            j = ends.index(_OPEN, j + 1)
            if keys[j]:  # (an unfinished slot's end is 0 too: it is the cursor's unfinished)
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

    def _release(self, first: int, stop: int, cursor: DrainCursor) -> None:
        """Free chunks ``first`` .. ``stop - 1`` (every slot drained), but those holding a range
        still open or a slot unfinished; chunks kept earlier are tried again. Never waits: the
        lock may be held by the thread this drain interrupted (a signal's write on the main
        thread), so when it is busy the chunks are kept for the next drain."""
        candidates = [*cursor.pinned, *range(first, stop)]
        # The acquire inside the try, and a release that only the owner's succeeds (an RLock):
        # CPython runs a signal handler right after a call returns, so a Ctrl-C landing as
        # acquire() returned, before a try began, left the lock held by this thread for good,
        # and another thread's next chunk (_grow) waited on it for ever.
        try:
            if not self._lock.acquire(blocking=False):
                cursor.pinned = sorted(set(candidates))
                return
            open_in = {j >> _SHIFT for j in cursor.open}
            unfinished_in = {j >> _SHIFT for j in cursor.unfinished}
            keep = open_in | unfinished_in
            kept = []
            for chunk in candidates:
                if self._keys[chunk] is _VOID or self._keys[chunk] is _GONE_KEYS:
                    continue
                if chunk in keep:
                    kept.append(chunk)
                    continue
                # _ends first: the one column a late write (an end) may still reach.
                self._ends[chunk] = _GONE_ENDS
                self._keys[chunk] = _GONE_KEYS
                self._tids[chunk] = _GONE_TIDS
                self._starts[chunk] = _GONE_STARTS
                self._freed += 1
                base = chunk << _SHIFT
                if self._args:
                    for slot in [s for s in self._args if base <= s < base + _CHUNK]:
                        del self._args[slot]
            cursor.pinned = sorted(set(kept))
            # Chunks kept only for an unfinished start take no room from new events (few, and
            # each at most UNFINISHED_NS): 5 RecursionErrors must not fill a small recorder.
            self._held_back = len(unfinished_in - open_in)
        finally:
            try:  # noqa: SIM105 (suppress() is a call before the release: a point to leak at)
                self._lock.release()
            except RuntimeError:  # not held by this thread: it was busy
                pass

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
        return sum(
            len(keys) - keys.count(0)
            for keys in self._keys
            if keys is not _GONE_KEYS and keys is not _VOID
        )

    def records(self) -> list[Record]:
        """Everything recorded, in the order the events started. A range still open is ended
        now and flagged ``open``."""
        out: list[Record] = []
        names, pid, now, args = self._names, self._pid, now_ns(), self._args
        i = -1
        threads = _threads
        for starts, ends, keys, tids in zip(self._starts, self._ends, self._keys, self._tids):
            if keys is _GONE_KEYS or keys is _VOID:  # freed after a spill drained it, or dropped
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
    unnamed: list[int] | None = None,
) -> int:
    """Hand ``block``'s events to ``sink`` as records, names and native thread ids looked up in
    ``names`` and ``threads``; returns how many are left out (a range that ends before it
    starts: what a damaged file holds). An event whose key or thread number the tables do not
    define (their line was lost) is kept, named :data:`UNKNOWN_NAME` (thread 0), and counted in
    ``unnamed[0]``: a lost name costs the name, never the event.

    >>> got, unnamed = [], [0]
    >>> b = Block(array("I", [1, 2]), array("q", [5, 6]), array("q", [9, -1]), array("I", [0, 0]))
    >>> block_records(b, {1: ("step", "d")}, [42], 7, got.append, unnamed)
    0
    >>> [(r.name, r.thread) for r in got], unnamed
    ([('step', 42), ('(unknown name)', 42)], [1])
    """
    bad = 0
    for key, start, end, number in zip(block.keys, block.starts, block.ends, block.threads):
        if not key:
            continue
        try:
            name, domain = names[key]
            tid = threads[number]
        except (IndexError, KeyError):  # (rare: the slow way, each lookup on its own)
            name, domain = _lookup(names, key, UNKNOWN)
            tid = _lookup(threads, number, 0)
            if unnamed is not None:
                unnamed[0] += 1
        # tuple.__new__: the NamedTuples' own __new__ is a Python call, the most of the cost
        if end == _INSTANT:
            sink(_new(InstantRecord, (name, domain, start, tid, pid, None)))
        elif end >= start:
            sink(_new(RangeRecord, (name, domain, start, end, tid, pid, False, None)))
        else:
            bad += 1
    return bad


def _lookup(table: Any, key: int, default: Any) -> Any:
    try:
        return table[key]
    except (IndexError, KeyError):
        return default


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
    return [_thread_names.get(n, "") for n in range(first, len(_threads))]


class DrainCursor:
    """Where :meth:`Recorder.drain` stopped: the next slot to look at, and the open ranges."""

    __slots__ = ("generation", "next", "open", "pinned", "unfinished")

    def __init__(self) -> None:
        self.reset(0)

    def reset(self, generation: int) -> None:
        self.generation, self.next = generation, 0
        self.open: list[int] = []
        #: Chunks drained whole but kept for a range still open or a slot unfinished in them,
        #: or because the lock was busy (``release``).
        self.pinned: list[int] = []
        #: Slots stepped over while their start was unfinished, and when first seen so
        #: (monotonic ns): handed out once complete, given up after :data:`UNFINISHED_NS`.
        self.unfinished: dict[int, int] = {}


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
