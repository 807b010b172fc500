"""Which ranges reach which backend: ``configure``, the environment, domain and rank filters.

Every range site holds a :class:`Gate` for its (domain, stream). A gate's ``start``, ``end`` and
``mark`` are the backend's calls while that domain is active and ``None`` otherwise, so the hot
path decides with one attribute read. Settings changes rewrite every gate, which is how
``configure`` reaches functions decorated before it was called.

The environment is read at first use, not at import:

- ``MSTX_MARKS_BACKEND``: auto | mstx | nvtx | torch | record | noop
- ``MSTX_MARKS_DISABLE=1``
- ``MSTX_MARKS_INCLUDE`` / ``MSTX_MARKS_EXCLUDE``: comma-separated domains
- ``MSTX_MARKS_RANKS``: comma-separated ranks, e.g. ``0,1``

>>> configure(backend="record", include=["verl"])
>>> is_active("verl"), is_active()
(True, False)
>>> reset()
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from collections.abc import Hashable, Iterable
from typing import Any, Callable, Union

from . import backends
from .backends.base import Backend, Emitter, EndFn, MarkFn, StartFn
from .names import DEFAULT_DOMAIN, check_domain

__all__ = ["Gate", "configure", "current_backend", "fault", "gate", "is_active", "reset"]

#: What ``stream=`` takes: None (host only), "current", or a stream object.
Stream = object
BackendSpec = Union[str, Backend]

_lock = threading.RLock()


def _no_end(handle: Any, domain: str) -> None:
    return None


class Gate:
    """The switch one range site reads: the three backend calls, or None while inactive."""

    __slots__ = ("domain", "end", "mark", "start", "stream")

    start: StartFn | None
    end: EndFn  # only called with a handle that start returned, so never needs to be None
    mark: MarkFn | None

    def __init__(self, domain: str, stream: Stream) -> None:
        self.domain = domain
        self.stream = stream
        self.open(_first_use(self))

    def open(self, em: Emitter | None) -> None:
        """Route this gate's ranges to ``em``, or switch it off with None."""
        if em is None:
            self.start = self.mark = None
            self.end = _no_end
        else:
            self.start, self.end, self.mark = em.start, em.end, em.mark

    # Ray and multiprocessing pickle decorated functions by value: a gate travels as its key and
    # rebinds to the receiving process's own settings.
    def __reduce__(self) -> tuple[Callable[..., Gate], tuple[str, Stream]]:
        return (gate, (self.domain, self.stream))


class _Settings:
    def __init__(self) -> None:
        self.explicit: dict[str, Any] = {}
        self.resolved = False
        self.spec: BackendSpec | None = None
        self.backend: Backend = backends.NoopBackend()
        self.enabled = True
        self.include: frozenset[str] | None = None
        self.exclude: frozenset[str] = frozenset()
        self.ranks: frozenset[int] | None = None
        self.emitters: dict[Hashable, Emitter] = {}
        # id of each current backend call -> its backend, so a fault names the right backend.
        self.owners: dict[int, Backend] = {}


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


def gate(domain: str | None, stream: Stream = None) -> Gate:
    """The gate for ``(domain, stream)``, created (and the domain checked) on first request."""
    dom = DEFAULT_DOMAIN if domain is None else check_domain(domain)
    key = (dom, _stream_key(stream))
    found = _gates.get(key)
    if found is None:
        if isinstance(stream, str) and stream != "current":
            raise ValueError(f"stream must be None, 'current' or a stream object, got {stream!r}")
        with _lock:
            found = _gates.get(key)
            if found is None:
                found = _gates[key] = Gate(dom, stream)
                if stream is None:
                    host_gates[dom] = found
                    if dom == DEFAULT_DOMAIN:
                        host_gates[None] = found
    return found


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
        real_start, real_end = g.start, g.end
        if real_start is None:
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

    def mark(name: str, domain: str) -> None:
        _resolve()
        real_mark = g.mark
        if real_mark is not None:
            try:
                real_mark(name, domain)
            except Exception as exc:
                fault(real_mark, exc)

    return Emitter(_settings.backend, start, end, mark)


# --- reading and applying settings -------------------------------------------------------------


def _split(raw: str) -> list[str]:
    return [p.strip() for p in raw.split(",") if p.strip()]


def _from_env() -> dict[str, Any]:
    """Environment settings; a bad value warns and is ignored, since this runs in the hot path."""
    env: dict[str, Any] = {}
    readers: list[tuple[str, str, Callable[[str], Any]]] = [
        ("MSTX_MARKS_BACKEND", "backend", lambda v: _check_backend(v.strip().lower())),
        ("MSTX_MARKS_DISABLE", "enabled", lambda v: v.strip().lower() not in ("1", "true", "yes")),
        ("MSTX_MARKS_INCLUDE", "include", lambda v: _check_domains(_split(v), "include")),
        ("MSTX_MARKS_EXCLUDE", "exclude", lambda v: _check_domains(_split(v), "exclude")),
        ("MSTX_MARKS_RANKS", "ranks", lambda v: _check_ranks([int(r) for r in _split(v)])),
    ]
    for var, key, parse in readers:
        raw = os.environ.get(var)
        if raw is None or not raw.strip():
            continue
        try:
            env[key] = parse(raw)
        except (ValueError, TypeError) as exc:
            warnings.warn(f"mstx_marks: ignoring {var}={raw!r}: {exc}", stacklevel=4)
    if env.get("include") and env.get("exclude"):
        warnings.warn(
            "mstx_marks: both MSTX_MARKS_INCLUDE and MSTX_MARKS_EXCLUDE are set; include wins,"
            " as in the Ascend profiler",
            stacklevel=4,
        )
        del env["exclude"]
    return env


