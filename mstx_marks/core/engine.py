"""The engine under every range: start a range through a gate, end it, and wrap a function of
any kind so that each call is one range. :mod:`.ranges` builds the user API on it, and the
presets and instrumentation use it for ranges they open and close in two places (hooks).

A backend call that raises is contained here (:func:`mstx_marks.core.gates.fault`): the
user's own code and exceptions pass through untouched.

>>> from mstx_marks.core.gates import gate
>>> end, handle = begin(None, gate("verl"), "update_actor", "verl")
>>> finish(end, handle, "verl")
"""

from __future__ import annotations

import functools
import types
from collections.abc import AsyncGenerator, Generator, Mapping
from typing import Any, Callable, TypeVar, Union

from mstx_marks.backends.base import EndFn
from mstx_marks.backends.record import Recorder
from mstx_marks.backends.reopen import WAITING, Token
from mstx_marks.base.interrupts import users_own
from mstx_marks.core.configuration import attach, resolve
from mstx_marks.core.gates import Gate, HoldFn, fault
from mstx_marks.core.sampling import Decisions, Policy

__all__ = ["ArgsGate", "begin", "cut_short", "finish", "rewrap", "target_name", "wrap_function"]

F = TypeVar("F", bound=Callable[..., Any])
release = WAITING.release
waiting = WAITING
_Method = types.MethodType
_RANGE_END = Recorder.range_end


def begin(
    decide: Decisions | None, gate: Gate | ArgsGate, name: str, domain: str
) -> tuple[Any, Any]:
    """Start a range: returns the ``end`` call to make and the handle to give it. A range the
    backend did not record is held for a profiler that may start before it ends (a
    :class:`~mstx_marks.backends.reopen.Token` is the handle then)."""
    if (decide is not None and not next(decide)) or (start := gate.start) is None:
        return None, 0
    end = gate.end
    try:
        handle = start(name, domain)
    except Exception as exc:
        return end, fault(start, exc)
    if (not handle or waiting.watching) and (hold := gate.hold) is not None:
        handle = hold(name, domain, start, end, handle)
    return end, handle


def finish(end: EndFn, handle: Any, domain: str) -> None:
    if handle:
        try:
            end(handle, domain)
        except BaseException as exc:
            cut_short(end, handle, domain, exc)
    elif handle.__class__ is Token:  # held, never recorded: what it was started again under
        release(handle)


#: How many times an interrupted end of the recorder is made again (each try is one store).
_RETRIES = 8


def cut_short(end: EndFn, handle: Any, domain: str, exc: BaseException) -> None:
    """An end that raised ``exc``. The recorder's end cannot fail: an exception from it is the
    user's (Ctrl-C, a signal handler's timeout), and it arrived before the end's one store (its
    only interruption points, its entry and its clock read, come first), so the end is made
    again, now, and the range does not stay open to the end of the run; ``exc`` goes on. Another
    backend's own exception is a fault, contained; the user's goes on unchanged (a device's end
    is not made twice: it may have ended already, and a second end is no no-op there)."""
    if end.__class__ is _Method and end.__func__ is _RANGE_END:
        _end_again(end, handle, domain, exc)
        raise exc  # the exception being handled: raised so, it keeps the context given below
    if isinstance(exc, Exception) and not users_own(exc):
        fault(end, exc)
        return
    raise exc


def _end_again(end: EndFn, handle: Any, domain: str, exc: BaseException) -> None:
    """Make the recorder's end that ``exc`` interrupted again. Each try may be interrupted too
    (a timer that fires every 0.2 ms), a few times at most, and none of those is lost: they hang
    off ``exc`` as a chain of contexts, in order, which ends where ``exc``'s own chain did.
    CPython gives each one ``exc`` for context, as the exception being handled: kept, hanging
    it off ``exc`` made a cycle, which a loop over ``__context__`` walked for ever."""
    base = exc.__context__
    later: list[BaseException] = []
    for _ in range(_RETRIES):
        try:
            end(handle, domain)
            break
        except BaseException as again:
            # Each once, and none that the chain holds already: a handler may raise one
            # prebuilt exception every time.
            new = again is not exc and all(e is not again for e in later)
            if new and not _in_chain(base, again):
                later.append(again)
    # Linked from the far end: cut short anywhere here (the loop's edge), it is no cycle yet.
    after = base
    for each in reversed(later):
        each.__context__ = after
        after = each
    exc.__context__ = after


def _in_chain(start: BaseException | None, exc: BaseException) -> bool:
    """Whether ``exc`` is ``start`` or in its chain of contexts (which a user may have made a
    cycle by hand: each link is looked at once)."""
    seen: set[int] = set()
    while start is not None and id(start) not in seen:
        if start is exc:
            return True
        seen.add(id(start))
        start = start.__context__
    return False


