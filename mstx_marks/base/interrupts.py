"""Whose exception is it: the backend's, or the user's own, arriving while our code ran?

The core contains an exception raised by a backend call (a fault: degrade, back off, retry). But
an exception can also arrive *during* that call without being the backend's, and taking it for a
fault would swallow it (the program's own timeout silently stops working) and put a healthy
backend to rest. :func:`users_own` tells them apart, on the fault path only: it costs a walk of
the traceback, one read of a code object's bytes and, at most, a look at the installed signal
handlers; a range that succeeds never pays for it.

The contract: **no exception that arrived from outside is taken for a fault.** One is the user's
when any of these holds, checked in this order:

1. It is no ``Exception`` (``KeyboardInterrupt``, ``SystemExit``: never caught in the first
   place), or it is program-wide: a ``RecursionError`` or ``MemoryError`` says more about the
   depth or size of the user's program than about any backend call.
2. It came from where only an interruption raises. CPython raises an asynchronous exception
   (``PyThreadState_SetAsyncExc``'s: a watchdog's or an RPC framework's timeout sent to a worker
   thread) and runs a signal handler only where its eval loop checks the "eval breaker"
   (``handle_eval_breaker`` in 3.11's ``Python/ceval.c``, ``_Py_HandlePending`` in 3.12 and
   3.13): at a function's entry (``RESUME``), at a backward jump (``JUMP_BACKWARD``; 3.11's
   ``POP_JUMP_BACKWARD_IF_*`` and its ``COMPARE_OP`` fused with one), and right after a call of
   C code returned (``PRECALL`` in 3.11, ``CALL``, ``CALL_KW`` in 3.13, ``CALL_FUNCTION_EX``).
   3.10 checks at the top of its loop: before a function's first instruction (the traceback
   says -2), after a call, a taken ``JUMP_ABSOLUTE`` or ``POP_JUMP_IF_*``, and where a generator
   resumes (its ``YIELD_VALUE``). The exception's traceback then ends at that instruction of the
   frame that was running (its last entry's ``tb_lasti``). Nothing raises at a ``RESUME``, a
   jump that calls nothing, or 3.10's entry: an exception from there was delivered.
   (tests/test_interrupts.py sends hundreds at random moments into threads that record.)
3. A Python signal handler's frame is on its traceback (a reward function's ``SIGALRM``
   timeout): a handler runs at any of the places above, ours included. Or it is the debugger's
   quit (``bdb.BdbQuit``, pdb's ``q`` while stepping through a range): a trace function raises
   it at any line, and CPython unsets the trace function as it does, so nothing else tells it.

Everything else is the backend's: raised by a ``raise`` in its frames (a ``RAISE_VARARGS``), or
by C code it ran at an instruction that runs some (a subscript, an attribute, a call).

The one place both meet is the call of a C function (and, in 3.10 and 3.11, a jump on a
``__bool__`` or a comparison written in C; 3.10's ``YIELD_VALUE``, where ``throw()`` raises): the
function raised, or it returned and an interruption came at once.
Same frame, same instruction. There the exception itself decides. ``PyThreadState_SetAsyncExc``
takes a class and raises ``cls()`` (given an instance, it raises ``SystemError`` "exception ...
is not a BaseException subclass" instead, in 3.10 to 3.13), so a delivered exception carries no
arguments unless its class's own Python ``__init__`` or ``__new__`` gave it some; C code raises
with its message (``OSError(9, 'Bad file descriptor')``). So at a call an exception is the
backend's only when it carries arguments its class could not have given itself.

The subtle cases, each a choice:

- The *last* entry of the traceback is where the exception came from, not the first: raising an
  exception object again (``raise exc``, a backend's ``except ...: raise err``) adds entries for
  the new raise in front and keeps the old ones after them; a bare ``raise`` adds none.
- A generator or coroutine resumed by ``yield from`` or ``await`` does not check at its
  ``RESUME`` (bpo-30039): the exception lands in the innermost frame, at one of the places above.
- A ``__bool__``, ``__eq__`` or property written in Python that raises has its own frame on the
  traceback, where it raised: the backend's, like any frame of its.
- Wrong toward the user, never toward a fault: C code that raises an exception with no arguments
  at a call (``next()``'s ``StopIteration``, a ``SimpleQueue``'s ``Empty``), or one whose class
  has a Python ``__init__``, is taken for the user's and reaches the user. The other way round
  would swallow the user's timeout, which nothing downstream can undo.
- A backend that catches the user's exception and raises its own (``raise DeviceError from
  exc``) has made it a fault of its own, whose ``__cause__`` is the user's; one that raises it
  again with a fresh traceback (``exc.with_traceback(None)``) hides where it came from.
- Every ``except Exception`` of ours that contains something (a backend call, a custom
  backend's ``degrade()``, a profiler's start) asks first and re-raises what is the user's; an
  interruption that lands where no ``except`` of ours is needs no rule. One that lands in the
  fault handling itself reaches the user too, with the fault as its ``__context__``: that fault
  may then go uncounted.

>>> users_own(RuntimeError("device lost")), users_own(RecursionError())
(False, True)
"""

from __future__ import annotations

import dis
import signal
import sys
from types import CodeType, FunctionType, TracebackType

__all__ = ["users_own"]

#: Exceptions that say more about the user's program than about any backend call.
_PROGRAM_WIDE = (RecursionError, MemoryError)


