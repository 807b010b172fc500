"""Which ranges reach which backend: ``configure``, the environment, domain and rank filters.

Every range site holds a :class:`Gate` for its (domain, stream). A gate's ``start``, ``end`` and
``instant`` are the backend's calls while that domain is active and ``None`` otherwise, so the
hot path decides with one attribute read. Settings changes rewrite every gate, which is how
``configure`` reaches functions decorated before it was called. A backend call that raises is
contained here (:func:`fault`): only what failed degrades, and it is retried after a back-off
(:mod:`mstx_marks.core.faults`).

The environment (:mod:`mstx_marks.base.env`: backend, disable, include/exclude, ranks, out) is read
at first use, not at import.

>>> configure(backend="record", include=["verl"])
>>> is_active("verl"), is_active()
(True, False)
>>> reset()
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from typing import Any, Callable, Union

from mstx_marks import backends
from mstx_marks.backends.base import Backend, Emitter, EndFn, InstantFn, StartFn
from mstx_marks.backends.reopen import WAITING, Token
from mstx_marks.base import env
from mstx_marks.base.diagnostics import warn, warn_once
from mstx_marks.base.forking import new_lock
from mstx_marks.base.import_hooks import when_imported
from mstx_marks.base.interrupts import users_own
from mstx_marks.base.names import DEFAULT_DOMAIN, check_domain
from mstx_marks.core.faults import FaultPolicy, Health

__all__ = ["configure", "current_backend", "is_active", "recording"]

#: What ``stream=`` takes: None (host only), "current", or a stream object.
Stream = object
BackendSpec = Union[str, Backend]
#: ``hold(name, domain, start, end)``: keep a range the backend did not record (``reopen.py``).
HoldFn = Callable[[str, str, StartFn, EndFn, Any], Token]

_lock = new_lock(reentrant=True)


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
        self.route(_first_use(self))

    def route(self, em: Emitter | None) -> None:
        """Send this gate's ranges to ``em``; None closes the gate."""
        if em is None:
            self.close()
        else:
            self.start, self.end, self.instant = em.start, em.end, em.instant
            self.hold = WAITING.hold if em.backend.reopens else None

    def close(self) -> None:
        """Switch this gate off: new ranges cost one attribute read; open ones still end."""
        self.start = self.instant = self.hold = None
        self.end = _noop_end

    # Ray and multiprocessing pickle decorated functions by value: a gate travels as its key and
    # rebinds to the receiving process's own settings.
    def __reduce__(self) -> tuple[Callable[..., Gate], tuple[str, Stream]]:
        return (gate, (self.domain, self.stream))


class _Settings:
    """The routing's state: what was asked, the backend in force, the emitters by stream key,
    and the fault policy that acts on them. Replaced whole by :func:`reset`."""

    lock = _lock

    def __init__(self) -> None:
        self.explicit: dict[str, Any] = {}
        self.resolved = False
        self.spec: BackendSpec | None = None
        #: What configure or the environment asked for; ``backend`` is what runs now, which a
        #: fault may have degraded or put to rest until its retry.
        self.armed: Backend = backends.NoopBackend()
        self.backend: Backend = self.armed
        self.enabled = True
        self.include: frozenset[str] | None = None
        self.exclude: frozenset[str] = frozenset()
        self.ranks: frozenset[int] | None = None
        self.record = False
        self.emitters: dict[Hashable, Emitter] = {}
        self.faults = FaultPolicy(self)

    @property
    def health(self) -> Health:
        return self.faults.health

    def refresh(self) -> None:
        _refresh()

    def rearm(self, backend: Backend) -> None:
        _rearm(backend)


_settings = _Settings()
_gates: dict[tuple[str, Hashable], Gate] = {}
#: Host-only gates by domain (None is the default domain): the lookup ``mark()`` makes per use.
host_gates: dict[str | None, Gate] = {}


