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

import itertools
import sys
from collections.abc import Mapping, MutableMapping
from time import perf_counter
from typing import Any, Callable, TypeVar, Union, overload

from mstx_marks.backends.base import EndFn
from mstx_marks.backends.reopen import WAITING, Token
from mstx_marks.base import env
from mstx_marks.base.names import SAFE_CHARS, check_name, fit_name
from mstx_marks.base.phases import Phase
from mstx_marks.core.configuration import instant_with_args
from mstx_marks.core.engine import (
    ArgsGate,
    begin,
    cut_short,
    finish,
    rewrap,
    target_name,
    wrap_function,
)
from mstx_marks.core.entries import Entries, last_at, overflow_lock
from mstx_marks.core.gates import Gate, fault, gate
from mstx_marks.core.process import PROCESS
from mstx_marks.core.sampling import Decisions, Policy

__all__ = ["Mark", "Range", "Timed", "instant", "mark", "mstx_range"]

F = TypeVar("F", bound=Callable[..., Any])
Name = Union[str, Phase]
release = WAITING.release
waiting = WAITING


def _site_name(name: object, domain: str | None) -> tuple[str, str | None]:
    """Name and domain of a range given by a str or a Phase (whose domain an explicit one beats)."""
    if isinstance(name, Phase):
        return name.name, name.domain if domain is None else domain
    return fit_name(name), domain


# Never replaced (a reset keeps the gates, rerouted): bound once, as the hot path reads it.
_host_gates = PROCESS.host_gates


def _gate(domain: str | None, stream: object) -> Gate:
    try:
        found = _host_gates.get(domain) if stream is None else None
    except TypeError:  # an unhashable domain; gate() says what is wrong with it
        found = None
    return gate(domain, stream) if found is None else found


def _check_decorated(func: object) -> None:
    """A decorator given a class would silently turn it into a function: refuse it now."""
    if isinstance(func, type):
        raise TypeError(
            f"@mstx_range and @mark decorate functions and methods, not the class "
            f"{func.__qualname__}: decorate its methods, or use instrument() on the class"
        )


class Mark(Entries):
    """A range definition: a context manager whose every entry is one range, and a decorator.

    Built by :func:`mark` and :func:`mstx_range`. One object may be reused, nested in itself and
    entered from many threads and tasks at once: each entry is its own range. While nothing
    listens (the gate is closed) an entry keeps no record, so one exception remains: an entry
    made while closed, whose exit comes after ``configure`` opened the gate and another entry of
    the same object started, ends that other entry's range (once, early) instead of nothing.

    >>> from mstx_marks import configure
    >>> configure(backend="record")
    >>> step = Mark("step")
    >>> with step:
    ...     with step:
    ...         pass
    """

    __slots__ = ("_decide", "_gate", "_sample", "name")

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
        g: Gate | ArgsGate = base
        if args is not None:
            if not isinstance(args, Mapping):
                raise TypeError(f"args must be a mapping such as a dict, got {args!r}")
            g = ArgsGate(base, args)
        self.name = name
        self.domain = g.domain
        self._gate = g
        self._no_entries()
        self._sample = sample
        self._decide: Decisions | None = None
        if sample is not None:
            if not isinstance(sample, Policy):
                raise TypeError(
                    f"sample must be a sampling policy (every, first...), got {sample!r}"
                )
            self._decide = sample.decisions()

    def __enter__(self) -> Mark:
        handle: Any  # a backend's: 0 or None is "not recorded", else what its end takes
        start = self._gate.start
        decide = self._decide
        end: Any = None
        handle = 0
        if start is None:
            if decide is not None:
                next(decide)  # calls count whether or not anything listens, as for decorators
            if self._rid is None and not self._more:
                # Nothing listens and no entry of this object is in flight: no range, and no
                # bookkeeping (no frame read, no slot), so a switched-off `with` costs what
                # nvtx's does. Its exit finds the slot empty and does nothing.
                return self
        # The frame is read before the start: from the start's return to the slot's claim
        # below there is no call, so neither a thread switch nor a signal handler's exception
        # can come between them (CPython makes both only at calls, function entries and
        # backward jumps) and leave a range that no exit will end.
        frame = sys._getframe(1)
        at = frame.f_lasti
        if self._rid is not None and self._frame is frame and self._at == at:
            self._end_stale(frame)
        elif (last := last_at.get(at)) is not None and last._frame is frame and last._at == at:
            last._end_stale(frame)  # another Mark at this site: `with mark(f"step_{i}")`
        if start is not None and (decide is None or next(decide)):
            end = self._gate.end
            try:
                handle = start(self.name, self.domain)
            except Exception as exc:
                handle = fault(start, exc)
            else:
                # Held for a profiler when nothing recorded it, or, once a watched profiler
                # runs, to be ended and started again at each window's edge (reopen.py).
                if (not handle or waiting.watching) and (hold := self._gate.hold) is not None:
                    handle = hold(self.name, self.domain, start, end, handle)
        # The first entry keeps its range in a slot, with the frame (and the instruction) that
        # entered it: a check and stores, no call. Later entries (nested, other threads,
        # tasks, generators, hooks) go to `_more`.
        if self._rid is None and not self._more:
            # None -> 0: a backend may say "not recorded" with None, which would free the slot
            # (a falsy Token stays: its exit releases it).
            self._rid, self._end, self._frame = 0 if handle is None else handle, end, frame
            self._at = at
            last_at[at] = self
        else:
            self._keep_more((frame, handle, end))
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._more:
            frame = sys._getframe(1)
            with overflow_lock:
                handle, end = self._pick_again(frame)
        else:
            handle = self._rid
            if handle is None:  # an entry made while nothing listened
                return
            self._rid = self._frame = None
            end = self._end if handle else None
        if handle:
            try:
                end(handle, self.domain)
            except BaseException as exc:
                cut_short(end, handle, self.domain, exc)
        elif handle.__class__ is Token:  # held, never recorded (backends/reopen.py)
            release(handle)

    def __call__(self, func: F) -> F:
        _check_decorated(func)
        return rewrap(func, self.wrap)

    def wrap(self, func: Callable[..., Any]) -> Callable[..., Any]:
        """``func`` (a plain, coroutine, generator or async generator function) wrapped so that
        each call is one range of this definition; what the decorator does, minus the handling of
        ``staticmethod``/``classmethod`` objects.

        >>> from mstx_marks import configure
        >>> configure(backend="record")
        >>> Mark("forward").wrap(abs)(-2)
        2
        """
        return wrap_function(func, self.name, self.domain, self._gate, self._sample)

    def start(self, *, sampled: bool = True) -> Range:
        """Start one range now and return it; its :meth:`Range.end` may run anywhere later.

        For code that cannot wrap a block, such as a module's forward pre- and post-hooks:

        >>> from mstx_marks import configure
        >>> configure(backend="record")
        >>> r = mark("forward").start()
        >>> r.end()

        With ``sampled=False`` the range starts whatever the sampling policy says, without
        counting a call: for hooks whose caller already made the decision.
        """
        decide = self._decide if sampled else None
        end, handle = begin(decide, self._gate, self.name, self.domain)
        return Range(end, handle, self.domain)

    def __reduce__(self) -> tuple[Callable[..., Mark], tuple[Any, ...]]:
        args = self._gate.args if isinstance(self._gate, ArgsGate) else None
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
        finish(self._end, handle, self._domain)  # type: ignore[arg-type]


