"""Ascend MSTX through torch_npu (``torch_npu.npu.mstx``).

Names and domains were checked when each range was defined, so this backend calls the C entry
points of ``torch_npu._C._mstx`` directly, with exactly the arguments torch_npu's public wrapper
would pass them. Should a C call raise (an unexpected torch_npu release), the backend degrades to
the public wrapper, which checks and swallows everything itself.

Range id 0 means "not recorded" (no collector, or the domain is filtered out): the hot path then
skips ``range_end``, as torch_npu's own code does.

>>> MstxBackend()  # doctest: +SKIP
<MstxBackend 'mstx'>
"""

from __future__ import annotations

from typing import Any, Callable

from ..diagnostics import warn
from .base import Backend, BackendUnavailable, Emitter

__all__ = ["MstxBackend"]

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

    def __init__(self) -> None:
        try:
            import torch_npu  # type: ignore[import-not-found,unused-ignore]
        except Exception as exc:
            raise BackendUnavailable(f"torch_npu does not import ({exc})") from exc
        self._npu: Any = torch_npu.npu
        self._api: Any = torch_npu.npu.mstx
        c_mstx = getattr(getattr(torch_npu, "_C", None), "_mstx", None)
        usable = c_mstx is not None and all(hasattr(c_mstx, f) for f in _C_ENTRY_POINTS)
        self._c: Any = c_mstx if usable else None
        # Emitters are rebuilt on every settings change and degrade; warn once per bad stream.
        # Compared by identity (streams may be unhashable), never by id(): ids are reused.
        self._warned: list[object] = []

    def device_present(self) -> bool:
        try:
            return bool(self._npu.is_available())
        except Exception:
            return False

    def degrade(self) -> bool:
        if self._c is None:
            return False
        self._c = None
        return True

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
        # The public wrapper returns None when it swallowed an error: "not recorded".
        return Emitter(
            self,
            lambda name, domain: api.range_start(name, get(), domain) or 0,
            api.range_end,
            lambda name, domain: api.mark(name, get(), domain),
        )
