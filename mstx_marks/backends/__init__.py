"""Backends: where ranges go. One interface (:mod:`.base`), one module per tool.

``create(name)`` builds one by name; ``"auto"`` picks, once, the first that works here: MSTX when
torch_npu imports and sees an NPU, else NVTX when CUDA is available, else noop. Unlike verl, an
installed ``nvtx`` package never wins on an NPU host. torch and torch_npu are imported only here,
lazily, by the backend that needs them, and ``auto`` never imports them itself: before the
program imported torch there is no device work to mark, so the choice waits (noop meanwhile,
:func:`detection_waits`) and is made when torch arrives (:mod:`mstx_marks.core.detection` hooks
that import). Importing torch just to find out costs seconds and a thousand modules.

>>> create("noop").name
'noop'
"""

from __future__ import annotations

import contextlib
import importlib
import sys

from mstx_marks.backends.base import Backend, BackendUnavailable, Emitter
from mstx_marks.backends.noop import NoopBackend
from mstx_marks.base.forking import new_lock

__all__ = [
    "NAMES",
    "Backend",
    "BackendUnavailable",
    "Emitter",
    "NoopBackend",
    "create",
    "detect",
    "detection_waits",
    "forget_detection",
    "tee_with_recorder",
]

#: Module and class of each named backend, imported on demand.
_BUILTIN = {
    "mstx": (".mstx", "MstxBackend"),
    "nvtx": (".nvtx", "NvtxBackend"),
    "torch": (".torch", "TorchBackend"),
    "record": (".record", "default_recorder"),
    "noop": (".noop", "NoopBackend"),
}
NAMES = ("auto", *_BUILTIN)

_detected: Backend | None = None
# Reentrant: a backend's import may run an import hook that asks for the choice again.
_detect_lock = new_lock(reentrant=True)


def create(name: str) -> Backend:
    """Build the backend called ``name``; raises BackendUnavailable if it cannot work here."""
    if name == "auto":
        return detect()
    module, attr = _BUILTIN[name]
    factory = getattr(importlib.import_module(module, __name__), attr)
    backend: Backend = factory()
    return backend


def tee_with_recorder(device: Backend) -> Backend:
    """``device`` with every range also kept by the default recorder (see
    :func:`mstx_marks.backends.tee.tee_with_recorder`); the recorder is loaded only here, when
    recording is asked for."""
    from mstx_marks.backends.tee import tee_with_recorder as tee

    return tee(device)


def forget_detection() -> None:
    """Choose again at the next ``auto`` (for a process that starts over)."""
    global _detected
    with _detect_lock:
        _detected = None


def detection_waits() -> bool:
    """Whether ``auto`` has not chosen yet because the program has not imported torch."""
    return _detected is None and "torch" not in sys.modules


def detect(*, probe: bool = False) -> Backend:
    """The ``auto`` choice, made once per process; never raises.

    While torch is not imported (and ``probe`` is False) it returns a noop backend and decides
    nothing; ``probe=True`` (``mstx-marks doctor``, the demo) imports what it needs to decide now.
    """
    global _detected
    if probe and "torch" not in sys.modules:
        # Outside the lock: importing torch runs the routing's hook for it, which detects too.
        with contextlib.suppress(Exception):  # no torch: nothing to detect with, noop below
            import torch  # noqa: F401
    with _detect_lock:
        if _detected is None:
            if "torch" not in sys.modules:
                return NoopBackend()
            _detected = NoopBackend()
            for name in ("mstx", "nvtx"):
                try:
                    backend = create(name)
                    if backend.device_present():
                        _detected = backend
                        break
                except Exception:  # a missing torch_npu is the normal case, not an error
                    continue
        return _detected
