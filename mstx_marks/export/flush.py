"""A process's files and its exit: one rank's Chrome trace and database written together, and
SIGTERM/SIGINT held back while the exit's writing runs.

The recording session that decides when to write them is :mod:`.out` (one per process: every
request for files joins it). Here: :func:`export_rank` writes one rank's two files atomically and
together (a flush cut short by a second signal leaves the previous complete files, never half of
one); :func:`signals_deferred` holds SIGTERM and SIGINT back while the exit's work runs and
handles them once it is done, so a signal at exit neither re-enters the writing (which waited on
itself for ever) nor cuts it short; :func:`chain_signal` runs a writer on a signal, then what was
installed before.

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

import contextlib
import os
import signal
import socket
import threading
from pathlib import Path
from types import FrameType
from typing import Any, Callable, Iterator

from mstx_marks.base.records import RankTrace
from mstx_marks.export.ascend_db import ascend_db_path, write_ascend_db
from mstx_marks.export.chrome import write_chrome_trace
from mstx_marks.export.files import atomic_paths

__all__ = [
    "chain_signal",
    "chrome_trace_path",
    "db_worker",
    "export_rank",
    "safe_role",
    "signals_deferred",
    "this_process",
]

_SignalHandler = Callable[[int, "FrameType | None"], object]


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


def chain_signal(signum: int, before: Callable[[], None]) -> None:
    """Run ``before`` on ``signum``, then what was installed before (dying of the signal when
    that was the default). A signal arriving while ``before`` runs does not start it again: the
    first one's flush finishes, then the chain goes on."""
    previous = signal.getsignal(signum)
    running: list[int] = []

    def handler(num: int, frame: FrameType | None) -> None:
        if running:
            return  # a second signal during the flush: the first one carries on
        running.append(num)
        try:
            before()
        finally:
            running.clear()
        signal.signal(num, previous)
        _run_previous(num, previous, frame)

    handler.mstx_previous = previous  # type: ignore[attr-defined]
    signal.signal(signum, handler)


def _run_previous(num: int, previous: object, frame: FrameType | None) -> None:
    if callable(previous):
        previous(num, frame)
    elif previous == signal.SIG_DFL:
        # Die of the same signal, so the parent sees the usual exit status.
        signal.signal(num, signal.SIG_DFL)
        os.kill(os.getpid(), num)


_DEFERRED: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)
_deferring: list[int] = []  # depth of signals_deferred in the main thread
_pending: list[int] = []  # signals that arrived meanwhile


def _defer(num: int, frame: FrameType | None) -> None:
    _pending.append(num)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGTERM and SIGINT back (in the main thread; elsewhere signals never run Python
    code) while the block runs, then handle those that came as the handler in place before
    would have (minus another flush of ours: the block was it). What a process's exit work runs
    in: a signal can neither re-enter it (a lock it holds) nor cut it short (Ctrl-C's
    KeyboardInterrupt in the middle of the spill)."""
    if _deferring or threading.current_thread() is not threading.main_thread():
        yield
        return
    saved: dict[int, Any] = {}
    for signum in _DEFERRED:
        try:
            saved[signum] = signal.signal(signum, _defer)
        except (ValueError, OSError, TypeError):
            continue
    _deferring.append(1)
    try:
        yield
    finally:
        _deferring.clear()
        for signum, before in saved.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(signum, before)
        came = list(dict.fromkeys(_pending))
        _pending.clear()
        for signum in came:
            handler: Any = saved.get(signum)
            while hasattr(handler, "mstx_previous"):  # ours: its flush is what just ran
                handler = handler.mstx_previous
            if handler is not None:
                _run_previous(signum, handler, None)
