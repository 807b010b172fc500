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

import contextlib
from collections.abc import Mapping
from typing import Any, Callable

from mstx_marks.backends.base import Backend, Emitter, FaultReport
from mstx_marks.backends.noop import NoopBackend
from mstx_marks.backends.record import Recorder, default_recorder
from mstx_marks.backends.reopen import WAITING, Token
from mstx_marks.base.interrupts import users_own

__all__ = ["Tee", "tee_with_recorder"]

release = WAITING.release


def _ignore_fault(call: Callable[..., object], exc: BaseException) -> object:
    return 0


class Tee(Backend):
    """``device``'s ranges, each also kept by ``recorder``.

    The recorder cannot fail, so a device fault never costs a record: the tee records first,
    contains the device's exception and passes it to :attr:`report` (the settings' fault
    handling). When the device has no safer path left it rests and the tee keeps recording.
    """

    def __init__(self, device: Backend, recorder: Recorder) -> None:
        self.device, self.recorder = device, recorder
        self._resting: Backend | None = None
        self.name = f"{device.name}+record"
        #: Told of each device fault with the tee's own call that met it.
        self.report: FaultReport = _ignore_fault

    def device_present(self) -> bool:
        return self.device.device_present()

    def degrade(self) -> bool:
        try:
            degraded = self.device.degrade()
        except Exception as exc:
            if users_own(exc):  # the user's, arriving as degrade() ran: not the device's
                raise
            degraded = False
        if not degraded and self._resting is None:
            self._resting, self.device = self.device, NoopBackend()
        return True  # the recorder side still works

    def rearm(self) -> None:
        if self._resting is not None:
            self.device, self._resting = self._resting, None
        self.device.rearm()

    def report_faults_to(self, report: FaultReport) -> None:
        self.report = report

    def records_into(self) -> Recorder:
        return self.recorder

    def keep_args(self, handle: Any, args: Mapping[str, Any]) -> None:
        self.recorder.keep_args(handle[1], args)

    def instant_with_args(
        self, name: str, domain: str, args: Mapping[str, Any], stream: object
    ) -> None:
        self.recorder.instant_with_args(name, domain, args)  # first: a device fault loses none
        self.device.emitter(stream).instant(name, domain)

    def emitter(self, stream: object) -> Emitter:
        dev, rec = self.device.emitter(stream), self.recorder.emitter(stream)
        dev_start, dev_end, dev_instant = dev.start, dev.end, dev.instant
        rec_start, rec_end, rec_instant = rec.start, rec.end, rec.instant
        report = self.report
        # The device's range that no collector recorded waits for a profiler (reopen.py), as it
        # would without the tee; the recorder's never needs to. Once a watched profiler has run,
        # one it did record is held too: the window may end before the range does, and later
        # windows start it again (reopen.py's contract, point 4).
        waiting = WAITING
        hold = waiting.hold if self.device.reopens else None

        def start(name: str, domain: str) -> tuple[Any, int]:
            handle = rec_start(name, domain)
            try:
                dev = dev_start(name, domain)
            except BaseException as exc:
                if isinstance(exc, Exception) and not users_own(exc):
                    report(start, exc)
                    return 0, handle
                # The user's (Ctrl-C, a handler's timeout) while the device started: no exit
                # will come to end the recorded range, so it ends here.
                rec_end(handle, domain)
                raise
            if hold is not None and (not dev or waiting.watching):
                dev = hold(name, domain, dev_start, dev_end, dev)
            return dev, handle

        def end(handle: tuple[Any, int], domain: str) -> None:
            try:
                rec_end(handle[1], domain)
            except BaseException:
                # Arrived before the recorder's one store (core.engine.cut_short says why):
                # made again, and the device's range ended too, before the exception goes on.
                with contextlib.suppress(BaseException):
                    rec_end(handle[1], domain)
                    end_device(handle[0], domain)
                raise
            end_device(handle[0], domain)

        def end_device(dev: Any, domain: str) -> None:
            if dev:
                try:
                    dev_end(dev, domain)
                except Exception as exc:
                    report(end, exc)
            elif dev.__class__ is Token:
                release(dev)

        def instant(name: str, domain: str) -> None:
            rec_instant(name, domain)
            try:
                dev_instant(name, domain)
            except Exception as exc:
                report(instant, exc)

        return Emitter(self, start, end, instant)


def tee_with_recorder(device: Backend, recorder: Recorder | None = None) -> Backend:
    """``device`` with every range also recorded: the recorder alone when ``device`` records
    nothing (noop) or is that recorder, else a :class:`Tee`."""
    recorder = recorder if recorder is not None else default_recorder()
    if not device.emits or device is recorder:
        return recorder
    if device.records_into() is recorder:
        return device
    return Tee(device, recorder)
