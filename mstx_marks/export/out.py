"""``MSTX_MARKS_OUT=DIR``: every process of a job records its ranges and writes them under DIR.

Each process records (beside the device backend), spills completed events to its own file at
least once a second (:mod:`.spill`), and at exit or SIGTERM adds the ranges still open and
writes its Chrome trace and Ascend database. Files are named by host and pid, so the processes
of a job (trainer ranks, Ray actors, vLLM's EngineCore and workers, which may all say rank 0)
never overwrite each other, and a process that records nothing writes nothing.

Processes that end without exit hooks still leave their spill: ``os._exit`` (Ray's quick exit
of actors on ``ray.shutdown()``/``ray.kill()``, multiprocessing children) is wrapped to write the
last events first; SIGKILL and OOM kills lose at most the last interval.

>>> import tempfile
>>> from mstx_marks import configure, mark
>>> configure(record=True)  # record_to() does this, and arranges the exit hooks
>>> session = OutSession(tempfile.mkdtemp(), interval=None)
>>> with mark("step"):
...     pass
>>> [p.parent.name for p in session.close()]
['spill', 'chrome', 'ASCEND_PROFILER_OUTPUT']
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Callable, Iterable

from .. import env, settings
from ..backends.record import default_recorder
from ..records import RankTrace
from .ascend_db import ascend_db_path
from .flush import _chain_signal, export_rank
from .spill import Spill

__all__ = ["OutSession", "process_role", "record_to"]


def process_role() -> str:
    """This process's role: ``MSTX_MARKS_ROLE``, else a named multiprocessing process's name
    (vLLM's ``EngineCore_DP0``, ...), else the script's name."""
    role = env.text(env.ROLE)
    if role:
        return role
    name = multiprocessing.current_process().name
    if name and name != "MainProcess":
        return name
    script = Path(sys.argv[0]).stem if sys.argv and sys.argv[0] else ""
    return script if script and script not in ("-c", "-m") else "python"


class OutSession:
    """One process's recording to ``out_dir``; :meth:`close` writes its files (once)."""

    def __init__(self, out_dir: str | Path, interval: float | None) -> None:
        self.out_dir = Path(out_dir)
        self.interval = interval
        self._closed = False
        self._begin()

    def _begin(self) -> None:
        recorder = default_recorder()
        self.spill = Spill(self.out_dir, recorder, rank=env.rank(), role=process_role())
        self._stop = threading.Event()
        if self.interval is not None:
            threading.Thread(target=self._loop, name="mstx_marks spill", daemon=True).start()

    def _loop(self) -> None:
        assert self.interval is not None
        while not self._stop.wait(self.interval):
            self.write_now(blocking=True)

    def write_now(self, *, final: bool = False, blocking: bool = True) -> Path:
        """Spill what completed (and, ``final``, what is still open); never raises."""
        try:
            # The rank may become known later (torch.distributed initialised after start).
            self.spill.rank, self.spill.role = env.rank(), process_role()
            return self.spill.write_now(final=final, blocking=blocking)
        except Exception:
            return self.spill.path

    def close(self) -> list[Path]:
        """The last spill, then this process's Chrome trace and database; idempotent."""
        if self._closed:
            return []
        self._closed = True
        self._stop.set()
        written = [self.write_now(final=True)]
        records = default_recorder().records()
        if not records:
            return []
        host, pid = socket.gethostname(), os.getpid()
        trace = RankTrace(self.spill.rank, records, role=self.spill.role)
        db = ascend_db_path(self.out_dir / "ascend", trace.rank)
        written += export_rank(self.out_dir, trace, db, process=f"{host}-{pid}")
        return written

    def _forked(self) -> None:
        # The child has its own pid, so its own files; the recorder cleared itself at the fork.
        self._closed = False
        self._begin()


_session: OutSession | None = None
_real_exit: Callable[[int], object] = os._exit


def _exit_writing(code: int) -> None:
    # os._exit skips atexit: Ray ends actors this way on ray.shutdown()/ray.kill() (see
    # ray/_private/worker.py, https://github.com/ray-project/ray/blob/master/python/ray/_private/worker.py),
    # and multiprocessing ends its children so. The spill is written first, without blocking.
    session = _session
    if session is not None:
        session.write_now(final=True, blocking=False)
    _real_exit(code)


def record_to(
    out_dir: str | Path,
    *,
    interval: float | None = 0.5,
    signals: Iterable[int] = (signal.SIGTERM,),
) -> OutSession:
    """Record this process's ranges to ``out_dir`` until it exits (what ``MSTX_MARKS_OUT``
    does); returns the session. ``interval`` is the spill period in seconds (None: only at
    exit). Once per process: a second call returns the first session."""
    global _session
    if _session is not None:
        return _session
    settings.configure(record=True)
    session = _session = OutSession(out_dir, interval)
    atexit.register(_close_quietly)
    os.register_at_fork(after_in_child=session._forked)
    os._exit = _exit_writing  # type: ignore[assignment]
    if threading.current_thread() is threading.main_thread():
        for signum in signals:
            _chain_signal(signum, _close_quietly)
    return session


def _close_quietly() -> None:
    session = _session
    if session is None:
        return
    try:
        session.close()
    except Exception as e:  # an exit hook must not hide the program's own exit status
        print(f"mstx_marks: could not write the recording to {session.out_dir}: {e}",
              file=sys.stderr)  # fmt: skip
