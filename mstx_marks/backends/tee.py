"""Two backends at once: the device's own ranges (MSTX or NVTX) and the same ranges recorded.

What writing files needs beside a profiler: ``flush_at_exit`` and ``MSTX_MARKS_OUT`` record
every range in process while the device backend still emits it, so asking for files always
means recording. Each range's handle holds both backends' handles; a falsy device handle
(MSTX's 0, "not recorded") gets no device end, as with the device backend alone.

>>> from mstx_marks.backends.record import Recorder
>>> from mstx_marks.backends.noop import NoopBackend
>>> rec = Recorder()
>>> tee_with_recorder(NoopBackend(), rec) is rec  # nothing to tee with
True
>>> e = Tee(Recorder(), rec).emitter(None)
>>> e.end(e.start("step", "default"), "default")
>>> [r.name for r in rec.records()]
['step']
"""

from __future__ import annotations

from typing import Any

from .base import Backend, Emitter
from .noop import NoopBackend
from .record import Recorder, default_recorder

__all__ = ["Tee", "tee_with_recorder"]


class Tee(Backend):
    """``device``'s ranges, each also kept by ``recorder``."""

    def __init__(self, device: Backend, recorder: Recorder) -> None:
        self.device, self.recorder = device, recorder
        self.name = f"{device.name}+record"

    def device_present(self) -> bool:
        return self.device.device_present()

    def degrade(self) -> bool:
        # Only the device side can fault in a way worth degrading; the recorder cannot raise.
        return self.device.degrade()

    def emitter(self, stream: object) -> Emitter:
        dev, rec = self.device.emitter(stream), self.recorder.emitter(stream)
        dev_start, dev_end, dev_instant = dev.start, dev.end, dev.instant
        rec_start, rec_end, rec_instant = rec.start, rec.end, rec.instant

        def start(name: str, domain: str) -> tuple[Any, int]:
            return dev_start(name, domain), rec_start(name, domain)

        def end(handle: tuple[Any, int], domain: str) -> None:
            rec_end(handle[1], domain)  # first: a raising device end must not lose the record
            if handle[0]:
                dev_end(handle[0], domain)

        def instant(name: str, domain: str) -> None:
            rec_instant(name, domain)
            dev_instant(name, domain)

        return Emitter(self, start, end, instant)


def tee_with_recorder(device: Backend, recorder: Recorder | None = None) -> Backend:
    """``device`` with every range also recorded: the recorder alone when ``device`` records
    nothing (noop) or is that recorder, else a :class:`Tee`."""
    recorder = recorder if recorder is not None else default_recorder()
    if isinstance(device, NoopBackend) or device is recorder:
        return recorder
    if isinstance(device, Tee) and device.recorder is recorder:
        return device
    return Tee(device, recorder)