def _stream_key(stream: Stream) -> Hashable:
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
    key = (dom, _stream_key(stream))
    found = _gates.get(key)
    if found is None:
        check_stream(stream)
        with _lock:
            found = _gates.get(key)
            if found is None:
                found = _gates[key] = Gate(dom, stream)
                if stream is None:
                    host_gates[dom] = found
                    if dom == DEFAULT_DOMAIN:
                        host_gates[None] = found
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
    if _settings.resolved:
        return _emitter_for(g)

    # Faults are reported against the real calls: fault() knows their backend, not the stand-in's.
    def start(name: str, domain: str) -> Any:
        _resolve()
        if g.start is start:  # an apply cut short (Ctrl-C) before it routed this gate
            g.route(_emitter_for(g))
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
        _resolve()
        if g.instant is instant:  # (as in start)
            g.route(_emitter_for(g))
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


# --- reading and applying settings -------------------------------------------------------------


def _split(raw: str) -> list[str]:
    return [p.strip() for p in raw.split(",") if p.strip()]


def settings_from_env() -> dict[str, Any]:
    """Environment settings; a bad value warns and is ignored, since this runs in the hot path."""
    found: dict[str, Any] = {}
    readers: list[tuple[str, str, Callable[[str], Any]]] = [
        (env.BACKEND, "backend", lambda v: _check_backend(v.lower())),
        (env.INCLUDE, "include", lambda v: _check_domains(_split(v), "include")),
        (env.EXCLUDE, "exclude", lambda v: _check_domains(_split(v), "exclude")),
        (env.RANKS, "ranks", lambda v: _check_ranks([int(r) for r in _split(v)])),
    ]
    for var, key, parse in readers:
        raw = env.text(var)
        if raw is None:
            continue
        try:
            found[key] = parse(raw)
        except (ValueError, TypeError) as exc:
            warn(f"ignoring {var}={env.quoted(raw)}: {env.shown(exc, 2 * env.QUOTE)}")
    if env.text(env.DISABLE) is not None:
        found["enabled"] = not env.flag(env.DISABLE)
    if env.off():
        found["enabled"] = False
    if env.text(env.OUT) is not None:
        found["record"] = True
    if found.get("include") and found.get("exclude"):
        warn(
            f"both {env.INCLUDE} and {env.EXCLUDE} are set; include wins, as in the Ascend profiler"
        )
        del found["exclude"]
    return found


def _resolve() -> None:
    if not _settings.resolved:
        with _lock:
            if not _settings.resolved:
                _apply()


#: Apply the settings now if they were not yet (they are, at the first range otherwise).
resolve = _resolve


def _apply(rearm: bool = False) -> None:
    """Combine environment and ``configure`` values, pick the backend, rewrite every gate.

    ``rearm``: build the backend afresh even if the same one is asked for again, forgetting its
    faults and back-offs (what ``configure(backend=...)`` promises).
    """
    s = _settings
    merged = {**settings_from_env(), **s.explicit} if not s.resolved else {**s.explicit}
    if not s.resolved:
        s.explicit = merged
    spec = merged.get("backend", "auto")
    record = bool(merged.get("record", False))
    if spec != s.spec or record != s.record or rearm:
        s.spec, s.record = spec, record
        backend = _create(spec)
        if spec == "auto" and backends.detection_waits():
            _redetect_when_torch_arrives()
        if record:
            backend = backends.tee_with_recorder(backend)
        _rearm(backend)
        s.armed = s.backend = backend
        s.faults.forget()
        s.emitters = {}
    s.enabled = merged.get("enabled", True)
    include = merged.get("include")
    s.include = frozenset(include) if include else None
    s.exclude = frozenset(merged.get("exclude") or ())
    ranks = merged.get("ranks")
    s.ranks = frozenset(ranks) if ranks else None
    # Resolved only once every gate is routed: an apply cut short (Ctrl-C at the first range)
    # is made again whole by the next range, instead of leaving gates on their stand-in.
    s.resolved = True
    _refresh()


_redetect_armed = False


def _redetect_when_torch_arrives() -> None:
    """``auto`` waits for torch (:func:`mstx_marks.backends.detect`): choose again once the
    program imports it, keeping every other setting."""
    global _redetect_armed
    if not _redetect_armed:
        _redetect_armed = True
        when_imported("torch", _redetect)


