"""The one interface every backend implements, and the bound calls the hot path makes.

A backend turns ``(name, domain)`` into a range in some tool. The hot path never talks to a
backend object: it calls the three plain callables of an :class:`Emitter`, which a backend builds
once per stream setting. That lets the MSTX backend hand out C functions directly.

>>> class Printing(Backend):
...     name = "printing"
...     def emitter(self, stream):
...         return Emitter(self, lambda n, d: print("start", n, d) or 1,
...                        lambda r, d: print("end", r, d), lambda n, d: print("instant", n, d))
>>> e = Printing().emitter(None)
>>> e.end(e.start("step", "default"), "default")
start step default
end 1 default
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from mstx_marks.backends.record import Recorder

__all__ = [
    "Backend",
    "BackendUnavailable",
    "Emitter",
    "EndFn",
    "FaultReport",
    "InstantFn",
    "StartFn",
]

#: ``start(name, domain)`` returns a range handle; a falsy handle means "not recorded, do not end".
StartFn = Callable[[str, str], Any]
#: ``end(handle, domain)`` ends the range; the domain is the one given to ``start``.
EndFn = Callable[[Any, str], object]
#: ``instant(name, domain)`` records an instant event (MSTX's ``mark``).
InstantFn = Callable[[str, str], object]
#: Told of a fault that a backend contained: the call that met it, and the exception.
FaultReport = Callable[[Callable[..., object], BaseException], object]


class BackendUnavailable(RuntimeError):
    """Raised by a backend's constructor when it cannot work on this machine."""


class Emitter:
    """The three calls for one backend and one stream setting, ready for the hot path: ``start``
    and ``end`` of a range, and ``instant`` (MSTX calls that one ``mark``)."""

    __slots__ = ("backend", "end", "instant", "start")

    def __init__(self, backend: Backend, start: StartFn, end: EndFn, instant: InstantFn) -> None:
        self.backend = backend
        self.start = start
        self.end = end
        self.instant = instant


class Backend:
    """Base class of all backends. Subclasses set :attr:`name` and implement :meth:`emitter`."""

    name: str = "backend"
    #: Whether ranges given to this backend go anywhere (False only for the no-op backend): the
    #: core closes every gate rather than call a backend that does nothing.
    emits: bool = True
    #: Whether a range this backend did not record (its start gave a falsy handle: no collector
    #: listening) may be recorded if started again later, once a profiler starts: the core then
    #: holds it (:mod:`mstx_marks.backends.reopen`). True for mstx and torch.
    reopens: bool = False

    def emitter(self, stream: object) -> Emitter:
        """Build the calls for ``stream``: ``None`` (host only), ``"current"``, or a stream object.

        Backends without streams ignore ``stream``. A stream the backend cannot use is reported
        with one warning and the host-only calls are returned instead.
        """
        raise NotImplementedError

    def device_present(self) -> bool:
        """For ``backend="auto"``: whether the device this backend serves is on this machine."""
        return True

    def degrade(self) -> bool:
        """Called after one of this backend's calls raised. Return True if the backend switched to
        a safer way of working and its emitters should be rebuilt, False to rest (record nothing)
        until the retry."""
        return False

    def rearm(self) -> None:
        """Go back to the fastest way of working: the retry after a back-off, and every
        ``configure(backend=...)``, call this before building emitters again."""

    def report_faults_to(self, report: FaultReport) -> None:
        """A backend that contains faults of a backend inside it (the tee) tells ``report``
        about each, with its own call that met it; others raise and need no report."""

    def records_into(self) -> Recorder | None:
        """The in-process recorder that keeps this backend's ranges, if any."""
        return None

    def keep_args(self, handle: Any, args: Mapping[str, Any]) -> None:
        """Keep ``args`` with the range ``handle`` (what ``start`` returned) where it is
        recorded; backends that record nothing ignore them (the MSTX message is the name)."""

    def instant_with_args(
        self, name: str, domain: str, args: Mapping[str, Any], stream: object
    ) -> None:
        """An instant event whose ``args`` are kept where it is recorded."""
        self.emitter(stream).instant(name, domain)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"
