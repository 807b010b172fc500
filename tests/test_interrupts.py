"""An exception may arrive at any line of our code: the user sees it, and recording goes on.

The harness raises, in turn, at every line event of the range path (a ``Mark``'s enter and
exit, a per-use ``mark``, a decorated call, an instant, ``Mark.start``/``Range.end``, down to
the recorder's start and end and the tee's calls), while other threads record with the same
``Mark`` objects. What it raises is what real programs raise there: a ``SIGALRM``-style timeout
from a signal handler (the tracer sends a real signal, whose Python handler raises), a caught
``KeyboardInterrupt``, a ``RecursionError``. After each: the exception reached the caller as it
was raised, the backend is not at rest, a later range is drained, and nothing hangs. Then a
fork-while-recording stress: threads record, the spill drains, the process forks at random
points, and every child finishes.
"""

from __future__ import annotations

import faulthandler
import linecache
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import mstx_marks
from mstx_marks import configure, instant, mark, mstx_range, status
from mstx_marks.backends.base import Backend, Emitter
from mstx_marks.backends.record import DrainCursor, Recorder
from mstx_marks.backends.tee import Tee

PACKAGE = Path(mstx_marks.__file__).parent
#: The modules of the range path: where the harness raises.
RANGE_PATH = {
    str(PACKAGE / rel)
    for rel in (
        "core/ranges.py",
        "core/engine.py",
        "core/routing.py",
        "backends/record.py",
        "backends/tee.py",
    )
}


class Timeout(Exception):
    """What a reward function's SIGALRM handler raises."""


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise Timeout(f"signal {signum}")


class Counting(Backend):
    """A device backend written in Python (so that it has lines to be interrupted at)."""

    name = "counting"

    def __init__(self) -> None:
        self.next_id = 0
        self.open: set[int] = set()

    def emitter(self, stream: object) -> Emitter:
        def start(name: str, domain: str) -> int:
            self.next_id += 1
            self.open.add(self.next_id)
            return self.next_id

        def end(handle: int, domain: str) -> None:
            self.open.discard(handle)

        return Emitter(self, start, end, lambda n, d: None)


#: Lines no asynchronous exception can land on. CPython runs a signal handler (and raises a
#: RecursionError) only at a call, a function's entry or a backward jump; a tracer, though,
#: sees these lines too, and raising there escapes the enclosing handler: a ``with`` line is
#: seen again for the implicit ``__exit__`` call (raising skips that very call, leaving a lock
#: held); ``try:`` and ``while True:`` are no-op instructions outside the enclosing ``try``'s
#: clean-up (CPython 3.11).
_NO_LANDING = ("with ", "async with ", "try:", "while True:")


def _line_event(frame: FrameType, event: str) -> bool:
    """A line event where a real asynchronous exception can land (see :data:`_NO_LANDING`)."""
    if event != "line":
        return False
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).lstrip()
    return not line.startswith(_NO_LANDING)


def _line_tracer(on_line: Callable[[int], None]) -> Callable[..., Any]:
    """A tracer calling ``on_line(k)`` at the k-th line event (from 1) in :data:`RANGE_PATH`."""
    seen = [0]

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename not in RANGE_PATH:
            return None
        if _line_event(frame, event):
            seen[0] += 1
            on_line(seen[0])
        return tracer

    return tracer


def _raise_at(n: int, raise_it: Callable[[], None]) -> Callable[..., Any]:
    """A tracer that calls ``raise_it`` at the ``n``-th line event in :data:`RANGE_PATH`."""
    return _line_tracer(lambda k: raise_it() if k == n else None)


def _lines(action: Callable[[], object]) -> int:
    """How many line events of :data:`RANGE_PATH` ``action`` makes."""
    count = [0]
    sys.settrace(_line_tracer(lambda k: count.__setitem__(0, k)))
    try:
        action()
    finally:
        sys.settrace(None)
    return count[0]


def _signal_timeout() -> None:
    signal.raise_signal(signal.SIGUSR1)  # its Python handler runs inside this call and raises


