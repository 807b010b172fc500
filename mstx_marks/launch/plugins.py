"""The frameworks' plugin entry points (declared in pyproject.toml): each activates mstx_marks
from the environment in the process the framework loads it in (see
:mod:`mstx_marks.launch.activate`).

- ``vllm.general_plugins`` -> :func:`vllm`: vLLM calls it in the front end, in each EngineCore
  process (before ``EngineCore.step`` is bound) and in each worker process;
- ``sglang.srt.plugins`` -> :func:`sglang`: SGLang calls it first thing in its scheduler
  process, where ``ModelRunner.forward`` runs;
- ``verl.plugins`` -> this module: verl (0.9.0+) only imports it, while ``verl/__init__`` is
  still running, so the work happens at import (and patches wait for their modules).

With no ``MSTX_MARKS_*`` variable set, loading any of them changes nothing.
"""

from __future__ import annotations

from mstx_marks.launch.activate import activate

__all__ = ["sglang", "vllm"]


def vllm() -> None:
    """``vllm.general_plugins`` entry point."""
    activate()


def sglang() -> None:
    """``sglang.srt.plugins`` entry point."""
    activate()


# verl.plugins: verl calls ep.load() and never the object, so importing must do the work.
activate()
