"""What the per-step analysis (``analysis/model/rl_steps.py``) costs ``summary``: the same inputs
summarised with it and without it (``--no-per-step``), side by side, in fresh processes, the
two modes alternated so that a busy machine weighs on both alike.

- the cluster of ``benchmarks/summary_scale.py`` (64 ranks x 1e5 events in Ascend databases);
- the spill of ``benchmarks/summary_memory.py`` (1e7 events by default, summarised in one
  pass).

Each run's wall time, CPU time (user + system of the command and its workers: what a busy
machine inflates least) and peak RSS of the whole process tree. Prints, per input and mode,
each round's figures, then the ratios of the medians (targets: time <= 1.3x; memory within
today's bound). Run it from the repository root:
``python3 benchmarks/per_step_cost.py [--ranks 64] [--events 1e5] [--spill 1e7] [--rounds 2]``.
Inputs are made once under ``--work`` and reused (those of the two benchmarks it borrows from).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import summary_memory  # noqa: E402
import summary_scale  # noqa: E402

MODES: dict[str, list[str]] = {"with per-step": [], "without (--no-per-step)": ["--no-per-step"]}


def run(root: Path, extra: list[str]) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds (user + system, the command and the workers it waited for:
    ``wait4``) and peak RSS of the whole process tree (bytes, sampled every 10 ms) of
    ``summary ROOT --json`` with ``extra``."""
    cmd = [sys.executable, "-m", "mstx_marks", "summary", str(root), "--json", *extra]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = time.monotonic()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env)
        peak = 0
        stop = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not stop.is_set():
                peak = max(peak, summary_scale._tree_rss(proc.pid))
                stop.wait(0.01)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        stop.set()
        sampler.join()
        if os.waitstatus_to_exitcode(status) != 0:
            err.seek(0)
            raise SystemExit(f"summary failed: {err.read()[-2000:]}")
    return time.monotonic() - start, usage.ru_utime + usage.ru_stime, peak


def compare(name: str, root: Path, rounds: int) -> None:
    got: dict[str, list[tuple[float, float, int]]] = {mode: [] for mode in MODES}
    for n in range(rounds):
        for mode, extra in MODES.items() if n % 2 == 0 else reversed(MODES.items()):
            wall, cpu, peak = run(root, extra)
            got[mode].append((wall, cpu, peak))
            print(
                f"  {name}, {mode}: {wall:.1f} s, cpu {cpu:.1f} s, peak {peak / 2**20:.0f} MiB",
                flush=True,
            )
    new, old = (got[m] for m in MODES)
    ratios = [statistics.median(v[k] for v in new) / statistics.median(v[k] for v in old)
              for k in range(3)]  # fmt: skip
    print(
        f"{name}: per-step / without (medians): wall {ratios[0]:.2f}x, cpu {ratios[1]:.2f}x,"
        f" peak memory {ratios[2]:.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--events", type=float, default=1e5)
    parser.add_argument("--spill", type=float, default=1e7, help="events of the spill (0: none)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "mstx_marks_per_step"))
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    print(f"cpus: {os.cpu_count()}; inputs under {work}")
    cluster = summary_scale.cluster(work, args.ranks, int(args.events))
    compare(f"{args.ranks} ranks x {int(args.events)} events", cluster, args.rounds)
    if args.spill:
        spill = summary_memory.build(work / f"spill_{int(args.spill)}", int(args.spill))
        compare(f"a spill of {int(args.spill)} events", spill, args.rounds)


if __name__ == "__main__":
    main()
