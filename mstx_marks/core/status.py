"""Where this process stands: the backend in use, what faults set aside, what the recorder holds.

>>> from mstx_marks import configure
>>> configure(backend="record")
>>> s = status()
>>> s.backend, s.faults, s.dropped
('record', {}, 0)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mstx_marks.backends.record import default_recorder
from mstx_marks.core import configuration as settings
from mstx_marks.core.faults import describe_stream

__all__ = ["Status", "status"]


@dataclass(frozen=True)
class Status:
    """A snapshot of :func:`status`; ``str()`` says it in plain words."""

    #: The backend ranges go to now (``noop`` while a fault has put it to rest).
    backend: str
    #: The backend that configure or the environment asked for.
    configured: str
    enabled: bool
    #: Whether ranges are also kept in the in-process recorder (files, summary).
    recording: bool
    #: Streams whose ranges go host-only after a fault, until their retry.
    host_only_streams: list[str] = field(default_factory=list)
    #: Seconds until the backend's faster path is tried again (None: not degraded).
    retry_in_s: float | None = None
    #: Faults by kind ("mstx call: RuntimeError"), counted since the process started.
    faults: dict[str, int] = field(default_factory=dict)
    #: Events in the recorder, its capacity, and how many it dropped when full.
    recorded: int = 0
    capacity: int = 0
    dropped: int = 0

    def __str__(self) -> str:
        lines = [f"backend: {self.backend}" + _unless_same(self.configured, self.backend)]
        if not self.enabled:
            lines.append(
                "disabled: no range is emitted (configure(enabled=True) or MSTX_MARKS_DISABLE)"
            )
        if self.retry_in_s is not None:
            lines.append(
                f"degraded by a fault; the faster path is tried again in {self.retry_in_s:.1f} s"
            )
        if self.host_only_streams:
            lines.append(f"host-only after a stream fault: {', '.join(self.host_only_streams)}")
        for kind, n in sorted(self.faults.items()):
            lines.append(f"fault x{n}: {kind}")
        if self.recording:
            lines.append(
                f"recorder: {self.recorded} of {self.capacity} events"
                + (f", {self.dropped} dropped when full" if self.dropped else "")
            )
        return "\n".join(lines)


def _unless_same(configured: str, running: str) -> str:
    return "" if configured == running else f" (configured: {configured})"


def status() -> Status:
    """What mstx_marks is doing in this process now, and what went wrong so far.

    >>> from mstx_marks import configure
    >>> configure(backend="noop")
    >>> print(status())
    backend: noop
    """
    s = settings.state()
    h = s.health
    now = h.clock()
    recorder = s.armed.records_into()
    if recorder is None and s.record:
        recorder = default_recorder()
    return Status(
        backend=s.backend.name,
        configured=s.armed.name,
        enabled=s.enabled,
        recording=recorder is not None,
        host_only_streams=sorted(describe_stream(k) for k in h.host_only),
        retry_in_s=None if h.retry_at is None else max(0.0, h.retry_at - now),
        faults=dict(h.faults),
        recorded=recorder.used if recorder is not None else 0,
        capacity=recorder.capacity if recorder is not None else 0,
        dropped=recorder.dropped if recorder is not None else 0,
    )
