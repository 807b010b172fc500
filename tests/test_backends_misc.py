"""The record, torch, nvtx and noop backends, and backend creation by name."""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import caught
from support.threads import run_threads

import mstx_marks
from mstx_marks import backends, configure, current_backend, instant, mark, mstx_range
from mstx_marks.backends import BackendUnavailable, NoopBackend
from mstx_marks.backends.record import Recorder
from mstx_marks.base.records import InstantRecord, RangeRecord

# --- record ------------------------------------------------------------------------------------


def test_record_fields(recorder: Recorder) -> None:
    main_tid = threading.get_native_id()
    with mark("outer", domain="verl"):
        instant("point")
        with mark("open_inside"):
            snapshot = recorder.records()
    outer, point, inner = recorder.records()
    assert (outer.name, outer.domain, outer.kind) == ("outer", "verl", "range")
    assert isinstance(point, InstantRecord) and not hasattr(point, "end_ns")
    assert (point.name, point.domain, point.kind) == ("point", "default", "instant")
    assert isinstance(outer, RangeRecord) and isinstance(inner, RangeRecord)
    assert outer.start_ns <= point.start_ns <= inner.start_ns <= inner.end_ns <= outer.end_ns
    assert not outer.open and not inner.open
    assert {r.thread for r in (outer, point, inner)} == {main_tid}
    assert {r.pid for r in (outer, point, inner)} == {os.getpid()}
    # Both still open at the snapshot: ended at the moment of reading and flagged.
    open_ones = [r for r in snapshot if isinstance(r, RangeRecord)]
    assert [r.open for r in open_ones] == [True, True]
    assert all(r.start_ns <= r.end_ns <= inner.end_ns for r in open_ones)


def test_record_is_thread_safe_with_exact_counts() -> None:
    for _ in range(5):  # fresh recorders: the first chunk is created under contention
        rec = Recorder()
        configure(backend=rec)
        n_threads, per_thread = 8, 300
        barrier = threading.Barrier(n_threads)
        tids: list[int] = []

        def work(
            i: int,
            tids: list[int] = tids,
            barrier: threading.Barrier = barrier,
            per_thread: int = 300,
        ) -> None:
            tids.append(threading.get_native_id())
            barrier.wait()
            for j in range(per_thread):
                with mark(f"t{i}", domain="verl"):
                    if j % 10 == 0:
                        instant("i")

        old = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)
        try:
            with caught() as w:
                run_threads(work, [(i,) for i in range(n_threads)])
        finally:
            sys.setswitchinterval(old)
        assert not w, [str(x.message) for x in w]
        records = rec.records()
        ranges = [r for r in records if r.kind == "range"]
        assert len(ranges) == n_threads * per_thread
        assert len([r for r in records if r.kind == "instant"]) == n_threads * per_thread // 10
        assert all(r.end_ns is not None for r in ranges)
        assert len(rec) == len(records) and rec.dropped == 0
        for i in range(n_threads):
            mine = [r for r in ranges if r.name == f"t{i}"]
            assert len(mine) == per_thread and len({r.thread for r in mine}) == 1
        assert {r.thread for r in ranges} == set(tids)


def test_record_direct_calls_from_many_threads_on_a_fresh_recorder() -> None:
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    errors: list[BaseException] = []
    try:
        for _ in range(20):
            rec = Recorder()
            barrier = threading.Barrier(8)

            def work(rec: Recorder = rec, barrier: threading.Barrier = barrier) -> None:
                barrier.wait()
                try:
                    for _ in range(50):
                        rec.range_end(rec.range_start("a", "d"), "d")
                except BaseException as exc:
                    errors.append(exc)

            run_threads(work, [() for _ in range(8)])
            assert len(rec) == 400
    finally:
        sys.setswitchinterval(old)
    assert not errors


def test_record_is_bounded_and_counts_dropped() -> None:
    rec = Recorder(capacity=5)
    configure(backend=rec)
    for i in range(8):
        with mark(f"r{i}"):
            pass
    instant("late")
    assert [r.name for r in rec.records()] == [f"r{i}" for i in range(5)]
    assert all(r.end_ns is not None for r in rec.records())
    assert rec.dropped == 4
    rec.clear()
    assert rec.records() == [] and rec.dropped == 0
    with mark("after_clear"):
        pass
    assert [r.name for r in rec.records()] == ["after_clear"]


