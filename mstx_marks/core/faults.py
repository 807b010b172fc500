"""What happens after a backend call raised: the bookkeeping behind "degrade, back off, retry".

A fault is contained to what failed. A stream that cannot be read sends only its own ranges to
the host-only path; a backend whose fast path fails falls back to its safer path, or rests
(records nothing) when it has none. Either way the failed part is tried again after a back-off
that doubles with each fault of that part (1 s, 2 s, 4 s ... at most 10 minutes), so a hiccup
costs a moment and a persistent failure costs a few attempts an hour. :class:`FaultPolicy`
decides and :class:`Health` counts and times, so :func:`mstx_marks.core.status` can show them;
:mod:`.routing` owns one policy and rebuilds its gates when the policy says so.

>>> h = Health(clock=lambda: 100.0)
>>> h.note("mstx call", RuntimeError("boom")), h.delay("backend"), h.delay("backend")
(1, 1.0, 2.0)
>>> h.faults
{'mstx call: RuntimeError': 1}
"""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable
from typing import Any, Callable, Protocol

from mstx_marks.backends.base import Backend, Emitter
from mstx_marks.backends.noop import NoopBackend
from mstx_marks.base.diagnostics import warn_once
from mstx_marks.base.interrupts import users_own

__all__ = ["FIRST_DELAY_S", "MAX_DELAY_S", "FaultPolicy", "Health", "Router", "probing"]

#: The first back-off after a fault, in seconds; each further fault of that part doubles it.
FIRST_DELAY_S = 1.0
#: The longest back-off: a part that always fails is tried six times an hour.
MAX_DELAY_S = 600.0


class Health:
    """Fault counts by kind and the back-off of each failed part. Not thread-safe: the routing
    calls it under its own lock."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.faults: dict[str, int] = {}
        self._next_delay: dict[Hashable, float] = {}
        #: Stream keys whose ranges go host-only, and when each is tried again.
        self.host_only: dict[Hashable, float] = {}
        #: When the backend's fast path is tried again (None: it is not degraded).
        self.retry_at: float | None = None

    def note(self, kind: str, exc: BaseException) -> int:
        """Count a fault; returns how many of that kind there have been."""
        key = f"{kind}: {type(exc).__name__}"
        self.faults[key] = self.faults.get(key, 0) + 1
        return self.faults[key]

    def delay(self, part: Hashable) -> float:
        """The back-off for ``part`` now, doubling the next one."""
        delay = self._next_delay.get(part, FIRST_DELAY_S)
        self._next_delay[part] = min(delay * 2, MAX_DELAY_S)
        return delay

    def due(self) -> list[Hashable]:
        """Stream keys whose retry time has come (removed from :attr:`host_only`)."""
        now = self.clock()
        keys = [k for k, at in self.host_only.items() if now >= at]
        for k in keys:
            del self.host_only[k]
        return keys

    def backend_due(self) -> bool:
        """Whether the backend's retry time has come (and clear it)."""
        if self.retry_at is not None and self.clock() >= self.retry_at:
            self.retry_at = None
            return True
        return False

    def forget_backoff(self) -> None:
        """What ``configure(backend=...)`` does: everything is tried again now, from scratch."""
        self._next_delay.clear()
        self.host_only.clear()
        self.retry_at = None


def probing(em: Emitter, due_at: float, retry: Callable[[], object], health: Health) -> Emitter:
    """``em``, whose starts and instants first try :func:`retry` once ``due_at`` has passed.

    What a degraded gate runs: the check costs one clock read per range while degraded, and
    nothing once the retry rebuilt the gate with the healthy calls.
    """
    start0, instant0 = em.start, em.instant

    def start(name: str, domain: str) -> Any:
        if health.clock() >= due_at:
            retry()
        return start0(name, domain)

    def instant(name: str, domain: str) -> object:
        if health.clock() >= due_at:
            retry()
        return instant0(name, domain)

    return Emitter(em.backend, start, em.end, instant)


class Router(Protocol):
    """What a :class:`FaultPolicy` acts on: the routing's backend in use and the one asked for,
    its emitters by stream key, its lock, and the two things it can be told to do."""

    backend: Backend
    armed: Backend
    emitters: dict[Hashable, Emitter]
    lock: threading.RLock

    def refresh(self) -> None:
        """Rebuild every gate from the emitters (building the missing ones)."""

    def rearm(self, backend: Backend) -> None:
        """Put ``backend`` back on its fastest path."""


def describe_stream(key: Hashable) -> str:
    """A stream key as users wrote the stream: ``'current'``, or the stream's repr."""
    return repr(key[1]) if isinstance(key, tuple) and len(key) == 2 else repr(key)