def _resolve() -> None:
    if not _settings.resolved:
        with _lock:
            if not _settings.resolved:
                _apply()


def _apply() -> None:
    """Combine environment and ``configure`` values, pick the backend, rewrite every gate."""
    s = _settings
    merged = {**_from_env(), **s.explicit} if not s.resolved else {**s.explicit}
    if not s.resolved:
        s.explicit = merged
    s.resolved = True
    spec = merged.get("backend", "auto")
    if spec != s.spec:
        s.spec = spec
        s.backend = _create(spec)
        s.emitters, s.owners = {}, {}
    s.enabled = merged.get("enabled", True)
    include = merged.get("include")
    s.include = frozenset(include) if include else None
    s.exclude = frozenset(merged.get("exclude") or ())
    ranks = merged.get("ranks")
    s.ranks = frozenset(ranks) if ranks else None
    _refresh()


def _create(spec: BackendSpec) -> Backend:
    if isinstance(spec, Backend):
        return spec
    try:
        return backends.create(spec)
    except Exception as exc:
        warnings.warn(
            f"mstx_marks: backend {spec!r} cannot work here ({exc}); ranges are not recorded",
            stacklevel=5,
        )
        return backends.NoopBackend()


def current_rank() -> int:
    """``RANK`` from the environment, else torch.distributed's rank when initialised, else 0."""
    raw = os.environ.get("RANK", "").strip()
    if raw.lstrip("-").isdigit():
        return int(raw)
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:
        pass
    return 0


def _active(domain: str) -> bool:
    s = _settings
    if not s.enabled or isinstance(s.backend, backends.NoopBackend):
        return False
    if s.ranks is not None and current_rank() not in s.ranks:
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
        try:
            em = _settings.backend.emitter(g.stream)
        except Exception as exc:
            _drop(_settings.backend, exc)
            return None
        _settings.emitters[key] = em
        for call in (em.start, em.end, em.mark):
            _settings.owners[id(call)] = em.backend
    return em


def _refresh() -> None:
    for g in list(_gates.values()):
        g.open(_emitter_for(g))


# --- faults ------------------------------------------------------------------------------------


def fault(call: Callable[..., object], exc: BaseException) -> int:
    """A backend call raised: warn once, degrade or drop that backend, keep the workload running.

    A call of a backend that was already replaced is ignored. Returns 0, the "not recorded"
    handle, so the caller skips the matching end.
    """
    with _lock:
        backend = _settings.owners.get(id(call))
        if backend is _settings.backend:
            _drop(backend, exc)
    return 0


def _drop(backend: Backend, exc: BaseException) -> None:
    degraded = backend.degrade()
    what = "switching to a safer path" if degraded else "ranges are no longer recorded"
    warnings.warn(
        f"mstx_marks: backend {backend.name!r} raised {exc!r}; {what}", RuntimeWarning, stacklevel=4
    )
    if not degraded:
        _settings.backend = backends.NoopBackend()
    _settings.emitters, _settings.owners = {}, {}
    _refresh()


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
) -> None:
    """Change the settings now; arguments left as None keep their value.

    ``include``/``exclude`` follow the Ascend profiler: with include only listed domains emit,
    with exclude all but the listed ones (``"default"`` is an ordinary domain). Giving one
    replaces the other; an empty list clears the filter. Giving both is a ValueError.
    ``ranks`` limits emitting to those ranks (an empty list: all ranks).

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
    if enabled is not None and not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool, got {enabled!r}")
    changes: dict[str, Any] = {}
    if backend is not None:
        changes["backend"] = _check_backend(backend)
    if enabled is not None:
        changes["enabled"] = enabled
    if include is not None:
        changes["include"], changes["exclude"] = _check_domains(include, "include"), ()
    if exclude is not None:
        changes["exclude"], changes["include"] = _check_domains(exclude, "exclude"), ()
    if ranks is not None:
        changes["ranks"] = _check_ranks(ranks)
    with _lock:
        # Not _resolve() first: that would build (and auto-detect) the env/default backend only
        # to replace it. Before the first resolution _apply merges the env under these values.
        _settings.explicit.update(changes)
        _apply()


def is_active(domain: str | None = None) -> bool:
    """Whether a host range in ``domain`` would reach a backend right now.

    >>> configure(enabled=False)
    >>> is_active()
    False
    >>> reset()
    """
    g = gate(domain)
    _resolve()
    return g.start is not None


def current_backend() -> Backend:
    """The backend ranges go to now (after resolving the settings)."""
    _resolve()
    return _settings.backend


def reset() -> None:
    """Forget ``configure`` calls; the environment is read again at next use. For tests."""
    global _settings
    with _lock:
        _settings = _Settings()
        for g in _gates.values():
            g.open(_first_use(g))