def _rebuild(
    name: str,
    domain: str,
    stream: object,
    sample: Policy | None,
    args: Mapping[str, Any] | None = None,
) -> Mark:
    return Mark(name, domain=domain, stream=stream, sample=sample, args=args)


# Host ranges built per use are cached per domain: `with mark("x")` in a loop then costs a dict
# lookup instead of building and checking an object (entries of a shared Mark stay separate).
# Sampled ones are cached per call site too, so that each `with mark(..., sample=every(10))`
# line counts its own calls as a prebuilt mark would. The cache is bounded: past _MAX_CACHED
# sites in one domain the oldest quarter is dropped (insertion order; no bookkeeping per hit).
_MAX_CACHED = 16_384
_cached: dict[str | None, dict[Any, Mark]] = {None: {}}


def _cached_site(name: Name, domain: str | None, sample: Policy | None, depth: int) -> Mark:
    if sample is None:
        key: Any = name
    else:
        caller = sys._getframe(depth + 1)
        key = (name, caller.f_code, caller.f_lasti)
    try:
        sites = _cached.get(domain)
        site = None if sites is None else sites.get(key)
    except TypeError:  # an unhashable name or domain; Mark() says what is wrong with it
        return Mark(name, domain=domain, sample=sample)
    # The same line may be given another policy (every(n) with a changing n): a new site then.
    if site is None or (site._sample is not sample and repr(site._sample) != repr(sample)):
        site = Mark(name, domain=domain, sample=sample)
        if sites is None:
            sites = _cached.setdefault(domain, {})
        if len(sites) >= _MAX_CACHED:
            for old in list(itertools.islice(sites, _MAX_CACHED // 4)):
                sites.pop(old, None)
        sites[key] = site
    return site


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

    ``name`` is a str or a :class:`~mstx_marks.base.phases.Phase`; ``domain=None`` is MSTX's
    ``"default"``; ``stream`` is None (host only), ``"current"`` (the current NPU stream at each
    start) or a stream object; ``sample`` a :mod:`~mstx_marks.core.sampling` policy. Over-long names
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
    if args is not None or stream is not None:
        site = Mark(name, domain=domain, stream=stream, sample=sample, args=args)
    elif sample is None or isinstance(sample, Policy):
        site = _cached_site(name, domain, sample, 1)
    else:
        site = Mark(name, domain=domain, sample=sample)  # says what is wrong with `sample`
    if timing is None:
        return site
    if not isinstance(timing, MutableMapping):
        raise TypeError(
            f"timing must be a dict (such as verl's timing_raw) or another mutable mapping, "
            f"got {timing!r}"
        )
    return Timed(site, timing)


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
            _check_decorated(func)
            site = Mark(fit_name(target_name(func)), domain=domain, stream=stream, sample=sample)
            return rewrap(func, site.wrap)

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


# MSTX_MARKS_OFF=1, read once at import: the three entry points are swapped here, where they are
# defined, so the switch holds whichever module a program imports them from.
if env.off():
    from mstx_marks.core.off import instant, mark, mstx_range  # type: ignore[no-redef]
