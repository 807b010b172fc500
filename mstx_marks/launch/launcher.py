"""``mstx-marks run [OPTIONS] -- CMD ARGS...``: run a command with every Python process under it
activated from the environment (:mod:`mstx_marks.launch.activate`).

The options only set the ``MSTX_MARKS_*`` variables (``--instrument`` is
``MSTX_MARKS_INSTRUMENT``, ...); the launcher puts its start-up hook first on ``PYTHONPATH`` and
replaces itself with the command, so signals and the exit status are the command's own. Child
processes inherit the environment, so each Python process started under it activates: torchrun
ranks, multiprocessing spawn children, a local Ray cluster's workers, vLLM's EngineCore.

>>> env = launch_env({"PYTHONPATH": "/opt/lib"}, {"MSTX_MARKS_OUT": "prof"})
>>> env["PYTHONPATH"].split(os.pathsep)[0].endswith("_startup"), env["MSTX_MARKS_OUT"]
(True, 'prof')
>>> launch_env({"PYTHONPATH": ":/opt/lib"}, {})["PYTHONPATH"].split(os.pathsep)[1:]
['', '/opt/lib']
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from mstx_marks.base import env

__all__ = ["STARTUP_DIR", "launch_env", "run"]

#: The folder holding the start-up ``sitecustomize.py``.
STARTUP_DIR = str(Path(__file__).resolve().parent / "_startup")


def launch_env(base: Mapping[str, str], settings: Mapping[str, str]) -> dict[str, str]:
    """``base`` with ``settings`` set and the start-up hook first on ``PYTHONPATH``."""
    out = dict(base)
    out.update(settings)
    # One run id for every process of the job: made here, inherited by all of them.
    out.setdefault(env.RUN, env.run_id())
    given = out.get("PYTHONPATH", "")
    # An empty entry is the current folder (`PYTHONPATH=:lib`): keep it, or a program importing
    # its own module would fail under the launcher only. An empty value adds nothing.
    paths = [p for p in given.split(os.pathsep) if p != STARTUP_DIR] if given else []
    out["PYTHONPATH"] = os.pathsep.join([STARTUP_DIR, *paths])
    return out


def run(command: Sequence[str], settings: Mapping[str, str]) -> int:
    """Replace this process by ``command`` under the launcher's environment. Returns only on
    failure to start it: 127 (not found) or 126 (not executable), as a shell would."""
    if not command:
        raise ValueError("no command given: mstx-marks run [OPTIONS] -- CMD ARGS...")
    program = shutil.which(command[0]) or command[0]
    env = launch_env(os.environ, settings)
    try:
        os.execvpe(program, list(command), env)
    except FileNotFoundError:
        return 127
    except PermissionError:
        return 126
    return 0  # not reached: exec does not return