def _keyboard() -> None:
    raise KeyboardInterrupt


def _recursion() -> None:
    raise RecursionError("maximum recursion depth exceeded")


RAISERS = {"signal": (_signal_timeout, Timeout), "ctrl-c": (_keyboard, KeyboardInterrupt),
           "recursion": (_recursion, RecursionError)}  # fmt: skip


@pytest.fixture
def handler() -> Iterator[None]:
    old = signal.signal(signal.SIGUSR1, _on_signal)
    faulthandler.dump_traceback_later(120, exit=True)  # "nothing hangs", as a hard limit
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGUSR1, old)


def _actions() -> dict[str, Callable[[], object]]:
    shared = mark("shared")

    @mstx_range("decorated")
    def decorated() -> int:
        return 1

    def with_shared() -> None:
        with shared:
            pass

    def per_use() -> None:
        with mark("per_use", domain="verl"):
            pass

    def started() -> None:
        mstx_marks.Mark("started").start().end()

    return {
        "with shared Mark": with_shared,
        "with mark()": per_use,
        "decorated": decorated,
        "instant": lambda: instant("instant"),
        "start/end": started,
    }


def _drained_after(rec: Recorder, cursor: DrainCursor) -> bool:
    """Whether a drain reaches the "after" range just recorded: at once, or within a second
    (a background thread may hold a slot it is still writing: a drain waits for that one)."""
    deadline = time.monotonic() + 1.0
    while True:
        if any(r.name == "after" for r in rec.drain(cursor)):
            return True
        if time.monotonic() > deadline:
            return False


