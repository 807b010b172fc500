"""Run commands one after another, each bounded and in a session of its own; the runner of
tests/support/background.py, and the one way a scenario command is run (inline too).

    python background_runner.py PLAN.json PARENT_PID

PLAN.json holds ``{"jobs": [{"commands": [COMMAND, ...], "status": PATH}, ...]}``, a COMMAND
being ``{"argv", "env", "cwd", "timeout", "output"}``. For each job, in order, the commands run
in order (the rest of a job is skipped once one fails); then the job's status is written to its
PATH, atomically: ``{"ran": [{"returncode", "timed_out", "wall_s"}, ...]}``. Standard library
only: it runs with the test process's python before anything else is imported.

The runner ends, killing the command it runs and that command's process group, on SIGTERM or
SIGINT, and when PARENT_PID (the process that started it) is no longer its parent: a killed
pytest leaves nothing running.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

POLL_S = 1.0


def run_command(
    command: Mapping[str, Any], stop: Callable[[], bool] = lambda: False
) -> dict[str, Any]:
    """Run one COMMAND with its output (stdout and stderr) in its ``output`` file; kill its
    process group on its timeout or when ``stop()`` says so (checked every second)."""
    started = time.monotonic()
    with open(command["output"], "w") as output:
        proc = subprocess.Popen(
            list(command["argv"]), env=dict(command["env"]), cwd=command["cwd"],
            stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
            start_new_session=True,  # a timeout kills the whole group: vLLM's, a local Ray's
        )  # fmt: skip
    timed_out = False
    try:
        while True:
            try:
                proc.wait(timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                timed_out = time.monotonic() - started > float(command["timeout"])
                if timed_out or stop():
                    break
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return {
        "returncode": proc.returncode,
        "timed_out": timed_out,
        "wall_s": round(time.monotonic() - started, 1),
    }


def _write_atomically(path: Path, data: object) -> None:
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(data))
    os.replace(part, path)


def main(plan_path: str, parent_pid: str) -> int:
    plan = json.loads(Path(plan_path).read_text())
    parent = int(parent_pid)  # not getppid(): the parent may be gone before this line
    stopping: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        stopping.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def stop() -> bool:
        return bool(stopping) or os.getppid() != parent

    for job in plan["jobs"]:
        ran = []
        for command in job["commands"]:
            if stop():
                return 1
            ran.append(run_command(command, stop))
            if ran[-1]["returncode"] != 0:
                break
        if stop():
            return 1
        _write_atomically(Path(job["status"]), {"ran": ran})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
