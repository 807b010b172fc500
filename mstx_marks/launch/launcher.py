"""``mstx-marks run [OPTIONS] -- CMD ARGS...``: run a command with every Python process under it
activated from the environment (:mod:`mstx_marks.launch.activate`).

The options only set the ``MSTX_MARKS_*`` variables (``--instrument`` is
``MSTX_MARKS_INSTRUMENT``, ...); the launcher puts its start-up hook first on ``PYTHONPATH`` and
replaces itself with the command, so signals and the exit status are the command's own. Child
processes inherit the environment, so each Python process started under it activates: torchrun
ranks, multiprocessing spawn children, a local Ray cluster's workers, vLLM's EngineCore.

>>> env = launch_env({"PYTHONPATH": "/opt/lib"}, {"MSTX_MARKS_OUT": "prof"})
>>> env["PYTHONPATH"].split(os.pathsep)[0].endswith("_startup")
True
>>> env["MSTX_MARKS_OUT"] == os.path.abspath("prof")  # the job's processes may change folder
True
>>> launch_env({"PYTHONPATH": ":/opt/lib"}, {})["PYTHONPATH"].split(os.pathsep)[1:]
['', '/opt/lib']
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NoReturn

from mstx_marks.base import env

__all__ = ["STARTUP_DIR", "CannotRun", "launch_env", "run"]

#: The folder holding the start-up ``sitecustomize.py``.
STARTUP_DIR = str(Path(__file__).resolve().parent / "_startup")


def launch_env(base: Mapping[str, str], settings: Mapping[str, str]) -> dict[str, str]:
    """``base`` with ``settings`` set and the start-up hook first on ``PYTHONPATH``."""
    out = dict(base)
    out.update(settings)
    if out.get(env.OUT, "").strip():
        # Resolved here, once: every process of the job then writes to the same folder,
        # whatever folder it starts in or moves to.
        out[env.OUT] = os.path.abspath(out[env.OUT].strip())
    # One run id for every process of the job: made here, inherited by all of them.
    out.setdefault(env.RUN, env.run_id())
    given = out.get("PYTHONPATH", "")
    # An empty entry is the current folder (`PYTHONPATH=:lib`): keep it, or a program importing
    # its own module would fail under the launcher only. An empty value adds nothing.
    paths = [p for p in given.split(os.pathsep) if p != STARTUP_DIR] if given else []
    out["PYTHONPATH"] = os.pathsep.join([STARTUP_DIR, *paths])
    return out


class CannotRun(Exception):
    """The command could not be started: ``code`` is the shell's exit status for it (127: not
    found, 126: found but it cannot run), the message one line saying why."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


#: What a shell exits with when the command is not found; anything else that stops exec is 126.
_NOT_FOUND = (errno.ENOENT, errno.ENOTDIR, errno.ENAMETOOLONG)


def run(command: Sequence[str], settings: Mapping[str, str]) -> NoReturn:
    """Replace this process by ``command`` under the launcher's environment. Returns never;
    raises :class:`CannotRun` when the command cannot be started, as a shell would say it.

    >>> try:
    ...     run(["/no/such/program"], {})
    ... except CannotRun as e:
    ...     print(e.code, e)
    127 cannot run '/no/such/program': No such file or directory
    """
    if not command:
        raise ValueError("no command given: mstx-marks run [OPTIONS] -- CMD ARGS...")
    try:
        program = shutil.which(command[0]) or command[0]
        os.execvpe(program, list(command), launch_env(os.environ, settings))
    except OSError as exc:
        code = 127 if exc.errno in _NOT_FOUND else 126
        raise CannotRun(
            code, f"cannot run {env.quoted(command[0])}: {_why(exc, command[0])}"
        ) from None


def _why(exc: OSError, name: str) -> str:
    reason = exc.strerror or type(exc).__name__
    if exc.errno == errno.ENOENT and "/" not in name:
        return "command not found"
    if exc.errno == errno.ENOEXEC:  # a script without its #! line, or another machine's binary
        return f"{reason} (a script needs a #! line naming its interpreter)"
    return reason
