"""Run inside the grpo venv: a real verl job of verl_grpo.py or verl_one_step_off.py (``JOB``:
``grpo`` or ``one_step_off``) whose trainer logs to verl's ``console``, ``file`` and
``tensorboard`` loggers (the grpo venv's spec holds the ``tensorboard`` package that
``torch.utils.tensorboard`` needs): the file logger's JSON lines (``VERL_FILE_LOGGER_PATH``) and
the tensorboard event files (``TENSORBOARD_DIR``) under WORK_DIR, where tests/test_live_grpo.py
reads them back. ``MSTX_MARKS_LIVE``, when set, goes to Ray's workers with the other variables.

usage: JOB=grpo python verl_live.py WORK_DIR RESULT_JSON [TIMEOUT_S]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import verl_job

JOBS = {
    "grpo": ("verl_grpo", "verl.trainer.main_ppo"),
    "one_step_off": ("verl_one_step_off", "verl.experimental.one_step_off_policy.main_ppo"),
}
#: verl's loggers the trainer logs to.
LOGGERS = ("console", "file", "tensorboard")


def main(argv: list[str]) -> int:
    runner, module = JOBS[os.environ.get("JOB", "grpo")]
    job = __import__(runner)
    work = Path(argv[0])
    logs = {
        "VERL_FILE_LOGGER_PATH": str(work / "metrics.jsonl"),
        "TENSORBOARD_DIR": str(work / "tensorboard"),
    }
    passed = dict(logs)
    if os.environ.get("MSTX_MARKS_LIVE"):
        passed["MSTX_MARKS_LIVE"] = os.environ["MSTX_MARKS_LIVE"]

    def overrides(inputs: Path, work: Path, ray_tmp: Path) -> list[str]:
        found = list(job.overrides(inputs, work, ray_tmp))
        found = [a for a in found if not a.startswith("trainer.logger=")]
        found.append(f"trainer.logger=[{','.join(LOGGERS)}]")
        for name, value in passed.items():
            found.append(
                f"+ray_kwargs.ray_init.runtime_env.env_vars.{name}={verl_job.quoted(value)}"
            )
        return found

    env = {**logs, **(verl_job.grpo_on_path() if runner == "verl_one_step_off" else {})}
    return verl_job.main(module, overrides, argv, env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
