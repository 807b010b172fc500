"""The switch each range site reads, and what routes it: a :class:`Gate` per (domain, stream).

A gate's ``start``, ``end`` and ``instant`` are the backend's calls while that domain is active
and ``None`` otherwise, so the hot path decides with one attribute read. A settings change
rewrites every gate (:func:`route_all`), which is how ``configure`` reaches functions decorated
before it was called. A backend call that raises is contained here (:func:`fault`): only what
failed degrades, and it is retried after a back-off (:mod:`mstx_marks.core.faults`).

>>> g = gate("verl")
>>> g.domain, g is gate("verl")
('verl', True)
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, Callable

from mstx_marks.backends.base import Backend, Emitter, EndFn, InstantFn, StartFn
from mstx_marks.backends.reopen import WAITING, Token
from mstx_marks.base import env
from mstx_marks.base.interrupts import users_own
from mstx_marks.base.names import DEFAULT_DOMAIN, check_domain
from mstx_marks.core.process import PROCESS

__all__ = ["Gate", "HoldFn", "Stream", "check_stream", "fault", "gate", "noop_gate", "route_all"]

#: What ``stream=`` takes: None (host only), "current", or a stream object.
Stream = object
#: ``hold(name, domain, start, end)``: keep a range the backend did not record (``reopen.py``).
HoldFn = Callable[[str, str, StartFn, EndFn, Any], Token]


def _noop_end(handle: Any, domain: str) -> None:
    return None


class Gate:
    """The switch one range site reads: the three backend calls, or None while inactive; and
    ``hold``, what keeps a range the backend did not record for a profiler that may start
    before it ends (None for backends that are never listened to later)."""

    __slots__ = ("domain", "end", "hold", "instant", "start", "stream")

    start: StartFn | None
    end: EndFn  # only called with a handle that start returned, so never needs to be None
    instant: InstantFn | None
    hold: HoldFn | None

    def __init__(self, domain: str, stream: Stream) -> None:
        self.domain = domain
        self.stream = stream
        self.restart()

    def route(self, em: Emitter | None) -> None:
        """Send this gate's ranges to ``em``; None closes the gate."""
        if em is None:
            self.close()
        else:
            self.start, self.end, self.instant = em.start, em.end, em.instant
            self.hold = WAITING.hold if em.backend.reopens else None

    def restart(self) -> None:
        """Route as at first use: the settings in force, or a stand-in that resolves them."""
        self.route(_first_use(self))

    def close(self) -> None:
        """Switch this gate off: new ranges cost one attribute read; open ones still end."""
        self.start = self.instant = self.hold = None
        self.end = _noop_end

    # Ray and multiprocessing pickle decorated functions by value: a gate travels as its key and
    # rebinds to the receiving process's own settings.
    def __reduce__(self) -> tuple[Callable[..., Gate], tuple[str, Stream]]:
        return (gate, (self.domain, self.stream))


def stream_key(stream: Stream) -> Hashable:
    """Streams key by value: torch_npu's ``current_stream()`` returns a new but equal object on
    every call, and one gate per object would grow without bound. Unhashable ones key by id."""
    if stream is None or isinstance(stream, str):
        return stream
    try:
        hash(stream)
    except TypeError:
        return ("id", id(stream))
    return ("stream", stream)


# Values that are surely not a device stream; anything else may be one (torch_npu's Stream class
# cannot be checked before torch_npu is imported, which happens at first use, not definition).
_NOT_STREAMS = (bool, int, float, complex, bytes, bytearray, list, tuple, dict, set, frozenset)


def check_stream(stream: object) -> None:
    """Refuse, at definition, a ``stream=`` that cannot be a stream.

    >>> check_stream(5)
    Traceback (most recent call last):
    ...
    TypeError: stream must be None, 'current' or a stream object (torch_npu.npu.Stream), got int 5
    """
    if isinstance(stream, str):
        if stream != "current":
            raise ValueError(f"stream must be None, 'current' or a stream object, got {stream!r}")
    elif isinstance(stream, _NOT_STREAMS):
        raise TypeError(
            "stream must be None, 'current' or a stream object (torch_npu.npu.Stream), "
            f"got {type(stream).__name__} {stream!r}"
        )


