"""What live step figures cost (issue 38): the trainer's hold per log call, and the background
thread's work per step.

1. ``hold``: :meth:`mstx_marks.live.steps.LiveSteps.log` picking up one step's figures (about
   ``--keys`` of them) and registering the call, timed ``--calls`` times in this process: the
   time verl's ``Tracking.log`` is held (the goal: well under 1 ms).
2. ``step``: one step's figures made the way the background thread makes them, from ``--procs``
   processes' spills of ``--events`` ranges each: follow every spill
   (:class:`~mstx_marks.export.spill_tail.SpillWindow`), write the windows and run
   ``summary``'s analysis on them (wall seconds, in the trainer's background thread: it takes no
   time from the trainer's step but the GIL it shares).

Run it from the repository root: ``python3 benchmarks/live_hold.py [--calls N] [--keys K]
[--procs P] [--events E]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from mstx_marks.backends.record import Recorder  # noqa: E402
from mstx_marks.export.spill import Spill  # noqa: E402
from mstx_marks.export.spill_tail import SpillWindow  # noqa: E402
from mstx_marks.live.steps import LiveSteps, StepCall  # noqa: E402


def hold(calls: int, keys: int) -> list[float]:
    """Microseconds each log call was held, one step's figures ready for each."""
    live = LiveSteps(tempfile.mkdtemp(), poll_s=3600)  # (the thread sleeps: only the calls)
    figures = {f"mstx/role{k % 9}/phase{k}_s/max": float(k) for k in range(keys)}
    held = []
    try:
        for step in range(1, calls + 1):
            with live._lock:  # (what the thread hands over: one step's figures, complete)
                live.calls.append(StepCall(step, 0, dict(figures), True, caught=1))
            began = time.perf_counter_ns()
            live.log({"timing_s/step": 1.0, "actor/loss": 0.5}, step + 1)
            held.append((time.perf_counter_ns() - began) / 1e3)
    finally:
        live.close()
    return held


def step(procs: int, events: int) -> tuple[float, float]:
    """Seconds to follow ``procs`` spills of ``events`` ranges each, and to analyse them."""
    out = Path(tempfile.mkdtemp())
    paths = []
    for p in range(procs):
        rec = Recorder(capacity=4 * events + 16)
        role = "trainer" if p == 0 else f"worker{p % 4}"
        spill = Spill(out, rec, rank=p, role=role, run="bench")
        spill.path = spill.path.with_name(f"h-{1000 + p}.jsonl")
        if p == 0:
            rec.range_end(rec.range_start("step", "d"), "d")
        for i in range(events):
            rec.range_end(rec.range_start("decode_batch" if i % 2 else "update_actor", "d"), "d")
        paths.append(spill.write_now())
    began = time.perf_counter()
    windows = [SpillWindow(path) for path in paths]
    for w in windows:
        w.follow()
    followed = time.perf_counter() - began
    from mstx_marks.analysis.summary import summarize_path

    began = time.perf_counter()
    folder = Path(tempfile.mkdtemp())
    for w in windows:
        w.write(folder)
    summarize_path(folder, jobs=1, progress=False)
    return followed, time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--keys", type=int, default=300)
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--events", type=int, default=5000)
    args = parser.parse_args()
    held = hold(args.calls, args.keys)
    print(
        f"hold per log call ({args.keys} figures ready): median {statistics.median(held):.1f} us,"
        f" p99 {sorted(held)[int(0.99 * len(held))]:.1f} us, max {max(held):.1f} us"
    )
    followed, analysed = step(args.procs, args.events)
    print(
        f"one step from {args.procs} spills x {args.events} ranges: follow {followed:.3f} s,"
        f" analyse {analysed:.3f} s (background thread)"
    )


if __name__ == "__main__":
    main()