def test_record_spans_chunks() -> None:
    rec = Recorder()
    n = (1 << 16) + 10
    for _ in range(n):
        rec.range_end(rec.range_start("x", "d"), "d")
    assert len(rec) == n and rec.records()[-1].end_ns is not None


@pytest.mark.parametrize("capacity", [0, -1, 1.5, "10"])
def test_record_capacity_must_be_a_positive_int(capacity: Any) -> None:
    with pytest.raises(ValueError, match=repr(capacity).replace(".", r"\.")):
        Recorder(capacity=capacity)


def test_default_recorder_capacity_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    from mstx_marks.backends import record

    monkeypatch.setattr(record, "_default", None)
    monkeypatch.setenv("MSTX_MARKS_RECORD_CAPACITY", "3")
    rec = mstx_marks.default_recorder()
    assert rec.capacity == 3 and mstx_marks.default_recorder() is rec
    configure(backend="record")
    assert current_backend() is rec


# --- noop and creation by name --------------------------------------------------------------------


def test_noop_backend_records_nothing_and_functions_still_run() -> None:
    emitter = NoopBackend().emitter("current")
    assert emitter.start("x", "default") == 0
    configure(backend="noop")

    @mstx_range("f")
    def f(x: int) -> int:
        return x * 5

    assert f(2) == 10
    assert not mstx_marks.is_active()
    assert mstx_marks.default_recorder().records() == []


def test_create_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    assert backends.create("noop").name == "noop"
    assert backends.create("record") is mstx_marks.default_recorder()
    assert set(backends.NAMES) == {"auto", "mstx", "nvtx", "torch", "record", "noop"}
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    with pytest.raises(BackendUnavailable, match="torch_npu"):
        backends.create("mstx")


# --- nvtx ----------------------------------------------------------------------------------------


def test_nvtx_backend_calls_torch_cuda_nvtx(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    import torch.cuda.nvtx as nvtx

    calls: list[tuple[Any, ...]] = []
    ids = iter(range(100, 200))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(nvtx, "range_start", lambda msg: calls.append(("start", msg)) or next(ids))
    monkeypatch.setattr(nvtx, "range_end", lambda rid: calls.append(("end", rid)))
    monkeypatch.setattr(nvtx, "mark", lambda msg: calls.append(("mark", msg)))
    configure(backend="nvtx")
    assert current_backend().name == "nvtx"
    with mark("outer", domain="verl", stream="current"), mark("inner"):
        instant("point", domain="verl")
    assert calls == [
        ("start", "outer"),
        ("start", "inner"),
        ("mark", "point"),
        ("end", 101),
        ("end", 100),
    ]


def test_nvtx_without_cuda_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(BackendUnavailable, match="CUDA"):
        backends.create("nvtx")


def test_nvtx_without_torch_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(BackendUnavailable, match="torch"):
        backends.create("nvtx")
    with caught() as w:
        configure(backend="torch")
    assert len(w) == 1 and current_backend().name == "noop"


# --- torch profiler -------------------------------------------------------------------------------


def _trace_events(path: Path) -> list[dict[str, Any]]:
    data = json.loads(path.read_text())
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if e.get("ph") == "X"]


