"""NVTX ranges through ``torch.cuda.nvtx``, for Nsight Systems on CUDA machines.

NVTX through torch has no domains: the range name is passed as is, and ``stream`` is ignored
(nsys correlates host ranges with the kernels they launch by itself).

>>> NvtxBackend()  # doctest: +SKIP
<NvtxBackend 'nvtx'>
"""

from __future__ import annotations

from typing import Any

from mstx_marks.backends.base import Backend, BackendUnavailable, Emitter

__all__ = ["NvtxBackend"]


class NvtxBackend(Backend):
    """``torch.cuda.nvtx.range_start`` / ``range_end`` / ``mark``."""

    name = "nvtx"

    def __init__(self) -> None:
        try:
            import torch
            from torch.cuda import nvtx
        except Exception as exc:
            raise BackendUnavailable(f"torch does not import ({exc})") from exc
        if not torch.cuda.is_available():
            raise BackendUnavailable("CUDA is not available")
        self._nvtx: Any = nvtx

    def emitter(self, stream: object) -> Emitter:
        start, end, mark = self._nvtx.range_start, self._nvtx.range_end, self._nvtx.mark
        return Emitter(
            self,
            lambda name, domain: start(name),
            lambda range_id, domain: end(range_id),
            lambda name, domain: mark(name),
        )
