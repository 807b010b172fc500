"""Start-up hook that ``mstx-marks run`` puts first on ``PYTHONPATH``: every Python process
started under the launcher (multiprocessing spawn children, torchrun ranks, a local Ray
cluster's workers, vLLM's EngineCore) activates mstx_marks from the environment, the way
coverage.py's process-startup hook does. Then the ``sitecustomize`` this file shadows, if any,
runs as it would have, and is what ``import sitecustomize`` gives from then on.

A user's ``sitecustomize`` runs once in the command's interpreter. ``mstx-marks run`` is itself
a Python program that replaces itself with the command (same pid), so its own interpreter ran
that file at its start-up too, as every Python program on that path does."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys


def _run_shadowed() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    # It is the program's `sitecustomize`: a later `import sitecustomize` must give it, not us.
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def _activate() -> None:
    try:
        from mstx_marks.launch.activate import activate
    except ImportError:  # an interpreter without mstx_marks (another venv): nothing to do
        return
    activate()


_activate()
_run_shadowed()
