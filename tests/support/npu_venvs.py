"""The vllm-ascend engine venvs (vLLM's CPU build, vllm-ascend), for ``tests/test_vllm_ascend.py``.

``ascend_python(line)`` (``line`` "0.23" or "0.11") is the python of engine venv
``vllm-ascend-<line>`` (``engine_venvs.py``, built on first use) with this repository installed
and vllm-ascend in it; it skips the test, with the reason, when that cannot be had.

vllm-ascend 0.11.0 is a wheel, installed by the spec. 0.23.0.post1 is on PyPI as an sdist only,
and its ``setup.py`` builds only with ``COMPILE_CUSTOM_KERNELS=0`` (no CANN to compile its
kernels with) and ``SOC_VERSION`` set (no ``npu-smi`` to ask): a spec's pip steps take no
environment, so it is added here, once per venv (a stamp file), with ``--no-deps`` and the
venv's own setuptools-scm (``--no-build-isolation``: its build requirements name torch-npu and a
CUDA torch). About 5 s, plus the 15 MB download.

Pre-build (both venvs, vllm-ascend included)::

    python tests/support/npu_venvs.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

if __package__:
    from . import engine_venvs
else:  # run as a script
    import engine_venvs  # type: ignore[no-redef]

#: The venv of each vllm-ascend line.
VENVS = {"0.23": "vllm-ascend-0.23", "0.11": "vllm-ascend-0.11"}
#: What a venv's spec cannot install: the requirement, and the environment its build needs.
SDISTS: dict[str, tuple[str, dict[str, str]]] = {
    "vllm-ascend-0.23": (
        "vllm-ascend==0.23.0.post1",
        # No custom kernels; an Atlas A2 (the SoC only names the build's device type, A2).
        {"COMPILE_CUSTOM_KERNELS": "0", "SOC_VERSION": "ascend910b1"},
    ),
}
STEP_TIMEOUT_S = 1200.0


def add_vllm_ascend(python: Path, name: str) -> None:
    """Install the sdist of venv ``name`` (:data:`SDISTS`) into ``python``'s venv, once.
    Raises ``engine_venvs.EngineVenvError`` (with the log's tail) when it fails."""
    if name not in SDISTS:
        return
    requirement, build_env = SDISTS[name]
    venv = Path(python).parent.parent
    stamp = venv / "mstx_marks-vllm-ascend.stamp"
    if stamp.is_file() and stamp.read_text() == requirement:
        return
    with engine_venvs._locked(venv / "mstx_marks-vllm-ascend.lock"):
        if stamp.is_file() and stamp.read_text() == requirement:
            return
        log_path = venv / "mstx_marks-vllm-ascend.log"
        cmd = [str(python), "-m", "pip", "install", "--no-deps", "--no-build-isolation",
               "--no-input", requirement]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(build_env)
        with open(log_path, "w") as log:
            log.write(f"$ {' '.join(f'{k}={v}' for k, v in build_env.items())} {' '.join(cmd)}\n")
            log.flush()
            try:
                proc = subprocess.run(
                    cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env=env, timeout=STEP_TIMEOUT_S, check=False,
                )  # fmt: skip
                failed = None if proc.returncode == 0 else f"exit code {proc.returncode}"
            except subprocess.TimeoutExpired:
                failed = f"no end after {STEP_TIMEOUT_S:.0f} s"
        if failed is not None:
            raise engine_venvs.EngineVenvError(
                f"`{' '.join(cmd)}` failed ({failed}); log: {log_path}\n"
                f"{engine_venvs._tail(log_path)}"
            )
        stamp.write_text(requirement)


def ascend_venv(line: str) -> Path:
    """The python of the venv of vllm-ascend ``line``, built and completed if needed (raises
    ``engine_venvs.EngineVenvError``)."""
    name = VENVS[line]
    python = engine_venvs.engine_venv(name)
    add_vllm_ascend(python, name)
    return python


def ascend_python(line: str) -> Path:
    """:func:`ascend_venv` with this repository installed; skips the test if impossible."""
    import pytest

    try:
        python = ascend_venv(line)
        engine_venvs.install_self(python)
    except engine_venvs.EngineVenvError as ex:
        pytest.skip(f"the vllm-ascend {line} venv cannot be built here: {ex}")
    return python


def main(argv: Optional[list[str]] = None) -> int:
    lines = list(sys.argv[1:] if argv is None else argv) or sorted(VENVS)
    for line in lines:
        started = time.monotonic()
        try:
            python = ascend_venv(line)
        except (engine_venvs.EngineVenvError, KeyError) as ex:
            print(f"vllm-ascend {line}: FAILED: {ex}", file=sys.stderr)
            return 1
        print(f"vllm-ascend {line}: {python} ({time.monotonic() - started:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
