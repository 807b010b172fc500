"""A small RL-shaped job of real processes for tests/test_live.py: a trainer that logs each step
through :class:`mstx_marks.live.steps.LiveSteps`, as verl's ``Tracking.log`` does once the
preset is armed, and two rollout workers that record on their own (worker 1 slower: a long
tail), all recording to ``MSTX_MARKS_OUT`` from the environment alone.

usage: python live_job.py trainer RESULT_JSON STEPS KILL_STEP   (KILL_STEP 0: no kill)
       python live_job.py worker RANK

The trainer SIGKILLs worker 0 in the middle of step KILL_STEP, and writes what it logged
(each call's data and step, and the longest hold of a log call) to RESULT_JSON.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

GEN_S, UPDATE_S = 1.2, 0.8


def worker(rank: int) -> None:
    import mstx_marks  # noqa: F401  (MSTX_MARKS_OUT: it records and spills from here on)
    from mstx_marks import mark

    slow = 1.0 + rank  # worker 1 takes twice as long per model step
    while True:
        with mark("generate_sequences"):
            for _ in range(3):
                with mark("decode_batch", args={"reqs": 2, "tokens": 2}):
                    time.sleep(0.04 * slow)
        time.sleep(0.1)


def trainer(result: str, steps: int, kill_step: int) -> None:
    import mstx_marks  # noqa: F401
    from mstx_marks import mark
    from mstx_marks.live.steps import LiveSteps

    live = LiveSteps(os.environ["MSTX_MARKS_OUT"], poll_s=0.1, settle_s=0.7, gone_s=3.0)
    workers = [
        subprocess.Popen(
            [sys.executable, __file__, "worker", str(rank)],
            env={**os.environ, "MSTX_MARKS_ROLE": "rollout", "RANK": str(rank)},
        )
        for rank in (0, 1)
    ]
    time.sleep(1.5)  # the workers import the library and start recording
    logged: list[tuple[dict[str, float], int]] = []
    try:
        for step in range(1, steps + 1):
            began = time.perf_counter()
            with mark("step"):
                with mark("gen"):
                    time.sleep(GEN_S / 2)
                    if step == kill_step:
                        os.kill(workers[0].pid, signal.SIGKILL)
                    time.sleep(GEN_S / 2)
                with mark("update_actor"):
                    time.sleep(UPDATE_S)
            data = {"timing_s/step": time.perf_counter() - began, "actor/loss": float(step)}
            logged += live.log(data, step)
        logged += live.finish()
    finally:
        for w in workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
        for w in workers:
            w.wait(timeout=30)
    with open(result, "w") as f:
        json.dump({"calls": logged, "hold_ns": live.hold_ns, "pid": os.getpid()}, f)


if __name__ == "__main__":
    if sys.argv[1] == "worker":
        worker(int(sys.argv[2]))
    else:
        trainer(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
