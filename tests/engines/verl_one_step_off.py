"""Run inside the grpo venv: verl 0.9.1's one-step-off GRPO job
(``python -m verl.experimental.one_step_off_policy.main_ppo``) on CPU: the tiny job of
verl_grpo.py, 3 steps, with the trainer (actor and reference, FSDP2 on gloo) and the rollout
(vLLM's CPU build) in two resource pools of one logical GPU each
(``actor_rollout_ref.hybrid_engine=False``). Step N's training runs while the rollout of step
N+1 generates; each step then pushes the actor's weights to the rollout through a checkpoint
engine: ``file`` (tests/support/grpo/file_checkpoint_engine.py, on the workers' ``PYTHONPATH``),
as none of verl's disaggregated backends runs without an accelerator.

``algorithm.rollout_correction.bypass_mode=False``: the trainer recomputes the old log-probs
(its ``old_log_prob`` stage) rather than taking the rollout's, as the colocated job does.

Marked only by the caller's environment (``MSTX_MARKS_*``, passed to Ray's workers); bounded and
cleaned up after, its result written as JSON: see verl_job.py.

usage: python verl_one_step_off.py WORK_DIR RESULT_JSON [TIMEOUT_S]
"""

from __future__ import annotations

import sys
from pathlib import Path

import verl_job

STEPS = 3


def overrides(inputs: Path, work: Path, ray_tmp: Path) -> list[str]:
    changes = [
        # Its config names ppo_trainer's folder relative to a verl checkout (file://verl/...):
        # installed verl has it as a package.
        "hydra.searchpath=[pkg://verl.trainer.config]",
        "trainer.experiment_name=one_step_off_cpu",
        *verl_job.disaggregated(work),
        "algorithm.rollout_correction.bypass_mode=False",
    ]
    return verl_job.tiny_overrides(inputs, work, ray_tmp, STEPS, changes)


if __name__ == "__main__":
    sys.exit(
        verl_job.main(
            "verl.experimental.one_step_off_policy.main_ppo",
            overrides,
            sys.argv[1:],
            verl_job.grpo_on_path(),
        )
    )
