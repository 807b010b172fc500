"""The user API: ``mark`` (context manager and decorator), ``mstx_range`` and ``instant``.

>>> from mstx_marks import configure, mark, mstx_range
>>> configure(backend="record")
>>> @mstx_range("update_actor", domain="verl")
... def update(batch):
...     return batch * 2
>>> with mark("step"):
...     update(21)
42

Every range carries its own id from start to end: no push/pop stack, no contextvars. So ranges
nest and interleave freely across threads, asyncio tasks and generators, and one ``mark`` object
may be entered many times at once.
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
from collections.abc import AsyncGenerator, Generator, Mapping, MutableMapping
from threading import get_ident
from time import perf_counter
from types import FrameType
from typing import Any, Callable, Tuple, TypeVar, Union, overload

from .backends.base import EndFn
from .names import SAFE_CHARS, check_name, fit_name
from .phases import Phase
from .sampling import Decisions, Policy
from .settings import Gate, attach, fault, gate, host_gates, instant_with_args, resolve

__all__ = ["Mark", "Range", "Timed", "instant", "mark", "mstx_range"]

F = TypeVar("F", bound=Callable[..., Any])
Name = Union[str, Phase]

# Reentrant: a signal handler entering a shared Mark may interrupt its own thread holding it.
_overflow_lock = threading.RLock()


def _site_name(name: object, domain: str | None) -> tuple[str, str | None]:
    """Name and domain of a range given by a str or a Phase (whose domain an explicit one beats)."""
    if isinstance(name, Phase):
        return name.name, name.domain if domain is None else domain
    return fit_name(name), domain


def _gate(domain: str | None, stream: object) -> Gate:
    try:
        found = host_gates.get(domain) if stream is None else None
    except TypeError:  # an unhashable domain; gate() says what is wrong with it
        found = None
    return gate(domain, stream) if found is None else found


# --- the shared begin/end of a range, for the function kinds that are not on the hot path -------


def _begin(
    decide: Decisions | None, gate: Gate | _ArgsGate, name: str, domain: str
) -> tuple[Any, Any]:
    """Start a range: returns the ``end`` call to make and the handle to give it."""
    if (decide is not None and not next(decide)) or (start := gate.start) is None:
        return None, 0
    end = gate.end
    try:
        return end, start(name, domain)
    except Exception as exc:
        return end, fault(start, exc)


def _end(end: EndFn, handle: Any, domain: str) -> None:
    if handle:
        try:
            end(handle, domain)
        except Exception as exc:
            fault(end, exc)


def _wrap(func: Callable[..., Any], site: Mark) -> Callable[..., Any]:
    """Wrap a function of any kind so that each call (or each run of its body) is one range."""
    name, domain, gate = site.name, site.domain, site._gate
    decide = None if site._sample is None else site._sample.decisions()

    if inspect.isasyncgenfunction(func):

        @functools.wraps(func)
        async def agen_wrapper(*args: Any, **kwargs: Any) -> AsyncGenerator[Any, Any]:
            agen = func(*args, **kwargs)
            end, handle = _begin(decide, gate, name, domain)
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
                _end(end, handle, domain)

        return agen_wrapper

    if inspect.isgeneratorfunction(func):

        @functools.wraps(func)
        def gen_wrapper(*args: Any, **kwargs: Any) -> Generator[Any, Any, Any]:
            end, handle = _begin(decide, gate, name, domain)
            try:
                return (yield from func(*args, **kwargs))
            finally:
                _end(end, handle, domain)

        return gen_wrapper

    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def coro_wrapper(*args: Any, **kwargs: Any) -> Any:
            end, handle = _begin(decide, gate, name, domain)
            try:
                return await func(*args, **kwargs)
            finally:
                _end(end, handle, domain)

        return coro_wrapper

    # The plain-function wrapper is the hot path: _begin/_end are inlined here because two more
    # Python calls per call would cost about half again the whole wrapper (benchmarks/overhead.py).
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
        try:
            return func(*args, **kwargs)
        finally:
            if handle:
                try:
                    end(handle, domain)
                except Exception as exc:
                    fault(end, exc)

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


def _target_name(target: Any) -> str:
    func = getattr(target, "__func__", target)
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)


#: One entry of a shared Mark beyond its first: the frame that entered, its handle and end.
_Entry = Tuple[FrameType, Any, Any]


class _ArgsGate:
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


class Mark:
    """A range definition: a context manager whose every entry is one range, and a decorator.

    Built by :func:`mark` and :func:`mstx_range`. One object may be reused, nested in itself and
    entered from many threads and tasks at once: each entry is its own range.

    >>> from mstx_marks import configure
    >>> configure(backend="record")
    >>> step = Mark("step")
    >>> with step:
    ...     with step:
    ...         pass
    """

    __slots__ = (
        "_decide",
        "_end",
        "_frame",
        "_gate",
        "_more",
        "_rid",
        "_sample",
        "domain",
        "name",
    )

    def __init__(
        self,
        name: Name,
        *,
        domain: str | None = None,
        stream: object = None,
        sample: Policy | None = None,
        args: Mapping[str, Any] | None = None,
    ) -> None:
        if type(name) is not str or not 0 < len(name) <= SAFE_CHARS or not name.isprintable():
            name, domain = _site_name(name, domain)
        base = _gate(domain, stream)
        g: Gate | _ArgsGate = base
        if args is not None:
            if not isinstance(args, Mapping):
                raise TypeError(f"args must be a mapping such as a dict, got {args!r}")
            g = _ArgsGate(base, args)
        self.name = name
        self.domain = g.domain
        self._gate = g
        self._rid: Any = None  # None: no entry holds the fast slot
        self._frame: FrameType | None = None
        # Entries made while the slot was held, by the thread that made them, newest last.
        self._more: dict[int, list[_Entry]] | None = None
        self._sample = sample
        self._decide: Decisions | None = None
        if sample is not None:
            if not isinstance(sample, Policy):
                raise TypeError(
                    f"sample must be a sampling policy (every, first...), got {sample!r}"
                )
            self._decide = sample.decisions()

    def __enter__(self) -> Mark:
        decide = self._decide
        if (decide is not None and not next(decide)) or (start := self._gate.start) is None:
            end, handle = None, 0
        else:
            end = self._gate.end
            try:
                handle = start(self.name, self.domain)
            except Exception as exc:
                handle = fault(start, exc)
        # The first entry keeps its range in a slot, with the frame that entered it; claiming the
        # slot is a check and stores with no call between them, which the GIL does not split.
        # Later entries (nested, other threads, tasks, generators, hooks) go to `_more`.
        if self._rid is None and not self._more:
            # `or 0`: a backend may say "not recorded" with None, which would free the slot.
            self._rid, self._end, self._frame = handle or 0, end, sys._getframe(1)
        else:
            with _overflow_lock:
                if self._more is None:
                    self._more = {}
                self._more.setdefault(get_ident(), []).append((sys._getframe(1), handle, end))
        return self

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

    def __exit__(self, *exc_info: object) -> None:
        if self._more:
            frame = sys._getframe(1)
            with _overflow_lock:
                for _ in range(3):  # a signal handler that used this Mark meanwhile: look again
                    try:
                        handle, end = self._pick(frame)
                        break
                    except (IndexError, RuntimeError):
                        continue
                else:
                    handle, end = 0, None
        else:
            handle = self._rid
            self._rid = self._frame = None
            end = self._end if handle else None
        if handle:
            try:
                end(handle, self.domain)
            except Exception as exc:
                fault(end, exc)

    def __call__(self, func: F) -> F:
        return rewrap(func, functools.partial(_wrap, site=self))

    def start(self) -> Range:
        """Start one range now and return it; its :meth:`Range.end` may run anywhere later.

        For code that cannot wrap a block, such as a module's forward pre- and post-hooks:

        >>> from mstx_marks import configure
        >>> configure(backend="record")
        >>> r = mark("forward").start()
        >>> r.end()
        """
        end, handle = _begin(self._decide, self._gate, self.name, self.domain)
        return Range(end, handle, self.domain)

    def __reduce__(self) -> tuple[Callable[..., Mark], tuple[Any, ...]]:
        args = self._gate.args if isinstance(self._gate, _ArgsGate) else None
        return (_rebuild, (self.name, self.domain, self._gate.stream, self._sample, args))

    def __repr__(self) -> str:
        return f"Mark({self.name!r}, domain={self.domain!r})"


class Range:
    """One range started by :meth:`Mark.start`; ``end()`` ends it once, later calls do nothing."""

    __slots__ = ("_domain", "_end", "_handle")

    def __init__(self, end: EndFn | None, handle: Any, domain: str) -> None:
        self._end, self._handle, self._domain = end, handle, domain

    def end(self) -> None:
        """End the range (from any thread); a second call does nothing."""
        handle, self._handle = self._handle, 0
        _end(self._end, handle, self._domain)  # type: ignore[arg-type]


def _rebuild(
    name: str,
    domain: str,
    stream: object,
    sample: Policy | None,
    args: Mapping[str, Any] | None = None,
) -> Mark:
    return Mark(name, domain=domain, stream=stream, sample=sample, args=args)


# Plain host ranges are cached per domain and name: `with mark("x")` in a loop then costs a dict
# lookup instead of building and checking an object, and entries of a shared Mark stay separate.
_MAX_CACHED = 4096
_cached: dict[str | None, dict[Any, Mark]] = {None: {}}


class Timed:
    """One ``with`` entry of a range that also adds its seconds to ``timing[name]``, whether the
    block returns or raises: verl's ``timing_raw`` dict, filled the way its ``marked_timer``
    does (which has no ``finally``). Built by ``mark(name, timing=...)``; not reusable."""

    __slots__ = ("_mark", "_t0", "_timing")

    def __init__(self, site: Mark, timing: MutableMapping[str, float]) -> None:
        self._mark, self._timing, self._t0 = site, timing, 0.0

    def __enter__(self) -> Timed:
        self._t0 = perf_counter()
        self._mark.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            self._mark.__exit__(*exc_info)
        finally:
            name = self._mark.name
            self._timing[name] = self._timing.get(name, 0.0) + (perf_counter() - self._t0)


@overload
def mark(
    name: Name,
    *,
    domain: str | None = None,
    stream: object = None,
    sample: Policy | None = None,
    timing: None = None,
    args: Mapping[str, Any] | None = None,
) -> Mark: ...


@overload
def mark(
    name: Name,
    *,
    domain: str | None = None,
    stream: object = None,
    sample: Policy | None = None,
    timing: MutableMapping[str, float],
    args: Mapping[str, Any] | None = None,
) -> Timed: ...


def mark(
    name: Name,
    *,
    domain: str | None = None,
    stream: object = None,
    sample: Policy | None = None,
    timing: MutableMapping[str, float] | None = None,
    args: Mapping[str, Any] | None = None,
) -> Mark | Timed:
    """A range around a ``with`` block, or around every call of a decorated function.

    ``name`` is a str or a :class:`~mstx_marks.phases.Phase`; ``domain=None`` is MSTX's
    ``"default"``; ``stream`` is None (host only), ``"current"`` (the current NPU stream at each
    start) or a stream object; ``sample`` a :mod:`~mstx_marks.sampling` policy. Over-long names
    built at run time are truncated with one warning. With ``timing`` (a dict such as verl's
    ``timing_raw``) the block's seconds are also added to ``timing[name]``, exception or not.
    ``args`` (a dict such as ``{"tokens": n}``) is kept with the range by the recorder and shown
    in the Chrome trace and the report; the MSTX message stays the name alone.

    >>> from mstx_marks import configure
    >>> configure(backend="record")
    >>> with mark("generate_sequences", domain="verl"):
    ...     pass
    >>> @mark("compute_log_prob")
    ... def logp(x):
    ...     return x
    >>> timing_raw = {}
    >>> with mark("gen", timing=timing_raw):
    ...     pass
    >>> list(timing_raw)
    ['gen']
    >>> with mark("generate_sequences", args={"batch": 8}):
    ...     pass
    """
    if timing is not None:
        return Timed(mark(name, domain=domain, stream=stream, sample=sample, args=args), timing)
    if args is not None:
        return Mark(name, domain=domain, stream=stream, sample=sample, args=args)
    if stream is None and sample is None:
        try:
            sites = _cached.get(domain)
            site = None if sites is None else sites.get(name)
        except TypeError:  # an unhashable name or domain; Mark() says what is wrong with it
            sites = site = None
        if site is None:
            site = Mark(name, domain=domain)
            if len(sites or ()) < _MAX_CACHED:
                _cached.setdefault(domain, {})[name] = site
        return site
    return Mark(name, domain=domain, stream=stream, sample=sample)


@overload
def mstx_range(name: F, /) -> F: ...


@overload
def mstx_range(
    name: Name | None = None,
    /,
    *,
    domain: str | None = None,
    stream: object = None,
    sample: Policy | None = None,
) -> Callable[[F], F]: ...


def mstx_range(
    name: Any = None,
    /,
    *,
    domain: str | None = None,
    stream: object = None,
    sample: Policy | None = None,
) -> Any:
    """Decorate a function so that each call is a range; bare, the name is its ``__qualname__``.

    Works for plain functions, methods, static and class methods (above or below the
    ``@staticmethod``/``@classmethod`` line), coroutine functions (the range spans the awaited
    body) and generator and async generator functions (from first resume to the end). The
    function keeps its metadata, its ``inspect`` kind, and stays picklable.

    >>> from mstx_marks import configure
    >>> configure(backend="record")
    >>> @mstx_range
    ... def rollout():
    ...     return "done"
    >>> @mstx_range("update_actor", domain="verl", stream="current")
    ... async def update():
    ...     return "updated"
    >>> rollout()
    'done'
    """
    if (
        name is None
        or (callable(name) and not isinstance(name, Phase))
        or isinstance(name, (staticmethod, classmethod))
    ):
        target = name

        def by_qualname(func: Any) -> Any:
            site = Mark(fit_name(_target_name(func)), domain=domain, stream=stream, sample=sample)
            return rewrap(func, functools.partial(_wrap, site=site))

        return by_qualname if target is None else by_qualname(target)
    if not isinstance(name, Phase):
        check_name(name)
    return Mark(name, domain=domain, stream=stream, sample=sample)


def instant(
    name: Name,
    *,
    domain: str | None = None,
    stream: object = None,
    args: Mapping[str, Any] | None = None,
) -> None:
    """Record an instant event (MSTX ``mark``); ``args`` as for :func:`mark`.

    >>> from mstx_marks import configure
    >>> configure(backend="record")
    >>> instant("weights_synced", domain="verl")
    >>> instant("batch_ready", args={"size": 32})
    """
    if type(name) is not str or not 0 < len(name) <= SAFE_CHARS or not name.isprintable():
        name, domain = _site_name(name, domain)
    g = _gate(domain, stream)
    if args is not None:
        if not isinstance(args, Mapping):
            raise TypeError(f"args must be a mapping such as a dict, got {args!r}")
        instant_with_args(g, name, args)
        return
    call = g.instant
    if call is not None:
        try:
            call(name, g.domain)
        except Exception as exc:
            fault(call, exc)
