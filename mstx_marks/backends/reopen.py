"""Ranges that began before a profiler started, started again inside it.

A collector records a range only if it was listening when the range started: torch_npu's MSTX
returns id 0 ("not recorded") before its profiler runs, torch's ``record_function`` records
nothing while no ``torch.profiler`` runs, and the end of such a range is no range either. Yet
profilers are often started inside a phase that is already open: MindSpeed-RL starts its
per-stage profiler inside the decorated stage (``actor_hybrid_worker.py``), verl's discrete mode
and our recipes inside ``update_actor`` or ``compute_log_prob``. Without help the capture then
lacks the very phase it was started for.

So when a backend that can be listened to later (``Backend.reopens``: mstx, torch) says "not
recorded", the hot path holds the range in :data:`WAITING` instead (its name, domain, and the
backend's own start and end) and keeps the :class:`Token` it gets, which it releases at the
range's end. A range that was recorded costs nothing more until a watched profiler has run
(:attr:`Waiting.watching`); a token is falsy, so it is looked at only where a handle said "not
recorded". When a profiler starts, or steps into a recording window, every range still waiting
is started again (:meth:`Waiting.reopen`): same name, same domain, now inside the capture; it
ends when its original ends. One that the profiler still does not record stays waiting for the
next step. A range re-started from the profiler's thread carries that thread's id in the
capture, which is the one difference from a range started there.

The hooks sit on ``torch.profiler.profile`` and ``torch_npu.profiler.profile`` (and their
``_KinetoProfile``): after ``start`` and each ``step`` the waiting ranges are started again;
before ``stop``, and before the ``step`` that ends a recording window, what was started again is
ended (:meth:`Waiting.suspend`), so the capture holds a whole range, and the next window starts
it again. They are installed when a backend that needs them is built and the profiler module is
imported (:func:`watch_profilers`).

The contract (issue 35), each point held by the structure rather than by the callers' timing:

1. **Every device handle a range is started again under is ended exactly once**, whatever
   threads start, step and stop profilers at once and wherever a range ends. A handle lives in
   its token's one slot (``again``, a dict holding it at key 0). It is stored by the device's
   start and taken by ``pop(0, None)`` for the device's end, each in the same C-level call as
   the device call (see :func:`_start_into`, :func:`_end_taken`), so the one who takes it ends
   it, and no bytecode of ours runs between a device call and the slot, where an exception
   raised by a signal handler could drop a handle (a device function written in Python, such
   as torch's, can still be interrupted at its own entry, as any call can). Only one thread at
   a time starts ranges again or ends them for a window
   (the holder of a baton, taken with an atomic ``dict.setdefault``), so no range is started
   again twice. A thread that finds the baton held leaves its request for the holder, which
   runs every request left before it gives the baton back and checks again after; the asker
   waits for it, up to :data:`WAIT_FOR_HOLDER` seconds, unless the holder is its own thread (a
   signal handler, or a hook inside a profiler call, that interrupted the holder: waiting would
   never end, so its request runs when the interrupted holder resumes).
2. **A range's end takes no lock and waits for nothing** (:meth:`Waiting.release` can run in a
   signal handler that interrupted the holder): it unlists the token, then takes the slot. The
   holder stores a handle, then checks the token is still listed, and takes the slot if not.
   In either order one of the two ends the handle, and only one can take it.
3. **A forked child holds none of its parent's ranges**: the fork reset
   (:func:`~mstx_marks.base.forking.after_fork_in_child`) forgets them, with the parent's
   handles (the parent ends those) and the parent's threads' requests and baton.
4. **A range still open when a window ends is started again in every later window it is open
   in**, whether it began before the profiler or inside an earlier window. From the first start
   of a watched profiler on (:attr:`Waiting.watching`, set before that start) callers hold a
   range the device did record too, passing its handle to :meth:`Waiting.hold`: the token then
   counts as started again, a window's end ends it and the next window starts it again. The
   tee does (:mod:`mstx_marks.backends.tee`); the core's own hot path (``core/engine.begin``
   and its copies) holds only unrecorded ranges so far, so with a device backend alone a range
   begun inside a window is in that window only. Residual, by nature of a range's start: a
   start that the closing window recorded but that returns to its caller only after the window
   was ended is held as started again and waits for its own end (still ended exactly once)
   instead of the next window.

>>> w = Waiting()
>>> listening = []
>>> def start(name, domain):
...     return 7 if listening else 0
>>> token = w.hold("update_actor", "default", start, lambda h, d: print("end", h, d))
>>> type(token).__name__, bool(token), w.waiting()
('Token', False, 1)
>>> listening.append(True); w.reopen()  # a profiler starts
1
>>> w.release(token)
end 7 default
"""

from __future__ import annotations