@pytest.mark.parametrize("backend", ["record", "tee"])
def test_an_exception_at_any_line_reaches_the_user_and_recording_goes_on(
    backend: str, handler: None
) -> None:
    rec = Recorder(capacity=1 << 20)
    device = Counting()
    configure(backend=rec if backend == "record" else Tee(device, rec))
    cursor = DrainCursor()
    actions = _actions()
    stop = threading.Event()
    shared = mark("shared")

    background_ids: list[int] = []

    def background() -> None:  # other threads use the same Mark objects meanwhile
        background_ids.append(threading.get_native_id())
        while not stop.is_set():
            with shared, mark("bg"):
                pass

    threads = [threading.Thread(target=background, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    tried = 0
    try:
        for label, action in actions.items():
            lines = _lines(action)
            assert lines > 3, label
            for n in range(1, lines + 1):
                for kind, (raise_it, expected) in RAISERS.items():
                    sys.settrace(_raise_at(n, raise_it))
                    try:
                        action()
                    except expected:
                        pass  # the user's exception, unchanged
                    finally:
                        sys.settrace(None)
                    tried += 1
                    # A later range is recorded, and a drain reaches it: no slot left unwritten.
                    with mark("after"):
                        pass
                    assert _drained_after(rec, cursor), (label, n, kind)
                    assert status().faults == {}, (label, n, kind)  # nothing put to rest
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
        if any(t.is_alive() for t in threads):
            faulthandler.dump_traceback(all_threads=True)  # where it hangs, for the failure
    assert tried > 100
    assert not any(t.is_alive() for t in threads)
    assert status().faults == {}  # no exception of the user's was taken for a backend fault
    # Every range the background threads started has ended: shared-Mark bookkeeping held (a
    # range of the main thread's whose start or end was interrupted may be left open: that is
    # the one the exception cut).
    rec.drain(cursor)
    assert not [r for r in rec.open_ranges(cursor) if r.thread in background_ids]


def test_a_sigalrm_timeout_in_a_range_start_reaches_user_code(handler: None) -> None:
    """The reported case: ~7 % of a reward loop's timeouts never reached the user, and the
    backend rested for minutes after. Each timeout here lands inside the recorder's start."""
    rec = Recorder()
    configure(backend=rec)
    reached = 0
    for _ in range(200):
        sys.settrace(_raise_at(3, _signal_timeout))
        try:
            with mark("compute_score"):
                pass
        except Timeout:
            reached += 1
        finally:
            sys.settrace(None)
    assert reached == 200
    with mark("next"):
        pass
    assert [r.name for r in rec.records()][-1] == "next"
    assert status().faults == {}


def test_an_interrupted_start_leaves_no_slot_that_stalls_the_drain() -> None:
    rec = Recorder()
    configure(backend=rec)
    cursor = DrainCursor()
    interrupted = 0
    # Raise inside the recorder's start at each of its lines, in a new name each time (so the
    # name-table branch is taken too).
    for n in range(1, 12):
        sys.settrace(_raise_at(n, _keyboard))
        try:
            with mark(f"name_{n}"):
                pass
        except KeyboardInterrupt:
            interrupted += 1
        finally:
            sys.settrace(None)
    for _ in range(100):
        with mark("later"):
            pass
    names = [r.name for r in rec.drain(cursor)]
    assert interrupted > 5
    assert names.count("later") == 100


def test_args_are_captured_when_the_range_starts() -> None:
    rec = Recorder()
    configure(backend=rec)
    args: dict[str, int] = {}
    for i in range(5):
        args["step"] = i  # one dict, reused across steps
        with mark("train_step", args=args):
            pass
    assert [r.args["step"] for r in rec.records() if r.args] == [0, 1, 2, 3, 4]


_FORK_STRESS = textwrap.dedent(
    """
    import os, random, sys, threading, time
    from mstx_marks import mark
    from mstx_marks.export import flush_at_exit

    flush_at_exit(sys.argv[1])  # the spill thread drains while we fork
    stop = threading.Event()

    def record():
        site = mark("bg")
        while not stop.is_set():
            with site, mark("inner"):
                pass

    threads = [threading.Thread(target=record, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    rng = random.Random(int(sys.argv[2]))
    children = []
    for i in range(int(sys.argv[3])):
        time.sleep(rng.random() * 0.01)
        pid = os.fork()
        if pid == 0:
            with mark("child_step"):
                pass
            if i % 2:
                os.execv(sys.executable, [sys.executable, "-c", "pass"])
            os._exit(0)
        children.append(pid)
    deadline = time.monotonic() + 60
    hung = []
    for pid in children:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                hung.append(pid)
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                break
            time.sleep(0.005)
    stop.set()
    print("hung", len(hung), "of", len(children))
    sys.exit(1 if hung else 0)
    """
)


@pytest.mark.parametrize("seed", [1, 2])
def test_a_fork_while_threads_record_and_the_spill_drains_never_hangs_the_child(
    tmp_path: Path, seed: int
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MSTX_MARKS_")}
    proc = subprocess.run(
        [sys.executable, "-c", _FORK_STRESS, str(tmp_path / "out"), str(seed), "40"],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "hung 0 of 40" in proc.stdout


def test_forking_resets_every_lock_before_any_reset_runs() -> None:
    """A lock held by another thread at the fork is free in the child at once."""
    from mstx_marks.base import forking

    lock = forking.new_lock()
    held = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(10)
    try:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: the holder thread is gone
            ok = lock.acquire(timeout=2)
            os.write(w, b"1" if ok else b"0")
            os._exit(0)
        os.close(w)
        got = os.read(r, 1)
        os.waitpid(pid, 0)
        os.close(r)
    finally:
        release.set()
        t.join()
    assert got == b"1"


def test_random_fork_points_in_process(tmp_path: Path) -> None:
    """Fork at random moments of recording threads, in this process: each child records and
    exits within a second (a hang would be a lock held by a thread that is not there)."""
    rng = random.Random(3)
    configure(backend="record")
    stop = threading.Event()

    def record() -> None:
        site = mark("bg")
        while not stop.is_set():
            with site:
                pass

    threads = [threading.Thread(target=record) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for _ in range(10):
            time.sleep(rng.random() * 0.005)
            pid = os.fork()
            if pid == 0:
                signal.alarm(5)  # a hang ends the child with SIGALRM, not the suite
                with mark("child"):
                    pass
                os._exit(0)
            _, code = os.waitpid(pid, 0)
            assert code == 0
    finally:
        stop.set()
        for t in threads:
            t.join()
