"""What the program asked for: ``configure``, the environment, and applying them to the gates.

The environment (:mod:`mstx_marks.base.env`: backend, disable, include/exclude, ranks, out) is
read at first use, not at import; ``configure`` values win over it. Applying builds the backend
(:mod:`.detection`), keeps it on :data:`~mstx_marks.core.process.PROCESS`, and routes every gate
(:mod:`.gates`).

>>> configure(backend="record", include=["verl"])
>>> is_active("verl"), is_active()
(True, False)
>>> reset()
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Callable

from mstx_marks import backends
from mstx_marks.backends.base import Backend
from mstx_marks.base import env
from mstx_marks.base.diagnostics import warn, warn_once
from mstx_marks.base.interrupts import users_own
from mstx_marks.base.names import check_domain
from mstx_marks.core import detection
from mstx_marks.core.gates import Gate, fault, gate, route_all, stream_key
from mstx_marks.core.process import PROCESS, BackendSpec, Settings

__all__ = [
    "attach",
    "configure",
    "current_backend",
    "instant_with_args",
    "is_active",
    "recording",
    "reset",
    "resolve",
    "settings_from_env",
    "state",
]


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


def resolve() -> None:
    """Apply the settings now if they were not yet (they are, at the first range otherwise)."""
    PROCESS.resolve()


def _apply(rearm: bool = False) -> None:
    """Combine environment and ``configure`` values, pick the backend, rewrite every gate.

    ``rearm``: build the backend afresh even if the same one is asked for again, forgetting its
    faults and back-offs (what ``configure(backend=...)`` promises).
    """
    s = PROCESS.settings
    merged = {**settings_from_env(), **s.explicit} if not s.resolved else {**s.explicit}
    if not s.resolved:
        s.explicit = merged
    spec = merged.get("backend", "auto")
    record = bool(merged.get("record", False))
    if spec != s.spec or record != s.record or rearm:
        s.spec, s.record = spec, record
        backend = detection.create(spec)
        if spec == "auto" and backends.detection_waits():
            detection.when_torch_arrives(_choose_again)
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
    route_all()


def _choose_again() -> None:
    """torch arrived: ``auto`` chooses now, every other setting kept."""
    with PROCESS.lock:
        if PROCESS.settings.resolved and PROCESS.settings.spec == "auto":
            _apply(rearm=True)


def _rearm(backend: Backend) -> None:
    try:
        backend.report_faults_to(fault)
        backend.rearm()
    except Exception as exc:  # a custom backend's rearm() must not reach the workload
        if users_own(exc):  # (but the user's own exception, arriving meanwhile, must)
            raise
        warn_once(("rearm", backend.name), f"backend {backend.name!r}: rearm() raised {exc!r}")


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
    with PROCESS.lock:
        # Not resolve() first: that would build (and auto-detect) the env/default backend only
        # to replace it. Before the first resolution _apply merges the env under these values.
        PROCESS.settings.explicit.update(changes)
        _apply(rearm=backend is not None)


def is_active(domain: str | None = None) -> bool:
    """Whether a host range in ``domain`` would reach a backend right now.

    >>> configure(enabled=False)
    >>> is_active()
    False
    >>> reset()
    """
    g = gate(domain)
    resolve()
    return g.start is not None and not PROCESS.settings.faults.resting()


def attach(handle: Any, args: Mapping[str, Any]) -> None:
    """Keep ``args`` with the range ``handle`` where it is recorded; never raises."""
    try:
        PROCESS.settings.backend.keep_args(handle, args)
    except Exception as exc:  # an unexpected handle shape: the range stands, args are not kept
        if users_own(exc):
            raise


def instant_with_args(g: Gate, name: str, args: Mapping[str, Any]) -> None:
    """An instant through ``g`` that the recorder keeps with ``args``; never raises."""
    resolve()
    call = g.instant
    if call is None:
        return
    s = PROCESS.settings
    backend = s.backend
    try:
        if backend.records_into() is None:
            call(name, g.domain)
            return
        # the stream the gate's own calls use: none while a fault holds it host-only
        stream = None if s.faults.host_only(stream_key(g.stream)) else g.stream
        backend.instant_with_args(name, g.domain, args, stream)
    except Exception as exc:
        fault(call, exc)


def current_backend() -> Backend:
    """The backend ranges go to now (after resolving the settings)."""
    resolve()
    return PROCESS.settings.backend


def state() -> Settings:
    """The settings in force (resolved), for the library's own diagnostics. Read-only."""
    resolve()
    return PROCESS.settings


def recording() -> bool:
    """Whether ranges are kept in the in-process recorder (backend ``record``, or beside another
    backend after ``configure(record=True)`` or with ``MSTX_MARKS_OUT``).

    >>> configure(record=True)
    >>> recording()
    True
    >>> reset()
    """
    resolve()
    s = PROCESS.settings
    return s.record or s.backend.records_into() is not None


def reset() -> None:
    """Start the process's state over (:meth:`~mstx_marks.core.process.Process.start_over`):
    ``configure`` calls, the recorder, the session and once-only warnings are forgotten, and the
    environment is read again at next use. For tests."""
    PROCESS.start_over()


PROCESS.apply = _apply
PROCESS.rearm_backend = _rearm
