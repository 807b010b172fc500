"""A fake of torch_npu's C layer for MSTX (``torch_npu._C._mstx``) and the stub module tree.

The fake follows ``torch_npu/csrc/profiler/mstx_mgr.cpp``: range ids come from one process-wide
counter starting at 1; 0 means "not recorded" (no collector, or the domain filtered out);
``_range_end`` ignores id 0 and ends in a filtered-out domain. A :class:`Collector` plays the part
of a profiler session with mstx on.

Push/pop return the 0-based depth (pop: of the popped range, -1 on an empty stack), as torch_npu's
own tests stub them; returning -1 while nothing collects is an assumption, not checked against C.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import threading
import time
import types
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Optional

# c10::DeviceType::PrivateUse1, which is what a real NPU stream reports as device_type.
NPU_DEVICE_TYPE = 20


class _StreamBase:
    """Plays ``torch_npu._C._NPUStreamBase``: the wrapper reads only these attributes."""

    def __init__(
        self, stream_id: int = 0, device_index: int = 0, device_type: int = NPU_DEVICE_TYPE
    ) -> None:
        self.stream_id = stream_id
        self.device_index = device_index
        self.device_type = device_type

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.stream_id}, {self.device_index}, {self.device_type})"


class Stream(_StreamBase):
    """Stands in for ``torch_npu.npu.streams.Stream``, which compares and hashes by value."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def _key(self) -> tuple[int, int, int]:
        return (self.stream_id, self.device_index, self.device_type)


class SyncLaunchStream(_StreamBase):
    """Not a Stream subclass, as in torch_npu, so mstx rejects it."""


@dataclass(frozen=True)
class StreamInfo:
    stream_id: int
    device_index: int
    device_type: int


@dataclass
class Range:
    """A start/end range (``range_id`` set) or a push/pop range (``range_id`` None)."""

    message: str
    domain: str
    range_id: Optional[int]
    stream: Optional[StreamInfo]
    start_tid: int
    start_ns: int
    end_tid: Optional[int] = None
    end_ns: Optional[int] = None

    @property
    def closed(self) -> bool:
        return self.end_ns is not None


@dataclass(frozen=True)
class Mark:
    message: str
    domain: str
    stream: Optional[StreamInfo]
    tid: int
    ns: int


@dataclass(frozen=True)
class BadEnd:
    """An end the profiler cannot pair: reason is "unknown", "double" or "domain_mismatch"."""

    range_id: int
    domain: str
    reason: str
    tid: int


@dataclass
class Collector:
    """One collection session (a profiler run with mstx on), with its domain filter and events."""

    c: FakeMstxC
    include: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)
    active: bool = True
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    ranges: list[Range] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    bad_ends: list[BadEnd] = field(default_factory=list)
    bad_pops: list[tuple[str, int]] = field(default_factory=list)

    def records(self, domain: str) -> bool:
        # As the profiler does: include wins over exclude; empty means no filter.
        if self.include:
            return domain in self.include
        return domain not in self.exclude

    def stop(self) -> None:
        self.c._stop(self)

    def __enter__(self) -> Collector:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.active:
            self.stop()

    def open_ranges(self) -> list[Range]:
        return [r for r in self.ranges if not r.closed]

    def messages(self) -> list[str]:
        return [r.message for r in self.ranges]

    def assert_clean(self) -> None:
        problems = [f"open: {r}" for r in self.open_ranges()]
        problems += [f"bad end: {b}" for b in self.bad_ends]
        problems += [f"pop on empty stack: domain={d!r} tid={t}" for d, t in self.bad_pops]
        assert not problems, "\n".join(problems)


def _check_types(**typed: tuple[object, type]) -> None:
    # pybind11 rejects wrong argument types with TypeError; the wrapper swallows it and prints.
    for name, (value, kind) in typed.items():
        if not isinstance(value, kind):
            raise TypeError(f"incompatible function arguments: {name}={value!r}")


def _stream_info(stream_id: int, device_index: int, device_type: int) -> StreamInfo:
    _check_types(stream_id=(stream_id, int), device_index=(device_index, int),
                 device_type=(device_type, int))  # fmt: skip
    return StreamInfo(stream_id, device_index, device_type)


