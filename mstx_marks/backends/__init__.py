"""Backends: where ranges go. One interface (:mod:`.base`), one module per tool.

``create(name)`` builds one by name; ``"auto"`` picks, once, the first that works here: MSTX when
torch_npu imports and sees an NPU, else NVTX when CUDA is available, else noop. Unlike verl, an
installed ``nvtx`` package never wins on an NPU host. torch and torch_npu are imported only here,
lazily, by the backend that needs them.

>>> create("noop").name
'noop'
"""

from __future__ import annotations

import importlib
import threading

from .base import Backend, BackendUnavailable, Emitter
from .noop import NoopBackend
from .tee import Tee, tee_with_recorder

__all__ = [
    "NAMES",
    "Backend",
    "BackendUnavailable",
    "Emitter",
    "NoopBackend",
    "Tee",
    "create",
    "detect",
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
_detect_lock = threading.Lock()


def create(name: str) -> Backend:
    """Build the backend called ``name``; raises BackendUnavailable if it cannot work here."""
    if name == "auto":
        return detect()
    module, attr = _BUILTIN[name]
    factory = getattr(importlib.import_module(module, __name__), attr)
    backend: Backend = factory()
    return backend


def detect() -> Backend:
    """The ``auto`` choice, made once per process; never raises."""
    global _detected
    with _detect_lock:
        if _detected is None:
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