def test_torch_backend_ranges_in_a_cpu_profiler_trace(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    configure(backend="torch")
    assert current_backend().name == "torch"

    @mstx_range("update_actor", domain="verl")
    def update() -> Any:
        with mark("forward_backward"):
            x = torch.ones(8, 8)
            return (x @ x).sum()

    with mark("before_profiler"):
        pass
    with profile(activities=[ProfilerActivity.CPU]) as prof, mark("step"):
        update()
        instant("synced")
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = {e["name"]: e for e in _trace_events(path)}
    assert {"step", "update_actor", "forward_backward"} <= set(events)
    assert "before_profiler" not in events

    def inside(child: dict[str, Any], parent: dict[str, Any]) -> bool:
        return bool(
            parent["ts"] <= child["ts"]
            and child["ts"] + child["dur"] <= parent["ts"] + parent["dur"]
        )

    assert inside(events["update_actor"], events["step"])
    assert inside(events["forward_backward"], events["update_actor"])
    assert not inside(events["step"], events["update_actor"])
    matmul = [e for e in _trace_events(path) if e["name"] in ("aten::mm", "aten::matmul")]
    assert matmul and all(inside(e, events["forward_backward"]) for e in matmul)


def test_torch_backend_without_profiler_records_nothing() -> None:
    torch = pytest.importorskip("torch")
    from mstx_marks.backends.reopen import WAITING
    from mstx_marks.backends.torch import TorchBackend

    backend = TorchBackend()
    assert backend.emitter(None).start("x", "default") == 0 and backend.reopens
    configure(backend=backend)
    before = WAITING.waiting()
    with mark("waits"):  # not recorded, so held for a profiler that may start (reopen.py)
        assert WAITING.waiting() == before + 1
    assert WAITING.waiting() == before
    configure(backend="torch")

    @mstx_range("f")
    async def f() -> int:
        return 3

    import asyncio

    with caught() as w:
        with mark("nobody_listens"):
            instant("nor_here")
        assert asyncio.run(f()) == 3
    assert not w
    assert current_backend().name == "torch"  # no fault happened
    assert not torch.autograd.profiler._is_profiler_enabled


# --- clear() with ranges open, and user arguments ----------------------------------------------


def test_clear_with_a_range_open_does_not_touch_what_took_its_slot() -> None:
    rec = Recorder(capacity=100)
    stale = rec.range_start("open_at_clear", "default")
    rec.clear()
    rec.instant("later_instant", "default")  # takes the slot the stale range had
    rec.range_end(stale, "default")  # the old range ends: nothing in this recording changes
    (only,) = rec.records()
    assert (only.kind, only.name) == ("instant", "later_instant")


def test_clear_of_the_default_recorder_keeps_the_backend(recorder: Recorder) -> None:
    m = mark("outer")
    m.__enter__()
    recorder.clear()
    with caught() as w:
        m.__exit__(None, None, None)
        with mark("after"):
            instant("point")
    assert not w and current_backend() is recorder  # no fault: the backend was not dropped
    assert [(r.name, r.kind) for r in recorder.records()] == [
        ("after", "range"),
        ("point", "instant"),
    ]


def test_ids_keep_counting_across_clears_and_forks_of_the_recording() -> None:
    rec = Recorder(capacity=10)
    first = rec.range_start("a", "d")
    rec.clear()
    second = rec.range_start("b", "d")
    assert second > first
    rec.range_end(second, "d")
    assert [(r.name, r.open) for r in rec.records()] == [("b", False)]


def test_args_are_kept_with_ranges_and_instants(recorder: Recorder) -> None:
    for n in (3, 5):
        with mark("generate", args={"tokens": n, "batch": 2}):
            instant("first_token", args={"at": n})
    with mark("plain"):
        pass
    got = [(r.name, r.kind, r.args) for r in recorder.records()]
    assert got == [
        ("generate", "range", {"tokens": 3, "batch": 2}),
        ("first_token", "instant", {"at": 3}),
        ("generate", "range", {"tokens": 5, "batch": 2}),
        ("first_token", "instant", {"at": 5}),
        ("plain", "range", None),
    ]


def test_args_beside_a_device_backend_and_the_device_sees_only_the_name() -> None:
    from conftest import Tape

    tape = Tape()
    configure(backend=tape, record=True)
    with mark("gen", args={"tokens": 4}):
        instant("tick", args={"i": 1})
    rec = mstx_marks.default_recorder()
    assert [(r.name, r.args) for r in rec.records()] == [("gen", {"tokens": 4}), ("tick", {"i": 1})]
    assert [r.name for r in tape.ranges.values()] == ["gen"]
    assert [m[0] for m in tape.marks] == ["tick"]


def test_args_must_be_a_mapping_at_definition() -> None:
    with pytest.raises(TypeError, match="args must be a mapping"):
        mark("x", args=[("tokens", 1)])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="args must be a mapping"):
        instant("x", args="tokens=1")  # type: ignore[arg-type]


def test_args_reach_the_spill_file_and_back(tmp_path: Path, recorder: Recorder) -> None:
    from mstx_marks.export.spill import Spill, read_spill

    with mark("gen", args={"tokens": 7, "obj": object()}):
        pass
    path = Spill(tmp_path, recorder, rank=0).write_now()
    (r,) = read_spill(path).records
    assert r.args is not None and r.args["tokens"] == 7 and r.args["obj"].startswith("<object")
