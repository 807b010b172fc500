"""What the per-step analysis (``analysis/rl_steps.py``) costs ``summary``: the same inputs
summarised with it and without it (``--no-per-step``), side by side, in fresh processes, the
two modes alternated so that a busy machine weighs on both alike.

- the cluster of ``benchmarks/summary_scale.py`` (64 ranks x 1e5 events in Ascend databases):
  wall time and peak RSS of the whole process tree (the command and its workers);
- the spill of ``benchmarks/summary_memory.py`` (1e7 events by default, summarised in one
  pass): wall time and the command's own peak RSS (``wait4``).

Prints, per input and mode, each round's figures, then the ratios of the medians (targets: time
<= 1.3x; memory within today's bound). Run it from the repository root:
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
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import summary_memory  # noqa: E402
import summary_scale  # noqa: E402

MODES = {"with per-step": [], "without (--no-per-step)": ["--no-per-step"]}


def tree(root: Path, extra: list[str]) -> tuple[float, int]:
    """Wall seconds and peak tree RSS (bytes) of ``summary ROOT --json`` with ``extra``."""
    cmd = [sys.executable, "-m", "mstx_marks", "summary", str(root), "--json", *extra]
    wall, peak, done = summary_scale.measure(cmd, 1800)
    if done is None or done.returncode != 0:
        raise SystemExit(f"summary failed: {done and done.stderr[-2000:]}")
    return wall, peak


def own(root: Path, extra: list[str]) -> tuple[float, int]:
    """Wall seconds and the command's own peak RSS (bytes; ``wait4``)."""
    cmd = [sys.executable, "-m", "mstx_marks", "summary", str(root), "--json", *extra]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = time.monotonic()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            err.seek(0)
            raise SystemExit(f"summary failed: {err.read()[-2000:]}")
    return time.monotonic() - start, usage.ru_maxrss * 1024


def compare(name: str, measure, root: Path, rounds: int) -> None:  # type: ignore[no-untyped-def]
    got: dict[str, list[tuple[float, int]]] = {mode: [] for mode in MODES}
    for n in range(rounds):
        for mode, extra in MODES.items() if n % 2 == 0 else reversed(MODES.items()):
            wall, peak = measure(root, extra)
            got[mode].append((wall, peak))
            print(f"  {name}, {mode}: {wall:.1f} s, peak {peak / 2**20:.0f} MiB", flush=True)
    (new, old) = (got[m] for m in MODES)
    wall = statistics.median(w for w, _ in new) / statistics.median(w for w, _ in old)
    peak = statistics.median(p for _, p in new) / statistics.median(p for _, p in old)
    print(f"{name}: per-step / without: time {wall:.2f}x, peak memory {peak:.2f}x")


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
    compare(f"{args.ranks} ranks x {int(args.events)} events", tree, cluster, args.rounds)
    if args.spill:
        spill = summary_memory.build(work / f"spill_{int(args.spill)}", int(args.spill))
        compare(f"a spill of {int(args.spill)} events", own, spill, args.rounds)


if __name__ == "__main__":
    main()
