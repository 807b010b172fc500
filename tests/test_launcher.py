"""``mstx-marks run -- CMD``: every Python process under the launcher activates from the
environment (here: a multiprocessing *spawn* child, which starts a fresh interpreter), the
shadowed sitecustomize still runs, and the command's exit status is the launcher's."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from mstx_marks.export.spill import read_spill
from mstx_marks.launch.launcher import STARTUP_DIR, launch_env

SCRIPT = """
import multiprocessing as mp
from mstx_marks import mark

def child():
    with mark("child_range"):
        pass

if __name__ == "__main__":
    with mark("parent_range"):
        ctx = mp.get_context("spawn")
        p = ctx.Process(target=child, name="worker0")
        p.start()
        p.join()
    raise SystemExit(p.exitcode)
"""


def _launch(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("MSTX_MARKS_")}
    return subprocess.run(
        [sys.executable, "-m", "mstx_marks", "run", *args],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )


def test_every_child_python_process_records(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(SCRIPT))
    out = tmp_path / "out"
    proc = _launch(tmp_path, "--out", str(out), "--", sys.executable, str(script))
    assert proc.returncode == 0, proc.stderr
    traces = [read_spill(p) for p in (out / "spill").glob("*.jsonl")]
    by_role = {t.role: [r.name for r in t.records] for t in traces}
    assert by_role == {"job": ["parent_range"], "worker0": ["child_range"]}


def test_the_shadowed_sitecustomize_still_runs(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "sitecustomize.py").write_text("import builtins\nbuiltins.MINE_RAN = True\n")
    code = (
        "import builtins, sys;"
        "print(getattr(builtins, 'MINE_RAN', False), sys.modules['sitecustomize'].__file__)"
    )
    proc = _launch(
        tmp_path, "--out", str(tmp_path / "o"), "--", sys.executable, "-c", code,
        env={"PYTHONPATH": str(mine)},
    )  # fmt: skip
    ran, module_file = proc.stdout.split()
    # it ran, and `sitecustomize` is the user's module from then on, not our start-up hook
    assert ran == "True" and module_file == str(mine / "sitecustomize.py")


def test_the_exit_status_is_the_commands(tmp_path: Path) -> None:
    proc = _launch(tmp_path, "--", sys.executable, "-c", "raise SystemExit(7)")
    assert proc.returncode == 7
    assert _launch(tmp_path, "--", "no-such-program-here").returncode == 127
    assert _launch(tmp_path).returncode == 2  # no command


def test_launch_env_puts_the_hook_first_once() -> None:
    once = launch_env({"PYTHONPATH": "/a"}, {})
    twice = launch_env(once, {})
    assert twice["PYTHONPATH"].split(os.pathsep) == [STARTUP_DIR, "/a"]


def test_the_current_folder_in_pythonpath_and_the_users_sitecustomize_stay_theirs(
    tmp_path: Path,
) -> None:
    """`PYTHONPATH=:lib` keeps the current folder; `import sitecustomize` gives the user's."""
    user = tmp_path / "user"
    user.mkdir()
    (user / "sitecustomize.py").write_text("MARKER = 'user'\n")
    work = tmp_path / "work"
    work.mkdir()
    (work / "own_module.py").write_text("VALUE = 42\n")
    (tmp_path / "prog.py").write_text(
        "import own_module, sitecustomize\nprint(own_module.VALUE, sitecustomize.MARKER)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MSTX_MARKS_")}
    env["PYTHONPATH"] = os.pathsep + str(user)  # an empty first entry: the current folder
    command = [sys.executable, "-m", "mstx_marks", "run", "--", sys.executable, "../prog.py"]
    proc = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["42", "user"]
