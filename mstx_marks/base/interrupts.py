"""Whose exception is it: the backend's, or the user's own, arriving while our code ran?

The core contains an exception raised by a backend call (a fault: degrade, back off, retry). But
an exception can also arrive *during* that call without being the backend's: a signal handler
that raises (a reward function's ``SIGALRM`` timeout) runs at whatever line the interpreter was
on, ours included; a ``RecursionError`` or ``MemoryError`` comes from the depth or the size of
the user's own program. Taking those for faults would swallow the user's exception (the program's
own timeout silently stops working) and put a healthy backend to rest. ``KeyboardInterrupt`` and
``SystemExit`` are no ``Exception`` and are never caught in the first place.

So :func:`users_own` answers, on the fault path only (it costs a walk of the traceback and a look
at the installed signal handlers, never on a range that succeeds).

>>> users_own(RuntimeError("device lost")), users_own(RecursionError())
(False, True)
"""

from __future__ import annotations

import signal
from types import CodeType

__all__ = ["users_own"]

#: Exceptions that say more about the user's program than about any backend call.
_PROGRAM_WIDE = (RecursionError, MemoryError)


def _handler_codes() -> set[CodeType]:
    """The code objects of the Python signal handlers installed now."""
    codes: set[CodeType] = set()
    for sig in signal.valid_signals():
        try:
            handler = signal.getsignal(sig)
        except (ValueError, OSError):  # not a signal this platform lets Python read
            continue
        # A function, a bound method, a functools.partial, an object with __call__.
        for candidate in (
            handler,
            getattr(handler, "func", None),
            vars(type(handler)).get("__call__"),  # an object whose class defines __call__
        ):
            code = getattr(getattr(candidate, "__func__", candidate), "__code__", None)
            if isinstance(code, CodeType):
                codes.add(code)
    return codes


def users_own(exc: BaseException) -> bool:
    """Whether ``exc``, caught around a backend call, is the user's and must reach the user
    unchanged: not an ``Exception`` at all, a program-wide error, or raised in a signal handler
    (whose frame is on its traceback)."""
    if not isinstance(exc, Exception) or isinstance(exc, _PROGRAM_WIDE):
        return True
    tb = exc.__traceback__
    if tb is None:
        return False
    handlers = _handler_codes()
    while tb is not None:
        if tb.tb_frame.f_code in handlers:
            return True
        tb = tb.tb_next
    return False