def wrap_function(
    func: Callable[..., Any], name: str, domain: str, gate: Gate | ArgsGate, sample: Policy | None
) -> Callable[..., Any]:
    """Wrap a function of any kind so that each call (or each run of its body) is one range."""
    import inspect  # here, not at import: it loads ast, dis and tokenize (~8 ms)

    decide = None if sample is None else sample.decisions()
    if inspect.isasyncgenfunction(func):
        return _async_generator(func, name, domain, gate, decide)
    if inspect.isgeneratorfunction(func):
        return _generator(func, name, domain, gate, decide)
    if inspect.iscoroutinefunction(func):
        return _coroutine(func, name, domain, gate, decide)
    wrapper = _plain(func, name, domain, gate)
    if decide is None:
        return wrapper

    # Sampling sits in front of the range wrapper: unsampled functions pay nothing for it, and
    # a sampled-out call costs one decision.
    @functools.wraps(func)
    def sampled(*args: Any, **kwargs: Any) -> Any:
        if next(decide):
            return wrapper(*args, **kwargs)
        return func(*args, **kwargs)

    return sampled


_Gate = Union[Gate, "ArgsGate"]


def _plain(func: Callable[..., Any], name: str, domain: str, gate: _Gate) -> Callable[..., Any]:
    # The hot path: begin/finish are inlined here because two more Python calls per call would
    # cost about half again the whole wrapper (benchmarks/overhead.py).
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = gate.start
        if start is None:
            return func(*args, **kwargs)
        end = gate.end
        try:
            handle = start(name, domain)
        except Exception as exc:
            handle = fault(start, exc)
        else:
            if (not handle or waiting.watching) and (hold := gate.hold) is not None:
                handle = hold(name, domain, start, end, handle)
        try:
            return func(*args, **kwargs)
        finally:
            if handle:
                try:
                    end(handle, domain)
                except BaseException as exc:
                    cut_short(end, handle, domain, exc)
            elif handle.__class__ is Token:
                release(handle)

    return wrapper


def _coroutine(
    func: Callable[..., Any], name: str, domain: str, gate: _Gate, decide: Decisions | None
) -> Callable[..., Any]:
    @functools.wraps(func)
    async def coro_wrapper(*args: Any, **kwargs: Any) -> Any:
        end, handle = begin(decide, gate, name, domain)
        try:
            return await func(*args, **kwargs)
        finally:
            finish(end, handle, domain)

    return coro_wrapper


def _generator(
    func: Callable[..., Any], name: str, domain: str, gate: _Gate, decide: Decisions | None
) -> Callable[..., Any]:
    @functools.wraps(func)
    def gen_wrapper(*args: Any, **kwargs: Any) -> Generator[Any, Any, Any]:
        end, handle = begin(decide, gate, name, domain)
        try:
            return (yield from func(*args, **kwargs))
        finally:
            finish(end, handle, domain)

    return gen_wrapper


def _async_generator(
    func: Callable[..., Any], name: str, domain: str, gate: _Gate, decide: Decisions | None
) -> Callable[..., Any]:
    # The range spans first resume to exhaustion; values, sends and throws pass through as an
    # `async for` over the inner generator would not (it has no `asend`/`athrow` forwarding).
    @functools.wraps(func)
    async def agen_wrapper(*args: Any, **kwargs: Any) -> AsyncGenerator[Any, Any]:
        agen = func(*args, **kwargs)
        end, handle = begin(decide, gate, name, domain)
        try:
            step = agen.__anext__()
            while True:
                try:
                    item = await step
                except StopAsyncIteration:
                    return
                try:
                    sent = yield item
                except GeneratorExit:
                    await agen.aclose()
                    raise
                except BaseException as exc:
                    step = agen.athrow(exc)
                else:
                    step = agen.asend(sent)
        finally:
            finish(end, handle, domain)

    return agen_wrapper


def rewrap(target: F, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> F:
    """``wrap`` a function, or the function inside a staticmethod/classmethod, keeping its kind.

    >>> rewrap(staticmethod(len), lambda f: f).__func__ is len
    True
    """
    if isinstance(target, (staticmethod, classmethod)):
        return type(target)(wrap(target.__func__))  # type: ignore[return-value,unused-ignore]
    if not callable(target):
        raise TypeError(f"can only wrap a function or method, not {target!r}")
    return wrap(target)  # type: ignore[return-value]


def target_name(target: Any) -> str:
    func = getattr(target, "__func__", target)
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)


class ArgsGate:
    """A gate whose ranges also keep ``args``: what ``mark(name, args=...)`` reads instead of the
    shared gate. It follows the shared gate's settings at each use; ranges without args never
    pay for it."""

    __slots__ = ("_gate", "args")

    def __init__(self, g: Gate, args: Mapping[str, Any]) -> None:
        self._gate, self.args = g, args

    @property
    def domain(self) -> str:
        return self._gate.domain

    @property
    def stream(self) -> object:
        return self._gate.stream

    @property
    def end(self) -> EndFn:
        return self._gate.end

    @property
    def hold(self) -> HoldFn | None:
        return self._gate.hold

    @property
    def start(self) -> Callable[[str, str], Any] | None:
        resolve()  # the first-use stand-in's handles are not the recorder's
        real = self._gate.start
        if real is None:
            return None
        args = self.args

        def start(name: str, domain: str) -> Any:
            try:
                handle = real(name, domain)
            except Exception as exc:
                return fault(real, exc)
            if handle:
                attach(handle, args)
            return handle

        return start
