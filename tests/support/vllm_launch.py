"""Launches of vLLM's CPU build (``tests/engines/vllm_generate.py``) on the session's tiny Llama:
the runs of tests/test_engine_vllm.py and tests/test_engine_vllm_batch_queue.py, planned for
the background (background.py).

The tiny model is built once per session and venv, by the first launch planned (the launches
run one after another, in the order they were planned, in the background as inline).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Optional

import pytest

from .background import Command
from .engine_run import clean_env, scenario

LAUNCH_TIMEOUT_S = 300
BUILD_TIMEOUT_S = 300
VLLM_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB; without it the worker takes most of the RAM
    "VLLM_ENABLE_V1_MULTIPROCESSING": "1",  # the default, said out loud
}
TINY_LLM = Path(__file__).resolve().with_name("tiny_llm.py")

_models: dict[Path, Path] = {}  # a venv's python -> its tiny model's folder, this session


def launch_commands(
    python: Path,
    factory: pytest.TempPathFactory,
    where: Path,
    settings: Optional[Mapping[str, str]],
    extra_env: Optional[Mapping[str, str]] = None,
) -> list[Command]:
    """The commands of one launch in the folder ``where``: the tiny model's build when no launch
    planned before has it, then the script (writing ``where/result.json``). ``settings``
    (``MSTX_MARKS_*``, with ``MSTX_MARKS_OUT`` the folder's ``out``) and ``extra_env`` go into
    its environment; ``settings`` None: no MSTX_MARKS_* variable."""
    commands = []
    model = _models.get(python)
    if model is None:
        model = _models[python] = factory.mktemp("tiny-llama")
        build = Command(
            argv=(str(python), str(TINY_LLM), str(model)), env=clean_env(),
            cwd=model.parent, timeout=BUILD_TIMEOUT_S,
            output=model.with_name(model.name + ".out"), label="tiny_llm.py",
        )  # fmt: skip
        commands.append(build)
    env = clean_env(**VLLM_ENV, **(extra_env or {}))
    if settings is not None:
        env.update(MSTX_MARKS_OUT=str(where / "out"), **settings)
    result = where / "result.json"
    commands.append(
        scenario(
            python, "vllm_generate.py", [model, result], env, timeout=LAUNCH_TIMEOUT_S, cwd=where
        )
    )
    return commands