def _ops(*names: str) -> frozenset[int]:
    """The opcodes of ``names`` that this interpreter has (each version renames some)."""
    return frozenset(dis.opmap[n] for n in names if n in dis.opmap)


if sys.version_info >= (3, 11):
    #: Where nothing but an interruption raises: a function's entry and the backward jumps that
    #: run no code of an object's (3.11's jumps on None).
    _ONLY_INTERRUPTED = _ops(
        "RESUME", "JUMP_BACKWARD", "POP_JUMP_BACKWARD_IF_NONE", "POP_JUMP_BACKWARD_IF_NOT_NONE"
    )
    #: Where C code runs, may raise, and an interruption may land once it returned: the calls,
    #: and 3.11's backward jumps that call a ``__bool__`` or compare (``COMPARE_OP`` fused with
    #: the jump that follows it).
    _C_THEN_INTERRUPTED = _ops(
        "PRECALL",
        "CALL",
        "CALL_KW",
        "CALL_FUNCTION_EX",
        "POP_JUMP_BACKWARD_IF_FALSE",
        "POP_JUMP_BACKWARD_IF_TRUE",
        *(("COMPARE_OP",) if sys.version_info < (3, 12) else ()),
    )
else:  # 3.10 checks before a function's first instruction (the traceback says -2), at a
    # taken jump back or on a truth value, after a call, and where a generator resumes (its
    # YIELD_VALUE, where throw() raises too).
    _ONLY_INTERRUPTED = _ops("JUMP_ABSOLUTE")
    _C_THEN_INTERRUPTED = _ops(
        "CALL_FUNCTION",
        "CALL_FUNCTION_KW",
        "CALL_FUNCTION_EX",
        "CALL_METHOD",
        "POP_JUMP_IF_FALSE",
        "POP_JUMP_IF_TRUE",
        "YIELD_VALUE",
    )
_ENTRY_BEFORE_FIRST = sys.version_info < (3, 11)
_EXTENDED_ARG = dis.opmap["EXTENDED_ARG"]
#: How ``PyThreadState_SetAsyncExc`` given an instance (not a class) fails, in 3.10 to 3.13.
_INSTANCE_SENT = "_PyErr_SetObject: exception"


def _codes_of(hook: object) -> list[CodeType]:
    """The code objects ``hook`` runs: a function, a bound method, a ``functools.partial``, an
    object whose class defines ``__call__``."""
    codes = []
    for candidate in (hook, getattr(hook, "func", None), vars(type(hook)).get("__call__")):
        code = getattr(getattr(candidate, "__func__", candidate), "__code__", None)
        if isinstance(code, CodeType):
            codes.append(code)
    return codes


def _handler_codes() -> set[CodeType]:
    """The code objects of the Python signal handlers installed now."""
    codes: set[CodeType] = set()
    for sig in signal.valid_signals():
        try:
            handler = signal.getsignal(sig)
        except (ValueError, OSError) as exc:  # not a signal this platform lets Python read
            if _interrupted_here(exc):  # a TimeoutError sent as getsignal returned: the user's
                raise
            continue
        codes.update(_codes_of(handler))
    return codes


def _debugger_quit(exc: BaseException) -> bool:
    bdb = sys.modules.get("bdb")  # never imported for this: no debugger, no BdbQuit
    return bdb is not None and isinstance(exc, bdb.BdbQuit)


def _could_be_sent(exc: BaseException) -> bool:
    """Whether ``exc`` could be what ``PyThreadState_SetAsyncExc`` raises: ``type(exc)()``."""
    if not exc.args:
        return True
    cls = type(exc)
    # A class that makes its own arguments (``def __init__(self, msg="timed out")``) has them
    # when made with none; a class built in C has none then.
    if isinstance(getattr(cls, "__init__", None), FunctionType):
        return True
    if isinstance(getattr(cls, "__new__", None), FunctionType):
        return True
    return cls is SystemError and str(exc).startswith(_INSTANCE_SENT)


def _interrupted_here(exc: BaseException) -> bool:
    """:func:`_interrupted`, for an exception caught in this module."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and _interrupted(tb, exc)


def _interrupted(last: TracebackType, exc: BaseException) -> bool:
    """Whether the instruction where ``exc`` came from (``last``, its traceback's last entry)
    is where an interruption lands, and ``exc`` one that could have been delivered there."""
    code, at = last.tb_frame.f_code.co_code, last.tb_lasti  # co_code: without specializations
    if at < 0:
        return _ENTRY_BEFORE_FIRST
    while at < len(code) and code[at] == _EXTENDED_ARG:  # the instruction it prefixes
        at += 2
    if at >= len(code):
        return False
    op = code[at]
    if op in _ONLY_INTERRUPTED:
        return True
    return op in _C_THEN_INTERRUPTED and _could_be_sent(exc)


def users_own(exc: BaseException) -> bool:
    """Whether ``exc``, caught around a backend call, is the user's and must reach the user
    unchanged (the module's contract): not an ``Exception`` at all, a program-wide error, one
    delivered to the thread where only an interruption lands, one raised in a signal handler
    (whose frame is on its traceback), or the debugger's quit."""
    if not isinstance(exc, Exception) or isinstance(exc, _PROGRAM_WIDE):
        return True
    tb = exc.__traceback__
    if tb is None:
        return False
    entries = []
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    if _interrupted(entries[-1], exc) or _debugger_quit(exc):
        return True
    handlers = _handler_codes()
    return any(entry.tb_frame.f_code in handlers for entry in entries)
