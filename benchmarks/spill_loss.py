"""What a killed process loses, and what a long recording costs in memory, under MSTX_MARKS_OUT.

    python benchmarks/spill_loss.py                 # SIGKILL loss window at 3e5 ranges/s
    python benchmarks/spill_loss.py --rate 1e5 --seconds 5
    python benchmarks/spill_loss.py --memory 1e7    # peak RSS of a 1e7-event run

The loss window: a child records ranges at ``--rate`` per second (paced, in bursts of 1000,
through the public ``mark``), under ``MSTX_MARKS_OUT``; after ``--seconds`` the parent SIGKILLs
it and reads its spill: the window is the kill time minus the end of the last range on disk.
The memory: a child records ``--memory`` events as fast as it can under ``MSTX_MARKS_OUT`` and
its peak RSS is read while recording and over its whole life (the exit's writing included), and
the events on disk counted.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

_PACED = """
import sys, time
from mstx_marks import mark
rate, burst = float(sys.argv[1]), 1000
print("ready", flush=True)
t0 = time.perf_counter()
done = 0
while True:
    for _ in range(burst):
        with mark("step_part"):
            pass
    done += burst
    ahead = done / rate - (time.perf_counter() - t0)
    if ahead > 0:
        time.sleep(ahead)
"""

_LONG = """
import resource, sys
from mstx_marks import mark
n = int(float(sys.argv[1]))
m = mark("step_part")
for i in range(n):
    with m:
        pass
print(f"rss_recording_kb={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}", flush=True)
"""


def loss_window(rate: float, seconds: float) -> dict[str, float]:
    out = Path(tempfile.mkdtemp())
    env = {**os.environ, "MSTX_MARKS_OUT": str(out), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _PACED, str(rate)], env=env, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    started = time.time_ns()
    time.sleep(seconds)
    killed = time.time_ns()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    from mstx_marks.export.spill import read_spill

    records = [r for p in (out / "spill").glob("*.jsonl") for r in read_spill(p).ranges]
    last = max((r.end_ns for r in records), default=started)
    return {
        "rate_per_s": rate,
        "ran_s": (killed - started) / 1e9,
        "ranges_on_disk": len(records),
        "achieved_rate_per_s": len(records) / max(1e-9, (last - started) / 1e9),
        "loss_window_s": (killed - last) / 1e9,
    }


def memory(events: float) -> dict[str, object]:
    out = Path(tempfile.mkdtemp())
    env = {**os.environ, "MSTX_MARKS_OUT": str(out), "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", _LONG, str(events)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stdout, stderr = proc.communicate()
    wall = time.perf_counter() - t0
    # The child's whole life, its exit's writing included (ru_maxrss of the waited children).
    whole_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    fields = dict(kv.split("=") for kv in stdout.split() if "=" in kv)
    from mstx_marks.export.spill import read_spill

    spilled = sum(len(read_spill(p).records) for p in (out / "spill").glob("*.jsonl"))
    return {
        "events": int(events),
        "on_disk": spilled,
        "rss_peak_recording_mb": round(int(fields.get("rss_recording_kb", 0)) / 1024, 1),
        "rss_peak_whole_run_with_exit_mb": round(whole_kb / 1024, 1),
        "exports": sorted(p.name for p in out.rglob("*") if p.suffix in (".db", ".json")),
        "wall_s": round(wall, 1),
        "stderr_tail": stderr[-300:],
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rate", type=float, default=3e5)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--memory", type=float, default=None)
    args = p.parse_args()
    if args.memory:
        print(json.dumps(memory(args.memory), indent=1))
    else:
        print(json.dumps(loss_window(args.rate, args.seconds), indent=1))


if __name__ == "__main__":
    main()
