"""``MSTX_MARKS_OUT=DIR``: every process of a job records its ranges and writes them under DIR.

Each process records (beside the device backend), spills completed events to its own file at
least once a second (:mod:`.spill`), and at exit or SIGTERM adds the ranges still open and
writes its Chrome trace and Ascend database. Files are named by host and pid, so the processes
of a job (trainer ranks, Ray actors, vLLM's EngineCore and workers, which may all say rank 0)
never overwrite each other, and a process that records nothing writes nothing.

Processes that end without exit hooks still leave their spill. ``os._exit`` (multiprocessing's
fork children end so) is wrapped to write the last events first. Ray 2.60 ends its workers from
C++, where no Python code runs at all (no atexit, no ``os._exit``, no Python signal handler: the
main thread is inside the core worker's task loop): on ``ray.shutdown()`` the raylet sends
SIGTERM and SIGKILLs the worker 20 to 60 ms later (or the worker's own C++ thread calls
``_exit``); ``ray.kill()`` calls ``_exit`` in C++ with no signal at all. So a thread also waits on
``signal.set_wakeup_fd`` (written by the C-level handler, whatever Python handler is installed
and wherever the main thread is) and spills at once on every signal: what completed just before
``ray.shutdown()`` usually arrives (18 of 20 actors complete in a test of this, against 13 of 20
with the periodic spill alone); it is not certain, as the worker may die before the thread
runs. Otherwise (``ray.kill()``, SIGKILL, an OOM kill) at most the last interval (0.5 s) is
lost. Such processes rarely write their Chrome trace and database: mostly only the spill. A Ray
worker that gets to handle its SIGTERM writes only its final spill (an export would be cut short
by the SIGKILL, leaving temporaries behind).

Each process's files carry its role (:func:`process_role`): the Chrome trace is
``chrome/<role>-rank<N>-<host>-<pid>.trace.json``, the database folder
``ascend/<role>_<host>_<pid>_<time>_ascend_pt``, and the spill says it in its header.

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
from typing import Any, Callable, Iterable

from mstx_marks.backends.record import default_recorder
from mstx_marks.base import env
from mstx_marks.base.forking import after_fork_in_child
from mstx_marks.core import routing as settings
from mstx_marks.export.ascend_db import ascend_db_path
from mstx_marks.export.flush import chain_signal, export_rank, safe_role, signals_deferred
from mstx_marks.export.spill import Spill

__all__ = ["OutSession", "process_role", "record_to"]


def process_role() -> str:
    """This process's role in the job, which tells apart processes that share a rank (a verl job
    on one GPU runs its trainer, FSDP workers and vLLM's processes all as ``RANK`` 0):

    1. ``MSTX_MARKS_ROLE``, when set;
    2. in a Ray actor, the actor's class (``TaskRunner``, ``WorkerDict``, ``AgentLoopWorkerTQ``,
       ...), else its name; in another Ray worker, ``ray_task``;
    3. a named multiprocessing process's name (vLLM's ``EngineCore_DP0``, ``VllmWorker-0``);
    4. the script's name (``main_ppo``, ``train``), else ``main`` (``python -c``, ``-m``, a REPL).

    Ray is never imported for this: only a process that already imported it is asked. Cheap
    enough to call at every spill (an actor's role is kept once found).
    """
    role = env.text(env.ROLE)
    if role:
        return role
    if _actor_role:
        return _actor_role[0]
    ray_role = _ray_role()
    if ray_role:
        return ray_role
    name = multiprocessing.current_process().name
    if name and name != "MainProcess":
        return name
    script = Path(sys.argv[0]).stem if sys.argv and sys.argv[0] else ""
    return script if script and script not in ("-c", "-m") else "main"


_actor_role: list[str] = []  # once known: a process is one actor for life


def _ray_role() -> str:
    """The Ray actor's class name (else its name), ``ray_task`` in another Ray worker, ``""``
    outside Ray workers (the driver included) or when Ray cannot say; never raises."""
    ray = sys.modules.get("ray")
    if ray is None:
        return ""
    try:
        worker = sys.modules.get("ray._private.worker")
        mode = getattr(getattr(worker, "global_worker", None), "mode", None)
        if mode is None or mode != getattr(worker, "WORKER_MODE", 1):
            return ""  # the driver (SCRIPT_MODE), or Ray not connected
        context = ray.get_runtime_context()
        if context.get_actor_id() is None:
            return "ray_task"
        role = _actor_class(context) or context.get_actor_name() or ""
    except Exception:
        return ""
    role = role.rsplit(".", 1)[-1]
    if role:
        _actor_role.append(role)
    return role


def _actor_class(context: Any) -> str:
    try:
        handle = context.current_actor
        descriptor = handle._ray_actor_creation_function_descriptor
        return str(getattr(descriptor, "class_name", ""))
    except Exception:
        return ""


class OutSession:
    """One process's recording to ``out_dir``; :meth:`close` writes its files (once)."""

    def __init__(self, out_dir: str | Path, interval: float | None) -> None:
        self.out_dir = Path(out_dir)
        self.interval = interval
        #: Set when a signal ended a Ray worker: only the spill is written from then on.
        self.spill_only = False
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
        if self.spill_only or self.spill.too_long_to_export():
            return written
        # Made from the spill: the recorder released what it spilled (constant memory).
        trace = self.spill.read()
        if not trace.records:
            return []
        host, pid = socket.gethostname(), os.getpid()
        trace.rank, trace.role = self.spill.rank, self.spill.role
        # torch_npu's folder is <worker>_<time>_ascend_pt: the role leads the worker name, so
        # a listing groups the databases by role too (the role is also in its META_DATA).
        worker = f"{safe_role(trace.role)}_{host}_{pid}" if trace.role else None
        db = ascend_db_path(self.out_dir / "ascend", trace.rank, worker=worker)
        written += export_rank(self.out_dir, trace, db, process=f"{host}-{pid}")
        return written

    def _forked(self) -> None:
        # The child has its own pid, so its own files; the recorder cleared itself at the fork.
        self._closed = False
        self._begin()
        _SignalWatch.after_fork()


_session: OutSession | None = None
_real_exit: Callable[[int], object] = os._exit


class _SignalWatch:
    """Spills from a thread as soon as a signal arrives, before any Python handler has run.

    ``signal.set_wakeup_fd`` makes CPython's C-level handler write the signal's number to a
    pipe; a daemon thread blocked on that pipe wakes at once, even while the main thread sits in
    C code that will never return to Python (Ray's core worker, which is SIGKILLed ~20 ms after
    its SIGTERM). The signal is then handled exactly as before: this only adds a spill. A
    process whose wakeup fd is already taken (an asyncio loop's signal handlers) keeps it, and
    relies on the periodic spill.
    """

    _fds: tuple[int, int] | None = None  # (read, write) of this process's pipe

    @classmethod
    def start(cls) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # set_wakeup_fd works in the main thread only
        read_fd, write_fd = os.pipe()
        try:
            os.set_blocking(write_fd, False)  # a full pipe must never block the C handler
            previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        except (ValueError, OSError):
            os.close(read_fd)
            os.close(write_fd)
            return
        if previous != -1:  # someone else's: give it back
            signal.set_wakeup_fd(previous)
            os.close(read_fd)
            os.close(write_fd)
            return
        cls._fds = (read_fd, write_fd)
        threading.Thread(
            target=cls._wait, args=(read_fd,), name="mstx_marks signal spill", daemon=True
        ).start()

    @staticmethod
    def _wait(read_fd: int) -> None:
        while True:
            try:
                if not os.read(read_fd, 512):
                    return
            except InterruptedError:
                continue
            except OSError:
                return
            session = _session
            if session is not None:
                session.write_now()

    @classmethod
    def after_fork(cls) -> None:
        # The child inherited the wakeup fd but not the thread that reads it: its own pair.
        if cls._fds is None:
            return
        try:
            inherited = signal.set_wakeup_fd(-1)
        except ValueError:  # not the main thread: leave things as they are
            return
        if inherited != cls._fds[1]:  # someone else's by now: put it back
            signal.set_wakeup_fd(inherited)
            return
        for fd in cls._fds:
            os.close(fd)
        cls._fds = None
        cls.start()


def _exit_writing(code: int) -> None:
    # os._exit skips atexit: multiprocessing ends its fork children so. The spill is written
    # first, without blocking. (Ray's workers end in C++, not through here: see _SignalWatch.)
    session = _session
    if session is not None:
        with signals_deferred():
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
    env.run_id()  # made now, so the processes this one starts share it
    session = _session = OutSession(out_dir, interval)
    atexit.register(_close_quietly)
    after_fork_in_child(session._forked)
    os._exit = _exit_writing  # type: ignore[assignment]
    if threading.current_thread() is threading.main_thread():
        for signum in signals:
            chain_signal(signum, _close_on_signal)
        _SignalWatch.start()
    return session


def _close_on_signal() -> None:
    """A signal's close. In a Ray worker the raylet SIGKILLs 20-60 ms after its SIGTERM: an
    export begun now (or from the exit Ray's own handler makes next) would be cut short and
    leave its temporaries, so only the final spill is written there (the reader takes it)."""
    session = _session
    if session is None:
        return
    if _ray_role():
        session.spill_only = True
        with signals_deferred():
            session.write_now(final=True)
        return
    _close_quietly()


def _close_quietly() -> None:
    session = _session
    if session is None:
        return
    try:
        with signals_deferred():  # a signal at exit neither re-enters nor cuts the writing
            session.close()
    except Exception as e:  # an exit hook must not hide the program's own exit status
        print(f"mstx_marks: could not write the recording to {session.out_dir}: {e}",
              file=sys.stderr)  # fmt: skip
