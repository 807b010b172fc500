"""The one state of this process: what was asked, the backend in force, the gates, the recorder,
the held ranges, the output session and what presets and recipes armed, with
:meth:`Process.start_over` the one way to begin again, for a test (``reset``) or a forked child
alike.

Everything a range site reads lives on :data:`PROCESS`, so that no module keeps a copy that a
reset or a fork could leave behind. The logic that fills it sits above this module (it is the
bottom of the routing, so every layer can read the state): :mod:`.gates` routes each gate,
:mod:`.configuration` reads the environment and ``configure``, and each installs the calls the
state needs of it (``route_all``, ``apply``, ``rearm``) when it is imported, which
``mstx_marks.core`` does first. The layers above (the output session, for one) add a
:class:`Part` that starts over with the rest.

>>> from mstx_marks.core.configuration import configure
>>> configure(backend="record", include=["verl"])
>>> PROCESS.settings.include
frozenset({'verl'})
>>> PROCESS.start_over()
>>> PROCESS.settings.include is None
True
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Any, Callable, Protocol, Union

from mstx_marks import backends
from mstx_marks.backends.base import Backend, Emitter
from mstx_marks.backends.reopen import WAITING
from mstx_marks.base import diagnostics
from mstx_marks.base.forking import after_fork_in_child, new_lock
from mstx_marks.core.faults import FaultPolicy, Health

if TYPE_CHECKING:
    from mstx_marks.backends.record import Recorder
    from mstx_marks.core.gates import Gate

__all__ = ["PROCESS", "BackendSpec", "Part", "Process", "Settings"]

BackendSpec = Union[str, Backend]


class Part(Protocol):
    """State a layer above the routing keeps for the process (the output session)."""

    def start_over(self, forked: bool) -> None:
        """Begin again: in a forked child (``forked``), or for a test."""


def _not_installed(*args: object) -> None:
    raise RuntimeError("mstx_marks.core.configuration was not imported")  # a packaging fault


class Settings:
    """What was asked (``explicit``), the backend in force, the filters, the emitters by stream
    key and the fault policy acting on them (the router it acts on: :class:`mstx_marks.core.
    faults.Router`). Replaced whole when the process starts over."""

    def __init__(self, process: Process) -> None:
        self._process = process
        self.lock = process.lock
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
        self._process.route_all()

    def rearm(self, backend: Backend) -> None:
        self._process.rearm_backend(backend)


class Process:
    """The process's state; :data:`PROCESS` is the one instance."""

    def __init__(self) -> None:
        # Reentrant: a backend's rearm may import torch, whose import hook re-detects under it.
        self.lock = new_lock(reentrant=True)
        #: Every gate by (domain, stream key), and the host-only ones by domain (None: the
        #: default domain), the lookup ``mark()`` makes per use.
        self.gates: dict[tuple[str, Hashable], Gate] = {}
        self.host_gates: dict[str | None, Gate] = {}
        #: The output session of :mod:`mstx_marks.export.out`, once one is made.
        self.session: Part | None = None
        #: What the presets armed (preset -> its options) and the profiler captures armed and
        #: not done (:mod:`mstx_marks.capture.presets`, :mod:`mstx_marks.profiling.recipes`).
        #: Kept when the process starts over: the patches they made stay in place, in a forked
        #: child too, and arming one again must not patch twice.
        self.presets: dict[str, object] = {}
        self.captures: list[object] = []
        self.settings = Settings(self)
        # Installed by the modules above at import (see the module docstring).
        self.route_all: Callable[[], None] = _not_installed
        self.apply: Callable[[], None] = _not_installed
        self.rearm_backend: Callable[[Backend], None] = _not_installed
        self._fork_watched = False

    def resolve(self) -> None:
        """Apply the settings now if they were not yet (the first range does otherwise)."""
        if not self.settings.resolved:
            with self.lock:
                if not self.settings.resolved:
                    self.apply()

    @property
    def recorder(self) -> Recorder:
        """The default recorder (made on first use)."""
        from mstx_marks.backends.record import default_recorder

        return default_recorder()

    def adopt(self, session: Part) -> None:
        """Make ``session`` the process's output session; it starts over with the process,
        in a forked child too."""
        self.session = session
        if not self._fork_watched:
            # Registered now, not at import: a forked child's resets run in the order they were
            # registered, and the session's new writer must find the recorder (made before any
            # session) already emptied by its own reset.
            self._fork_watched = True
            after_fork_in_child(self._forked)

    def start_over(self, *, forked: bool = False) -> None:
        """Begin again. For a test (``reset``): forget ``configure`` and the backend chosen
        (the environment is read again at next use), the once-only warnings, the recorder's
        events, the held ranges and the output session. In a forked child (``forked``): the
        settings stay (the child was configured as its parent was) and the session makes the
        child's own files; the recorder and the held ranges have emptied themselves already
        (each object resets its own state at a fork: :mod:`mstx_marks.base.forking`)."""
        with self.lock:
            if forked:
                if self.session is not None:
                    self.session.start_over(forked)
                return
            if self.session is not None:
                self.session.start_over(forked)
                self.session = None
            self.settings = Settings(self)
            backends.forget_detection()
            diagnostics.forget_warnings()
            self.recorder.clear()
            WAITING.clear()
            for g in self.gates.values():
                g.restart()

    def _forked(self) -> None:
        self.start_over(forked=True)


#: The process's state.
PROCESS = Process()
