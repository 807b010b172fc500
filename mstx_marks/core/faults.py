"""What happens after a backend call raised: the bookkeeping behind "degrade, back off, retry".

A fault is contained to what failed. A stream that cannot be read sends only its own ranges to
the host-only path; a backend whose fast path fails falls back to its safer path, or rests
(records nothing) when it has none. Either way the failed part is tried again after a back-off
that doubles with each fault of that part (1 s, 2 s, 4 s ... at most 10 minutes), so a hiccup
costs a moment and a persistent failure costs a few attempts an hour. :mod:`.settings` applies
the decisions; this module only counts and times them, so :func:`mstx_marks.core.status` can show
them.

>>> h = Health(clock=lambda: 100.0)
>>> h.note("mstx call", RuntimeError("boom")), h.delay("backend"), h.delay("backend")
(1, 1.0, 2.0)
>>> h.faults
{'mstx call: RuntimeError': 1}
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from typing import Any, Callable

from mstx_marks.backends.base import Emitter

__all__ = ["FIRST_DELAY_S", "MAX_DELAY_S", "Health", "probing"]

#: The first back-off after a fault, in seconds; each further fault of that part doubles it.
FIRST_DELAY_S = 1.0
#: The longest back-off: a part that always fails is tried six times an hour.
MAX_DELAY_S = 600.0


class Health:
    """Fault counts by kind and the back-off of each failed part. Not thread-safe: settings
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
