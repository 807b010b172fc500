"""Fault injection and state properties: flaky backends, the recorder against a model, forks
inside open ranges, and signal handlers that record while the main thread records.

Every loop is bounded and every subprocess has a timeout: a hang is a failure, not a stall.
"""

from __future__ import annotations

import functools
import os
import random
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
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
    from mstx_marks.core.configuration import state

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


@pytest.mark.parametrize("made", ["new", "cleared"])
def test_a_handler_that_records_during_the_first_chunks_allocation_needs_no_chunk_of_its_own(
    monkeypatch: pytest.MonkeyPatch, made: str
) -> None:
    """A signal handler that records, run as the recorder allocates chunk memory (right after
    one of the allocation's calls returns, where CPython runs handlers), finds its chunk there:
    the first range's grow takes a chunk made ahead, in a new recorder and in a cleared one.
    Without it each handler grew the same chunk, was interrupted by the next signal, and so
    on: a 0.5 ms timer on CI's loaded machine nested to the recursion limit. (A stand-in for
    the signal: the allocation calls the handler's range itself.)"""
    from mstx_marks.backends import record

    rec = record.Recorder()
    if made == "cleared":
        rec.range_end(rec.range_start("before", "d"), "d")
        rec.clear()
    real = record._new_chunk
    nested: list[int] = []

    def allocating() -> Any:
        nested.append(1)
        if len(nested) < 50:  # a handler per allocation, as a timer faster than it would be
            rec.range_end(rec.range_start(f"in_handler_{len(nested)}", "d"), "d")
        return real()

    monkeypatch.setattr(record, "_new_chunk", allocating)
    rec.range_end(rec.range_start("main", "d"), "d")
    assert len(nested) == 1, len(nested)  # one allocation (the next spare), one handler
    assert sorted(r.name for r in rec.records()) == ["in_handler_1", "main"]


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
        def forward(self) -> int:
            return 1

    before = dict(vars(Model))
    for decorate in (mstx_range, mstx_range("x"), mark("y")):
        with pytest.raises(TypeError, match="not the class"):
            decorate(Model)
        # Refused before touching it: no attribute set, no method wrapped.
        assert dict(vars(Model)) == before
    assert Model().forward() == 1


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
    """Capacity 5e4, 1e6 ranges drained as they go (what the spill does), twenty times the
    capacity: none dropped, at most capacity held; a range open across it all pins its chunk and
    still comes out once."""
    from mstx_marks.backends.record import DrainCursor, Recorder

    capacity = 50_000
    rec, cursor = Recorder(capacity=capacity), DrainCursor()
    long = rec.range_start("whole_job", "d")
    names: list[str] = []
    peak = 0
    for _ in range(40):
        for _ in range(capacity // 2):
            rec.range_end(rec.range_start("step", "d"), "d")
        while batch := rec.drain(cursor, 4096, release=True):
            names += [r.name for r in batch]
        peak = max(peak, rec.held)
    rec.range_end(long, "d")
    names += [r.name for r in rec.drain(cursor, release=True)]
    assert rec.dropped == 0 and len(names) == 40 * capacity // 2 + 1
    assert names.count("whole_job") == 1
    assert peak <= capacity + 2 * 16_384  # capacity, plus the chunk being filled and the pinned one


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


# --- hostile conditions: nothing lost, nothing mixed, nothing hangs -----------------------------
# Each test holds one item of the attack (its number in the issue); the subprocess ones have
# timeouts far above their run time on a loaded 2-core machine: a hang fails, it never stalls.

_PY = [sys.executable, "-c"]


def _run(
    code: str, *args: str, timeout: float = 120, **kw: Any
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_PY, textwrap.dedent(code), *args], capture_output=True, text=True, timeout=timeout, **kw
    )


