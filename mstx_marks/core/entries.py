"""The entries of one ``Mark``: which range each ``with`` (or hook) entered, so that its exit
ends exactly that range, once.

A Mark may be entered many times at once (nested in itself, from threads, tasks, generators,
hooks). The first entry keeps its range in a slot on the object, with the frame and the
instruction that entered it: a check and a few stores, no call, which is what a plain
``with mark(...)`` costs. Entries made while the slot is held go to ``_more``, per thread,
newest last, under a lock. An exit picks the entry its frame made. The hot path (``__enter__``,
``__exit__``) stays in :mod:`.ranges`; what it calls when a case is not the plain one is here.

Two cases are an interruption's, not the program's:

- an exit cut short (Ctrl-C or a signal handler's exception at the exit's first instruction,
  where no code of ours runs) leaves its entry behind; the same ``with`` entered again by the
  same frame can only be a new pass, so the old entry's range ends then (:meth:`_end_stale`),
  also for a site whose Mark changes each time (:data:`last_at`);
- an exception raised while an entry is being kept ends its range before it goes on
  (:meth:`_keep_more`), or no exit ever would.

>>> from mstx_marks import configure, mark
>>> configure(backend="record")
>>> step = mark("step")
>>> with step, step:
...     step._rid is not None, len(step._more[__import__("threading").get_ident()])
(True, 1)
"""

from __future__ import annotations

import dis
from threading import get_ident
from types import FrameType
from typing import Any, Tuple

from mstx_marks.backends.reopen import WAITING, Token
from mstx_marks.base.forking import new_lock
from mstx_marks.core.engine import cut_short, finish

__all__ = ["Entries", "last_at", "overflow_lock"]

release = WAITING.release

#: One entry of a shared Mark beyond its first: the frame that entered, its handle and end.
_Entry = Tuple[FrameType, Any, Any]

# Reentrant: a signal handler entering a shared Mark may interrupt its own thread holding it.
overflow_lock = new_lock(reentrant=True)
#: The instructions a `with` statement enters by (the stale check, Entries._end_stale).
_WITH_OPS = frozenset(
    dis.opmap[op] for op in ("BEFORE_WITH", "BEFORE_ASYNC_WITH", "SETUP_WITH") if op in dis.opmap
)


class Entries:
    """The slot and the further entries of one range definition (the base of ``Mark``)."""

    __slots__ = ("_at", "_end", "_frame", "_more", "_rid", "domain")

    domain: str
    _end: Any  # the end call of the slot's range, set with its handle

    def _no_entries(self) -> None:
        self._rid: Any = None  # None: no entry holds the fast slot
        self._frame: FrameType | None = None
        self._at = -1  # the instruction of _frame that entered the slot's range
        # Entries made while the slot was held, by the thread that made them, newest last.
        self._more: dict[int, list[_Entry]] | None = None

    def _end_stale(self, frame: FrameType) -> None:
        """The slot's entry was made by the `with` statement that ``frame`` is entering again
        now, which it can only do once it has left: its exit was cut short (Ctrl-C or a signal
        handler's exception at the exit's first instruction, where no code of ours runs). Its
        range ends now, not at the end of the run (24,826 ranges of 2 us summed to 102 s in a
        3 s run when they were left open). Not for an entry made by calling ``__enter__``
        itself, which may enter again on purpose (hooks that enter in a loop, exit later)."""
        if frame.f_code.co_code[frame.f_lasti] not in _WITH_OPS:
            return
        handle, end = self._take_slot()
        # The end is called here, not through finish(): an interruption at finish's own entry
        # would come after the slot was taken and before any end, and lose the range for good
        # (2 of 5 SIGALRM storms left one open for the whole run). Here it lands in the `try`.
        if handle:
            try:
                end(handle, self.domain)
            except BaseException as exc:
                cut_short(end, handle, self.domain, exc)
        elif handle.__class__ is Token:
            release(handle)

    def _keep_more(self, entry: _Entry) -> None:
        """Keep an entry in `_more`; interrupted before it is kept (an exception raised while
        the lock is taken), end its range before the exception goes on, or no exit ever will."""
        try:
            with overflow_lock:
                self._add_entry(entry)
        except BaseException:
            mine = (self._more or {}).get(get_ident(), [])
            for i in range(len(mine) - 1, -1, -1):
                if mine[i] is entry:
                    del mine[i]
            _, handle, end = entry
            finish(end, handle, self.domain)
            raise

    def _add_entry(self, entry: _Entry) -> None:
        """Keep an entry beyond the slot's, under this thread. A function of its own so that
        the ``with`` around its call has no loop header line of its own: an exception raised at
        such a line (a tracer's) escapes the ``with``'s clean-up in CPython 3.11."""
        tid = get_ident()
        while True:
            if self._more is None:
                self._more = {}
            mine = self._more.setdefault(tid, [])
            mine.append(entry)
            # A signal handler on this thread may have run between the two calls above, used
            # this Mark and dropped the list it left empty: our entry went with it.
            if self._more.get(tid) is mine:
                return

    def _pick(self, frame: FrameType) -> tuple[Any, Any]:
        """The entry an exit from ``frame`` closes, with other entries in flight: the newest one
        this frame entered; else this thread's newest (enter and exit in two hooks); else the
        slot; else another thread's newest (entered there, exited here)."""
        more = self._more or {}
        tid = get_ident()
        mine = more.get(tid)
        chosen: _Entry | None = None
        if mine:
            for i in range(len(mine) - 1, -1, -1):
                if mine[i][0] is frame:
                    chosen = mine.pop(i)
                    break
        if chosen is None and self._rid is not None and self._frame is frame:
            return self._take_slot()
        if chosen is None and mine:
            chosen = mine.pop()
        if chosen is None:
            if self._rid is not None:
                return self._take_slot()
            tid, mine = next(((t, m) for t, m in more.items() if m), (tid, None))
            if not mine:
                return 0, None
            chosen = mine.pop()
        if not mine:
            more.pop(tid, None)
        return chosen[1], chosen[2]

    def _take_slot(self) -> tuple[Any, Any]:
        handle, end = self._rid, self._end
        self._rid = self._frame = None
        return handle, end

    def _pick_again(self, frame: FrameType) -> tuple[Any, Any]:
        """:meth:`_pick`, looked at again should a signal handler have used this Mark while it
        looked (a list emptied, a dict resized under it). Holds no ``try`` of the caller's: an
        exception raised at a nested ``try`` line escapes the enclosing ``with``'s clean-up in
        CPython 3.11, which would leave the lock held."""
        for _ in range(3):
            try:
                return self._pick(frame)
            except (IndexError, RuntimeError) as exc:
                if isinstance(exc, RecursionError):  # the user's, never retried here
                    raise
        return 0, None


#: The entries whose slot was last claimed at each instruction offset, on any thread: the stale
#: check's second look, for a site whose Mark changes each time (`with mark(f"step_{i}")`).
#: Keyed by offset alone: bounded by the sizes of functions, and a site that another overwrote
#: is only not looked at (the Mark's own check still ends its range when it is used again).
last_at: dict[int, Entries] = {}
