"""Ascend MSTX through torch_npu (``torch_npu.npu.mstx``).

Names and domains were checked when each range was defined, so this backend calls the C entry
points of ``torch_npu._C._mstx`` directly, with exactly the arguments torch_npu's public wrapper
would pass them. Should a C call raise (an unexpected torch_npu release), the backend degrades to
the public wrapper, which checks and swallows everything itself. The wrapper prints an ``[ERROR]``
line on stdout for every call it swallows, so its ``None`` ("I swallowed an error") counts as a
fault too: after one such line the wrapper is not used again, and only the C path is retried
(:mod:`mstx_marks.core.faults`), which keeps the job's stdout to a line or two however long it runs.

Range id 0 means "not recorded" (no collector, or the domain is filtered out): such a range is
never ended in C, as torch_npu's own code does, and it waits to be started again should a
profiler start before it ends (:mod:`mstx_marks.backends.reopen`).

>>> MstxBackend()  # doctest: +SKIP
<MstxBackend 'mstx'>
"""

from __future__ import annotations

from typing import Any, Callable

from mstx_marks.backends.base import Backend, BackendUnavailable, Emitter
from mstx_marks.backends.reopen import watch_profilers
from mstx_marks.base.diagnostics import warn

__all__ = ["MstxBackend", "WrapperFailed"]


class WrapperFailed(RuntimeError):
    """torch_npu's public wrapper swallowed an error (and printed it): it returned None."""


def _checked(handle: Any) -> Any:
    if handle is None:
        raise WrapperFailed("torch_npu.npu.mstx.range_start failed (its [ERROR] line says why)")
    return handle


_C_ENTRY_POINTS = (
    "_mark",
    "_mark_on_host",
    "_range_start",
    "_range_start_on_host",
    "_range_end",
)


class MstxBackend(Backend):
    """MSTX ranges for the Ascend profiler, msprof and MSPTI."""

    name = "mstx"
    reopens = True

    def __init__(self, wrapper_only: bool = False) -> None:
        """``wrapper_only``: always go through torch_npu's public wrapper, never the C entry
        points (what the backend falls back to; for comparing the two)."""
        try:
            import torch_npu  # type: ignore[import-not-found,unused-ignore]
        except Exception as exc:
            raise BackendUnavailable(f"torch_npu does not import ({exc})") from exc
        self._npu: Any = torch_npu.npu
        self._api: Any = torch_npu.npu.mstx
        c_mstx = getattr(getattr(torch_npu, "_C", None), "_mstx", None)
        usable = (
            not wrapper_only
            and c_mstx is not None
            and all(hasattr(c_mstx, f) for f in _C_ENTRY_POINTS)
        )
        self._c_found: Any = c_mstx if usable else None
        watch_profilers()
        self._c: Any = self._c_found
        self._wrapper_failed = False
        # Emitters are rebuilt on every settings change and degrade; warn once per bad stream.
        # Compared by identity (streams may be unhashable), never by id(): ids are reused.
        self._warned: list[object] = []

    def device_present(self) -> bool:
        try:
            return bool(self._npu.is_available())
        except Exception:
            return False

    def degrade(self) -> bool:
        if self._c is None:  # the wrapper failed: it is not tried again, only the C path is
            self._wrapper_failed = True
            return False
        self._c = None
        return not self._wrapper_failed

    def rearm(self) -> None:
        self._c = self._c_found

    def _stream_source(self, stream: object) -> Callable[[], Any] | None:
        """A callable giving the stream for each range, or None for host-only ranges."""
        if not stream:  # torch_npu treats any falsy stream as host-only
            return None
        if stream == "current":
            current: Callable[[], Any] = self._npu.current_stream
            return current
        stream_type = getattr(getattr(self._npu, "streams", None), "Stream", None)
        if stream_type is not None and isinstance(stream, stream_type):
            return lambda: stream
        if any(seen is stream for seen in self._warned):
            return None
        self._warned.append(stream)
        warn(
            f"stream {stream!r} is not a torch_npu.npu.streams.Stream;"
            " its ranges are recorded on the host only"
        )
        return None

    def emitter(self, stream: object) -> Emitter:
        source = self._stream_source(stream)
        c, api = self._c, self._api
        if c is not None:
            if source is None:
                return Emitter(self, c._range_start_on_host, c._range_end, c._mark_on_host)

            def start(name: str, domain: str) -> Any:
                s = source()
                return c._range_start(name, s.stream_id, s.device_index, s.device_type, domain)

            def mark(name: str, domain: str) -> None:
                s = source()
                c._mark(name, s.stream_id, s.device_index, s.device_type, domain)

            return Emitter(self, start, c._range_end, mark)

        get = source or (lambda: None)
        # The public wrapper returns None when it swallowed an error; its 0 is "not recorded".
        return Emitter(
            self,
            lambda name, domain: _checked(api.range_start(name, get(), domain)),
            api.range_end,
            lambda name, domain: api.mark(name, get(), domain),
        )
