"""A process's files: what each is named, and one rank's Chrome trace and database written
together from a trace in memory.

The recording session that decides when to write them is :mod:`.out` (one per process: every
request for files joins it), and its writer thread writes them, streamed from the spill
(:mod:`.writer`, :mod:`.stream`). Here: :func:`export_rank` writes one rank's two files
atomically and together (a write cut short leaves the previous complete files, never half of
one), for a trace made in memory.

Every file a process writes is named by :func:`chrome_trace_path` and :func:`db_worker`: its
role, its rank and the process (``<host>-<pid>``), so the processes of a job, which may all say
rank 0, never overwrite each other, however they asked for files.

>>> import tempfile
>>> from mstx_marks.base.records import RangeRecord, RankTrace
>>> trace = RankTrace(0, [RangeRecord("step", "default", 1, 2, 1, 1)], role="train")
>>> chrome, db = export_rank(tempfile.mkdtemp(), trace)
>>> chrome.name == f"train-rank0-{this_process()}.trace.json"
True
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from mstx_marks.base.records import RankTrace
from mstx_marks.export.ascend_db import ascend_db_path, write_ascend_db
from mstx_marks.export.chrome import write_chrome_trace
from mstx_marks.export.files import atomic_paths

__all__ = [
    "chrome_trace_path",
    "db_worker",
    "export_rank",
    "safe_role",
    "this_process",
]


def this_process() -> str:
    """This process in a file name: ``<host>-<pid>`` (read at each call: a forked child is
    another process, with files of its own).

    >>> this_process() == f"{socket.gethostname()}-{os.getpid()}"
    True
    """
    return f"{socket.gethostname()}-{os.getpid()}"


def chrome_trace_path(
    out_dir: str | Path, rank: int, process: str | None = None, role: str = ""
) -> Path:
    """Where a process's Chrome trace goes: ``out_dir/chrome/[ROLE-]rankN-PROCESS.trace.json``,
    ``PROCESS`` being this one (:func:`this_process`) unless given. The name of every Chrome
    trace we write (``MSTX_MARKS_OUT``'s, :func:`flush_at_exit`'s, :func:`export_rank`'s): a
    listing groups the files by role, then rank, and processes sharing a rank never collide.

    >>> chrome_trace_path("o", 0, "h-7", role="WorkerDict").name
    'WorkerDict-rank0-h-7.trace.json'
    """
    lead = f"{safe_role(role)}-" if role else ""
    return Path(out_dir) / "chrome" / f"{lead}rank{rank}-{process or this_process()}.trace.json"


def db_worker(role: str = "", process: str | None = None) -> str:
    """The worker part of a process's database folder (torch_npu's
    ``<worker>_<time>_ascend_pt``): ``[ROLE_]<host>_<pid>``, the role leading as in
    :func:`chrome_trace_path` (a listing groups the databases by role too) and ``process``
    (``<host>-<pid>``) this one unless given.

    >>> db_worker("WorkerDict", "h-7"), db_worker(process="p0")
    ('WorkerDict_h_7', 'p0')
    """
    host, dash, pid = (process or this_process()).rpartition("-")
    lead = f"{safe_role(role)}_" if role else ""
    return f"{lead}{host}_{pid}" if dash else f"{lead}{pid}"


def safe_role(role: str) -> str:
    """``role`` as a file-name part: letters, digits, ``_``, ``.`` and ``-``; others ``_``.

    >>> safe_role("agent_loop_worker_0:1")
    'agent_loop_worker_0_1'
    """
    return "".join(c if c.isascii() and (c.isalnum() or c in "_.-") else "_" for c in role)


def export_rank(
    out_dir: str | Path,
    trace: RankTrace,
    db_path: str | Path | None = None,
    process: str | None = None,
) -> list[Path]:
    """Write ``trace`` as a Chrome trace and as an Ascend database under ``out_dir``.

    The Chrome trace goes to :func:`chrome_trace_path` (named by the trace's role and rank and
    by ``process``, this process unless given); the database to ``db_path`` if given, else to a
    new :func:`ascend_db_path` under ``out_dir/ascend`` named by the same (:func:`db_worker`).
    Returns the two paths written.
    """
    if db_path is None:
        worker = db_worker(trace.role, process)
        db_path = ascend_db_path(Path(out_dir) / "ascend", trace.rank, worker=worker)
    chrome = chrome_trace_path(out_dir, trace.rank, process, trace.role)
    # Both files are written, then replaced together: a reader never gets one rank's Chrome
    # trace from one flush and its database from another.
    with atomic_paths(chrome, db_path) as (chrome_tmp, db_tmp):
        write_chrome_trace(chrome_tmp, [trace])
        write_ascend_db(db_tmp, trace)
    return [chrome, Path(db_path)]