def test_1_a_spilled_recording_past_its_capacity_loses_nothing(tmp_path: Any) -> None:
    """Capacity 5e4, 1e5 events: spilled slots are reused, and the exports (made from the
    spill) hold all of them."""
    from mstx_marks.export import flush_at_exit, read_ascend_db, read_chrome_trace
    from mstx_marks.export.spill import read_spill

    capacity = 50_000
    rec = Recorder(capacity=capacity)
    flush = flush_at_exit(tmp_path, rank=0, recorder=rec, signals=(), interval=None)
    target = flush.func.__self__  # type: ignore[attr-defined]
    for i in range(2 * capacity):
        rec.range_end(rec.range_start("step" if i == 0 else "x", "d"), "d")
        if i % (capacity // 5) == 0:
            target.spill.write_now()  # what the periodic spill does
    chrome, db = flush()
    assert rec.dropped == 0 and rec.held <= capacity + 16_384
    (spill,) = (tmp_path / "spill").iterdir()
    assert len(read_spill(spill).records) == 2 * capacity
    assert len(read_chrome_trace(chrome)[0].records) == 2 * capacity
    assert len(read_ascend_db(db).records) == 2 * capacity


def test_1_a_spill_that_falls_behind_warns_once_and_every_export_marks_the_drop(
    tmp_path: Any,
) -> None:
    from mstx_marks.analysis.summary import summarize_path
    from mstx_marks.export import flush_at_exit, read_ascend_db, read_chrome_trace
    from mstx_marks.export.spill import read_spill

    rec = Recorder(capacity=1000)
    flush = flush_at_exit(tmp_path, rank=0, recorder=rec, signals=(), interval=None)
    rec.wake_reader = None  # a writer that is not woken at half full: it falls behind
    with caught() as w:
        for _ in range(5000):
            rec.range_end(rec.range_start("step", "d"), "d")
        chrome, db = flush()
        flush()
    assert rec.dropped == 4000
    said = [x for x in w if "dropped" in str(x.message)]
    assert len(said) == 1, [str(x.message) for x in w]
    (spill,) = (tmp_path / "spill").iterdir()
    assert read_spill(spill).dropped == 4000
    assert read_chrome_trace(chrome)[0].dropped == 4000
    assert read_ascend_db(db).dropped == 4000
    summary = summarize_path(tmp_path, jobs=1, progress=False)
    assert any("dropped 4000 events" in n for n in summary.notes), summary.notes


_SIGNAL_AT_EXIT_FLUSH = """
import os, signal, sys
from mstx_marks.backends.record import Recorder
from mstx_marks.export import flush_at_exit

class SignalledAtExit(Recorder):
    sent = False

    def open_ranges(self, cursor):  # inside the exit flush's final spill, under its lock
        if not self.sent:
            self.sent = True
            os.kill(os.getpid(), int(sys.argv[2]))
        return super().open_ranges(cursor)

rec = SignalledAtExit()
for _ in range(3):
    rec.range_end(rec.range_start("update_actor", "default"), "default")
flush_at_exit(sys.argv[1], rank=0, recorder=rec)
print("leaving", flush=True)
"""


@pytest.mark.parametrize("signum", [2, 15])  # SIGINT (Ctrl-C), SIGTERM
def test_2_a_signal_during_the_exit_flush_is_handled_after_it(tmp_path: Any, signum: int) -> None:
    from mstx_marks.export import read_ascend_db

    try:
        proc = _run(_SIGNAL_AT_EXIT_FLUSH, str(tmp_path), str(signum), timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail("the exit flush deadlocked on a signal")
    if signum == 15:
        assert proc.returncode == -15, proc.stderr
    else:  # Ctrl-C: KeyboardInterrupt once the flush is done
        assert "KeyboardInterrupt" in proc.stderr or proc.returncode == -2, proc.stderr
    (db,) = tmp_path.glob("ascend/*/ASCEND_PROFILER_OUTPUT/ascend_pytorch_profiler_0.db")
    assert [r.name for r in read_ascend_db(db).ranges] == ["update_actor"] * 3


def test_3_args_json_cannot_hold_lose_nothing(tmp_path: Any) -> None:
    from mstx_marks.export import flush_at_exit, read_ascend_db, read_chrome_trace
    from mstx_marks.export.spill import read_spill

    class NoStr:
        def __str__(self) -> str:
            raise RuntimeError("no str")

    circular: dict[str, Any] = {}
    circular["self"] = circular
    rec = Recorder()
    flush = flush_at_exit(tmp_path, rank=0, recorder=rec, signals=(), interval=None)
    for bad in ({("a", 1): 1}, {"c": circular}, {"s": NoStr()}, {"n": float("nan")}):
        rec.set_args(rec.range_start("odd", "d"), bad)
    for _ in range(10_000):
        rec.range_end(rec.range_start("x", "d"), "d")
    for rid in range(1, 5):
        rec.range_end(rid, "d")
    chrome, db = flush()
    (spill,) = (tmp_path / "spill").iterdir()
    for records in (read_spill(spill).records, read_chrome_trace(chrome)[0].records):
        assert len(records) == 10_004
        odd = sorted(str(r.args) for r in records if r.name == "odd")
        assert "{\"('a', 1)\": 1}" in odd and "{'s': '<unprintable NoStr>'}" in odd, odd
    assert len(read_ascend_db(db).records) == 10_004


_SIGNALLED_MID_CLOSE = """
import os, signal, sys
from mstx_marks.backends.record import default_recorder
from mstx_marks.export import out, spill

session = out.record_to(sys.argv[1], interval=None)  # what MSTX_MARKS_OUT does, no period
rec = default_recorder()
for _ in range(int(sys.argv[3])):
    rec.range_end(rec.range_start("x", "d"), "d")

real_append, sent = spill.Spill._append, []

def append(self, *args, **kw):  # the first batch of the exit's final spill
    if not sent:
        sent.append(1)
        os.kill(os.getpid(), int(sys.argv[2]))
    return real_append(self, *args, **kw)

spill.Spill._append = append
print("leaving", flush=True)
"""


@pytest.mark.parametrize("signum", [15, 2])
def test_5_a_signal_right_at_exit_keeps_everything(tmp_path: Any, signum: int) -> None:
    """The signal comes in the first of the exit's final spill's batches (8,192 events each):
    the other five batches, and the exports, are still written."""
    from mstx_marks.export.spill import read_spill

    n = 50_000
    proc = _run(_SIGNALLED_MID_CLOSE, str(tmp_path), str(signum), str(n), timeout=300)
    assert proc.returncode in (-signum, 1, 0), proc.stderr
    (spill,) = (tmp_path / "spill").glob("*.jsonl")
    trace = read_spill(spill)
    assert len(trace.records) == n and trace.complete
    if signum == 15:
        assert proc.returncode == -15
        assert list(tmp_path.glob("ascend/*/ASCEND_PROFILER_OUTPUT/*.db"))  # exports finished


def test_6_a_full_disk_leaves_whole_lines_and_a_torn_line_anywhere_is_skipped(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from mstx_marks.export import spill as spill_module

    rec = Recorder()
    sp = spill_module.Spill(tmp_path, rec, rank=0)
    for _ in range(100):
        rec.range_end(rec.range_start("a", "d"), "d")
    sp.write_now()
    real_write, calls = os.write, []

    def short_then_full(fd: int, data: bytes) -> int:
        calls.append(1)
        if len(calls) == 1:
            return real_write(fd, data[: len(data) // 2])  # a short count...
        raise OSError(errno.ENOSPC, "No space left on device")  # ...then the disk is full

    monkeypatch.setattr(spill_module.os, "write", short_then_full)
    for _ in range(100):
        rec.range_end(rec.range_start("b", "d"), "d")
    with pytest.raises(OSError):
        sp.write_now()
    monkeypatch.setattr(spill_module.os, "write", real_write)  # space again
    for _ in range(100):
        rec.range_end(rec.range_start("c", "d"), "d")
    sp.write_now(final=True)
    trace = spill_module.read_spill(sp.path)
    assert trace.skipped == 0
    assert [r.name for r in trace.records] == ["a"] * 100 + ["b"] * 100 + ["c"] * 100
    # A torn line in the middle (another writer's crash, a copy cut short): skipped, counted.
    # Events are written a block (of columns) per line: a torn block loses that block only.
    lines = sp.path.read_bytes().split(b"\n")
    blocks = [i for i, line in enumerate(lines) if line.startswith(b'["c",100,')]
    assert len(blocks) == 3
    lines[blocks[1]] = lines[blocks[1]][:300]
    torn = tmp_path / "spill" / "torn.jsonl"
    torn.write_bytes(b"\n".join(lines))
    trace = spill_module.read_spill(torn)
    assert trace.skipped == 1
    assert [r.name for r in trace.records] == ["a"] * 100 + ["c"] * 100


def test_7_two_processes_with_one_host_and_pid_are_both_kept(tmp_path: Any) -> None:
    import socket

    from mstx_marks.analysis.summary import summarize_path
    from mstx_marks.export import ascend_db_path, export_rank
    from mstx_marks.export.spill import Spill, read_spill

    host, pid = socket.gethostname(), os.getpid()
    for names in (["gen", "gen"], ["update_actor"] * 3):  # two containers, one pid
        rec = Recorder()
        for n in names:
            rec.range_end(rec.range_start(n, "default"), "default")
        sp = Spill(tmp_path, rec, rank=0)
        sp.write_now(final=True)
        db = ascend_db_path(tmp_path / "ascend", 0, worker=f"{host}_{pid}")
        export_rank(tmp_path, read_spill(sp.path), db, process=f"{host}-{pid}")
    assert len(list((tmp_path / "spill").iterdir())) == 2
    summary = summarize_path(tmp_path, jobs=1, progress=False)
    counts = {p.name: p.overall.count for p in summary.phases}
    assert counts == {"generate_sequences": 2, "update_actor": 3}, counts


_FORKS = """
import os, sys, time, multiprocessing
from mstx_marks.backends.record import default_recorder
from mstx_marks.export import flush_at_exit

flush = flush_at_exit(sys.argv[1], rank=0)
rec = default_recorder()
for _ in range(100):
    rec.range_end(rec.range_start("step", "default"), "default")
flush()
if sys.argv[2] == "fork":
    pid = os.fork()
    if pid == 0:  # the child records its own and leaves normally: its exit flush runs
        rec.range_end(rec.range_start("child_step", "default"), "default")
        sys.exit(0)
    os.waitpid(pid, 0)
else:  # a multiprocessing fork child, terminated; then the parent leaves with os._exit
    def work():
        rec.range_end(rec.range_start("child_step", "default"), "default")
        print("child ready", flush=True)
        time.sleep(60)

    child = multiprocessing.get_context("fork").Process(target=work)
    child.start()
    time.sleep(1.0)
    child.terminate()
    child.join()
    os._exit(0)
"""


@pytest.mark.parametrize("how", ["fork", "multiprocessing"])
def test_8_a_forked_child_neither_counts_nor_spoils_its_parents_ranges(
    tmp_path: Any, how: str
) -> None:
    from mstx_marks.analysis.summary import load_traces, summarize_path

    proc = _run(_FORKS, str(tmp_path), how)
    assert proc.returncode == 0, proc.stderr
    summary = summarize_path(tmp_path, jobs=1, progress=False)
    assert summary.errors == []
    counts = {p.name: p.overall.count for p in summary.phases}
    assert counts.get("step") == 100, counts
    assert counts.get("child_step") == 1, counts
    traces, errors, _ = load_traces(tmp_path)
    assert errors == [] and sum(r.name == "step" for t in traces for r in t.records) == 100


_ONE_RUN = """
import sys
from mstx_marks import mark
from mstx_marks.export import flush_at_exit
flush_at_exit(sys.argv[1])
for _ in range(3):
    with mark("step"):
        pass
"""


def test_9_runs_into_one_folder_are_kept_apart_and_the_newest_is_read(tmp_path: Any) -> None:
    from mstx_marks.analysis.summary import summarize_path

    env = {k: v for k, v in os.environ.items() if not k.startswith("MSTX_MARKS_")}
    for _ in range(3):
        assert _run(_ONE_RUN, str(tmp_path / "out"), env=env).returncode == 0
    summary = summarize_path(tmp_path / "out", jobs=1, progress=False)
    (step,) = [p for p in summary.phases if p.name == "step"]
    assert step.overall.count == 3
    assert any("3 runs are here; reading the newest" in n for n in summary.notes), summary.notes
    every = summarize_path(tmp_path / "out", jobs=1, progress=False, run="all")
    assert [p.overall.count for p in every.phases if p.name == "step"] == [9]


_KILLED_FLUSHING = """
import sys, time
from mstx_marks.backends.record import default_recorder
from mstx_marks.export import flush_at_exit
flush_at_exit(sys.argv[1], rank=0, interval=0.2)
rec = default_recorder()
for _ in range(100):
    rec.range_end(rec.range_start("step", "default"), "default")
print("ready", flush=True)
time.sleep(60)
"""


def test_4_a_spill_of_ten_times_the_ranges_takes_no_more_memory(tmp_path: Any) -> None:
    """What keeps the spill ahead of 3e5 ranges a second: it copies the recorder's columns
    instead of making an object per event (its CPU time against the recording's is
    benchmarks/spill_cost.py's). What holds on any machine: Python's allocations while it
    writes ten times the ranges stay the same (a block at a time), and it writes every one."""
    import tracemalloc

    from mstx_marks.export.spill import Spill, read_spill

    peaks = []
    for n in (20_000, 200_000):
        rec = Recorder(capacity=1 << 20)
        spill = Spill(tmp_path / str(n), rec, rank=0)
        for _ in range(n):
            rec.range_end(rec.range_start("x", "d"), "d")
        tracemalloc.start()
        try:
            spill.write_now()
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        assert len(read_spill(spill.path).ranges) == n
    assert peaks[1] < 2 * peaks[0], peaks  # ~0.7 MB each: a JSON object per event held was 10x


_PACED = """
import sys, time
from mstx_marks import mark
rate, burst = float(sys.argv[1]), 1000
m = mark("step_part")
print("ready", flush=True)
t0 = time.perf_counter()
done = 0
while True:
    for _ in range(burst):
        with m:
            pass
    done += burst
    ahead = done / rate - (time.perf_counter() - t0)
    if ahead > 0:
        time.sleep(ahead)
"""


def test_4_sigkill_at_3e5_ranges_a_second_loses_under_a_second(tmp_path: Any) -> None:
    """The issue's goal, as benchmarks/spill_loss.py measures it (0.17-0.32 s here; 1.5-1.8 s
    before blocks): the time between the kill and the end of the last range on disk."""
    import signal
    import time

    from mstx_marks.export.spill import read_spill

    env = {**os.environ, "MSTX_MARKS_OUT": str(tmp_path)}
    proc = subprocess.Popen([*_PY, _PACED, "3e5"], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        time.sleep(3.0)
    finally:
        killed = time.time_ns()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    ends = [r.end_ns for p in tmp_path.glob("spill/*.jsonl") for r in read_spill(p).ranges]
    assert len(ends) > 100_000  # it recorded, and spilled, for most of the time
    assert (killed - max(ends)) / 1e9 <= 1.0


def test_10_flush_at_exit_spills_periodically_so_sigkill_keeps_the_ranges(tmp_path: Any) -> None:
    import signal
    import time

    from mstx_marks.export.spill import read_spill

    proc = subprocess.Popen(
        [*_PY, _KILLED_FLUSHING, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        deadline = time.monotonic() + 30  # the spill comes within 0.2 s; 30 s is the margin
        while time.monotonic() < deadline and not list(tmp_path.glob("spill/*.jsonl")):
            time.sleep(0.1)
        time.sleep(1.0)  # let the interval pass again, loaded box or not
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    (spill,) = tmp_path.glob("spill/*.jsonl")
    assert len(read_spill(spill).ranges) == 100


def test_11_args_are_kept_when_the_database_copy_wins(tmp_path: Any) -> None:
    from mstx_marks.analysis.summary import load_traces
    from mstx_marks.base.records import RangeRecord
    from mstx_marks.export import RankTrace, export_rank

    r = RangeRecord("gen", "default", 2 * 10**18, 2 * 10**18 + 10, 1, 7, args={"tokens": 8})
    export_rank(tmp_path, RankTrace(0, [r]))
    (trace,), errors, _ = load_traces(tmp_path)
    assert errors == [] and trace.source is not None and trace.source.suffix == ".db"
    assert trace.records[0].args == {"tokens": 8}


def test_12_a_planted_link_is_never_followed_and_a_foreign_folder_is_refused(
    tmp_path: Any,
) -> None:
    from mstx_marks.export.files import UnsafeOutput
    from mstx_marks.export.spill import Spill, spill_path

    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / "out" / "spill").mkdir(parents=True)
    spill_path(tmp_path / "out").symlink_to(victim)  # planted at the predictable name
    rec = Recorder()
    rec.range_end(rec.range_start("x", "d"), "d")
    written = Spill(tmp_path / "out", rec, rank=0).write_now()
    assert victim.read_text() == "precious\n"
    assert not written.is_symlink() and written.stat().st_size > 0
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # root can make a folder someone else's
        foreign = tmp_path / "shared" / "spill"
        foreign.mkdir(parents=True)
        os.chown(foreign, 54321, 54321)
        foreign.chmod(0o777)
        with pytest.raises(UnsafeOutput, match="belongs to another user"):
            Spill(tmp_path / "shared", rec, rank=0).write_now(final=True)


def test_13_a_fifo_among_the_traces_hangs_nothing(tmp_path: Any) -> None:
    from mstx_marks.base.records import RangeRecord
    from mstx_marks.export import RankTrace, export_rank

    r = RangeRecord("step", "default", 2 * 10**18, 2 * 10**18 + 10, 1, 7)
    export_rank(tmp_path, RankTrace(0, [r]))
    (tmp_path / "spill").mkdir()
    os.mkfifo(tmp_path / "spill" / "h-1.jsonl")
    os.mkfifo(tmp_path / "chrome" / "rank9.trace.json")
    for args in ([], ["--html", str(tmp_path / "r.html")]):
        try:
            proc = _run(
                "import sys; from mstx_marks.cli.main import main; sys.exit(main(sys.argv[1:]))",
                "summary", str(tmp_path), *args, timeout=120,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            pytest.fail("a FIFO hung the summary")
        assert proc.returncode == 0 and "step" in proc.stdout, proc.stderr


def test_14_a_gzip_bomb_is_refused_in_bounded_memory(tmp_path: Any) -> None:
    import gzip

    with gzip.open(tmp_path / "bomb.trace.json.gz", "wb", compresslevel=1) as f:
        block = b" " * (1 << 20)
        for _ in range(600):  # 600 MB of JSON whitespace, a megabyte or so on disk
            f.write(block)
    proc = _run(
        """
        import sys, tracemalloc
        from mstx_marks.analysis.summary import load_traces
        tracemalloc.start()
        _, errors, _ = load_traces(sys.argv[1])
        print(errors)
        print(tracemalloc.get_traced_memory()[1] >> 20)
        """,
        str(tmp_path),
    )
    errors, peak_mb = proc.stdout.splitlines()
    assert "bomb.trace.json.gz" in errors and "more than" in errors, proc.stdout
    # Never held: what it reads at once is a small part of what it inflates (~23 MB of 600; its
    # peak RSS, under the 1 GB goal, is benchmarks/summary_memory.py --bomb --check's).
    assert int(peak_mb) < 600 // 10, peak_mb


def test_15_one_bad_value_leaves_the_rest_summarised(tmp_path: Any) -> None:
    import gzip
    import json

    from mstx_marks.analysis.summary import run_summary
    from mstx_marks.base.records import RangeRecord
    from mstx_marks.export import RankTrace, chrome_trace

    base = 2 * 10**18
    good = [RangeRecord("step", "default", base, base + 10**6, 1, 7),
            RangeRecord("gen", "default", base, base + 10**5, 1, 7)]  # fmt: skip
    doc = chrome_trace([RankTrace(0, good)])
    doc["traceEvents"] += [
        {**doc["traceEvents"][-1], "pid": float("nan")},
        {**doc["traceEvents"][-1], "dur": 1e30},
        {**doc["traceEvents"][-1], "dur": -1000.0, "name": "backwards"},
    ]
    (tmp_path / "rank0.trace.json").write_text(json.dumps(doc))
    (tmp_path / "broken.trace.json.gz").write_bytes(gzip.compress(b"{}")[:12] + b"\x00" * 40)
    for out in ({}, {"html": str(tmp_path / "r.html")}, {"trace": str(tmp_path / "m.json")}):
        with caught():
            code = run_summary(str(tmp_path), **out)  # type: ignore[arg-type]
        assert code == 1  # the corrupt gzip is an error, named; the rest is summarised
    traces_json = json.loads((tmp_path / "m.json").read_text())
    names = {e.get("name") for e in traces_json["traceEvents"]}
    assert "step" in names and "backwards" not in names


def test_16_a_comment_opener_escapes_and_long_names_are_cut(tmp_path: Any) -> None:
    from mstx_marks.analysis.render.report_html import write_html_report
    from mstx_marks.analysis.summary import format_table, summarize
    from mstx_marks.base.records import RangeRecord
    from mstx_marks.export import RankTrace

    r = [RangeRecord("<!--<script>", "default", 0, 10, 1, 1),
         RangeRecord("n" * 1_000_000, "default", 0, 5, 1, 1)]  # fmt: skip
    traces = [RankTrace(0, r)]
    summary = summarize(traces)
    page = write_html_report(tmp_path / "r.html", traces, summary).read_text()
    scripts = page.split("<script")[1:]
    assert all("<!--" not in s.split("</script>")[0] for s in scripts)
    assert max(len(line) for line in format_table(summary).splitlines()) < 300


def test_16_file_names_with_terminal_escapes_are_printed_escaped(tmp_path: Any) -> None:
    from mstx_marks.analysis.summary import run_summary

    bad = tmp_path / "x\x1b[2Jy.trace.json"
    bad.write_text("not json")
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        run_summary(str(tmp_path))
    assert "\x1b" not in err.getvalue() and "\\x1b[2J" in err.getvalue()


def test_17_a_superscript_capacity_is_not_an_int(monkeypatch: pytest.MonkeyPatch) -> None:
    from mstx_marks.base import env

    monkeypatch.setenv(env.RECORD_CAPACITY, "²")
    with caught() as w:
        assert env.positive_int(env.RECORD_CAPACITY, 7) == 7
    assert w and "expected an int" in str(w[0].message)


def test_19_many_bad_sample_pairs_give_one_short_warning() -> None:
    from mstx_marks.launch.activate import parse_samples

    with caught() as w:
        assert parse_samples("a=bad(1);" * 7000) == {}
    assert len(w) == 1 and len(str(w[0].message)) < 600


def test_9_processes_of_one_job_without_a_shared_run_id_are_one_run(tmp_path: Any) -> None:
    """Processes started by a parent that never recorded (so never made the id) each make
    their own: runs whose processes overlap in time are one run."""
    from mstx_marks.analysis.summary import summarize_path
    from mstx_marks.export.spill import Spill

    recs = [Recorder(), Recorder()]
    rids = [rec.range_start("step", "default") for rec in recs]  # both running at once
    runs = ("20250101-000000-aaaa", "20250101-000000-bbbb")
    for rank, (rec, rid, run) in enumerate(zip(recs, rids, runs)):  # ranks 0 and 1 of one job
        rec.range_end(rid, "default")
        Spill(tmp_path, rec, rank=rank, run=run).write_now(final=True)
    summary = summarize_path(tmp_path, jobs=1, progress=False)
    assert summary.notes == [] and [p.overall.count for p in summary.phases] == [2]


def test_a_second_reader_skips_what_the_first_released() -> None:
    """A cursor that starts after another released chunks (a second spill of the same recorder)
    reads what is still held and ends: it must not spin on a freed chunk."""
    from mstx_marks.backends.record import DrainCursor, Recorder

    rec = Recorder(capacity=100_000)
    for _ in range(40_000):
        rec.range_end(rec.range_start("x", "d"), "d")
    first = DrainCursor()
    assert len(rec.drain(first, release=True)) == 40_000
    second = DrainCursor()
    # chunks 0 and 1 were freed; the chunk still being filled is held, and read again
    assert len(rec.drain(second, release=True)) == 40_000 - 2 * 16_384
    rec.range_end(rec.range_start("y", "d"), "d")
    assert [r.name for r in rec.drain(second)] == ["y"]


def test_one_mark_entered_by_many_threads_at_once_ends_every_range() -> None:
    """Two threads entering one Mark could both take its slot: a thread switch right after a
    call returns (here the frame read) fell between the check and the stores, and one range
    was never ended (about 1 in 1,400 at a 1 us switch interval). The frame is read first now."""
    rec = Recorder(capacity=1 << 20)
    configure(backend=rec)
    m = mark("shared")

    def work() -> None:
        for _ in range(10_000):
            with m:
                pass

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch as often as the interpreter can
    try:
        run_threads(work, [() for _ in range(8)])
    finally:
        sys.setswitchinterval(interval)
    records = rec.records()
    assert len(records) == 80_000
    assert [r for r in records if r.open] == []


# --- interruptions where CPython delivers them, read back from the files (issue 35) -----------
# An exception after every call, at every function entry and at every taken backward jump of the
# library's range, give-up, drain, spill and exit paths, one per case (support/interruptions.py
# says how each lands where CPython would raise it); a timer storm whose handler raises inside
# library frames only; RecursionErrors at the limit. After each, what a user reads: the
# exception reached them, and the files (summary --json, the Chrome trace) hold every range
# completed before it and the later ones. Never the recorder's memory.

_HARNESS = str(Path(__file__).parent / "support" / "interruptions.py")
# Seconds a case may take (they take ~10-50 ms): past it, it hung. Past the library's own
# budget of 5 s (a flush's export under the load of the engine runs beside it takes that).
_CASE_LIMIT = 30.0


def _harness(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MSTX_MARKS_")}
    return subprocess.run(
        [sys.executable, _HARNESS, *args], capture_output=True, text=True, timeout=timeout,
        env=env,
    )  # fmt: skip


def _run_cases(
    sites: Path, first: int, stop: int, root: Path, results: Path, deadline: float
) -> dict[int, str]:
    """Cases ``first`` .. ``stop - 1`` in as few processes as possible: a case that hangs (or
    kills its process) is recorded with the stacks the watchdog dumped, and the rest go on in a
    new process. Returns those cases' symptoms."""
    import json
    import time

    dead: dict[int, str] = {}
    i = first
    while i < stop and time.monotonic() < deadline:
        proc = _harness(
            "cases", str(sites), str(i), str(stop), str(root), str(results), str(_CASE_LIMIT),
            timeout=max(10.0, deadline - time.monotonic() + 60),
        )  # fmt: skip
        lines = [json.loads(line) for line in results.read_text().splitlines()]
        done = {r["case"] for r in lines if "case" in r}
        started = [r["start"] for r in lines if "start" in r and r["start"] >= i]
        if proc.returncode == 0 and all(s in done for s in started):
            break
        stuck = max(started, default=i)
        if stuck not in done:
            dead[stuck] = _hung(proc)
        i = stuck + 1
    return dead


def _hung(proc: subprocess.CompletedProcess[str]) -> str:
    stacks = [ln.strip() for ln in proc.stderr.splitlines() if "mstx_marks/" in ln]
    return f"the process hung (or died, exit {proc.returncode}); in the library: " + " | ".join(
        stacks[:8]
    )


def _run_exit_cases(sites: Path, cases: list[int], root: Path, results: Path) -> dict[int, str]:
    """Each case a real exit, interrupted (a child forked per case); those that hang."""
    import json

    proc = _harness("exitcases", str(sites), ",".join(map(str, cases)), str(root), str(results),
                    timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(ln) for ln in results.read_text().splitlines()] if cases else []
    return {r["case"]: r["hung"] for r in lines if "hung" in r}


def _in_parallel(jobs: list[Callable[[], Any]]) -> list[Any]:
    out: list[Any] = [None] * len(jobs)

    def run(k: int) -> None:
        out[k] = jobs[k]()

    run_threads(run, [(k,) for k in range(len(jobs))], timeout=600)
    return out


_PY311 = pytest.mark.skipif(
    sys.version_info < (3, 11), reason="the sites are CPython 3.11's opcodes (RESUME, CALL)"
)


@_PY311
def test_an_interruption_at_every_call_entry_and_loop_edge_loses_no_later_range(
    tmp_path: Path,
) -> None:
    """Every site (a hundred or more) with a caught Ctrl-C (an ``Interrupt``) and a
    RecursionError (the exit's sites: a Ctrl-C, in a real exit): the user gets their exception,
    unchanged; recording goes on; every range completed before it and 100 later ones reach the
    files. Cases run in two processes, each case in a fresh session and out folder (the exit's,
    a process each); the folders are read back by two other processes."""
    import json
    import time

    from support import interruptions as harness

    sites_file = tmp_path / "sites.jsonl"
    proc = _harness("collect", str(sites_file), str(tmp_path / "collect"), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sites = harness.load_sites(sites_file)
    cases = harness.pairs(sites)
    total = len(cases)
    # The probe found the paths: the range path's, and whatever of the flush, drain, spill and
    # exit runs on the main thread (a writer thread's own frames no signal handler reaches).
    per = {name: [s for s in sites if s.scenario == name] for name in harness.SCENARIOS}
    assert len(per["range"]) > 30 and all(per.values()), {k: len(v) for k, v in per.items()}
    assert {"after-call", "entry"} <= {s.kind for s in sites}
    deadline = time.monotonic() + 300  # hangs cost _CASE_LIMIT each: all hanging still ends
    in_process = [i for i, (s, _) in enumerate(cases) if s.scenario not in harness.AT_EXIT]
    at_exit = [i for i, (s, _) in enumerate(cases) if s.scenario in harness.AT_EXIT]
    half = in_process[len(in_process) // 2]
    dead: dict[int, str] = {}
    for found in _in_parallel([
        functools.partial(_run_cases, sites_file, 0, half, tmp_path / "w0",
                          tmp_path / "results0.jsonl", deadline),
        functools.partial(_run_cases, sites_file, half, total, tmp_path / "w1",
                          tmp_path / "results1.jsonl", deadline),
        functools.partial(_run_exit_cases, sites_file, at_exit[::2], tmp_path / "x0",
                          tmp_path / "exits0.jsonl"),
        functools.partial(_run_exit_cases, sites_file, at_exit[1::2], tmp_path / "x1",
                          tmp_path / "exits1.jsonl"),
    ]):  # fmt: skip
        dead.update(found)
    results: dict[int, dict[str, Any]] = {}
    for name in ("results0", "results1", "exits0", "exits1"):
        path = tmp_path / f"{name}.jsonl"
        for line in path.read_text().splitlines() if path.exists() else []:
            r = json.loads(line)
            if "case" in r:  # (an exit case's lines each add to its result)
                results.setdefault(r["case"], {}).update(r)
    folders = [r["folder"] for _, r in sorted(results.items())]
    lists = [tmp_path / "folders0.json", tmp_path / "folders1.json"]
    lists[0].write_text(json.dumps(folders[::2]))
    lists[1].write_text(json.dumps(folders[1::2]))
    files: dict[str, Any] = {}
    for proc in _in_parallel([functools.partial(_harness, "read", str(p), timeout=300)
                              for p in lists]):  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        files.update(json.loads(proc.stdout))

    failures: dict[str, list[str]] = {}
    held_back = unreached = 0
    for case, (site, kind) in enumerate(cases):
        label = f"{site.name} [{kind}, via {site.via}]"
        if case in dead:
            failures.setdefault(dead[case], []).append(label)
            continue
        r = results.get(case)
        if r is None:
            failures.setdefault("not run (out of time)", []).append(label)
            continue
        if kind == "interrupt" and r["deferred"]:
            held_back += 1  # SIGINT and SIGTERM are held back there: no Ctrl-C lands there
            continue
        if not r["fired"]:
            unreached += 1  # this pass took another path (a thread's timing): nothing raised
            continue
        wrong, detail = [], ""
        if r.get("user") != "reached" and r["scenario"] not in harness.AT_EXIT:
            wrong.append(f"the user's exception was {r['user']}")
        if "after" in r:
            wrong.append(f"recording after it raised {r['after']}")
        found = harness.symptom(r["scenario"], files[r["folder"]])
        if found:
            wrong.append(found[0])
            detail = f": {found[1]}" if found[1] else ""
        if wrong:
            failures.setdefault("; ".join(wrong), []).append(label + detail)
    failed = sum(map(len, failures.values()))
    report = [
        f"{len(sites)} sites, {total} cases: {failed} failed, {held_back} held back"
        f" (signals deferred there), {unreached} not reached again"
    ]
    for symptom, labels in sorted(failures.items(), key=lambda kv: -len(kv[1])):
        report.append(f"{len(labels)} x {symptom}\n    " + "\n    ".join(labels))
    (tmp_path / "report.txt").write_text("\n".join(report))  # the whole of it, for reading
    assert not failures, "\n".join(report)[:20_000]
    assert unreached <= total // 10, report[0]  # the replay meets (almost) every site again


@_PY311
@pytest.mark.skipif(not hasattr(__import__("signal"), "setitimer"), reason="needs setitimer")
def test_a_timer_handler_raising_inside_library_frames_for_seconds_loses_no_later_range(
    tmp_path: Path,
) -> None:
    """A 0.2 ms SIGALRM whose handler raises a Timeout only while a library frame is on top (a
    reward function's timeout, landing in the library at calls, entries and loop edges), for
    2 s of recording: every Timeout reaches the loop (none taken for a fault), the 1,000 ranges
    after all reach the files, with every range that completed meanwhile, and the interrupted
    ones add no time that was never spent (the issue's 2 us ranges summing to 100 s): the
    ranges that ended sum to less than the loop's time, and at most two are left open (read
    from the Chrome trace, where a range open at the write says so)."""
    import json

    from support import interruptions as harness

    proc = _harness("itimer", str(tmp_path), "2", timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.splitlines()[-1])
    assert got["raised"] > 30, got  # the timer did land inside the library, often
    assert got["swallowed_at"] == {} and got["faults"] == {}, got  # none swallowed
    assert got["cycles"] == 0, got  # each Timeout's chain of contexts ends
    files = harness.read([str(tmp_path)])[str(tmp_path)]
    for view in ("summary", "chrome"):
        counts = files[view] or {}
        later = (view, counts.get("later"), "spill:", files["spill"].get("later"))
        assert counts.get("later", 0) == 1000, later
        storms = sum(n for name, n in counts.items() if name.startswith("storm_"))
        # every loop that completed is there; an interrupted one may be (its end ran) or not
        assert got["completed"] <= storms <= got["loops"], (view, storms, got)
    ended = files.get("ended_us", {})
    ended_us = sum(us for name, us in ended.items() if name.startswith("storm_"))
    assert ended_us * 1000 <= got["elapsed_ns"], (ended_us, got["elapsed_ns"])
    # Left open, ended at the exit's write: a pass whose exit the timer cut short at its first
    # instruction, where no code of ours runs, with no pass after it to end it (the loop's
    # last), and, rarer, an end cut short again at the entry of the call that makes it again
    # (core/engine.py). Either is one range; thousands was the bug.
    opened = [name for name in files.get("open", []) if name.startswith("storm_")]
    assert len(opened) <= 2, opened
    # summary --json counts the same time: the ended ranges and the open ones to the write
    open_us = sum(us for name, us in files.get("open_us", {}).items() if name.startswith("storm_"))
    storm_ns = sum(n for name, n in files["total_ns"].items() if name.startswith("storm_"))
    assert abs(storm_ns - (ended_us + open_us) * 1000) <= storms, (storm_ns, ended_us, open_us)


@_PY311
def test_recursion_errors_at_the_limit_reach_the_user_and_lose_no_later_range(
    tmp_path: Path,
) -> None:
    """For each of the 40 depths just below the recursion limit: recurse, and at the bottom
    enter a mark first used there, a shared Mark twice, a decorated call. Every RecursionError
    reaches the top (none taken for a fault: a bottom that completed has its ranges in the
    files), and the 100 later ranges reach the files."""
    import json

    from support import interruptions as harness

    proc = _harness("recursion", str(tmp_path), "40", timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.splitlines()[-1])
    # the limit was met, in the library's frames too, and nothing else came out of it
    assert sum(got["errors"].values()) > 10 and got["other"] == [], got
    assert got["faults"] == {}, got
    files = harness.read([str(tmp_path)])[str(tmp_path)]
    for view in ("summary", "chrome"):
        counts = files[view] or {}
        assert counts.get("later", 0) == 100, (view, counts, files["spill"])
        tried = 40  # per kind of bottom; those that completed are all there
        deep = sum(n for name, n in counts.items() if name.startswith("deep_"))
        done = got["completed"]
        assert done.get("deep", 0) <= deep <= tried, (view, deep, got)
        shared = counts.get("shared_deep", 0)
        assert 2 * done.get("shared_deep", 0) <= shared <= 2 * tried, (view, shared, got)
        decorated = counts.get("decorated_deep", 0)
        assert done.get("decorated_deep", 0) <= decorated <= tried, (view, decorated, got)
