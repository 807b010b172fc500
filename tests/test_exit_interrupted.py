"""A Ctrl-C that lands in the exit's write, right as any call there returns (where CPython runs
a signal handler), leaves no lock held: the exit ends, and a range that an exit hook records
after the library's exit write still reaches the files (issue 35: the exit only asks, with a
deadline, and nothing it leaves behind makes a later ask wait for ever).

Each case is a real exit in a process of its own, read back with ``mstx-marks summary --json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from mstx_marks.backends.record import DrainCursor, Recorder

# The program: 10 ranges, then its exit. A hook registered before the library's (so it runs
# after the library's exit write, as a job's own hook does) records one range more. Another,
# registered after it (so it runs first), arms a profiler on the main thread that raises a
# Ctrl-C as the NTH call made by the first run of TARGET returns (0: none; it says how many
# calls that run made).
_PROGRAM = textwrap.dedent(
    """
    import atexit, os, sys
    from mstx_marks import mark
    from mstx_marks.export import flush_at_exit
    from mstx_marks.export.out import OutSession
    from mstx_marks.export.spill import Spill

    folder, target, nth = sys.argv[1], sys.argv[2], int(sys.argv[3])
    code = {"spill": Spill.write_now, "ask": OutSession._ask}[target].__code__
    calls, first = [], []

    def said():
        os.write(1, f"calls {len(calls)}\\n".encode())

    def hook():
        with mark("after_exit_write"):
            pass

    def profile(frame, event, arg):
        if event == "c_return" and frame.f_code is code:
            caller, what = frame, getattr(arg, "__qualname__", repr(arg))
        elif event == "return" and frame.f_back is not None and frame.f_back.f_code is code:
            caller, what = frame.f_back, frame.f_code.co_qualname
        else:
            return
        if not first:
            first.append(caller)
        if caller is not first[0]:  # a later run (the hook's range): not this case's
            return
        calls.append(what)
        if len(calls) == nth:
            sys.setprofile(None)
            os.write(1, f"fired after {what}\\n".encode())
            raise KeyboardInterrupt(f"Ctrl-C as {what} returned")

    atexit.register(said)
    atexit.register(hook)
    flush_at_exit(folder)
    for _ in range(10):
        with mark("before"):
            pass
    atexit.register(sys.setprofile, profile)
    """
)


def _exit(folder: Path, target: str, nth: int) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MSTX_MARKS_")}
    env["MSTX_MARKS_EXIT_SECONDS"] = "2"  # a lock left held costs a late ask its budget
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _PROGRAM, str(folder), target, str(nth)],
            capture_output=True, text=True, timeout=60, env=env,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"the exit hung: a Ctrl-C after call {nth} of {target}")
    return proc.stdout


def _summary(folder: Path) -> dict[str, int]:
    proc = subprocess.run(
        [sys.executable, "-m", "mstx_marks", "summary", "--json", "--jobs", "1", str(folder)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    counts: dict[str, int] = {}
    for phase in json.loads(proc.stdout)["phases"]:
        counts[phase["name"]] = counts.get(phase["name"], 0) + phase["all"]["count"]
    return counts


@pytest.mark.parametrize("target", ["spill", "ask"])
def test_a_ctrl_c_as_any_call_of_the_exit_write_returns_loses_no_later_range(
    tmp_path: Path, target: str
) -> None:
    """``spill``: the spill's write (its lock); ``ask``: a request served on the asking
    thread once the writer has stopped (the lock that makes those one at a time)."""
    dry = _exit(tmp_path / "dry", target, 0)
    calls = int(dry.split("calls ")[-1])
    assert calls >= 3, dry  # the exit's write ran on the main thread, making calls there
    assert _summary(tmp_path / "dry") == {"before": 10, "after_exit_write": 1}
    wrong = []
    for nth in range(1, calls + 1):
        folder = tmp_path / f"case-{nth}"
        said = _exit(folder, target, nth)
        assert "fired after" in said, said
        got = _summary(folder)
        if got != {"before": 10, "after_exit_write": 1}:
            wrong.append(f"{said.split('fired after ')[1].split()[0]}: {got}")
    assert not wrong, wrong


class _Interrupt(KeyboardInterrupt):
    """The user's Ctrl-C."""


_RELEASE = Recorder._release.__code__


def _drain_interrupted(nth: int) -> tuple[Recorder, list[str]]:
    """A recorder of 100 ranges, drained with its chunks released, a Ctrl-C raised as the
    ``nth`` call of the release returns (0: none); the recorder and the release's calls."""
    rec = Recorder()
    for _ in range(100):
        rec.range_end(rec.range_start("before", "d"), "d")
    calls: list[str] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "c_return" and frame.f_code is _RELEASE:
            calls.append(getattr(arg, "__qualname__", repr(arg)))
            if len(calls) == nth:
                sys.setprofile(None)
                raise _Interrupt(f"Ctrl-C as {calls[-1]} returned")

    sys.setprofile(profile)
    try:
        rec.drain(DrainCursor(), release=True)
    except _Interrupt:
        assert nth == len(calls)
    finally:
        sys.setprofile(None)
    return rec, calls


def _record_from_a_thread(rec: Recorder, n: int) -> bool:
    """Whether another thread recorded ``n`` ranges (past a chunk: it takes the lock)."""

    def later() -> None:
        for _ in range(n):
            rec.range_end(rec.range_start("later", "d"), "d")

    other = threading.Thread(target=later, daemon=True)
    other.start()
    other.join(timeout=60)
    return not other.is_alive()


def test_a_ctrl_c_as_a_drain_takes_the_recorders_lock_leaves_it_to_other_threads() -> None:
    """A drain that releases chunks takes the recorder's lock without waiting; a Ctrl-C right
    as any call there returns must leave it free: another thread takes it for each new chunk
    of its ranges, and would wait for ever."""
    _, calls = _drain_interrupted(0)
    assert calls, "the drain released nothing"
    for nth in range(1, len(calls) + 1):
        rec, seen = _drain_interrupted(nth)
        assert len(seen) == nth
        assert _record_from_a_thread(rec, 40_000), f"a thread waits after {seen[-1]}"
        names = [r.name for r in rec.drain(DrainCursor())]
        assert names.count("later") == 40_000, seen[-1]
