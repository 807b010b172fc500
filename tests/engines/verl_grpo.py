"""Run inside the grpo venv: a real verl 0.9.1 GRPO job (``python -m verl.trainer.main_ppo``) on
CPU, with vLLM's CPU build as the rollout engine, on a tiny random Qwen2: 2 steps, batch 4 x n=2,
prompt 64 / response 16 tokens, actor and rollout colocated on one logical GPU.

Marked only by the caller's environment (``MSTX_MARKS_*``, passed to Ray's workers); bounded and
cleaned up after, its result written as JSON: see verl_job.py, shared with the other runners.

usage: python verl_grpo.py WORK_DIR RESULT_JSON [TIMEOUT_S]
"""

from __future__ import annotations

import sys
from pathlib import Path

import verl_job

STEPS = 2


def overrides(inputs: Path, work: Path, ray_tmp: Path) -> list[str]:
    return verl_job.tiny_overrides(
        inputs, work, ray_tmp, STEPS, ["trainer.experiment_name=grpo_cpu"]
    )


if __name__ == "__main__":
    sys.exit(verl_job.main("verl.trainer.main_ppo", overrides, sys.argv[1:]))
