"""The frameworks' plugin entry points: each activates mstx_marks from the environment in the
process the framework loads it in (see :mod:`mstx_marks.launch.activate`).

The presets declare them (:func:`mstx_marks.capture.presets.entry_points`; pyproject.toml holds
the same, a test keeps the two equal):

- a framework that calls what it loads gets ``mstx_marks.launch.plugins:<preset>``: vLLM's
  ``vllm.general_plugins`` (in the front end, each EngineCore process before
  ``EngineCore.step`` is bound, each worker process) and SGLang's ``sglang.srt.plugins`` (first
  thing in its scheduler process, where ``ModelRunner.forward`` runs) load ``plugins:vllm`` and
  ``plugins:sglang``;
- one that only imports it (``verl.plugins``: verl 0.9.0+ imports it while ``verl/__init__`` is
  still running) gets this module, which does the work as it is imported (and the patches wait
  for their modules).

With no ``MSTX_MARKS_*`` variable set, loading any of them changes nothing.

>>> from mstx_marks.launch import plugins
>>> plugins.vllm is plugins.sglang
True
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from mstx_marks.base import env
from mstx_marks.launch.activate import activate

__all__: list[str] = []


_PRESETS_FOLDER = Path(__file__).resolve().parent.parent / "capture" / "presets"


def _loaded() -> None:
    """What a framework calls: activate, as this module's import already did."""
    activate()


def __getattr__(name: str) -> Callable[[], None]:
    # A preset's entry point `plugins:<name>`: found only when a framework loads it (PEP 562).
    # vLLM loads it in every process of every install, most with no MSTX_MARKS_* variable set:
    # there, where calling it does nothing, a preset module's file is all that is looked for
    # (a stat; importing the presets costs 43 ms); with a variable set, a declared entry point.
    if not name.isidentifier() or name.startswith("_"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if not env.any_set():
        if (_PRESETS_FOLDER / f"{name}.py").is_file():
            return _loaded
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from mstx_marks.capture.presets import entry_points

    if f"{__name__}:{name}" in entry_points().values():
        return _loaded
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# verl.plugins: verl calls ep.load() and never the object, so importing must do the work.
activate()