class FakeMstxC:
    """The functions of ``torch_npu._C._mstx`` plus the state the C++ side keeps."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.collector: Optional[Collector] = None
        self._next_id = 1
        self._lock = threading.RLock()
        self._open: dict[int, Range] = {}
        self._stacks: dict[tuple[int, str], list[Range]] = {}

    def collect(
        self, include: Optional[Iterable[str]] = None, exclude: Optional[Iterable[str]] = None
    ) -> Collector:
        """Start a session; use as ``with c.collect(include=[...]) as col:``."""
        with self._lock:
            if self.collector is not None:
                raise RuntimeError("a collection session is already running")
            self.collector = Collector(self, list(include or []), list(exclude or []))
            return self.collector

    def _stop(self, collector: Collector) -> None:
        with self._lock:
            if self.collector is not collector:
                raise RuntimeError("this collection session is not running")
            collector.active = False
            self.collector = None
            self._open.clear()
            self._stacks.clear()

    def _log(self, call: tuple[Any, ...], domain: str) -> Optional[Collector]:
        """Log a call; return the collector that records it, if any."""
        self.calls.append(call)
        col = self.collector
        if col is None:
            return None
        col.calls.append(call)
        return col if col.records(domain) else None

    def _mark_impl(
        self, call: tuple[Any, ...], msg: str, stream: Optional[StreamInfo], domain: str
    ) -> None:
        _check_types(msg=(msg, str), domain=(domain, str))
        with self._lock:
            col = self._log(call, domain)
            if col is not None:
                tid = threading.get_native_id()
                col.marks.append(Mark(msg, domain, stream, tid, time.monotonic_ns()))

    def _start_impl(
        self, call: tuple[Any, ...], msg: str, stream: Optional[StreamInfo], domain: str
    ) -> int:
        _check_types(msg=(msg, str), domain=(domain, str))
        with self._lock:
            col = self._log(call, domain)
            if col is None:
                return 0
            range_id = self._next_id
            self._next_id += 1
            tid = threading.get_native_id()
            rng = Range(msg, domain, range_id, stream, tid, time.monotonic_ns())
            col.ranges.append(rng)
            self._open[range_id] = rng
            return range_id

    def _push_impl(
        self, call: tuple[Any, ...], msg: str, stream: Optional[StreamInfo], domain: str
    ) -> int:
        _check_types(msg=(msg, str), domain=(domain, str))
        with self._lock:
            col = self._log(call, domain)
            if col is None:
                return -1
            tid = threading.get_native_id()
            rng = Range(msg, domain, None, stream, tid, time.monotonic_ns())
            col.ranges.append(rng)
            stack = self._stacks.setdefault((tid, domain), [])
            stack.append(rng)
            return len(stack) - 1

    def _mark(
        self, msg: str, stream_id: int, device_index: int, device_type: int, domain: str
    ) -> None:
        stream = _stream_info(stream_id, device_index, device_type)
        self._mark_impl(
            ("mark", msg, stream_id, device_index, device_type, domain), msg, stream, domain
        )

    def _mark_on_host(self, msg: str, domain: str) -> None:
        self._mark_impl(("mark_on_host", msg, domain), msg, None, domain)

    def _range_start(
        self, msg: str, stream_id: int, device_index: int, device_type: int, domain: str
    ) -> int:
        stream = _stream_info(stream_id, device_index, device_type)
        call = ("range_start", msg, stream_id, device_index, device_type, domain)
        return self._start_impl(call, msg, stream, domain)

    def _range_start_on_host(self, msg: str, domain: str) -> int:
        return self._start_impl(("range_start_on_host", msg, domain), msg, None, domain)

    def _range_end(self, range_id: int, domain: str) -> None:
        _check_types(range_id=(range_id, int), domain=(domain, str))
        with self._lock:
            col = self._log(("range_end", range_id, domain), domain)
            if col is None or range_id == 0:
                return
            tid = threading.get_native_id()
            rng = self._open.pop(range_id, None)
            if rng is None:
                known = any(r.range_id == range_id for r in col.ranges)
                col.bad_ends.append(BadEnd(range_id, domain, "double" if known else "unknown", tid))
                return
            rng.end_tid, rng.end_ns = tid, time.monotonic_ns()
            if rng.domain != domain:
                col.bad_ends.append(BadEnd(range_id, domain, "domain_mismatch", tid))

    def _range_push(
        self, msg: str, stream_id: int, device_index: int, device_type: int, domain: str
    ) -> int:
        stream = _stream_info(stream_id, device_index, device_type)
        call = ("range_push", msg, stream_id, device_index, device_type, domain)
        return self._push_impl(call, msg, stream, domain)

    def _range_push_on_host(self, msg: str, domain: str) -> int:
        return self._push_impl(("range_push_on_host", msg, domain), msg, None, domain)

    def _range_pop(self, domain: str) -> int:
        _check_types(domain=(domain, str))
        with self._lock:
            col = self._log(("range_pop", domain), domain)
            if col is None:
                return -1
            tid = threading.get_native_id()
            stack = self._stacks.get((tid, domain))
            if not stack:
                col.bad_pops.append((domain, tid))
                return -1
            depth = len(stack) - 1
            rng = stack.pop()
            rng.end_tid, rng.end_ns = tid, time.monotonic_ns()
            return depth

    def as_module(self) -> types.ModuleType:
        mod = types.ModuleType("torch_npu._C._mstx")
        for name in ("_mark", "_mark_on_host", "_range_start", "_range_start_on_host",
                     "_range_end", "_range_push", "_range_push_on_host", "_range_pop"):  # fmt: skip
            setattr(mod, name, getattr(self, name))
        return mod


class FakeTorchNpu:
    """One fake ``torch_npu`` module tree over a :class:`FakeMstxC`, with switchable NPU presence.

    ``npu_available`` and ``device_count`` may be changed while installed.
    """

    def __init__(self, flavour: str, npu_available: bool = True) -> None:
        self.flavour = flavour
        self.npu_available = npu_available
        self.device_count = 1
        self.c = FakeMstxC()
        self.modules: dict[str, types.ModuleType] = {}
        self._installed = False
        root = self.package("torch_npu")
        self.package("torch_npu._C")
        self.add(self.c.as_module())
        npu = self.package("torch_npu.npu")
        streams = self.package("torch_npu.npu.streams")
        streams.Stream = npu.Stream = Stream  # type: ignore[attr-defined]
        streams.SyncLaunchStream = npu.SyncLaunchStream = SyncLaunchStream  # type: ignore[attr-defined]
        npu.is_available = lambda: self.npu_available  # type: ignore[attr-defined]
        npu.device_count = lambda: self.device_count if self.npu_available else 0  # type: ignore[attr-defined]
        npu.current_stream = self._current_stream  # type: ignore[attr-defined]
        self.torch_npu = root

    def _current_stream(self, device: Optional[int] = None) -> Stream:
        if not self.npu_available:
            raise RuntimeError("fake torch_npu: no NPU device")
        return Stream(0, device or 0)

    def package(self, name: str) -> types.ModuleType:
        mod = types.ModuleType(name)
        mod.__path__ = []  # type: ignore[attr-defined]
        return self.add(mod)

    def add(self, mod: types.ModuleType) -> types.ModuleType:
        """Register ``mod`` and bind it as an attribute of its parent, as an import would."""
        self.modules[mod.__name__] = mod
        if self._installed:
            sys.modules[mod.__name__] = mod
        parent, _, child = mod.__name__.rpartition(".")
        if parent:
            setattr(self.modules[parent], child, mod)
        return mod

    @property
    def mstx(self) -> Any:
        """``torch_npu.npu.mstx``: the class, as ``from .mstx import mstx`` leaves it."""
        return self.torch_npu.npu.mstx  # type: ignore[attr-defined]

    def collect(
        self, include: Optional[Iterable[str]] = None, exclude: Optional[Iterable[str]] = None
    ) -> Collector:
        return self.c.collect(include, exclude)

    @contextlib.contextmanager
    def installed(self) -> Iterator[FakeTorchNpu]:
        """Put the tree into ``sys.modules``; afterwards every ``torch_npu*`` entry is as before."""
        saved = {k: v for k, v in sys.modules.items() if _is_torch_npu(k)}
        for key in saved:
            del sys.modules[key]
        sys.modules.update(self.modules)
        self._installed = True
        try:
            yield self
        finally:
            self._installed = False
            for key in [k for k in sys.modules if _is_torch_npu(k)]:
                del sys.modules[key]
            sys.modules.update(saved)


def _is_torch_npu(name: str) -> bool:
    return name == "torch_npu" or name.startswith("torch_npu.")


# torch_npu's two log formats: utils._print_log and the profiler's print_*_msg.
_LOG_LINE = re.compile(
    r"^(?:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\(\d+\)-\[(?P<a>[A-Z]+)\] "
    r"|\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] \[(?P<b>[A-Z]+)\] \[\d+\] profiler\.py: )(?P<msg>.*)$"
)


@dataclass
class Captured:
    """What torch_npu code emitted: warnings as (category, text) and printed stdout lines."""

    warnings: list[tuple[type[Warning], str]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    @property
    def logs(self) -> list[tuple[str, str]]:
        """Printed lines as (level, message) without timestamp/pid; unparsed lines as ("", line)."""
        out = []
        for line in self.lines:
            m = _LOG_LINE.match(line)
            out.append((m["a"] or m["b"], m["msg"]) if m else ("", line))
        return out

    @property
    def silent(self) -> bool:
        return not self.warnings and not self.lines


# torch_npu silences its printed warnings on ranks other than 0 or when asked to; a check for
# "no warning" must not pass only because the test machine happens to set one of these.
_SILENCING_ENV = ("RANK", "TORCH_NPU_WARNING_DISABLE", "TORCH_NPU_DISABLED_WARNING")


@contextlib.contextmanager
def capture_output() -> Iterator[Captured]:
    """Record every warning (filters reset to "always") and every line printed to stdout."""
    captured = Captured()
    saved_env = {k: os.environ.pop(k) for k in _SILENCING_ENV if k in os.environ}
    out = io.StringIO()
    try:
        with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(out):
            warnings.simplefilter("always")
            yield captured
    finally:
        os.environ.update(saved_env)
        captured.warnings.extend((w.category, str(w.message)) for w in caught)
        captured.lines.extend(out.getvalue().splitlines())