def _redetect(torch: object) -> None:
    global _redetect_armed
    with _lock:
        _redetect_armed = False
        if _settings.resolved and _settings.spec == "auto":
            _apply(rearm=True)


def _create(spec: BackendSpec) -> Backend:
    if isinstance(spec, Backend):
        return spec
    try:
        return backends.create(spec)
    except Exception as exc:
        warn_once(
            ("unavailable", spec, str(exc)),
            f"backend {spec!r} cannot work here ({exc}); ranges are not recorded",
        )
        return backends.NoopBackend()


def _rearm(backend: Backend) -> None:
    try:
        backend.report_faults_to(fault)
        backend.rearm()
    except Exception as exc:  # a custom backend's rearm() must not reach the workload
        if users_own(exc):  # (but the user's own exception, arriving meanwhile, must)
            raise
        warn_once(("rearm", backend.name), f"backend {backend.name!r}: rearm() raised {exc!r}")


def _active(domain: str) -> bool:
    s = _settings
    if not s.enabled or (not s.backend.emits and not s.faults.resting()):
        return False
    if s.ranks is not None and env.rank() not in s.ranks:
        return False
    if s.include is not None:
        return domain in s.include
    return domain not in s.exclude


def _emitter_for(g: Gate) -> Emitter | None:
    if not _active(g.domain):
        return None
    key = _stream_key(g.stream)
    em = _settings.emitters.get(key)
    if em is None:
        em = _settings.emitters[key] = _build(key, g.stream)
    return em


def _build(key: Hashable, stream: Stream) -> Emitter:
    """The calls for one stream setting: host-only while that stream rests, each wrapped to try
    the retry when one is pending. Never raises: an ``emitter()`` that does is a fault."""
    s = _settings
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


def _refresh() -> None:
    for g in list(_gates.values()):
        g.route(_emitter_for(g))


# --- faults ------------------------------------------------------------------------------------


def fault(call: Callable[..., object], exc: BaseException) -> int:
    """A backend call raised: contain it to what failed and keep the workload running (see
    :class:`mstx_marks.core.faults.FaultPolicy`). Returns 0, the "not recorded" handle, so the
    caller skips the matching end.

    Only the backend's own exception is a fault: one that arrived while the call ran (raised by
    a signal handler, a ``RecursionError``: :func:`~mstx_marks.base.interrupts.users_own`) is
    raised again, unchanged, for the user."""
    if users_own(exc):
        raise exc
    with _lock:
        _settings.faults.fault(call, exc)
    return 0


# --- the public calls --------------------------------------------------------------------------


def _check_backend(spec: object) -> BackendSpec:
    if isinstance(spec, Backend):
        return spec
    if spec not in backends.NAMES:
        raise ValueError(
            f"unknown backend {spec!r}; expected one of {', '.join(backends.NAMES)} "
            "or a Backend instance"
        )
    return spec  # type: ignore[return-value,unused-ignore]


def _check_domains(domains: object, what: str) -> tuple[str, ...]:
    if isinstance(domains, str) or not isinstance(domains, Iterable):
        raise TypeError(f"{what} must be a list of domain names, got {domains!r}")
    return tuple(dict.fromkeys(check_domain(d) for d in domains))


def _check_ranks(ranks: object) -> tuple[int, ...]:
    if isinstance(ranks, (str, bytes)) or not isinstance(ranks, Iterable):
        raise TypeError(f"ranks must be a list of ints, got {ranks!r}")
    out = tuple(ranks)
    for r in out:
        if type(r) is not int or r < 0:
            raise ValueError(f"ranks must be ints >= 0, got {r!r} in {ranks!r}")
    return out


