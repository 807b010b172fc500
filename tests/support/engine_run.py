"""Running a scenario script (``tests/engines/*.py``) with an engine venv's python, and reading
what the processes it started wrote under an ``MSTX_MARKS_OUT`` folder.

``venv_python(name)`` builds (first time) or finds the venv, installs this repository into it
(so the entry points are registered) and skips the test, with the reason, when that cannot be
done. ``scenario(...)`` is the command that runs a script with a clean environment (no
``MSTX_MARKS_*``, ``RANK`` or ``PYTHONPATH`` leaking in from the test process) in a bounded time:
planned for the background (background.py), or run now with ``.run()``, which fails with the end
of its output when it fails.
"""

from __future__ import annotations

import json
import os
import socket
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from . import engine_venvs
from .background import Command
from .engine_venvs import REPO

ENGINES = REPO / "tests" / "engines"
#: The worker's model-step ranges (the vllm preset), one per forward.
MODEL_STEP_KINDS = ("prefill_batch", "decode_batch", "mixed_batch")


def venv_python(name: str) -> Path:
    """The python of engine venv ``name`` with this repository installed; skips if impossible."""
    try:
        python = engine_venvs.engine_venv(name)
        engine_venvs.install_self(python)
    except engine_venvs.EngineVenvError as ex:
        pytest.skip(f"the {name!r} engine venv cannot be built here: {ex}")
    return python


#: Variables of the test process that would change what a scenario does.
_LEAKY = ("RANK", "PYTHONPATH", "PYTHONHOME", "RAY_ADDRESS")


def clean_env(**settings: str) -> dict[str, str]:
    """This process's environment without anything that would change the scenario, plus
    ``settings``."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("MSTX_MARKS_") and k not in _LEAKY
    }
    env.update(settings)
    return env


def scenario_env(python: Path) -> dict[str, str]:
    """What every scenario of the venv of ``python`` runs with, besides its own settings.

    - ``VLLM_CACHE_ROOT`` inside the venv. vLLM keeps one model-info file per model class under
      it (``modelinfos/``), stamped with the hash of that class's source; in the shared default
      (``~/.cache/vllm``) the venvs' different vLLM releases overwrite each other's file, so the
      next launch in another venv inspects the model class again in a subprocess of its own
      (about 15 s of CPU and of wall time here).
    - ``RAY_worker_niceness=0``. Ray starts its workers at nice 15; beside the suite's other
      tests (the runs are made in the background, background.py) such a worker then waits so
      long for a CPU that its signal-watch thread misses the 20-60 ms between Ray's SIGTERM and
      SIGKILL at ``ray.shutdown()``, and the ranges of the job's last moments are lost (1 run in
      2 of the one-step-off job lost its last ``rollout_resume``). A job alone on its machine
      does not compete so; Ray's own job manager runs its jobs at 0 too.
    """
    return {
        "VLLM_CACHE_ROOT": str(Path(python).parent.parent / "vllm-cache"),
        "RAY_worker_niceness": "0",
    }


def scenario(
    python: Path,
    script: str,
    args: Iterable[object],
    env: Mapping[str, str],
    *,
    timeout: float,
    cwd: Path,
) -> Command:
    """The command that runs ``tests/engines/<script>`` in ``cwd`` (its output kept in
    ``cwd/<script>.out``): for a background run's plan, or to run now (``.run()``)."""
    return Command(
        argv=(str(python), str(ENGINES / script), *map(str, args)),
        env={**scenario_env(python), **env}, cwd=cwd, timeout=timeout,
        output=cwd / f"{script}.out", label=script,
    )  # fmt: skip


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def files_by_pid(out: Path, pids: Iterable[int]) -> dict[int | None, list[Path]]:
    """Every file under ``out`` by the process (among ``pids``) whose name it carries: the
    spill ``<host>-<pid>.jsonl``, the Chrome trace ``[<role>-]rank<R>-<host>-<pid>.trace.json``,
    the database folder ``[<role>_]<host>_<pid>_<ms>_ascend_pt``. Files of no such process are
    under None."""
    host = socket.gethostname()
    found: dict[int | None, list[Path]] = {}
    for path in sorted(out.rglob("*")):
        if not path.is_file():
            continue
        top = path.relative_to(out).parts
        name = top[1] if len(top) > 1 else top[0]
        owner = next(
            (
                pid
                for pid in pids
                if name == f"{host}-{pid}.jsonl"
                or name.endswith(f"-{host}-{pid}.trace.json")
                or (name.endswith("_ascend_pt") and f"{host}_{pid}_" in name)
            ),
            None,
        )
        found.setdefault(owner, []).append(path)
    return found


def spills(out: Path) -> dict[int, Any]:
    """Each process's spill under ``out``, read with ``read_spill``, by the pid in its header."""
    from mstx_marks.export.spill import read_spill

    traces = {}
    for path in sorted((out / "spill").glob("*.jsonl")) if (out / "spill").is_dir() else []:
        trace = read_spill(path)
        pids = {r.pid for r in trace.records}
        assert len(pids) == 1, (path, pids)  # one process per file
        (pid,) = pids
        assert path.name.endswith(f"-{pid}.jsonl"), path  # named by its own pid
        assert pid not in traces, path
        traces[pid] = trace
    return traces


def counts(records: Iterable[Any]) -> Counter[str]:
    return Counter(r.name for r in records)


def chrome_counts(path: Path) -> Counter[str]:
    """Range names of a Chrome trace file (complete events only)."""
    events = read_json(path)["traceEvents"]
    return Counter(e["name"] for e in events if e.get("ph") == "X")


@dataclass
class VllmProcesses:
    """A vLLM run's EngineCore and worker traces, told apart by the roles their spills name."""

    engine: Any
    worker: Any
    all: dict[int, Any]


def vllm_processes(out: Path) -> VllmProcesses:
    """The one EngineCore and the one worker that spilled under ``out`` (fails otherwise)."""
    traces = spills(out)
    engine = [t for t in traces.values() if t.role.startswith("EngineCore")]
    worker = [t for t in traces.values() if t.role.startswith("VllmWorker")]
    assert len(engine) == 1 and len(worker) == 1, {pid: t.role for pid, t in traces.items()}
    return VllmProcesses(engine[0], worker[0], traces)
