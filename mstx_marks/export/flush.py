"""Write a process's recording when it ends, including when it is stopped by SIGTERM or Ctrl-C.

A training worker is often stopped rather than left to finish; :func:`flush_at_exit` makes sure
what it recorded still reaches disk. The files are written atomically, so a flush cut short by a
second signal leaves the previous complete files, never half of one; and while the exit's work
runs, SIGTERM and SIGINT are held back (:func:`signals_deferred`) and handled once it is done, so
a signal at exit neither re-enters the flush (which waited on itself for ever) nor cuts it short.

Recording to files means spilling: completed events go to ``out/spill/`` every half second (so a
SIGKILL loses at most that), the recorder frees what was spilled (constant memory however long
the run), and the Chrome trace and database are made from the spill. A forked child gets files
of its own (its own spill, database folder and a Chrome trace named by host and pid).

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
import contextlib
import functools
import os
import signal
import socket
import sys
import threading
import weakref
from pathlib import Path
from types import FrameType
from typing import Any, Callable, Iterable, Iterator

from mstx_marks.backends.record import Recorder, default_recorder
from mstx_marks.base import env
from mstx_marks.base.diagnostics import warn_once
from mstx_marks.base.forking import after_fork_in_child, new_lock
from mstx_marks.base.records import RankTrace
from mstx_marks.core import routing as settings
from mstx_marks.export.ascend_db import ascend_db_path, write_ascend_db
from mstx_marks.export.chrome import write_chrome_trace
from mstx_marks.export.files import atomic_paths
from mstx_marks.export.spill import Spill

__all__ = [
    "chain_signal",
    "chrome_trace_path",
    "export_rank",
    "flush_at_exit",
    "safe_role",
    "signals_deferred",
]

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
    interval: float | None = 0.5,
) -> Callable[[], list[Path]]:
    """Export ``recorder`` (default: the ``"record"`` backend's) with :func:`export_rank` at
    interpreter exit and on each of ``signals``; return the flush, to call at any time as well.

    Asking for files means recording: unless ``recorder`` is given, every range from now on is
    also kept by the in-process recorder, beside the device backend (``configure(record=True)``).
    ``rank`` defaults to :func:`mstx_marks.base.env.rank` (``RANK``, else torch.distributed's rank,
    else 0). Completed events are spilled every ``interval`` seconds (None: only at a flush) and
    released from the recorder; each flush spills the rest and rewrites the same files from the
    spill; a flush with nothing recorded says why once and never replaces files that hold
    ranges. On a signal the flush runs, then the handler that was there before runs (so SIGTERM
    still ends the process and Ctrl-C still raises KeyboardInterrupt).
    Signal handlers can only be set from the main thread; pass ``signals=()`` elsewhere.
    ``multiprocessing`` children leave with ``os._exit``, which skips exit hooks: call the flush
    at the end of such a child yourself.
    """
    rank = env.rank() if rank is None else rank
    env.run_id()  # made now, so the processes this one starts share it
    if recorder is None:
        settings.configure(record=True)
    source = recorder if recorder is not None else default_recorder()
    target = _FlushTarget(out_dir, source, rank, interval)
    after_fork_in_child(functools.partial(_forked, weakref.ref(target)))

    def on_exit() -> None:
        try:
            target.flush(at_exit=True)
        except Exception as e:  # an exit hook must not hide the program's own exit status
            print(f"mstx_marks: could not write the recording to {out_dir}: {e}", file=sys.stderr)

    atexit.register(on_exit)
    for signum in signals:
        chain_signal(signum, on_exit)
    return target.flush


class _FlushTarget:
    """What :func:`flush_at_exit` writes, for the process it is in: a forked child makes its
    own spill and files (it must neither append to its parent's spill nor replace its files)."""

    def __init__(
        self, out_dir: str | Path, source: Recorder, rank: int, interval: float | None
    ) -> None:
        self.out_dir, self.source, self.rank, self.interval = Path(out_dir), source, rank, interval
        # Re-entrant: a flush called from a signal handler on a thread already flushing (the
        # signals are deferred at exit; a user's own flush() from a handler may still nest).
        self.lock = new_lock(reentrant=True)
        self._begin(child=False)

    def _begin(self, *, child: bool) -> None:
        self.pid = os.getpid()
        self.spill = Spill(self.out_dir, self.source, rank=self.rank)
        self.process = f"{socket.gethostname()}-{self.pid}" if child else ""
        self.db_path = ascend_db_path(self.out_dir / "ascend", self.rank)
        self.written: list[Path] = []
        if self.interval is not None:
            self.spill.start(self.interval)

    def forked(self) -> None:
        self.lock = new_lock(reentrant=True)  # the parent's may have been held by another thread
        self._begin(child=True)

    def flush(self, at_exit: bool = False) -> list[Path]:
        with signals_deferred(), self.lock:
            spill = self.spill
            spill.rank = self.rank
            if self.source.used:
                spill.write_now(final=True)
            if not self.source.used:
                warn_once(
                    ("empty flush", str(self.out_dir), self.rank),
                    f"rank {self.rank} recorded no ranges, so {self.out_dir} gets none: "
                    f"{_why_empty()}",
                )
                if self.written:
                    return list(self.written)  # an empty recording never replaces one with ranges
            if spill.too_long_to_export():
                return [spill.path]
            trace = spill.read()
            trace.rank = self.rank
            self.written[:] = export_rank(self.out_dir, trace, self.db_path, self.process)
            return list(self.written)


def _forked(ref: weakref.ref[_FlushTarget]) -> None:
    target = ref()
    if target is not None:
        target.forked()


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
