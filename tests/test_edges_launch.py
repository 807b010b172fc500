"""Issue 27: ``mstx-marks run`` and a command it cannot start (launch/launcher.py, cli/main.py):
one line on stderr and the shell's exit status, 126 (found, cannot run) or 127 (not found),
never an OSError traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest


def _launch(*command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("MSTX_MARKS_")}
    return subprocess.run(
        [sys.executable, "-m", "mstx_marks", "run", "--", *command],
        env=base,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def _script(folder: Path, text: str) -> str:
    path = folder / "job"
    path.write_text(text)
    path.chmod(0o755)
    return "./job"


def _not_executable(folder: Path, text: str) -> str:
    """A script without any execute bit (which root cannot run either: exec wants one bit).
    Where the file system keeps no modes (a bind mount from another OS shows every file as
    0777) it goes on tmpfs instead, so the case runs on every machine, as root too."""
    for where in (folder, Path("/dev/shm")):
        if not where.is_dir():
            continue
        path = Path(tempfile.mkdtemp(dir=where)) / "job"
        path.write_text(text)
        path.chmod(0o644)
        if not os.access(path, os.X_OK):
            return str(path)
    pytest.fail("no file system here keeps a file's modes: a 0644 file stays executable")


@pytest.mark.parametrize(
    ("case", "code", "words"),
    [
        ("no #! line", 126, "Exec format error (a script needs a #! line"),
        ("not executable", 126, "Permission denied"),
        ("a folder", 126, "Permission denied"),
        ("name too long", 127, "File name too long"),
        ("missing", 127, "command not found"),
        ("missing path", 127, "No such file or directory"),
    ],
)
def test_a_command_that_cannot_start_is_one_line_and_the_shells_status(
    tmp_path: Path, case: str, code: int, words: str
) -> None:
    if case == "no #! line":
        command = _script(tmp_path, "echo from a script without its first line\n")
    elif case == "not executable":
        command = _not_executable(tmp_path, "#!/bin/sh\necho hi\n")
    elif case == "a folder":
        (tmp_path / "folder").mkdir()
        command = "./folder"
    elif case == "name too long":
        command = "a" * 5000
    elif case == "missing":
        command = "no-such-program-here"
    else:
        command = "./no-such-script"
    proc = _launch(command, "arg", cwd=tmp_path)
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith("error: cannot run ") and words in line, line
    assert len(line) < 400  # a 5,000-character name is cut
