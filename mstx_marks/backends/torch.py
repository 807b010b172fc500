"""Ranges in any ``torch.profiler`` trace, on any device, CPU included.

Uses the C++ calls behind ``torch.profiler.record_function``. While no profiler runs, starting a
range is a cheap check that returns "not recorded", so leaving this backend selected in
production costs almost nothing; the range then waits to be started again should a profiler
start before it ends (:mod:`mstx_marks.backends.reopen`). The domain travels as the record's
args string.

>>> TorchBackend()  # doctest: +SKIP
<TorchBackend 'torch'>
"""

from __future__ import annotations

from typing import Any

from mstx_marks.backends.base import Backend, BackendUnavailable, Emitter
from mstx_marks.backends.reopen import watch_profilers

__all__ = ["TorchBackend"]


class TorchBackend(Backend):
    """``record_function`` ranges for ``torch.profiler.profile``."""

    name = "torch"
    reopens = True  # a range begun while no profiler ran waits to be started inside one

    def __init__(self) -> None:
        try:
            import torch
        except Exception as exc:
            raise BackendUnavailable(f"torch does not import ({exc})") from exc
        self._torch: Any = torch
        watch_profilers()

    def emitter(self, stream: object) -> Emitter:
        torch = self._torch
        enabled = torch._C._autograd._profiler_enabled
        enter = torch.ops.profiler._record_function_enter_new
        leave = torch.ops.profiler._record_function_exit._RecordFunction
        plain = torch._C.DisableTorchFunctionSubclass

        def record(name: str, domain: str) -> Any:
            # The handle's truth value raises, so it travels in a (truthy) tuple.
            return (enter(name, domain),) if enabled() else 0

        def leave_range(handle: Any, domain: str) -> None:
            with plain():  # as record_function does: skips __torch_function__ dispatch
                leave(handle[0])

        def mark(name: str, domain: str) -> None:
            if enabled():
                leave_range((enter(name, domain),), domain)

        return Emitter(self, record, leave_range, mark)
