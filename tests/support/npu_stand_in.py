"""Device rows as torch_npu writes them on an NPU, for tests that run msprof-analyze's recipes.

THESE ROWS ARE A STAND-IN FOR AN NPU. On a CPU machine nothing runs on a device, so the tables a
real capture has beside ``MSTX_EVENTS`` (``TASK``, ``COMPUTE_TASK_INFO``, ``PYTORCH_API``,
``CONNECTION_IDS``) are written here from what did run: each device task starts
``DEVICE_LAG_NS`` after its host call and lasts as long, and shares its ``connectionId`` with
the host row, as in a real database. The MSTX rows themselves are the library's own export.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest

DEVICE_LAG_NS = 2_000
_TASK = (
    "CREATE TABLE IF NOT EXISTS TASK (startNs INTEGER, endNs INTEGER, deviceId INTEGER,"
    " connectionId INTEGER, globalTaskId INTEGER, globalPid INTEGER, taskType INTEGER,"
    " contextId INTEGER, streamId INTEGER, taskId INTEGER, modelId INTEGER)"
)


def _string_id(db: sqlite3.Connection, text: str) -> int:
    row = db.execute("SELECT id FROM STRING_IDS WHERE value = ?", (text,)).fetchone()
    if row:
        return int(row[0])
    nxt = db.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM STRING_IDS").fetchone()[0]
    db.execute("INSERT INTO STRING_IDS VALUES (?, ?)", (nxt, text))
    return int(nxt)


def add_mstx_tasks(path: Path, *, messages: Iterable[str] | None = None, stream: int = 2) -> int:
    """A device task for each MSTX range (of these messages), as a range started on a stream
    gets one: same ``connectionId``, device time lagging the host's. Returns how many."""
    with sqlite3.connect(path) as db:
        db.execute(_TASK)
        query = (
            "SELECT e.startNs, e.endNs, e.connectionId, s.value FROM MSTX_EVENTS e"
            " JOIN STRING_IDS s ON s.id = e.message WHERE e.eventType = 2"
        )
        wanted = None if messages is None else set(messages)
        rows = [r for r in db.execute(query) if wanted is None or r[3] in wanted]
        base = db.execute("SELECT COALESCE(MAX(globalTaskId), 0) FROM TASK").fetchone()[0]
        db.executemany(
            "INSERT INTO TASK VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            [
                (s + DEVICE_LAG_NS, e + DEVICE_LAG_NS, 0, c, base + i, 0, 0, 0, stream, i, 0)
                for i, (s, e, c, _) in enumerate(rows, 1)
            ],
        )
    return len(rows)


def add_operators(path: Path, ops: Sequence[tuple[str, int, int]], tid: int) -> None:
    """Framework operators (``PYTORCH_API``) with one kernel each (``TASK`` +
    ``COMPUTE_TASK_INFO``), linked through ``CONNECTION_IDS`` as torch_npu links them."""
    with sqlite3.connect(path) as db:
        db.execute(_TASK)
        db.executescript(
            "CREATE TABLE IF NOT EXISTS PYTORCH_API (startNs INTEGER, endNs INTEGER,"
            " globalTid INTEGER, connectionId INTEGER, name INTEGER, sequenceNumber INTEGER,"
            " fwdThreadId INTEGER, inputDtypes INTEGER, inputShapes INTEGER, callchainId INTEGER,"
            " type INTEGER);"
            "CREATE TABLE IF NOT EXISTS CONNECTION_IDS (id INTEGER, connectionId INTEGER);"
            "CREATE TABLE IF NOT EXISTS COMPUTE_TASK_INFO (name INTEGER, globalTaskId INTEGER,"
            " blockDim INTEGER, mixBlockDim INTEGER, taskType INTEGER, opType INTEGER,"
            " inputFormats INTEGER, inputDataTypes INTEGER, inputShapes INTEGER,"
            " outputFormats INTEGER, outputDataTypes INTEGER, outputShapes INTEGER,"
            " attrInfo INTEGER, opState INTEGER, hf32Eligible INTEGER);"
        )
        base = db.execute("SELECT COALESCE(MAX(globalTaskId), 0) FROM TASK").fetchone()[0]
        for i, (name, start, end) in enumerate(ops, 1):
            conn = 10_000_000 + base + i  # a kernel launch id, not an MSTX one
            db.execute(
                "INSERT INTO PYTORCH_API VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (start, end, tid, i, _string_id(db, name), i, 0, 0, 0, 0, 50001),
            )
            db.execute("INSERT INTO CONNECTION_IDS VALUES (?, ?)", (i, conn))
            db.execute(
                "INSERT INTO TASK VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (start + DEVICE_LAG_NS, end + DEVICE_LAG_NS, 0, conn, base + i, 0, 0, 0, 2, i, 0),
            )
            kernel = _string_id(db, f"{name.split('::')[-1]}_kernel")
            db.execute(
                "INSERT INTO COMPUTE_TASK_INFO (name, globalTaskId) VALUES (?, ?)",
                (kernel, base + i),
            )


def msprof_analyze() -> str:
    """The msprof-analyze command; fails in CI, skips elsewhere, when it is not installed."""
    beside = Path(sys.executable).with_name("msprof-analyze")  # pip's script beside python
    exe = (
        os.environ.get("MSPROF_ANALYZE")
        or shutil.which("msprof-analyze")
        or (str(beside) if beside.exists() else None)
    )
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("msprof-analyze is not installed (pip install msprof-analyze==26.2.0)")
        pytest.skip("msprof-analyze is not installed; set MSPROF_ANALYZE or install it")
    return exe


def run_recipe(
    recipe: str, data: Path, out: Path, export: str = "db", exe: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``msprof-analyze cluster -m RECIPE``; its exit code is 0 even when it fails, so callers
    check the files it writes (this returns its output for their messages)."""
    cmd = [exe or msprof_analyze(), "cluster", "-m", recipe, "-d", str(data), "-o", str(out)]
    cmd += ["--export_type", export, "--force"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=out.parent)
