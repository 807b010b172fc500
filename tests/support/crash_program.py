"""The programs tests/test_crash_only.py runs, written as a user writes them (issue 35).

``python crash_program.py SCENARIO [ARGS...]``. Each scenario records ranges through the public
API only (``mstx_marks.mark``, ``flush_at_exit``), under ``flush_at_exit(CRASH_FLUSH)`` when that
variable names a folder and under ``MSTX_MARKS_OUT`` when that is set (activated at import), and
reports what it completed on stdout with ``os.write`` (one whole line per call, safe in a signal
handler and between threads): the test compares that with the files a user reads, never with the
recorder's memory.

``faulthandler`` dumps every thread's stack on SIGUSR1, so a process that hangs says where.
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import resource
import signal
import sys
import threading
import time
from typing import Any, Callable


def say(line: str) -> None:
    """One whole line on stdout, unbuffered (no lock that a signal handler could meet)."""
    os.write(1, (line + "\n").encode())


def _peak_mib() -> float:
    """This process's peak resident memory. Linux keeps ``ru_maxrss`` across exec, so a child
    of a large test process would report its parent's; VmHWM starts again at exec."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


faulthandler.register(signal.SIGUSR1, all_threads=True)
if os.environ.get("CRASH_PEAK"):
    # Registered before mstx_marks is imported: atexit runs it last, after the exit writes.
    atexit.register(lambda: say(f"peak_mib {_peak_mib():.1f}"))

USER_HANDLER_FIRST = os.environ.get("CRASH_ORDER") == "user_first"


def _user_handler(signum: int, frame: object) -> None:
    """A user's own SIGTERM / SIGINT handler: checkpoint (a range), then leave."""
    with mark("save_checkpoint"):
        pass
    say("ckpt")
    sys.exit(0)


def _install_user_handlers() -> None:
    signal.signal(signal.SIGTERM, _user_handler)
    signal.signal(signal.SIGINT, _user_handler)


if sys.argv[1:2] == ["kill"] and USER_HANDLER_FIRST:
    _install_user_handlers()  # before the library chains its own in front of it

import mstx_marks  # noqa: E402  (MSTX_MARKS_OUT, when set, is activated here)
from mstx_marks import mark  # noqa: E402
from mstx_marks.export import flush_at_exit  # noqa: E402

if os.environ.get("CRASH_FLUSH"):
    if os.environ.get("CRASH_INTERVAL") == "none":  # no periodic spill: one write at exit
        flush_at_exit(os.environ["CRASH_FLUSH"], interval=None)
    else:
        flush_at_exit(os.environ["CRASH_FLUSH"])

assert mstx_marks  # the package, imported for its activation


def kill(threads: int, iterations: int) -> None:
    """Record ``micro_batch_{i}`` for ever (or ``iterations`` times), with ``threads`` more
    threads recording beside it, until a signal's handler ends the process. Each completed range
    is said with the (system-wide) monotonic clock read after it ended."""
    if not USER_HANDLER_FIRST:
        _install_user_handlers()  # replaces the library's handlers, as most programs do

    def worker(k: int) -> None:
        i = 0
        while True:
            with mark(f"worker{k}_batch_{i}"):
                pass
            say(f"t{k} {i} {time.monotonic_ns()}")
            i += 1

    for k in range(threads):
        threading.Thread(target=worker, args=(k,), daemon=True).start()
    say("ready")
    i = 0
    while iterations < 0 or i < iterations:
        with mark(f"micro_batch_{i}"):
            pass
        say(f"m {i} {time.monotonic_ns()}")
        i += 1
    say("done")


def names(n: int, digits: int = 0) -> None:
    """``n`` ranges, each of a new name (its number written with at least ``digits`` digits: a
    longer name), in one write."""
    for i in range(n):
        with mark(f"micro_batch_{i:0{digits}d}"):
            pass
    say("done")


def recursion(attempts: list[tuple[int, bool]], after: int) -> None:
    """For each (headroom, shallow): recurse (plain calls) until that many frames are left below
    the recursion limit, then enter a range of a new name there (a Mark made at the top when
    ``shallow``, else made there); headroom -1: recurse through ranges of new names, one a
    level, until the limit. Every RecursionError is caught; then ``after`` ranges at the normal
    depth."""
    limit = sys.getrecursionlimit()
    made = {a: mark(f"probe{a}") for a, (_, shallow) in enumerate(attempts) if shallow}

    def depth() -> int:
        frame: Any = sys._getframe(1)
        n = 0
        while frame is not None:
            frame, n = frame.f_back, n + 1
        return n

    def dive(attempt: int, level: int) -> None:
        with mark(f"dive{attempt}_level{level}"):  # first used here, near the limit at last
            dive(attempt, level + 1)

    def probe(attempt: int, headroom: int, level: int) -> None:
        if level < limit - headroom:
            probe(attempt, headroom, level + 1)
            return
        with made[attempt] if attempt in made else mark(f"probe{attempt}"):
            pass

    errors = 0
    for attempt, (headroom, _) in enumerate(attempts):
        try:
            if headroom < 0:
                dive(attempt, 0)
            else:
                probe(attempt, headroom, depth() + 1)
        except RecursionError:
            errors += 1
    say(f"recursion_errors {errors}")
    for j in range(after):
        with mark(f"after_{j}"):
            pass
    say("done")


