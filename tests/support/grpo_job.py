"""The real verl GRPO job of tests/test_real_grpo.py: its venv, its launch, and reading it back.

``grpo_python()`` returns the python of the ``grpo`` engine venv (built on first use, about 4-8
minutes, see engine_venvs.py) with this repository (editable, ``--no-deps``: its entry points)
and the CPU test plugins (``tests/support/cpu_plugins``: editable, plus the metadata-only
``vllm`` alias) installed; it skips the test when that cannot be done.

``launch()`` plans a run of ``tests/engines/verl_grpo.py`` (the job, bounded, cleaned up after;
another runner of tests/engines sharing its verl_job.py, e.g. ``verl_one_step_off.py``, when
named) for the background (background.py), and reads what it reported and printed.
``metric_lines()`` parses verl's console logger lines (``step:1 - key:value - ...``). What
mstx_marks wrote is read through its CLI (``summary --json``, ``coverage``) and, for the
per-process view, by ``process_ranges()``: the one place that reads spill files directly.
``marked_run()`` plans one marked run of a runner with its processes read back (the
asynchronous modes' tests share one each).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import pytest

from . import background, engine_venvs
from .engine_run import clean_env, scenario, venv_python

#: The presets a marked run arms (``MSTX_MARKS_INSTRUMENT``).
INSTRUMENT = "verl,vllm"
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


def launch(
    python: Path,
    where: Path,
    settings: Optional[dict[str, str]],
    timeout: float,
    runner: str = "verl_grpo.py",
) -> background.Planned[Job]:
    """The run of the job of ``tests/engines/<runner>`` in ``where``; ``settings``
    (MSTX_MARKS_*) go into its environment."""
    result = where / "result.json"
    env = clean_env()
    out = None
    if settings is not None:
        env.update(settings)
        out = Path(settings["MSTX_MARKS_OUT"]) if "MSTX_MARKS_OUT" in settings else None
    command = scenario(
        python, runner, [where / "work", result, timeout], env,
        timeout=timeout + 90, cwd=where,
    )  # fmt: skip

    def read(ran: background.Ran) -> Job:
        report = json.loads(result.read_text())
        log = Path(report["log"]).read_text(errors="replace")
        return Job(report, log, out, ran.wall_s, metric_lines(log))

    return background.Planned([command], read)


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
        # (one step may have several lines: the last step's live figures come at finish)
        found.setdefault(int(m.group(1)), {}).update(metrics)
    return [found[k] for k in sorted(found)]


def cli(python: Path, *args: object, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -m mstx_marks ARGS`` with the venv's python (the repository is installed there)."""
    return subprocess.run(
        [str(python), "-m", "mstx_marks", *map(str, args)],
        env=clean_env(), capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


@dataclass
class ProcessRanges:
    """One process's spill file: its pid, the role it said, its range names counted, each
    range's ``(start_ns, end_ns)`` by name (on the wall clock: comparable across the processes
    of one host, in order of start), and whether the file ends with its writer's final write."""

    pid: int
    role: str
    rank: int
    names: Counter[str]
    file: Path
    spans: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    complete: bool = True


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
        "    names, spans = {}, {}\n"
        "    for r in t.records:\n"
        "        names[r.name] = names.get(r.name, 0) + 1\n"
        "        if r.kind == 'range':\n"
        "            spans.setdefault(r.name, []).append((r.start_ns, r.end_ns))\n"
        "    rows.append(dict(file=str(path), pids=pids, role=t.role or '', rank=t.rank,"
        " names=names, spans=spans, complete=t.complete))\n"
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
    spans = {name: sorted((int(a), int(b)) for a, b in s) for name, s in row["spans"].items()}
    return ProcessRanges(
        pid=int(pids[0]), role=row["role"], rank=int(row["rank"]), names=Counter(row["names"]),
        file=file, spans=spans, complete=bool(row["complete"]),
    )  # fmt: skip


def overlap_ns(a: tuple[int, int], b: tuple[int, int]) -> int:
    """How many nanoseconds two ``(start_ns, end_ns)`` spans share."""
    return max(0, min(a[1], b[1]) - max(a[0], b[0]))


def run_folder(factory: pytest.TempPathFactory, name: str) -> Path:
    """A fresh folder for one run: ``$GRPO_TEST_DIR/<name>`` when set (kept afterwards), else
    a pytest temporary folder."""
    kept = os.environ.get("GRPO_TEST_DIR")
    if not kept:
        return factory.mktemp(name)
    path = Path(kept) / name
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


@dataclass
class MarkedRun:
    """A run marked from the environment alone (:data:`INSTRUMENT`, ``MSTX_MARKS_OUT``), and the
    spills its processes wrote."""

    python: Path
    job: Job
    processes: list[ProcessRanges]

    @property
    def out(self) -> Path:
        assert self.job.out is not None
        return self.job.out

    def one(self, role: str) -> ProcessRanges:
        """The one process whose spill's role names ``role`` (a Ray actor class, a vLLM
        process)."""
        found = [p for p in self.processes if role in p.role]
        listed = {p.pid: (p.role, dict(p.names)) for p in self.processes}
        assert len(found) == 1, f"one {role} process among the spills: {listed}"
        return found[0]


def marked_run(
    factory: pytest.TempPathFactory,
    name: str,
    runner: str,
    timeout: float,
    more: Optional[dict[str, str]] = None,
) -> background.Planned[MarkedRun]:
    """One marked run of ``tests/engines/<runner>`` in :func:`run_folder` ``name``; ``more``:
    further variables of its environment."""
    python = grpo_python()
    where = run_folder(factory, name)
    settings = {"MSTX_MARKS_INSTRUMENT": INSTRUMENT, "MSTX_MARKS_OUT": str(where / "out")}
    settings.update(more or {})
    planned = launch(python, where, settings, timeout, runner=runner)

    def read(ran: background.Ran) -> MarkedRun:
        job = planned.read(ran)
        spilled = job.out is not None and (job.out / "spill").is_dir()
        return MarkedRun(python, job, process_ranges(python, where / "out") if spilled else [])

    return background.Planned(planned.commands, read)
