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
range's end. A range that was recorded costs nothing more: the hot path calls the backend's own
functions, and a token is falsy, so it is looked at only where a handle said "not recorded".
When a profiler starts, or steps into a recording window, every range still waiting is started
again (:meth:`Waiting.reopen`): same name, same domain, now inside the capture; it ends when its
original ends. One that the profiler still does not record stays waiting for the next step. A
range re-started from the profiler's thread carries that thread's id in the capture, which is
the one difference from a range started there.

The hooks sit on ``torch.profiler.profile`` and ``torch_npu.profiler.profile`` (and their
``_KinetoProfile``): after ``start`` and each ``step`` the waiting ranges are started again;
before ``stop``, and before the ``step`` that ends a recording window, what was started again is
ended (:meth:`Waiting.suspend`), so the capture holds a whole range, and the next window starts
it again. They are installed when a backend that needs them is built and the profiler module is
imported (:func:`watch_profilers`).

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

import functools
import itertools
from typing import Any, Callable

from mstx_marks.backends.base import EndFn, StartFn
from mstx_marks.base.diagnostics import warn_once
from mstx_marks.base.import_hooks import when_imported
from mstx_marks.base.interrupts import users_own

__all__ = ["MAX_WAITING", "WAITING", "Token", "Waiting", "watch_profilers"]

#: Ranges kept waiting at most; past it the oldest are forgotten (a range never ended, such as a
#: ``Mark.start()`` whose ``end()`` never came, must not grow the process without bound).
MAX_WAITING = 65_536


class Token:
    """What the hot path holds for a range no collector recorded when it started: the range
    itself (name, domain, the backend's start and end), and what it was started again under.

    Falsy like any "not recorded" handle, so a recorded range's end (``if handle: end(...)``)
    pays nothing for it; only a falsy handle is then asked whether it is a Token, whose end goes
    to :meth:`Waiting.release`. ``again`` is None until a profiler starts it again, then a list
    holding that handle, taken out with ``list.pop``, which the GIL keeps whole: a range that
    ends while a profiler re-starts it is ended exactly once, by whichever side takes it."""

    __slots__ = ("again", "domain", "end", "name", "start")
    name: str
    domain: str
    start: StartFn
    end: EndFn
    again: list[Any] | None

    def __bool__(self) -> bool:
        return False


class Waiting:
    """The ranges a collector did not record when they started, until they end (see module).
    Lock-free (see :class:`Token`)."""

    def __init__(self) -> None:
        self._open: dict[Token, None] = {}

    def hold(self, name: str, domain: str, start: StartFn, end: EndFn) -> Token:
        """Keep a range that was not recorded; the token is what the hot path ends."""
        token = Token()
        token.name, token.domain, token.start, token.end, token.again = (
            name,
            domain,
            start,
            end,
            None,
        )
        waiting = self._open
        waiting[token] = None
        if len(waiting) > MAX_WAITING:
            for old in list(itertools.islice(waiting, MAX_WAITING // 4)):
                waiting.pop(old, None)
        return token

    def release(self, token: Token) -> None:
        """The range ``token`` ended: end what it was started again under, if anything."""
        self._open.pop(token, None)
        if token.again:  # started again (rare)
            _end_taken(token)

    def waiting(self) -> int:
        """How many ranges are waiting."""
        return len(self._open)

    def reopen(self) -> int:
        """Start again every waiting range that has not been; how many a collector took."""
        taken = 0
        for token in list(self._open):
            if token.again:
                continue
            try:
                handle = token.start(token.name, token.domain)
            except Exception as exc:  # a profiler's start must never fail because of us
                if users_own(exc):
                    raise
                warn_once(("reopen", token.name), f"range {token.name!r} not started again ({exc})")
                continue
            if not handle:
                continue  # still not recorded: it waits for the next step
            token.again = [handle]
            taken += 1
            if token not in self._open:  # it ended meanwhile: end this one too, once
                _end_taken(token)
        return taken

    def suspend(self) -> int:
        """End what the waiting ranges were started again under, keeping them waiting: the
        profiler is about to stop recording (its ``stop``, or the step that ends a window), and
        a range it holds open would have no end in the capture. How many were ended."""
        ended = 0
        for token in list(self._open):
            if token.again:
                _end_taken(token)
                token.again = None
                ended += 1
        return ended

    def clear(self) -> None:
        """Forget every waiting range (a forked child's copy is its parent's)."""
        self._open.clear()


def _end_taken(token: Token) -> None:
    try:
        handle = token.again.pop()  # type: ignore[union-attr]  # None: nothing to take
    except (IndexError, AttributeError):  # the other side took it
        return
    try:
        token.end(handle, token.domain)
    except Exception as exc:
        if users_own(exc):
            raise
        warn_once(
            ("reopen end", token.name), f"range {token.name!r} started again did not end ({exc})"
        )


#: The process's waiting ranges, for every backend.
WAITING = Waiting()


def _closing(profiler: Any, attr: str) -> bool:
    """Whether ``profiler.attr()`` is about to stop recording: its ``stop``, or a ``step``
    taken in the last step of a window (torch's and torch_npu's ``ProfilerAction``)."""
    action = getattr(getattr(profiler, "current_action", None), "name", "")
    return attr == "stop" or (attr == "step" and action == "RECORD_AND_SAVE")


def _watched(attr: str, raw: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(raw)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            if _closing(self, attr):
                WAITING.suspend()
        except Exception as exc:  # never into the profiler's caller
            warn_once(("reopen hook",), f"open ranges not ended in the profiler ({exc})")
        result = raw(self, *args, **kwargs)
        try:
            if attr != "stop":
                WAITING.reopen()
        except Exception as exc:
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