class RewardTimeout(Exception):
    """What a reward function's time limit raises."""


def _recording_workers(
    threads: int, name: Callable[[int, int], str]
) -> tuple[threading.Event, list[threading.Thread]]:
    """``threads`` threads recording ``name(k, i)`` ranges of a step's work each (the GIL
    released) until the event is set; each says how many it completed when it ends."""
    stop = threading.Event()

    def worker(k: int) -> None:
        i = 0
        while not stop.is_set():
            with mark(name(k, i)):
                time.sleep(0.0002)
            i += 1
        say(f"worker{k} {i}")

    workers = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    return stop, workers


def alarm(interval_us: int, alarms: int, after: int, threads: int) -> None:
    """A SIGALRM handler that raises, ``alarms`` times, while ranges record; then ``after``
    ranges. Threads record beside it the whole time."""
    t0 = time.time_ns()  # (before the threads start: the run's wall time holds all they did)
    stop, workers = _recording_workers(threads, lambda k, i: f"worker{k}_{i % 300}")

    armed = False  # the time limit applies while the reward runs; each raise disarms it

    def on_alarm(signum: int, frame: object) -> None:
        nonlocal armed
        if armed:
            armed = False
            raise RewardTimeout

    caught = n = 0
    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, interval_us / 1e6, interval_us / 1e6)
    swallowed = 0  # raised by the handler, never reached this code
    while caught + swallowed < alarms:
        try:
            armed = True
            while armed:
                with mark(f"reward_{n % 500}"):  # a new name at first, then known ones
                    n += 1
            swallowed += 1
        except RewardTimeout:
            caught += 1
    signal.setitimer(signal.ITIMER_REAL, 0, 0)
    signal.signal(signal.SIGALRM, signal.SIG_IGN)  # one may still be pending
    say(f"caught {caught}")
    say(f"swallowed {swallowed}")
    for j in range(after):
        with mark(f"after_{j}"):
            pass
    stop.set()
    for w in workers:
        w.join()
    say(f"wall_ns {time.time_ns() - t0}")
    say("done")


def storm(storms: int, after: int, threads: int) -> None:
    """Ctrl-C from another process, ``storms`` times, a KeyboardInterrupt caught each time; then
    ``after`` ranges. Each "ack K" is written where a Ctrl-C is caught (inside the ``try``), and
    the sender sends the next one only once it has read it: a Ctrl-C lands in code that catches
    it, wherever the library is at that moment."""
    t0 = time.time_ns()  # (before the threads start: the run's wall time holds all they did)
    stop, workers = _recording_workers(threads, lambda k, i: f"worker{k}")
    caught = 0
    while caught < storms:
        try:
            say(f"ack {caught}")  # "ack 0": ready
            while True:
                with mark("storm"):
                    pass
        except KeyboardInterrupt:
            caught += 1
    say(f"ack {caught}")  # the last: no Ctrl-C follows it
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for j in range(after):
        with mark(f"after_{j}"):
            pass
    stop.set()
    for w in workers:
        w.join()
    say(f"wall_ns {time.time_ns() - t0}")
    say("done")


def loop(n: int, names: int) -> None:
    """``n`` ranges in a tight loop (one name when ``names`` is 1, else ``names`` cycled); with
    CRASH_QUICK_EXIT, leave as Ray's actors do (``os._exit``: no exit hooks)."""
    if os.environ.get("CRASH_PEAK"):
        say(f"start_mib {_peak_mib():.1f}")
    t0 = time.time_ns()
    if names == 1:
        for _ in range(n):
            with mark("tight_step"):  # no registered phase: summary keeps the name
                pass
    else:
        for i in range(n):
            with mark(f"name_{i % names}"):
                pass
    say(f"loop_ns {time.time_ns() - t0}")
    say("done")
    if os.environ.get("CRASH_QUICK_EXIT"):
        os._exit(0)


if __name__ == "__main__":
    scenario, args = sys.argv[1], [int(a) for a in sys.argv[2:] if a.lstrip("-").isdigit()]
    if scenario == "kill":
        kill(*args)
    elif scenario == "names":
        names(*args)
    elif scenario == "recursion":
        pairs = [a.split(":") for a in sys.argv[2].split(",")]
        recursion([(int(h), shallow == "1") for h, shallow in pairs], int(sys.argv[3]))
    elif scenario == "alarm":
        alarm(*args)
    elif scenario == "storm":
        storm(*args)
    elif scenario == "loop":
        loop(*args)
    else:
        raise SystemExit(f"unknown scenario {scenario}")