class FaultPolicy:
    """Contains a backend call that raised, and retries what it set aside.

    A call serving one stream setting sends that stream's ranges host-only; any other call
    degrades the backend to its safer path, or puts it to rest. Either is retried after a
    back-off. The first fault of each kind warns; later ones are counted in :attr:`health`.
    Not thread-safe: called under the router's lock, except :meth:`retry`, which takes it
    without waiting.
    """

    def __init__(self, router: Router) -> None:
        self.router = router
        self.health = Health()
        # Each current backend call -> its backend and the stream key it alone serves (None: host
        # ranges, or shared by several streams), so a fault names what failed. Keyed by the call
        # itself (held alive here), never by id(): a freed call's id can be reused.
        self._owners: dict[Callable[..., object], tuple[Backend, Hashable]] = {}

    def forget(self) -> None:
        """A new backend: no call is known, every back-off starts over."""
        self._owners = {}
        self.health.forget_backoff()

    def resting(self) -> bool:
        """Whether the backend was put to rest by a fault (records nothing until its retry)."""
        return not self.router.backend.emits and self.health.retry_at is not None

    def host_only(self, key: Hashable) -> bool:
        """Whether the ranges of stream ``key`` go host-only after a fault of that stream."""
        return key in self.health.host_only

    def adopt(self, em: Emitter, key: Hashable) -> Emitter:
        """Know ``em``'s calls (built for stream ``key``), and make them try the retry once a
        back-off has passed."""
        h, backend = self.health, self.router.backend
        host_only = key in h.host_only
        part = None if host_only else key
        due = [at for at in (h.host_only.get(key), h.retry_at) if at is not None]
        if due:
            em = probing(em, min(due), self.retry, h)
        for call in (em.start, em.end, em.instant):
            prev = self._owners.get(call)
            # a call serving two stream settings (range_end, the host calls) is the backend's own
            self._owners[call] = (backend, part if prev is None or prev[1] == part else None)
        return em

    def fault(self, call: Callable[..., object], exc: BaseException) -> None:
        """``call`` raised ``exc``: a call of a backend already replaced is ignored."""
        owner = self._owners.get(call)
        if owner is not None and owner[0] is self.router.backend:
            backend, part = owner
            if part is not None and part not in self.health.host_only:
                self.stream_fault(backend, part, exc)
            else:
                self.backend_fault(backend, exc)

    def stream_fault(self, backend: Backend, key: Hashable, exc: BaseException) -> None:
        h = self.health
        h.note(f"{backend.name} stream", exc)
        delay = h.delay(("stream", key))
        h.host_only[key] = h.clock() + delay
        warn_once(
            ("stream fault", backend.name, key),
            f"backend {backend.name!r}: ranges on stream {describe_stream(key)} raised {exc!r};"
            f" they are recorded on the host only, and the stream is tried again in {delay:g} s"
            " (later faults are counted in mstx_marks.status())",
        )
        self.router.emitters.pop(key, None)
        self.router.refresh()

    def backend_fault(self, backend: Backend, exc: BaseException) -> None:
        self.health.note(f"{backend.name} call", exc)
        try:
            degraded = backend.degrade()
        except Exception as again:  # a custom backend's degrade() must not reach the workload
            if users_own(again):  # but the user's exception, arriving meanwhile, must
                raise
            degraded = False
        if not degraded:
            self.rest(backend, exc)
            return
        delay = self.health.delay("backend")
        self.health.retry_at = self.health.clock() + delay
        warn_once(
            ("degraded", backend.name),
            f"backend {backend.name!r} raised {exc!r}; switching to a safer path, and the faster"
            f" one is tried again in {delay:g} s (later faults are counted in mstx_marks.status())",
        )
        self._rebuild_all()

    def rest(self, backend: Backend, exc: BaseException) -> None:
        """Record nothing until the retry: the backend has no safer path left."""
        delay = self.health.delay("backend")
        self.health.retry_at = self.health.clock() + delay
        warn_once(
            ("resting", backend.name),
            f"backend {backend.name!r} raised {exc!r}; ranges are not recorded for {delay:g} s, "
            "then it is tried again (later faults are counted in mstx_marks.status())",
        )
        self.router.backend = NoopBackend()
        self._rebuild_all()

    def retry(self) -> None:
        """Try again what a fault set aside, once its back-off has passed. Called from the hot
        path of a degraded gate, so it never waits: if the router is busy it tries at the next
        range."""
        router = self.router
        if not router.lock.acquire(blocking=False):
            return
        try:
            streams = self.health.due()
            if self.health.backend_due():
                router.rearm(router.armed)
                router.backend = router.armed
                router.emitters, self._owners = {}, {}
            elif streams:
                for key in streams:
                    router.emitters.pop(key, None)
            else:
                return
            router.refresh()
        finally:
            router.lock.release()

    def _rebuild_all(self) -> None:
        self.router.emitters, self._owners = {}, {}
        self.router.refresh()
