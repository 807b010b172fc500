"""verl 0.9.1's one-step-off GRPO job on this CPU machine, marked from the environment alone.

``python -m verl.experimental.one_step_off_policy.main_ppo`` trains the tiny random Qwen2 of
tests/test_real_grpo.py for 3 steps with the trainer (an FSDP2 actor and reference on gloo, one
WorkerDict) and the rollout (vLLM's CPU build: its server actor, EngineCore and worker) on
separate resource pools (``hybrid_engine=False``). Each step N waits for the rollout launched in
step N-1 (``gen``), pushes the actor's weights to the rollout (``sync_rollout_weights``: the
actor sends, the rollout's CheckpointEngineWorker receives, the vLLM server pauses and resumes
around it), launches the rollout of step N+1 (``generate_async``) and trains while it generates.
Weights go through files (tests/support/grpo/file_checkpoint_engine.py): verl's own
disaggregated checkpoint engines all need an accelerator's libraries.

One marked run (``MSTX_MARKS_INSTRUMENT=verl,vllm`` and ``MSTX_MARKS_OUT``, in the driver's
environment and Ray's ``runtime_env.env_vars``), about 3-6 minutes, shared by the tests
(tests/engines/verl_one_step_off.py). ``GRPO_TEST_DIR=<folder>`` runs it there instead of
pytest's temporary folder (kept afterwards).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.engine_run import MODEL_STEP_KINDS
from support.grpo_job import MarkedRun, cli, overlap_ns

STEPS = [1, 2, 3]
#: Weight syncs: one before training, then one in every step.
SYNCS = len(STEPS) + 1
#: The one-step-off trainer's timers, in its TaskRunner: once per step each.
TRAINER_TIMERS = (
    "step",
    "gen",
    "generate_async",
    "sync_rollout_weights",
    "old_log_prob",
    "ref",
    "adv",
    "update_actor",
)
#: verl's annotated worker stages (0.9.1 marker text, and the canonical names), in the WorkerDict.
WORKER_STAGES = {
    "actor_compute_log_prob": ("actor_compute_log_prob", "compute_log_prob"),
    "ref_compute_log_prob": ("ref_compute_log_prob", "compute_ref_log_prob"),
    "actor_update": ("actor_update", "update_actor"),
}


@pytest.fixture(scope="module")
def run(one_step_off_marked: MarkedRun) -> MarkedRun:
    """The session's marked one-step-off run (tests/support/grpo_runs.py), shared with
    tests/test_live_grpo.py."""
    return one_step_off_marked


def test_every_step_finishes(run: MarkedRun) -> None:
    assert run.job.result["rc"] == 0 and not run.job.result["timed_out"], run.job.result
    assert run.job.steps == STEPS, run.job.result["log"]
    assert len(run.job.step_times()) == len(STEPS)


def test_no_process_or_shared_memory_is_left(run: MarkedRun) -> None:
    assert run.job.result["killed_after_grace"] == [], run.job.result
    assert [p for p in run.job.result["shm_removed"] if Path(p).exists()] == [], run.job.result


def test_trainer_timers_once_per_step(run: MarkedRun) -> None:
    runner = run.one("OneStepTaskRunner")
    assert {t: runner.names[t] for t in TRAINER_TIMERS} == dict.fromkeys(
        TRAINER_TIMERS, len(STEPS)
    ), runner.names
    # The trainer's own weight-sync timer: before training, then inside sync_rollout_weights.
    assert runner.names["update_weights"] == SYNCS, runner.names


def test_worker_stages_in_the_fsdp_worker(run: MarkedRun) -> None:
    worker = run.one("WorkerDict")
    seen = {stage: sum(worker.names[n] for n in names) for stage, names in WORKER_STAGES.items()}
    assert seen == dict.fromkeys(WORKER_STAGES, len(STEPS)), worker.names


def test_model_steps_in_vllms_engine_core_and_worker(run: MarkedRun) -> None:
    engine = run.one("EngineCore")
    worker = run.one("VllmWorker")
    assert engine.names["vllm_one_step"] > 0, engine.names
    kinds = sum(worker.names[k] for k in MODEL_STEP_KINDS)
    assert 0 < kinds <= engine.names["vllm_one_step"], (engine.names, worker.names)
    assert worker.names["decode_batch"] > 0, worker.names


def test_generation_of_the_next_step_overlaps_training(run: MarkedRun) -> None:
    """The rollout consumed by step N+1 generates (agent loop's ``generate_sequences``) while
    step N computes its log-probs (``old_log_prob``, ``ref``): the point of the mode."""
    generations = run.one("AgentLoopWorker").spans["generate_sequences"]
    runner = run.one("OneStepTaskRunner")
    assert len(generations) == len(STEPS), generations
    training = list(zip(runner.spans["old_log_prob"], runner.spans["ref"]))
    assert len(training) == len(STEPS), runner.spans
    # generations[n] is consumed by step n+1; generations[0] is launched before step 1.
    for step, (old_log_prob, ref) in enumerate(training[:-1], start=1):
        following = generations[step]
        shared = overlap_ns(following, old_log_prob) + overlap_ns(following, ref)
        assert shared > 0, (step, following, old_log_prob, ref)
    # ... and never in the last step, which launches no rollout.
    last = training[-1]
    assert all(overlap_ns(g, last[0]) + overlap_ns(g, last[1]) == 0 for g in generations)


def test_the_actor_sends_the_weights_once_per_sync(run: MarkedRun) -> None:
    assert run.one("WorkerDict").names["actor_send_weights"] == SYNCS


def test_the_rollout_receives_the_weights_once_per_sync(run: MarkedRun) -> None:
    receiver = run.one("CheckpointEngineWorker")
    assert receiver.names["rollout_receive_weights"] == SYNCS, receiver.names


def test_the_vllm_server_pauses_and_resumes_once_per_sync(run: MarkedRun) -> None:
    server = run.one("vLLMHttpServer")
    assert server.names["rollout_pause"] == SYNCS, server.names
    assert server.names["rollout_resume"] == SYNCS, server.names
    # Each pause ends before its resume starts: the sync lies between them.
    for pause, resume in zip(server.spans["rollout_pause"], server.spans["rollout_resume"]):
        assert pause[1] <= resume[0], (pause, resume)


def test_each_side_of_a_sync_runs_inside_the_trainers_sync(run: MarkedRun) -> None:
    syncs = run.one("OneStepTaskRunner").spans["update_weights"]
    sides = (
        run.one("WorkerDict").spans["actor_send_weights"],
        run.one("CheckpointEngineWorker").spans["rollout_receive_weights"],
    )
    for side in sides:
        assert len(side) == len(syncs) == SYNCS, (side, syncs)
        for inner, outer in zip(side, syncs):
            assert overlap_ns(inner, outer) == inner[1] - inner[0], (inner, outer)


def test_coverage_of_a_one_step_off_job_with_vllm(run: MarkedRun) -> None:
    done = cli(run.python, "coverage", run.out, "--expect", "verl-async+vllm")
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_last_step_survives_ray_shutdown_in_every_worker(run: MarkedRun) -> None:
    """Ray ends its actors at the job's end: each one's last ranges must be in its spill."""
    last = {
        "OneStepTaskRunner": (("step",), len(STEPS)),
        "WorkerDict": (WORKER_STAGES["actor_update"], len(STEPS)),
        "AgentLoopWorker": (("generate_sequences",), len(STEPS)),
        "CheckpointEngineWorker": (("rollout_receive_weights",), SYNCS),
        "vLLMHttpServer": (("rollout_pause",), SYNCS),
    }
    counts = {role: sum(run.one(role).names[n] for n in names) for role, (names, _) in last.items()}
    assert counts == {role: count for role, (_, count) in last.items()}
