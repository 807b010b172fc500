"""Write a process's recording when it ends, including when it is stopped by SIGTERM or Ctrl-C.

A training worker is often stopped rather than left to finish; :func:`flush_at_exit` makes sure
what it recorded still reaches disk. The files are written atomically, so a flush cut short by a
second signal leaves the previous complete files, never half of one.

>>> import tempfile
>>> from mstx_marks.backends.record import Recorder
>>> rec = Recorder()
>>> rec.range_end(rec.range_start("step", "default"), "default")
>>> flush = flush_at_exit(tempfile.mkdtemp(), rank=0, recorder=rec, signals=())
>>> [p.name for p in flush()]
['rank0.trace.json', 'ascend_pytorch_profiler_0.db']
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Callable, Iterable

from mstx_marks.backends.record import Recorder, default_recorder
from mstx_marks.base import env
from mstx_marks.base.diagnostics import warn_once
from mstx_marks.base.records import RankTrace
from mstx_marks.core import routing as settings
from mstx_marks.export.ascend_db import ascend_db_path, write_ascend_db
from mstx_marks.export.chrome import write_chrome_trace
from mstx_marks.export.files import atomic_paths
from mstx_marks.export.spill import Spill

__all__ = ["chain_signal", "chrome_trace_path", "export_rank", "flush_at_exit", "safe_role"]

_SignalHandler = Callable[[int, "FrameType | None"], object]


def chrome_trace_path(out_dir: str | Path, rank: int, process: str = "", role: str = "") -> Path:
    """Where :func:`export_rank` puts a rank's Chrome trace: ``out_dir/chrome/rankN.trace.json``,
    or ``[ROLE-]rankN-PROCESS.trace.json`` when several processes of a job may share a rank (so
    that a listing groups the files by role, then rank).

    >>> chrome_trace_path("o", 0, "h-7", role="WorkerDict").name
    'WorkerDict-rank0-h-7.trace.json'
    """
    tag = f"-{process}" if process else ""
    lead = f"{safe_role(role)}-" if role else ""
    return Path(out_dir) / "chrome" / f"{lead}rank{rank}{tag}.trace.json"


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
    process: str = "",
) -> list[Path]:
    """Write ``trace`` as a Chrome trace and as an Ascend database under ``out_dir``.

    The database goes to ``db_path`` if given, else to a new :func:`ascend_db_path` under
    ``out_dir/ascend``; ``process`` tells apart the Chrome traces of processes sharing a rank
    (their names then lead with the trace's role). Returns the two paths written.
    """
    if db_path is None:
        db_path = ascend_db_path(Path(out_dir) / "ascend", trace.rank)
    chrome = chrome_trace_path(out_dir, trace.rank, process, trace.role if process else "")
    # Both files are written, then replaced together: a reader never gets one rank's Chrome
    # trace from one flush and its database from another.
    with atomic_paths(chrome, db_path) as (chrome_tmp, db_tmp):
        write_chrome_trace(chrome_tmp, [trace])
        write_ascend_db(db_tmp, trace)
    return [chrome, Path(db_path)]


def flush_at_exit(
    out_dir: str | Path,
    *,
    rank: int | None = None,
    recorder: Recorder | None = None,
    signals: Iterable[int] = (signal.SIGTERM, signal.SIGINT),
) -> Callable[[], list[Path]]:
    """Export ``recorder`` (default: the ``"record"`` backend's) with :func:`export_rank` at
    interpreter exit and on each of ``signals``; return the flush, to call at any time as well.

    Asking for files means recording: unless ``recorder`` is given, every range from now on is
    also kept by the in-process recorder, beside the device backend (``configure(record=True)``).
    ``rank`` defaults to :func:`mstx_marks.base.env.rank` (``RANK``, else torch.distributed's rank,
    else 0). Each flush rewrites the same files; a flush with nothing recorded says why once and
    never replaces files that hold ranges. On a signal the flush runs, then the handler that was
    there before runs (so SIGTERM still ends the process and Ctrl-C still raises KeyboardInterrupt).
    Signal handlers can only be set from the main thread; pass ``signals=()`` elsewhere.
    ``multiprocessing`` children leave with ``os._exit``, which skips exit hooks: call the flush
    at the end of such a child yourself.
    """
    rank = env.rank() if rank is None else rank
    if recorder is None:
        settings.configure(record=True)
    source = recorder if recorder is not None else default_recorder()
    db_path = ascend_db_path(Path(out_dir) / "ascend", rank)
    # At exit the spill goes first: 1-2 us an event puts everything on disk, so a grace period
    # that ends during the slower Chrome + DB export loses nothing (summary reads the spill).
    spill = Spill(out_dir, source, rank=rank)
    # Re-entrant: a signal handler runs on the main thread, possibly inside a flush that
    # thread is already doing; a plain lock would wait on itself for ever.
    lock = threading.RLock()
    written: list[Path] = []

    def flush() -> list[Path]:
        with lock:
            records = source.records()
            if not records:
                warn_once(
                    ("empty flush", str(out_dir), rank),
                    f"rank {rank} recorded no ranges, so {out_dir} gets none: {_why_empty()}",
                )
                if written:
                    return list(written)  # an empty recording never replaces one with ranges
            written[:] = export_rank(out_dir, RankTrace(rank, records), db_path)
            return list(written)

    def on_exit() -> None:
        try:
            if source.used:
                spill.write_now(final=True)
            flush()
        except Exception as e:  # an exit hook must not hide the program's own exit status
            print(f"mstx_marks: could not write the recording to {out_dir}: {e}", file=sys.stderr)

    atexit.register(on_exit)
    for signum in signals:
        chain_signal(signum, on_exit)
    return flush


def _why_empty() -> str:
    """In plain words, why a process recorded nothing."""
    state = settings.state()
    if env.off():
        return f"{env.OFF}=1 switched the library off for this process"
    if not state.enabled:
        return "ranges are disabled (configure(enabled=False) or MSTX_MARKS_DISABLE)"
    if not settings.recording():
        return f"the backend in use ({state.backend.name}) does not record in process"
    if state.ranks is not None and env.rank() not in state.ranks:
        return f"this rank ({env.rank()}) is not in the ranks filter {sorted(state.ranks)}"
    return "no range or instant was started in this process"


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
        if callable(previous):
            previous(num, frame)
        elif previous == signal.SIG_DFL:
            # Die of the same signal, so the parent sees the usual exit status.
            os.kill(os.getpid(), num)

    signal.signal(signum, handler)
