"""The Chrome trace and Ascend database of every process that left only its spill.

A process ended by a signal it cannot outlive writes its spill and nothing else: Ray SIGKILLs its
workers 20-60 ms after their SIGTERM, too soon for an export (which would be cut short and leave
its temporaries), so a Ray worker writes only its final spill then (:mod:`.out`). The spill is
the record; the exports are views of it, made afterwards by a reader (``mstx-marks export DIR``),
named as the process itself would have named them (its role, rank, host and pid), so
MindStudio Insight, msprof-analyze and Perfetto see every process of the job.

>>> import tempfile
>>> from mstx_marks import configure, mark
>>> from mstx_marks.export.out import OutSession
>>> configure(record=True)
>>> folder = tempfile.mkdtemp()
>>> session = OutSession(folder, interval=None)
>>> with mark("update_actor"):
...     pass
>>> session.spill.write_now(final=True).parent.name  # a Ray worker's last act
'spill'
>>> [p.name for p in unexported(folder)] == [session.spill.path.name]
True
>>> [p.parent.name for p in export_spills(folder)]
['chrome', 'ASCEND_PROFILER_OUTPUT']
>>> unexported(folder)
[]
"""

from __future__ import annotations

import re
from pathlib import Path

from mstx_marks.export.ascend_db import ascend_db_path
from mstx_marks.export.flush import chrome_trace_path, db_worker, export_rank
from mstx_marks.export.spill import read_spill

__all__ = ["export_spills", "unexported"]


def _exports_of(folder: Path, spill: Path) -> tuple[list[Path], list[Path]]:
    """The Chrome traces and database files already written for the process of ``spill``
    (``spill/<host>-<pid>.jsonl``), found by name alone: ``[ROLE-]rankN-<host>-<pid>`` and
    ``[ROLE_]<host>_<pid>_<time>_ascend_pt`` (what comes right before the host is a separator,
    so host ``a-h`` is not taken for host ``h``)."""
    host, _, pid = spill.stem.rpartition("-")
    chrome_name = re.compile(rf"(?:.*-)?rank[0-9]+-{re.escape(spill.stem)}\.trace\.json")
    db_folder = re.compile(rf"(?:.*_)?{re.escape(host)}_{pid}_[0-9]+_ascend_pt")
    chrome = sorted(
        p for p in (folder / "chrome").glob("*.trace.json") if chrome_name.fullmatch(p.name)
    )
    dbs = sorted(
        db
        for d in (folder / "ascend").glob("*_ascend_pt")
        if db_folder.fullmatch(d.name)
        for db in (d / "ASCEND_PROFILER_OUTPUT").glob("ascend_pytorch_profiler_*.db")
    )
    return chrome, dbs


def unexported(folder: str | Path) -> list[Path]:
    """The spills under ``folder/spill`` whose process has no Chrome trace or no database (by
    their names: no spill is read). A process that wrote its exports keeps them, even when its
    spill took a few more lines after (the exit's own late writes): ``export --all`` redoes
    every process."""
    root = Path(folder)
    found = []
    for spill in sorted(root.glob("spill/*.jsonl")):
        chrome, dbs = _exports_of(root, spill)
        if not chrome or not dbs:
            found.append(spill)
    return found


def export_spills(folder: str | Path, *, every: bool = False) -> list[Path]:
    """Write the Chrome trace and Ascend database of each process in :func:`unexported` (of
    every process with a spill, ``every``, replacing what it wrote); the files written. Run it
    once the job has ended: a live process rewrites its own exports at its exit."""
    root = Path(folder)
    todo = sorted(root.glob("spill/*.jsonl")) if every else unexported(root)
    written: list[Path] = []
    for spill in todo:
        trace = read_spill(spill)
        if not trace.records:
            continue
        role = trace.role or ""
        chrome, dbs = _exports_of(root, spill)
        name = chrome_trace_path(root, trace.rank, spill.stem, role)
        for old in chrome:  # the rank may have been another when it was last written
            if old != name:
                old.unlink()
        if dbs:  # its folder is kept (torch_npu's name holds the time the process wrote it)
            db = dbs[-1].parent / f"ascend_pytorch_profiler_{trace.rank}.db"
            for old in dbs:
                if old != db:
                    old.unlink()
        else:
            db = ascend_db_path(root / "ascend", trace.rank, worker=db_worker(role, spill.stem))
        written += export_rank(root, trace, db, spill.stem)
    return written
