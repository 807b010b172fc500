"""Fault injection and state properties: flaky backends, the recorder against a model, forks
inside open ranges, and signal handlers that record while the main thread records.

Every loop is bounded and every subprocess has a timeout: a hang is a failure, not a stall.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
import threading
from typing import Any

import pytest
from conftest import caught
from hypothesis import given, settings
from hypothesis import strategies as st
from support.threads import run_threads

import mstx_marks
from mstx_marks import configure, instant, mark, mstx_range
from mstx_marks.backends.base import Backend, Emitter
from mstx_marks.backends.record import DrainCursor, Recorder


class Flaky(Backend):
    """Each call raises with probability ``p`` (seeded); counts what it saw."""

    name = "flaky"

    def __init__(self, p: float, seed: int) -> None:
        self.p, self.rng, self.lock = p, random.Random(seed), threading.Lock()
        self.started: set[int] = set()
        self.ended: list[int] = []
        self.next_id = 0

    def _fails(self) -> bool:
        with self.lock:
            return self.rng.random() < self.p

    def emitter(self, stream: object) -> Emitter:
        def start(name: str, domain: str) -> int:
            if self._fails():
                raise RuntimeError("injected start fault")
            with self.lock:
                self.next_id += 1
                self.started.add(self.next_id)
                return self.next_id

        def end(handle: int, domain: str) -> None:
            if self._fails():
                raise RuntimeError("injected end fault")
            with self.lock:
                self.ended.append(handle)

        def point(name: str, domain: str) -> None:
            if self._fails():
                raise RuntimeError("injected instant fault")

        return Emitter(self, start, end, point)

    def degrade(self) -> bool:
        return True  # stays in place: each retry meets more faults


def _later_always() -> None:
    from mstx_marks.core.routing import state

    state().health.clock = lambda: float("inf")  # every back-off has passed: retry at once


@settings(max_examples=25, deadline=None)
@given(p=st.floats(0.0, 0.6), seed=st.integers(0, 2**16), depth=st.integers(1, 4))
def test_a_flaky_device_never_reaches_the_workload_and_the_recorder_keeps_everything(
    p: float, seed: int, depth: int
) -> None:
    from support.isolation import fresh

    fresh()
    device = Flaky(p, seed)
    configure(backend=device, record=True)
    _later_always()
    rec = mstx_marks.default_recorder()
    inner = mstx_range("inner")(lambda x: x * 2)

    def nest(level: int, x: int) -> int:
        if level == 0:
            instant("leaf")
            return inner(x)
        with mark(f"level{level}"):
            return nest(level - 1, x) + 1

    def work(offset: int) -> None:
        for i in range(20):
            assert nest(depth, i + offset) == 2 * (i + offset) + depth

    with caught():
        run_threads(work, [(k * 100,) for k in range(3)])
    # the device ended only what it started, each at most once
    assert len(device.ended) == len(set(device.ended))
    assert set(device.ended) <= device.started
    # the recorder beside it lost nothing: every range and instant of the workload, closed
    records = rec.records()
    ranges = [r for r in records if r.kind == "range"]
    assert len(ranges) == 3 * 20 * (depth + 1) and not any(r.open for r in ranges)
    assert sum(1 for r in records if r.kind == "instant") == 3 * 20


_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("start"), st.sampled_from(["a", "b", "c"])),
        st.tuples(st.just("end"), st.integers(0, 30)),
        st.tuples(st.just("instant"), st.sampled_from(["i", "j"])),
        st.tuples(st.just("drain"), st.integers(1, 5)),
        st.tuples(st.just("clear"), st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(ops=_OPS)
def test_the_recorder_against_a_model(ops: list[tuple[str, Any]]) -> None:
    rec = Recorder(capacity=1000)
    cursor = DrainCursor()
    issued: list[int] = []  # every id handed out, stale ones included
    model: dict[int, list[Any]] = {}  # live id -> [name, ended]
    instants: list[str] = []
    drained: list[tuple[str, str]] = []
    for op, arg in ops:
        if op == "start":
            rid = rec.range_start(arg, "d")
            issued.append(rid)
            model[rid] = [arg, False]
        elif op == "end" and issued:
            rid = issued[arg % len(issued)]
            if rid in model and not model[rid][1]:
                model[rid][1] = True
                rec.range_end(rid, "d")
            elif rid not in model:
                rec.range_end(rid, "d")  # an id from before a clear: must change nothing
        elif op == "instant":
            rec.instant(arg, "d")
            instants.append(arg)
        elif op == "drain":
            drained += [(r.kind, r.name) for r in rec.drain(cursor, arg)]
        elif op == "clear":
            rec.clear()
            model.clear()
            instants.clear()
            drained.clear()
    drained += [(r.kind, r.name) for r in rec.drain(cursor)]
    ended = sorted(name for name, done in model.values() if done)
    assert sorted(n for k, n in drained if k == "range") == ended
    assert sorted(n for k, n in drained if k == "instant") == sorted(instants)
    still_open = sorted(name for name, done in model.values() if not done)
    assert sorted(r.name for r in rec.open_ranges(cursor)) == still_open
    everything = rec.records()
    assert sorted(r.name for r in everything if r.kind == "range" and r.open) == still_open
    assert len(everything) == len(model) + len(instants)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.parametrize("ends_inherited", [True, False])
def test_forking_inside_an_open_range_leaves_the_child_a_working_recorder(
    recorder: Recorder, ends_inherited: bool
) -> None:
    outer = mark("outer")
    outer.__enter__()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what its recorder holds, then leave at once
        try:
            if ends_inherited:
                outer.__exit__(None, None, None)  # the parent's range: ends nothing here
            with mark("child_work"):
                instant("child_tick")
            names = sorted(
                f"{r.kind}:{r.name}:{getattr(r, 'open', False)}" for r in recorder.records()
            )
            os.write(write, ",".join(names).encode())
        except BaseException as exc:
            os.write(write, repr(exc).encode())
        finally:
            os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    got = os.read(read, 10_000).decode()
    os.close(read)
    assert os.waitstatus_to_exitcode(status) == 0
    assert got == "instant:child_tick:False,range:child_work:False"
    outer.__exit__(None, None, None)
    assert [(r.name, r.open) for r in recorder.records()] == [("outer", False)]


_SIGNALS_WHILE_RECORDING = textwrap.dedent(
    """
    import signal, sys, time
    from mstx_marks import configure, default_recorder, mark, instant
    configure(backend="record")
    shared = mark("shared")
    handled = [0]

    def handler(num, frame):
        # new names take the recorder's lock; the shared Mark takes its re-entry lock
        with shared:
            with mark(f"in_handler_{handled[0] % 50}"):
                instant("tick")
        handled[0] += 1

    signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, 0.0005, 0.0005)
    deadline = time.monotonic() + 3
    i = 0
    while time.monotonic() < deadline and i < 200_000:
        with shared:
            with mark(f"main_{i % 5000}"):  # mostly new names: the lock is often held
                pass
        i += 1
    signal.setitimer(signal.ITIMER_REAL, 0, 0)
    recs = default_recorder().records()
    opened = sum(1 for r in recs if r.kind == "range" and r.open)
    print(handled[0], i, opened, len(recs))
    """
)


@pytest.mark.skipif(not hasattr(__import__("signal"), "setitimer"), reason="needs setitimer")
def test_signal_handlers_that_record_never_deadlock_the_recording_main_thread() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _SIGNALS_WHILE_RECORDING],
        capture_output=True,
        text=True,
        timeout=60,  # a deadlock would sit here
    )
    assert proc.returncode == 0, proc.stderr
    handled, loops, opened, total = map(int, proc.stdout.split())
    assert handled > 50 and loops > 100
    assert opened == 0  # every range, handler or main, ended exactly once
    assert total == 2 * loops + 3 * handled


# --- programmer input refused at definition, never at block exit -------------------------------


def test_a_class_is_refused_by_every_decorator_form() -> None:
    from mstx_marks import mark, mstx_range

    class Model:
        pass

    for decorate in (mstx_range, mstx_range("x"), mark("y")):
        with pytest.raises(TypeError, match="not the class"):
            decorate(Model)
    assert isinstance(Model, type)  # untouched


def test_timing_that_is_not_a_mapping_is_refused_before_the_block() -> None:
    from mstx_marks import mark

    with pytest.raises(TypeError, match="timing must be a dict"):
        mark("x", timing=[])  # type: ignore[call-overload]
    # the user's own exception passes through a valid timed block untouched
    timing: dict[str, float] = {}
    with pytest.raises(KeyError, match="mine"), mark("x", timing=timing):
        raise KeyError("mine")
    assert "x" in timing


# --- a spilled recording reuses what it drained ------------------------------------------------


def test_a_drained_recording_runs_for_ever_in_constant_memory() -> None:
    """Capacity 1e5, 2e6 ranges drained as they go (what the spill does): none dropped, at most
    capacity held; a range open across it all pins its chunk and still comes out once."""
    from mstx_marks.backends.record import DrainCursor, Recorder

    rec, cursor = Recorder(capacity=100_000), DrainCursor()
    long = rec.range_start("whole_job", "d")
    names: list[str] = []
    peak = 0
    for _ in range(40):
        for _ in range(50_000):
            rec.range_end(rec.range_start("step", "d"), "d")
        while batch := rec.drain(cursor, 4096, release=True):
            names += [r.name for r in batch]
        peak = max(peak, rec.held)
    rec.range_end(long, "d")
    names += [r.name for r in rec.drain(cursor, release=True)]
    assert rec.dropped == 0 and len(names) == 2_000_001
    assert names.count("whole_job") == 1
    assert peak <= 100_000 + 2 * 16_384  # capacity, plus the chunk being filled and the pinned one


def test_a_spill_that_falls_behind_drops_whole_chunks_and_counts_them() -> None:
    from mstx_marks.backends.record import DrainCursor, Recorder

    rec, cursor = Recorder(capacity=65_536), DrainCursor()
    rec.drain(cursor, release=True)  # a spill is attached
    for _ in range(300_000):  # far more than capacity before anything drains
        rec.range_end(rec.range_start("x", "d"), "d")
    drained = 0
    while batch := rec.drain(cursor, 4096, release=True):
        drained += len(batch)
    assert drained + rec.dropped == 300_000  # every range is either kept or counted
    assert rec.dropped > 0 and rec.held <= 65_536
    # Room again once drained: recording resumes at the next chunk (the chunk being dropped
    # when room came back stays dropped: slots are dropped a chunk at a time).
    dropped_before = rec.dropped
    for _ in range(40_000):
        rec.range_end(rec.range_start("y", "d"), "d")
    kept = [r.name for r in rec.drain(cursor, release=True)]
    assert set(kept) == {"y"} and len(kept) >= 40_000 - 16_384
    assert len(kept) + rec.dropped - dropped_before == 40_000