import collections
import functools
import itertools
import threading
import time
from typing import Any, Callable

from mstx_marks.backends.base import EndFn, StartFn
from mstx_marks.base.diagnostics import warn_once
from mstx_marks.base.forking import after_fork_in_child
from mstx_marks.base.import_hooks import when_imported
from mstx_marks.base.interrupts import users_own

__all__ = ["MAX_WAITING", "WAITING", "WAIT_FOR_HOLDER", "Token", "Waiting", "watch_profilers"]

#: Ranges kept waiting at most; past it the oldest are forgotten (a range never ended, such as a
#: ``Mark.start()`` whose ``end()`` never came, must not grow the process without bound), and
#: what they were started again under is ended.
MAX_WAITING = 65_536

#: Seconds a profiler's thread waits for another thread's start-again or window end to run its
#: own: a profiler's start or step itself takes milliseconds to seconds, and past this bound the
#: request still runs, later, by the holder.
WAIT_FOR_HOLDER = 2.0
_POLL = 0.0002


class Token:
    """What the hot path holds for a range no collector recorded when it started (or one a
    collector did record once a watched profiler has run): the range itself (name, domain, the
    backend's start and end), and the handle it was started again under, if any.

    Falsy like any "not recorded" handle, so a recorded range's end (``if handle: end(...)``)
    pays nothing for it; only a falsy handle is then asked whether it is a Token, whose end goes
    to :meth:`Waiting.release`. ``again`` is the slot of contract point 1: empty, or the handle
    at key 0."""

    __slots__ = ("again", "domain", "end", "name", "start")
    name: str
    domain: str
    start: StartFn
    end: EndFn
    again: dict[int, Any]

    def __bool__(self) -> bool:
        return False


class _Ask:
    """One thread's start-again or window end, for the baton's holder to run."""

    __slots__ = ("do", "done", "result")

    def __init__(self, do: Callable[[], int]) -> None:
        self.do, self.done, self.result = do, False, 0


