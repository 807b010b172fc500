"""verl 0.9.1's fully async GRPO job on this CPU machine, marked from the environment alone.

``python -m verl.experimental.fully_async_policy.fully_async_main`` (tests/engines/
verl_fully_async.py) runs the tiny random Qwen2 of tests/test_real_grpo.py with the trainer
(``FullyAsyncTrainer``, an FSDP2 actor and reference in one WorkerDict) and the rollouter
(``FullyAsyncRollouter``, vLLM's CPU build behind its server actor) on separate resource pools.
The rollouter streams one prompt at a time through a message queue, up to one step's samples
ahead of the trainer; the trainer takes 2 prompts (x n=2) per update and pushes its weights
after every update (``timing_s/param_sync``: the actor sends, the rollout's
CheckpointEngineWorker receives through the file checkpoint engine, the vLLM server pauses
around it). 6 prompts make 3 trainer steps; weight syncs: one before training, one per step.

One marked run (``MSTX_MARKS_INSTRUMENT=verl,vllm`` and ``MSTX_MARKS_OUT``), about 4 minutes,
shared by the tests. ``GRPO_TEST_DIR=<folder>`` runs it there instead (kept afterwards).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support import background
from support.grpo_job import MarkedRun, cli, marked_run, overlap_ns

JOB_TIMEOUT_S = 900  # about 220 s on an idle machine
STEPS = [1, 2, 3]
PROMPTS = 6
N = 2
SYNCS = len(STEPS) + 1
_TRAINER_STEP = re.compile(r"\[FullyAsyncTrainer\] global_steps: (\d+) ")


@background.run()
def run(tmp_path_factory: pytest.TempPathFactory) -> background.Planned[MarkedRun]:
    return marked_run(tmp_path_factory, "fully-async-marked", "verl_fully_async.py", JOB_TIMEOUT_S)


def test_every_trainer_step_finishes(run: MarkedRun) -> None:
    assert run.job.result["rc"] == 0 and not run.job.result["timed_out"], run.job.result
    assert [int(s) for s in _TRAINER_STEP.findall(run.job.log)] == STEPS, run.job.result["log"]


def test_no_process_or_shared_memory_is_left(run: MarkedRun) -> None:
    assert run.job.result["killed_after_grace"] == [], run.job.result
    assert [p for p in run.job.result["shm_removed"] if Path(p).exists()] == [], run.job.result


def test_trainer_timers_in_the_fully_async_trainer(run: MarkedRun) -> None:
    trainer = run.one("FullyAsyncTrainer")
    once = ("ref", "adv", "update_actor")
    assert {t: trainer.names[t] for t in once} == dict.fromkeys(once, len(STEPS)), trainer.names
    assert trainer.names["timing_s/param_sync"] == SYNCS, trainer.names
    # It opens one more step than it finishes: that one ends on the queue's end signal.
    assert trainer.names["step"] in (len(STEPS), len(STEPS) + 1), trainer.names


def test_worker_stages_in_the_fsdp_worker(run: MarkedRun) -> None:
    worker = run.one("WorkerDict")
    assert worker.names["compute_ref_log_prob"] == len(STEPS), worker.names
    assert worker.names["update_actor"] == len(STEPS), worker.names


def test_the_rollouter_generates_and_scores_each_prompt(run: MarkedRun) -> None:
    assert run.one("AgentLoopWorker").names["generate_sequences"] == PROMPTS
    assert run.one("RewardLoopWorker").names["compute_score"] == PROMPTS * N
    assert run.one("EngineCore").names["vllm_one_step"] > 0
    assert run.one("VllmWorker").names["decode_batch"] > 0


def test_the_rollout_runs_while_the_trainer_trains(run: MarkedRun) -> None:
    generations = run.one("AgentLoopWorker").spans["generate_sequences"]
    trainer = run.one("FullyAsyncTrainer").spans
    training = trainer["ref"] + trainer["update_actor"]
    assert any(overlap_ns(g, t) > 0 for g in generations for t in training), (generations, trainer)


def test_each_side_of_the_weight_sync_once_per_sync(run: MarkedRun) -> None:
    assert run.one("WorkerDict").names["actor_send_weights"] == SYNCS
    assert run.one("CheckpointEngineWorker").names["rollout_receive_weights"] == SYNCS
    server = run.one("vLLMHttpServer")
    assert server.names["rollout_pause"] == SYNCS, server.names
    assert server.names["rollout_resume"] == SYNCS, server.names


def test_coverage_of_a_fully_async_job_with_vllm(run: MarkedRun) -> None:
    done = cli(run.python, "coverage", run.out, "--expect", "verl-fully-async+vllm")
    assert done.returncode == 0, done.stdout + done.stderr
