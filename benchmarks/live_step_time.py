"""The verl GRPO trainer's step time with the live figures on and off, side by side (issue 38):
the real job of the suite (tests/engines/verl_live.py in the grpo venv, 2 steps), run ``--runs``
times each way, alternating, with ``MSTX_MARKS_INSTRUMENT=verl,vllm`` and ``MSTX_MARKS_OUT``;
off is ``MSTX_MARKS_LIVE=0``. Prints each run's step times and the longest log-call hold.

    python3 benchmarks/live_step_time.py --runs 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))

from support.engine_run import clean_env  # noqa: E402
from support.grpo_job import INSTRUMENT, grpo_python, metric_lines  # noqa: E402


def run(live: bool, where: Path) -> dict[str, object]:
    env = clean_env(MSTX_MARKS_INSTRUMENT=INSTRUMENT, MSTX_MARKS_OUT=str(where / "out"), JOB="grpo")
    if not live:
        env["MSTX_MARKS_LIVE"] = "0"
    result = where / "result.json"
    runner = TESTS / "engines" / "verl_live.py"
    cmd = [str(grpo_python()), str(runner), str(where / "work"), str(result), "600"]
    subprocess.run(cmd, env=env, cwd=where, check=False, timeout=700)
    report = json.loads(result.read_text())
    metrics = metric_lines(Path(report["log"]).read_text(errors="replace"))
    steps = [m.get("timing_s/step") for m in metrics if "timing_s/step" in m]
    holds = [m.get("mstx/live/hold_ms") for m in metrics if "mstx/live/hold_ms" in m]
    return {"live": live, "rc": report["rc"], "step_s": steps, "hold_ms": holds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    for i in range(args.runs):
        for live in (True, False):
            with tempfile.TemporaryDirectory() as tmp:
                print(json.dumps({"run": i, **run(live, Path(tmp))}), flush=True)


if __name__ == "__main__":
    os.environ.pop("PYTHONPATH", None)
    main()
