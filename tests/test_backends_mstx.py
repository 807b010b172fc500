"""The mstx backend over the fake C layer, through the torch_npu double AND the real 2.14.0 wrapper.

Each test runs for both flavours and for both ways the backend works: ``direct`` (C entry points)
and ``wrapper`` (the public ``torch_npu.npu.mstx`` class, what the backend degrades to). Whatever
the flavour, torch_npu's own code must neither warn nor print: the ``npu`` fixture fails the test
otherwise.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import types
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import caught
from support.fake_mstx_c import (
    NPU_DEVICE_TYPE,
    Captured,
    FakeTorchNpu,
    Stream,
    SyncLaunchStream,
    capture_output,
)
from support.real_torch_npu import FLAVOURS, install
from support.torch_npu_double import install_double

from mstx_marks import (
    backends,
    configure,
    current_backend,
    instant,
    is_active,
    mark,
    mstx_range,
    status,
)
from mstx_marks.backends.mstx import MstxBackend
from mstx_marks.core.configuration import state

MODES = ("direct", "wrapper")


class Npu:
    def __init__(self, env: FakeTorchNpu, cap: Captured) -> None:
        self.env = env
        self.cap = cap
        self.noisy = False  # set by tests that make torch_npu itself fail on purpose

    @property
    def c(self) -> Any:
        return self.env.c

    def use(self, mode: str) -> MstxBackend:
        backend = MstxBackend(wrapper_only=mode == "wrapper")
        configure(backend=backend)
        return backend


def _foreign(warns: list[Any]) -> list[str]:
    """Warnings that are not mstx_marks' own (they would come from torch_npu's wrapper)."""
    texts = [str(getattr(w, "message", w)) for w in warns]
    return [t for t in texts if not t.startswith("mstx_marks:")]


@pytest.fixture(params=FLAVOURS)
def npu(request: pytest.FixtureRequest) -> Iterator[Npu]:
    with install(request.param) as env, capture_output() as cap:
        holder = Npu(env, cap)
        yield holder
    if not holder.noisy:
        assert not _foreign([t for _, t in cap.warnings]), cap.warnings
        assert not cap.lines, cap.lines


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_host_ranges_pair_with_their_own_id_and_domain(npu: Npu, mode: str) -> None:
    npu.use(mode)

    @mstx_range("update_actor", domain="verl")
    def update() -> str:
        with mark("inner"):
            return "ok"

    with npu.env.collect() as col:
        assert update() == "ok"
    assert col.calls == [
        ("range_start_on_host", "update_actor", "verl"),
        ("range_start_on_host", "inner", "default"),
        ("range_end", 2, "default"),
        ("range_end", 1, "verl"),
    ]
    assert [(r.message, r.domain, r.range_id) for r in col.ranges] == [
        ("update_actor", "verl", 1),
        ("inner", "default", 2),
    ]
    col.assert_clean()


def test_id_zero_means_no_range_end(npu: Npu, mode: str) -> None:
    npu.use(mode)
    with mark("no_collector", domain="verl"):
        pass
    with npu.env.collect(include=["other"]) as col, mark("filtered", domain="verl"):
        pass
    assert npu.c.calls == [
        ("range_start_on_host", "no_collector", "verl"),
        ("range_start_on_host", "filtered", "verl"),
    ]
    assert not col.ranges


def test_instants_are_mstx_marks(npu: Npu, mode: str) -> None:
    npu.use(mode)
    with npu.env.collect() as col:
        instant("weights_synced", domain="verl")
        instant("on_stream", stream=Stream(4, 1))
    assert col.calls == [
        ("mark_on_host", "weights_synced", "verl"),
        ("mark", "on_stream", 4, 1, NPU_DEVICE_TYPE, "default"),
    ]
    assert [(m.message, m.domain) for m in col.marks] == [
        ("weights_synced", "verl"),
        ("on_stream", "default"),
    ]


def test_stream_object_is_passed_through(npu: Npu, mode: str) -> None:
    npu.use(mode)
    stream = Stream(7, 1)
    with npu.env.collect() as col, mark("on_device", domain="verl", stream=stream):
        pass
    assert col.calls == [
        ("range_start", "on_device", 7, 1, NPU_DEVICE_TYPE, "verl"),
        ("range_end", 1, "verl"),
    ]
    assert col.ranges[0].stream is not None and col.ranges[0].stream.stream_id == 7
    col.assert_clean()


def test_current_stream_is_resolved_at_each_range_start(npu: Npu, mode: str) -> None:
    current = [Stream(11, 0)]
    npu.env.torch_npu.npu.current_stream = lambda device=None: current[0]
    npu.use(mode)

    @mstx_range("step", stream="current")
    def step() -> None:
        instant("tick", stream="current")

    with npu.env.collect() as col:
        step()
        current[0] = Stream(12, 1)
        step()
        with mark("ctx", stream="current"):
            current[0] = Stream(13, 0)  # the range keeps the stream it started on
    starts = [c for c in col.calls if c[0] == "range_start"]
    assert [(c[2], c[3]) for c in starts] == [(11, 0), (12, 1), (12, 1)]
    assert [(c[2], c[3]) for c in col.calls if c[0] == "mark"] == [(11, 0), (12, 1)]
    col.assert_clean()


@pytest.mark.parametrize("bad", [SyncLaunchStream(3, 1), object()], ids=["sync launch", "object"])
def test_bad_stream_object_warns_once_and_is_host_only(npu: Npu, mode: str, bad: Any) -> None:
    with caught() as w, npu.env.collect() as col:
        backend = npu.use(mode)  # gates made by earlier tests get their emitter here
        for _ in range(3):
            with mark("r", stream=bad):
                instant("i", stream=bad)
    about = f"stream {bad!r} is not"
    ours = [str(x.message) for x in w if about in str(x.message)]
    assert len(ours) == 1 and ours[0].startswith("mstx_marks:")
    # a later degrade rebuilds every emitter: the same backend does not warn again
    with caught() as again:
        assert backend.degrade() == (mode == "direct")
        configure(enabled=False)
        configure(enabled=True)
        with mark("r", stream=bad):
            pass
    assert not [x for x in again if about in str(x.message)]
    assert not _foreign(w)
    assert {c[0] for c in col.calls} == {"range_start_on_host", "mark_on_host", "range_end"}
    assert len(col.ranges) == 3
    col.assert_clean()


def _later(seconds: float = 3600.0) -> None:
    """Move the fault clock past every back-off pending now."""
    health = state().health
    now = health.clock()
    health.clock = lambda: now + seconds


def test_failing_current_stream_sends_only_its_ranges_host_only_then_retries(
    npu: Npu, mode: str
) -> None:
    npu.env.npu_available = False  # current_stream() raises; forcing mstx still works
    npu.use(mode)

    @mstx_range("on_stream", stream="current")
    def work(x: int) -> int:
        return x + 1

    with caught() as w, npu.env.collect() as col:
        results = [work(i) for i in range(5)]
        with mark("host_after"):
            pass
    assert results == [1, 2, 3, 4, 5]
    texts = [str(x.message) for x in w]
    assert len(texts) == 1 and "host only" in texts[0] and "no NPU device" in texts[0]
    assert current_backend().name == "mstx" and is_active()  # host ranges were never affected
    # the range that met the fault is lost; the 4 after it went to the host
    assert [r.message for r in col.ranges] == ["on_stream"] * 4 + ["host_after"]
    assert {c[0] for c in col.calls} == {"range_start_on_host", "range_end"}
    col.assert_clean()
    assert status().faults == {"mstx stream: RuntimeError": 1}
    assert status().host_only_streams == ["'current'"]

    # the device comes back: once the back-off has passed, the stream is tried again
    npu.env.npu_available = True
    _later()
    with caught() as w2, npu.env.collect() as col2:
        assert [work(1), work(2), work(3)] == [2, 3, 4]
    assert not w2 and not status().host_only_streams
    # the first call made the retry and still ran host-only; the next ones are on the stream
    assert [c[0] for c in col2.calls] == ["range_start_on_host", "range_end"] + [
        "range_start",
        "range_end",
    ] * 2
    col2.assert_clean()


def test_a_persistently_failing_stream_is_retried_with_a_growing_back_off(npu: Npu) -> None:
    npu.env.npu_available = False
    npu.use("direct")
    work = mstx_range("on_stream", stream="current")(lambda: None)
    with caught() as w, npu.env.collect() as col:
        for _ in range(10):  # faults on odd calls; each even call retries (still host-only)
            work()
            _later()  # the back-off passes: the retry meets the fault again
    assert len(w) == 1  # the first fault warns; the others are counted
    assert status().faults == {"mstx stream: RuntimeError": 5}
    health = state().health
    assert health.delay(("stream", "current")) == 32.0  # 1, 2, 4, 8, 16 s were used
    assert [r.message for r in col.ranges] == ["on_stream"] * 5
    col.assert_clean()


def test_forcing_mstx_does_not_check_for_a_device(npu: Npu, mode: str) -> None:
    npu.env.npu_available = False
    npu.use(mode)
    assert current_backend().name == "mstx" and is_active()
    with npu.env.collect() as col, mark("x"):
        pass
    assert [r.message for r in col.ranges] == ["x"]
    col.assert_clean()


def test_forcing_mstx_by_name(npu: Npu) -> None:
    configure(backend="mstx")
    assert isinstance(current_backend(), MstxBackend)
    with npu.env.collect() as col, mark("named"):
        pass
    assert [r.message for r in col.ranges] == ["named"]


def test_a_c_hiccup_degrades_to_the_wrapper_and_the_c_path_comes_back(npu: Npu) -> None:
    c_module = npu.env.modules["torch_npu._C._mstx"]
    real_start = c_module._range_start_on_host
    failures = [TypeError("incompatible function arguments")]

    def flaky(msg: str, domain: str) -> int:
        if failures:
            raise failures.pop()
        return int(real_start(msg, domain))

    c_module._range_start_on_host = flaky
    backend = npu.use("direct")

    def body(x: int) -> int:
        with mark("r", domain="verl"):
            return x * 2

    with caught() as w, npu.env.collect() as col:
        first = body(1)
        second = body(2)
    assert (first, second) == (2, 4)
    assert len(w) == 1 and "safer path" in str(w[0].message)
    assert current_backend() is backend and backend._c is None
    assert col.calls == [("range_start_on_host", "r", "verl"), ("range_end", 1, "verl")]
    col.assert_clean()
    assert status().retry_in_s is not None and status().faults == {"mstx call: TypeError": 1}

    _later()  # after the back-off the C path is tried again, and it works now
    with caught() as w2, npu.env.collect() as col2:
        assert [body(i) for i in range(3)] == [0, 2, 4]
    assert not w2 and backend._c is c_module and status().retry_in_s is None
    assert len(col2.ranges) == 3
    col2.assert_clean()


def test_c_layer_and_wrapper_both_failing_rest_then_only_the_c_path_is_retried(
    npu: Npu,
) -> None:
    npu.noisy = True  # torch_npu's wrapper prints its [ERROR] line: counted below
    c_module = npu.env.modules["torch_npu._C._mstx"]

    def broken(*args: Any, **kwargs: Any) -> int:
        raise RuntimeError("C layer broke")

    for entry in ("_range_start_on_host", "_mark_on_host"):
        setattr(c_module, entry, broken)
    npu.use("direct")

    def step(x: int) -> int:
        with mark("r"):
            instant("i")
            return x

    with caught() as w:
        results = [step(i) for i in range(1000)]
        for _ in range(20):  # many back-offs pass, each retry meets the broken C layer
            _later()
            step(0)
    assert results == list(range(1000))
    texts = [str(x.message) for x in w]
    assert len(texts) == 2 and "safer path" in texts[0] and "not recorded for" in texts[1]
    assert current_backend().name == "noop" and not is_active()
    # torch_npu's wrapper ran once; its [ERROR] lines stay a handful however long the job runs
    assert len(npu.cap.lines) <= 2, npu.cap.lines
    faults = status().faults
    assert faults.get("mstx call: RuntimeError", 0) >= 20


def test_configure_backend_always_rearms_it(npu: Npu) -> None:
    npu.env.npu_available = False
    npu.use("direct")
    stream_work = mstx_range("s", stream="current")(lambda: None)
    with caught():
        stream_work()
    assert status().host_only_streams
    npu.env.npu_available = True
    configure(backend="mstx")  # the same backend asked for again: faults and back-offs forgotten
    assert not status().host_only_streams and status().retry_in_s is None
    with npu.env.collect() as col:
        stream_work()
    assert [c[0] for c in col.calls] == ["range_start", "range_end"]


def test_many_threads_and_tasks_reusing_one_mark(npu: Npu, mode: str) -> None:
    npu.use(mode)
    m = mark("shared", domain="verl")

    def thread_work() -> None:
        for _ in range(20):
            with m, m:
                pass

    async def task(i: int) -> None:
        with m:
            for _ in range(i % 3 + 1):
                await asyncio.sleep(0)

    async def tasks() -> None:
        await asyncio.gather(*(task(i) for i in range(10)))

    with npu.env.collect() as col:
        threads = [threading.Thread(target=thread_work) for _ in range(4)]
        for t in threads:
            t.start()
        asyncio.run(tasks())
        for t in threads:
            t.join()
    assert len(col.ranges) == 4 * 20 * 2 + 10
    assert {r.domain for r in col.ranges} == {"verl"}
    ends = [c for c in col.calls if c[0] == "range_end"]
    assert sorted(c[1] for c in ends) == sorted(r.range_id for r in col.ranges)
    col.assert_clean()


def test_user_exception_ends_the_range_once(npu: Npu, mode: str) -> None:
    npu.use(mode)
    err = ValueError("mine")

    @mstx_range("fails")
    def fails() -> None:
        raise err

    with npu.env.collect() as col, pytest.raises(ValueError) as info:
        fails()
    assert info.value is err
    assert [c[0] for c in col.calls] == ["range_start_on_host", "range_end"]
    col.assert_clean()


# --- auto-detection -------------------------------------------------------------------------------


def _torch_npu_imports() -> bool:
    try:
        import torch_npu  # type: ignore[import-not-found]  # noqa: F401
    except Exception:
        return False
    return True


@pytest.mark.skipif(_torch_npu_imports(), reason="a real torch_npu imports here")
def test_auto_is_noop_when_torch_npu_does_not_import() -> None:
    assert current_backend().name == "noop"
    assert backends.detect() is backends.detect()
    with mark("x"):
        pass
    assert not is_active()


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA "available" and the `nvtx` pip package importable, as on a CUDA box."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "nvtx", types.ModuleType("nvtx"))


def test_auto_prefers_mstx_on_an_npu_host_even_with_nvtx_and_cuda(fake_cuda: None) -> None:
    # caught(): gates with bad stream objects from earlier tests warn for the new backend
    with caught(), install_double(npu_available=True) as env, env.collect() as col:
        assert current_backend().name == "mstx"
        with mark("auto"):
            pass
    assert [r.message for r in col.ranges] == ["auto"]


def test_auto_picks_nvtx_when_torch_npu_sees_no_npu_but_cuda_is_there(fake_cuda: None) -> None:
    with install_double(npu_available=False):
        assert backends.detect().name == "nvtx"


def test_auto_is_noop_when_torch_npu_sees_no_npu_and_no_cuda(monkeypatch: Any) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with install_double(npu_available=False):
        assert current_backend().name == "noop"


def test_auto_detection_runs_once(monkeypatch: pytest.MonkeyPatch) -> None:
    with caught(), install_double(npu_available=True) as env:  # caught(): as above
        calls = []
        available = env.torch_npu.npu.is_available
        env.torch_npu.npu.is_available = lambda: calls.append(1) or available()
        first = backends.detect()
        env.npu_available = False
        assert backends.detect() is first and first.name == "mstx"
        configure(backend="auto")
        assert current_backend() is first
    assert calls == [1]


def test_auto_never_raises_on_a_broken_torch_npu(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = types.ModuleType("torch_npu")  # imports, but has no `npu`
    monkeypatch.setitem(sys.modules, "torch_npu", broken)
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with caught() as w:
        assert current_backend().name == "noop"
    assert not w


def test_is_available_raising_counts_as_no_device() -> None:
    with install_double(npu_available=True) as env:

        def boom() -> bool:
            raise RuntimeError("driver")

        env.torch_npu.npu.is_available = boom
        assert MstxBackend().device_present() is False


def test_equal_stream_objects_share_one_gate(npu: Npu, mode: str) -> None:
    # torch_npu's current_stream() returns a new, equal Stream object on every call.
    from mstx_marks.core.process import PROCESS

    npu.use(mode)
    with npu.env.collect() as col:
        for _ in range(50):
            with mark("per_call_stream", stream=Stream(2, 0)):
                pass
    assert sum(g.stream == Stream(2, 0) for g in PROCESS.gates.values()) == 1
    assert [r.stream.stream_id for r in col.ranges if r.stream] == [2] * 50
    col.assert_clean()
