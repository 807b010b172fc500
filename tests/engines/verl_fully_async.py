"""Run inside the grpo venv: verl 0.9.1's fully async GRPO job
(``python -m verl.experimental.fully_async_policy.fully_async_main``) on CPU: the tiny job of
verl_grpo.py with the trainer (actor and reference, FSDP2 on gloo) and the rollouter (vLLM's
CPU build) in two resource pools of one logical GPU each. The rollouter feeds one prompt at a
time (``gen_batch_size=1``) into a message queue while the trainer takes 2 prompts (x n=2) per
update and pushes its weights after every update (``trigger_parameter_sync_step=1``): 6 prompts
make 3 trainer steps, and the rollouter may run one step's samples ahead
(``staleness_threshold=1``). Weights go through the ``file`` checkpoint engine
(tests/support/grpo/file_checkpoint_engine.py), as in verl_one_step_off.py.

Marked only by the caller's environment (``MSTX_MARKS_*``, passed to Ray's workers); bounded and
cleaned up after, its result written as JSON: see verl_job.py.

usage: python verl_fully_async.py WORK_DIR RESULT_JSON [TIMEOUT_S]
"""

from __future__ import annotations

import sys
from pathlib import Path

import verl_job

STEPS = 3
PROMPTS_PER_STEP = 2


def overrides(inputs: Path, work: Path, ray_tmp: Path) -> list[str]:
    return verl_job.tiny_overrides(
        inputs,
        work,
        ray_tmp,
        STEPS,
        [
            "trainer.experiment_name=fully_async_cpu",
            *verl_job.disaggregated(work),
            "data.train_batch_size=0",
            "data.gen_batch_size=1",
            f"rollout.total_rollout_steps={STEPS * PROMPTS_PER_STEP}",
            f"{verl_job.ACTOR}.ppo_mini_batch_size={PROMPTS_PER_STEP}",
            # A step's 4 samples are one micro-batch (its size must divide them).
            f"{verl_job.ACTOR}.ppo_micro_batch_size_per_gpu={PROMPTS_PER_STEP * 2}",
            f"{verl_job.REF}.log_prob_micro_batch_size_per_gpu={PROMPTS_PER_STEP * 2}",
            f"{verl_job.ROLLOUT}.log_prob_micro_batch_size_per_gpu={PROMPTS_PER_STEP * 2}",
            "async_training.trigger_parameter_sync_step=1",
            "async_training.require_batches=1",
            # Up to one step's samples ahead of the trainer: the rollout of step N+1 runs while
            # step N trains (0.1, the default, leaves 2 x 1.1 = 2 samples: none ahead).
            "async_training.staleness_threshold=1",
            # Logical CPUs: the trainer and the rollouter actors ask for 10 each.
            "ray_kwargs.ray_init.num_cpus=48",
        ],
    )


if __name__ == "__main__":
    sys.exit(
        verl_job.main(
            "verl.experimental.fully_async_policy.fully_async_main",
            overrides,
            sys.argv[1:],
            verl_job.grpo_on_path(),
        )
    )