class Waiting:
    """The ranges a collector did not record when they started, until they end (see module).
    Its contract is the module's."""

    def __init__(self) -> None:
        #: Set for good before a watched profiler first starts or steps (:func:`watch_profilers`).
        #: From then on a range the device records at its start may outlive the window that
        #: recorded it, so the hot path holds it too (:meth:`hold`'s ``handle``). Set before the
        #: profiler's own start, so a start the profiler records always finds it set.
        self.watching = False
        self._open: dict[Token, None] = {}
        self._asked: collections.deque[_Ask] = collections.deque()
        #: Empty, or {0: (thread id, request)} of the thread that runs the requests now.
        self._baton: dict[int, tuple[int, _Ask]] = {}

    def hold(self, name: str, domain: str, start: StartFn, end: EndFn, handle: Any = 0) -> Token:
        """Keep a range; the token is what the hot path ends. ``handle``: what the device gave
        if it did record the range (a watched profiler listens), which the token then holds as
        started again (contract point 4)."""
        token = Token()
        token.name, token.domain, token.start, token.end = name, domain, start, end
        token.again = {0: handle} if handle else {}
        waiting = self._open
        waiting[token] = None
        if len(waiting) > MAX_WAITING:
            for old in list(itertools.islice(waiting, MAX_WAITING // 4)):
                self.release(old)
        return token

    def release(self, token: Token) -> None:
        """The range ``token`` ended: end what it was started again under, if anything. Takes no
        lock (contract point 2): it may run in a signal handler."""
        self._open.pop(token, None)
        if token.again:  # started again (rare)
            _end_taken(token)

    def waiting(self) -> int:
        """How many ranges are waiting."""
        return len(self._open)

    def reopen(self) -> int:
        """Start again every waiting range that has not been; how many a collector took (0 when
        another thread ran it)."""
        return self._by_holder(self._reopen)

    def suspend(self) -> int:
        """End what the waiting ranges were started again under, keeping them waiting: the
        profiler is about to stop recording (its ``stop``, or the step that ends a window), and
        a range it holds open would have no end in the capture. How many were ended (0 when
        another thread ran it)."""
        return self._by_holder(self._suspend)

    def clear(self) -> None:
        """Forget every waiting range and what it was started again under, ending nothing: in a
        forked child they are the parent's, as are the requests and the baton of its threads."""
        for token in list(self._open):
            token.again.clear()
        self._open = {}
        self._asked = collections.deque()
        self._baton = {}
        self.watching = False

    def _by_holder(self, do: Callable[[], int]) -> int:
        """Run ``do`` as the baton's holder, or leave it to the holder (contract point 1)."""
        ask = _Ask(do)
        self._asked.append(ask)
        mine = (threading.get_ident(), ask)
        deadline = 0.0
        while True:
            held = self._baton.setdefault(0, mine)
            if held is mine:
                try:
                    self._run_asked()
                finally:
                    self._baton.pop(0, None)
                if self._asked:  # left while the baton went back, by one that does not wait
                    continue
                return ask.result
            if ask.done or held[0] == mine[0]:
                return ask.result  # done, or the holder is this thread, interrupted
            now = time.monotonic()
            deadline = deadline or now + WAIT_FOR_HOLDER
            if now > deadline:
                return ask.result
            time.sleep(_POLL)

    def _run_asked(self) -> None:
        asked = self._asked
        while True:
            try:
                ask = asked.popleft()
            except IndexError:
                return
            try:
                ask.result = ask.do()
            finally:
                ask.done = True

    def _reopen(self) -> int:
        taken = 0
        for token in list(self._open):
            if token.again:
                continue
            try:
                _start_into(token)
            except Exception as exc:  # a profiler's start must never fail because of us
                if users_own(exc):
                    raise
                warn_once(("reopen", token.name), f"range {token.name!r} not started again ({exc})")
                continue
            taken += bool(token.again)  # empty: still not recorded, it waits for the next step
            if token not in self._open:  # it ended meanwhile (contract point 2)
                _end_taken(token)
        return taken

    def _suspend(self) -> int:
        ended = 0
        for token in list(self._open):
            if token.again:
                _end_taken(token)
                ended += 1
        return ended


def _start_into(token: Token) -> None:
    """Start ``token``'s range again and store a handle the device recorded in its slot.

    One C-level call does both (``dict.update`` over ``zip``/``filter``/``map``): after the
    device's start returns no bytecode runs before the handle is stored, so a signal handler
    that raises there cannot lose it. A falsy handle (not recorded) is not stored."""
    started = map(token.start, (token.name,), (token.domain,))
    token.again.update(zip((0,), filter(None, started)))


def _end_taken(token: Token) -> None:
    """End the handle in ``token``'s slot, if one is there and no other caller takes it first.

    Taking (``pop(0, None)``) and ending happen in one C-level call (``map`` over an iterator
    of pops, drained by ``any``, which stops early only after an end), so a handle taken is a
    handle whose end was called."""
    taking = iter(functools.partial(token.again.pop, 0, None), None)
    while True:
        try:
            any(map(token.end, taking, itertools.repeat(token.domain)))
            return
        except Exception as exc:  # that end is done with; any other handle is still ended
            if users_own(exc):
                raise
            warn_once(
                ("reopen end", token.name),
                f"range {token.name!r} started again did not end ({exc})",
            )


#: The process's waiting ranges, for every backend.
WAITING = Waiting()
after_fork_in_child(WAITING.clear)


def _closing(profiler: Any, attr: str) -> bool:
    """Whether ``profiler.attr()`` is about to stop recording: its ``stop``, or a ``step``
    taken in the last step of a window (torch's and torch_npu's ``ProfilerAction``)."""
    action = getattr(getattr(profiler, "current_action", None), "name", "")
    return attr == "stop" or (attr == "step" and action == "RECORD_AND_SAVE")


def _watched(attr: str, raw: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(raw)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        if attr != "stop":
            WAITING.watching = True  # before the profiler can listen (contract point 4)
        try:
            if _closing(self, attr):
                WAITING.suspend()
        except Exception as exc:  # never into the profiler's caller, unless it is the user's
            if users_own(exc):
                raise
            warn_once(("reopen hook",), f"open ranges not ended in the profiler ({exc})")
        result = raw(self, *args, **kwargs)
        try:
            if attr != "stop":
                WAITING.reopen()
        except Exception as exc:
            if users_own(exc):
                raise
            warn_once(("reopen hook",), f"open ranges not started in the profiler ({exc})")
        return result

    call.__mstx_marks_reopen__ = True  # type: ignore[attr-defined]
    return call


def _hook(classes: tuple[str, ...], module: Any) -> None:
    for qualname in classes:
        cls = getattr(module, qualname, None)
        for attr in ("start", "step", "stop"):
            raw = vars(cls).get(attr) if isinstance(cls, type) else None
            if callable(raw) and not getattr(raw, "__mstx_marks_reopen__", False):
                setattr(cls, attr, _watched(attr, raw))


#: The profilers' modules, and the classes there whose start and step are watched.
PROFILERS = {
    "torch.profiler.profiler": ("_KinetoProfile", "profile"),
    "torch_npu.profiler.profiler": ("_KinetoProfile", "profile"),
}


def watch_profilers() -> None:
    """Re-start waiting ranges whenever a torch or torch_npu profiler starts or steps (from the
    moment each profiler module is imported; at once if it is)."""
    for module, classes in PROFILERS.items():
        when_imported(module, functools.partial(_hook, classes))