def configure(
    *,
    backend: BackendSpec | None = None,
    enabled: bool | None = None,
    include: Iterable[str] | None = None,
    exclude: Iterable[str] | None = None,
    ranks: Iterable[int] | None = None,
    record: bool | None = None,
) -> None:
    """Change the settings now; arguments left as None keep their value.

    ``include``/``exclude`` follow the Ascend profiler: with include only listed domains emit,
    with exclude all but the listed ones (``"default"`` is an ordinary domain). Giving one
    replaces the other; an empty list clears the filter. Giving both is a ValueError.
    ``ranks`` limits emitting to those ranks (an empty list: all ranks). ``record=True`` also
    keeps every range in the in-process recorder, beside the backend (what writing files needs;
    see :func:`recording`).

    >>> configure(backend="record", exclude=["communication"], ranks=[0])
    >>> is_active("communication"), is_active("verl")
    (False, True)
    >>> reset()
    """
    if include is not None and exclude is not None:
        raise ValueError(
            f"give include ({include!r}) or exclude ({exclude!r}), not both: "
            "the profiler would silently ignore exclude"
        )
    for what, value in (("enabled", enabled), ("record", record)):
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"{what} must be True or False, got {value!r}")
    changes: dict[str, Any] = {}
    if backend is not None:
        changes["backend"] = _check_backend(backend)
    if enabled is not None:
        if enabled and env.off():
            warn_once(
                "configure under OFF",
                f"{env.OFF}=1 was set when mstx_marks was imported: ranges stay off for the "
                "whole process, whatever configure() says",
            )
            enabled = False
        changes["enabled"] = enabled
    if include is not None:
        changes["include"], changes["exclude"] = _check_domains(include, "include"), ()
    if exclude is not None:
        changes["exclude"], changes["include"] = _check_domains(exclude, "exclude"), ()
    if ranks is not None:
        changes["ranks"] = _check_ranks(ranks)
    if record is not None:
        changes["record"] = record
    with _lock:
        # Not _resolve() first: that would build (and auto-detect) the env/default backend only
        # to replace it. Before the first resolution _apply merges the env under these values.
        _settings.explicit.update(changes)
        _apply(rearm=backend is not None)


def is_active(domain: str | None = None) -> bool:
    """Whether a host range in ``domain`` would reach a backend right now.

    >>> configure(enabled=False)
    >>> is_active()
    False
    >>> reset()
    """
    g = gate(domain)
    _resolve()
    return g.start is not None and not _settings.faults.resting()


def attach(handle: Any, args: Mapping[str, Any]) -> None:
    """Keep ``args`` with the range ``handle`` where it is recorded; never raises."""
    try:
        _settings.backend.keep_args(handle, args)
    except Exception as exc:  # an unexpected handle shape: the range stands, args are not kept
        if users_own(exc):
            raise


def instant_with_args(g: Gate, name: str, args: Mapping[str, Any]) -> None:
    """An instant through ``g`` that the recorder keeps with ``args``; never raises."""
    _resolve()
    call = g.instant
    if call is None:
        return
    backend = _settings.backend
    try:
        if backend.records_into() is None:
            call(name, g.domain)
            return
        # the stream the gate's own calls use: none while a fault holds it host-only
        stream = None if _settings.faults.host_only(_stream_key(g.stream)) else g.stream
        backend.instant_with_args(name, g.domain, args, stream)
    except Exception as exc:
        fault(call, exc)


def current_backend() -> Backend:
    """The backend ranges go to now (after resolving the settings)."""
    _resolve()
    return _settings.backend


def state() -> _Settings:
    """The settings in force (resolved), for the library's own diagnostics. Read-only."""
    _resolve()
    return _settings


def recording() -> bool:
    """Whether ranges are kept in the in-process recorder (backend ``record``, or beside another
    backend after ``configure(record=True)`` or with ``MSTX_MARKS_OUT``).

    >>> configure(record=True)
    >>> recording()
    True
    >>> reset()
    """
    _resolve()
    return _settings.record or _settings.backend.records_into() is not None


def reset() -> None:
    """Forget ``configure`` calls; the environment is read again at next use. For tests."""
    global _settings
    with _lock:
        _settings = _Settings()
        for g in _gates.values():
            g.route(_first_use(g))
