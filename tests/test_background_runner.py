"""The runner that makes the real engines' runs in the background (tests/support/background.py):
one command at a time, in order, each bounded with its process group, nothing left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.background import Command, Planned, checked, run_inline
from support.background_runner import run_command

RUNNER = Path(__file__).parent / "support" / "background_runner.py"


def command(where: Path, name: str, code: str, timeout: float = 30) -> dict[str, Any]:
    return {
        "argv": [sys.executable, "-c", code], "env": dict(os.environ), "cwd": str(where),
        "timeout": timeout, "output": str(where / f"{name}.out"),
    }  # fmt: skip


def log_line(path: Path, text: str) -> str:
    return f"import time; open({str(path)!r}, 'a').write({text!r} + ' %d\\n' % time.time_ns())"


def run_plan(where: Path, jobs: list[dict[str, Any]], timeout: float = 60) -> None:
    plan = where / "plan.json"
    plan.write_text(json.dumps({"jobs": jobs}))
    runner = [sys.executable, str(RUNNER), str(plan), str(os.getpid())]
    subprocess.run(runner, check=True, timeout=timeout)


def test_jobs_run_one_after_another_and_a_failure_ends_only_its_job(tmp_path: Path) -> None:
    order = tmp_path / "order.txt"
    jobs = [
        {
            "commands": [
                command(tmp_path, "a1", log_line(order, "a1") + "; time.sleep(0.3)"),
                command(tmp_path, "a2", "import sys; print('no'); sys.exit(3)"),
                command(tmp_path, "a3", log_line(order, "a3")),
            ],
            "status": str(tmp_path / "a.json"),
        },
        {
            "commands": [command(tmp_path, "b1", log_line(order, "b1"))],
            "status": str(tmp_path / "b.json"),
        },
    ]
    run_plan(tmp_path, jobs)
    lines = [line.split() for line in order.read_text().splitlines()]
    assert [name for name, _ in lines] == ["a1", "b1"]  # a3 never ran: a2 failed before it
    assert int(lines[1][1]) - int(lines[0][1]) >= 300_000_000  # b1 began after a1 ended
    a = json.loads((tmp_path / "a.json").read_text())["ran"]
    assert [s["returncode"] for s in a] == [0, 3] and not any(s["timed_out"] for s in a)
    assert (tmp_path / "a2.out").read_text() == "no\n"
    assert [s["returncode"] for s in json.loads((tmp_path / "b.json").read_text())["ran"]] == [0]
    assert not list(tmp_path.glob("*.part"))  # statuses are written whole, then renamed


def test_a_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    child = tmp_path / "child.pid"
    code = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(child)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(60)\n"
    )
    started = time.monotonic()
    status = run_command(command(tmp_path, "slow", code, timeout=1.5))
    assert status["timed_out"] and status["returncode"] == -signal.SIGKILL
    assert time.monotonic() - started < 15
    pid = int(child.read_text())
    time.sleep(0.2)  # the grandchild's SIGKILL is delivered; it is reaped by init, not by us
    state = Path(f"/proc/{pid}/stat")
    assert not state.exists() or state.read_text().split()[2] == "Z"


def test_the_runner_ends_with_the_process_that_started_it(tmp_path: Path) -> None:
    started = tmp_path / "started"
    jobs = [
        {
            "commands": [command(tmp_path, "long", log_line(started, "go") + "; time.sleep(60)")],
            "status": str(tmp_path / "long.json"),
        }
    ]
    (tmp_path / "plan.json").write_text(json.dumps({"jobs": jobs}))
    # A parent that starts the runner, says its pid, and dies at once.
    parent = subprocess.run(
        [
            sys.executable, "-c",
            "import os, subprocess, sys\n"
            "runner = [sys.executable, *sys.argv[1:], str(os.getpid())]\n"
            "print(subprocess.Popen(runner, stdout=subprocess.DEVNULL).pid)\n",
            str(RUNNER), str(tmp_path / "plan.json"),
        ],
        capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    runner = int(parent.stdout)
    deadline = time.monotonic() + 20
    while Path(f"/proc/{runner}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{runner}").exists()  # it saw its parent go, killed its command
    assert not (tmp_path / "long.json").exists()  # and wrote no status for the unfinished job


def test_a_failed_run_fails_the_test_with_its_output(tmp_path: Path) -> None:
    def cmd(name: str, code: str) -> Command:
        return Command(
            argv=(sys.executable, "-c", code), env=dict(os.environ), cwd=tmp_path, timeout=30,
            output=tmp_path / f"{name}.out", label=f"{name}.py",
        )  # fmt: skip

    planned = Planned([cmd("ok", "print('built')"), cmd("bad", "raise SystemExit('broken')")], str)
    with pytest.raises(pytest.fail.Exception, match=r"(?s)bad\.py exited with 1:.*broken"):
        run_inline(planned.commands)
    good = checked([cmd("ok", "")], [{"returncode": 0, "timed_out": False, "wall_s": 0.5}])
    assert good.wall_s == 0.5
    with pytest.raises(pytest.fail.Exception, match="never ran"):
        checked(planned.commands, [{"returncode": 0, "timed_out": False, "wall_s": 0.1}])
