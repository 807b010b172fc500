"""``summary`` of one large spill: its peak memory and time (issue 20, item 14).

Builds a spill of ``N`` events (default 1e7) with the real writer (a :class:`Recorder` and a
:class:`Spill` written every 20 000 steps, as the spill thread does; GRPO-shaped steps of 13
ranges: step, gen, 8 decode steps, log-probs, reward, update_actor), then runs
``python -m mstx_marks summary DIR --json`` on it in a fresh process and prints, as JSON: the
events written and counted, the file's size, the command's peak RSS
(``getrusage(RUSAGE_CHILDREN).ru_maxrss``: the spill is built in this process, so the command
is the only child) and its wall time. ``--in-memory`` lifts the limits of
:mod:`mstx_marks.analysis.stream` in the child, to see what holding every record would take.

Run it from the repository root: ``python3 benchmarks/summary_memory.py [N] [--in-memory]``.
The spill is kept under ``--work`` and reused.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from mstx_marks.backends.record import Recorder  # noqa: E402
from mstx_marks.export.spill import Spill  # noqa: E402

#: Ranges per step (see the module's docstring).
PER_STEP = 13

# The child for --in-memory: the limits lifted, then the command itself.
_HELD = (
    "import sys; from mstx_marks.analysis import stream; "
    "stream.MAX_HELD_EVENTS = stream.MAX_SPILL_BYTES = 1 << 62; "
    "from mstx_marks.cli.main import main; sys.exit(main(sys.argv[1:]))"
)


def build(root: Path, events: int) -> Path:
    """A folder holding one spill of about ``events`` events (whole steps), made once."""
    done = root / ".complete"
    if done.exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    rec = Recorder(capacity=1 << 20)
    spill = Spill(root, rec, rank=0, role="trainer", run="bench")
    start, end = rec.range_start, rec.range_end
    for n in range(events // PER_STEP):
        step, gen = start("step", "default"), start("gen", "default")
        for _ in range(8):
            end(start("vllm_one_step", "vllm"), "vllm")
        end(gen, "default")
        for name in ("old_log_prob", "reward", "update_actor"):
            end(start(name, "default"), "default")
        end(step, "default")
        if n % 20_000 == 19_999:
            spill.write_now()
    spill.write_now(final=True)
    done.write_text("")
    return root


def measure(root: Path, in_memory: bool, timeout: float) -> dict[str, object]:
    head = ["-c", _HELD] if in_memory else ["-m", "mstx_marks"]
    cmd = [sys.executable, *head, "summary", str(root), "--json"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    wall = time.monotonic() - start
    if done.returncode != 0:
        raise SystemExit(f"summary failed ({done.returncode}): {done.stderr[-2000:]}")
    doc = json.loads(done.stdout)
    counted = sum(p["all"]["count"] for p in doc["phases"])
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # kilobytes on Linux
    return {
        "counted": counted,
        "streamed": any("summarised in one pass" in n for n in doc["notes"]),
        "peak_rss_mb": round(peak_kb / 1024),
        "wall_s": round(wall, 1),
        "steps": doc["ranks"]["trainer:0"]["steps"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("events", nargs="?", type=float, default=1e7)
    parser.add_argument("--in-memory", action="store_true", help="lift the stream's limits")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument(
        "--work", default=str(Path(tempfile.gettempdir()) / "mstx_marks_summary_memory")
    )
    args = parser.parse_args()
    events = int(args.events)
    t = time.monotonic()
    root = build(Path(args.work) / f"spill_{events}", events)
    built = time.monotonic() - t
    (spill,) = (root / "spill").glob("*.jsonl")
    result = {
        "events": events // PER_STEP * PER_STEP,
        "file_mb": round(spill.stat().st_size / 2**20),
        "build_s": round(built, 1),
        "in_memory": args.in_memory,
        **measure(root, args.in_memory, args.timeout),
    }
    print(json.dumps(result))
    if result["counted"] != result["events"]:
        raise SystemExit(f"counted {result['counted']} events of {result['events']}")


if __name__ == "__main__":
    main()