def gate(domain: str | None, stream: Stream = None) -> Gate:
    """The gate for ``(domain, stream)``, created (and the domain checked) on first request."""
    dom = DEFAULT_DOMAIN if domain is None else check_domain(domain)
    key = (dom, stream_key(stream))
    gates = PROCESS.gates
    found = gates.get(key)
    if found is None:
        check_stream(stream)
        with PROCESS.lock:
            found = gates.get(key)
            if found is None:
                found = gates[key] = Gate(dom, stream)
                if stream is None:
                    PROCESS.host_gates[dom] = found
                    if dom == DEFAULT_DOMAIN:
                        PROCESS.host_gates[None] = found
    return found


def noop_gate(domain: str) -> Gate:
    """A gate no settings change reaches, switched off for good: what an instrumented wrapper
    left inside someone else's patch reads after its undo."""
    g = Gate.__new__(Gate)
    g.domain, g.stream = domain, None
    g.close()
    return g


def _first_use(g: Gate) -> Emitter | None:
    """Before the settings are resolved a gate holds a stand-in that resolves them on first call.

    Its handles carry the real ``end``, so a range started through it ends on the backend that
    started it even if the settings change in between.
    """
    if PROCESS.settings.resolved:
        return emitter_for(g)

    # Faults are reported against the real calls: fault() knows their backend, not the stand-in's.
    def start(name: str, domain: str) -> Any:
        PROCESS.resolve()
        if g.start is start:  # an apply cut short (Ctrl-C) before it routed this gate
            g.route(emitter_for(g))
        real_start, real_end = g.start, g.end
        if real_start is None or real_start is start:
            return 0
        try:
            handle = real_start(name, domain)
        except Exception as exc:
            return fault(real_start, exc)
        return (real_end, handle) if handle else 0

    def end(handle: Any, domain: str) -> None:
        try:
            handle[0](handle[1], domain)
        except Exception as exc:
            fault(handle[0], exc)

    def instant(name: str, domain: str) -> None:
        PROCESS.resolve()
        if g.instant is instant:  # (as in start)
            g.route(emitter_for(g))
        real_instant = g.instant
        if real_instant is not None and real_instant is not instant:
            try:
                real_instant(name, domain)
            except Exception as exc:
                fault(real_instant, exc)

    return Emitter(_UNRESOLVED, start, end, instant)


class _Unresolved(Backend):
    """Whose calls a gate holds before the settings are resolved: the stand-in's start may say
    "not recorded" for a backend that is listened to later (mstx), so its ranges are held."""

    name = "unresolved"
    reopens = True


_UNRESOLVED = _Unresolved()


def active(domain: str) -> bool:
    """Whether the settings in force let ``domain``'s ranges through on this rank."""
    s = PROCESS.settings
    if not s.enabled or (not s.backend.emits and not s.faults.resting()):
        return False
    if s.ranks is not None and env.rank() not in s.ranks:
        return False
    if s.include is not None:
        return domain in s.include
    return domain not in s.exclude


def emitter_for(g: Gate) -> Emitter | None:
    """The calls ``g`` gets under the settings in force (None: the gate is off)."""
    if not active(g.domain):
        return None
    key = stream_key(g.stream)
    emitters = PROCESS.settings.emitters
    em = emitters.get(key)
    if em is None:
        em = emitters[key] = _build(key, g.stream)
    return em


def _build(key: Hashable, stream: Stream) -> Emitter:
    """The calls for one stream setting: host-only while that stream rests, each wrapped to try
    the retry when one is pending. Never raises: an ``emitter()`` that does is a fault."""
    s = PROCESS.settings
    backend = s.backend
    host_only = s.faults.host_only(key)
    try:
        em = backend.emitter(None if host_only else stream)
    except Exception as exc:
        if users_own(exc):  # the user's, arriving as emitter() ran: not the backend's
            raise
        if key is None or host_only:
            s.faults.rest(backend, exc)
        else:
            s.faults.stream_fault(backend, key, exc)
        return _build(key, stream)
    return s.faults.adopt(em, key)


def route_all() -> None:
    """Route every gate anew under the settings in force."""
    for g in list(PROCESS.gates.values()):
        g.route(emitter_for(g))


def fault(call: Callable[..., object], exc: BaseException) -> int:
    """A backend call raised: contain it to what failed and keep the workload running (see
    :class:`mstx_marks.core.faults.FaultPolicy`). Returns 0, the "not recorded" handle, so the
    caller skips the matching end.

    Only the backend's own exception is a fault: one that arrived while the call ran (raised by
    a signal handler, a ``RecursionError``: :func:`~mstx_marks.base.interrupts.users_own`) is
    raised again, unchanged, for the user."""
    if users_own(exc):
        raise exc
    with PROCESS.lock:
        PROCESS.settings.faults.fault(call, exc)
    return 0


PROCESS.route_all = route_all
