"""The process's one recording session: whatever asks for files joins it, and it owns the only
spill and the only exit write.

``MSTX_MARKS_OUT=DIR`` (and ``mstx-marks run --out``, the Ray hook, a recipe) calls
:func:`record_to`; a program's own :func:`flush_at_exit` joins the same session. Two sessions
on one recorder would each drain and release what the other had not written (a program run with
both kept 63-65k of 200k ranges); so there is one :class:`OutSession` per recorder, a process
has one, and each request for files is a *view* of it (:class:`View`): a folder, written from the
session's one spill at exit, on SIGTERM, or when a ``flush()`` asks.

Each process records (beside the device backend), spills completed events to its own file at
least once a second (:mod:`.spill`), and at exit or SIGTERM adds the ranges still open and
writes each view's Chrome trace and Ascend database, streamed from the spill (:mod:`.stream`).
The files are named by role, rank, host and pid, whoever asked for them (``MSTX_MARKS_OUT`` or
:func:`flush_at_exit`), so the processes of a job (trainer ranks, Ray actors, vLLM's EngineCore
and workers, which may all say rank 0) never overwrite each other; a process that records
nothing writes nothing.

All of a session's writing is done by its one writer thread (:mod:`.writer`, whose contract
says why): the periodic spill, a spill when the recorder is half full, a ``flush()``, a
signal's write, the exit. A signal handler (:func:`~.signals.chain_signal`) or the exit only
asks it and waits, within :func:`exit_seconds`; what does not fit is said in one line, the
spill holds every event, and a view that got no files gets the spill (``mstx-marks export``
writes them). The writer is no daemon: once the program is done (its main thread and the
threads the shutdown waits for have ended) it writes the exit itself, so no code of the main
thread's is needed for the exit's files. Events that exit hooks record after that are written
as they end (:class:`_Late`).

Processes that end without exit hooks still leave their spill. ``os._exit`` (multiprocessing's
fork children end so) is wrapped to write the last events first. Ray 2.60 ends its workers from
C++, where no Python code runs at all (no atexit, no ``os._exit``, no Python signal handler: the
main thread is inside the core worker's task loop): on ``ray.shutdown()`` the raylet sends
SIGTERM and SIGKILLs the worker 20 to 60 ms later (or the worker's own C++ thread calls
``_exit``); ``ray.kill()`` calls ``_exit`` in C++ with no signal at all. So the writer's pipe is
also the process's ``signal.set_wakeup_fd`` (written by the C-level handler, whatever Python
handler is installed and wherever the main thread is), and it spills at once on every signal:
what completed just before ``ray.shutdown()`` usually arrives (18 of 20 actors complete in a
test of this, against 13 of 20 with the periodic spill alone); it is not certain, as the worker
may die before the thread runs. Otherwise (``ray.kill()``, SIGKILL, an OOM kill) at most the
last interval (0.5 s) is lost. Such processes rarely write their Chrome trace and database:
mostly only the spill. A Ray worker that gets to handle its SIGTERM writes only its final spill
(an export would be cut short by the SIGKILL, leaving temporaries behind).

Each process's files carry its role (:func:`process_role`): the Chrome trace is
``chrome/<role>-rank<N>-<host>-<pid>.trace.json`` (:func:`~.process_files.chrome_trace_path`),
the database folder ``ascend/<role>_<host>_<pid>_<time>_ascend_pt``
(:func:`~.process_files.db_worker`, one per folder and process, rewritten by each write), and
the spill says it in its header.

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
import contextlib
import functools
import multiprocessing
import os
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from mstx_marks.backends.base import Backend, Emitter, FaultReport
from mstx_marks.backends.record import Recorder, default_recorder
from mstx_marks.base import env
from mstx_marks.base.diagnostics import warn, warn_once
from mstx_marks.base.forking import after_fork_in_child, new_lock
from mstx_marks.core import configuration as settings
from mstx_marks.core.process import PROCESS
from mstx_marks.export.files import folder_below, probe_folder
from mstx_marks.export.live_beat import Beat
from mstx_marks.export.signals import chain_signal
from mstx_marks.export.spill import Spill
from mstx_marks.export.stream import ExportTimedOut, export_spill
from mstx_marks.export.writer import Request, Writer, say

__all__ = [
    "OutSession",
    "View",
    "cannot_write",
    "flush_at_exit",
    "process_role",
    "record_to",
]


def cannot_write(folder: str | Path) -> str | None:
    """``"cannot write FOLDER: REASON"`` when ``folder`` cannot take files, else None: decided
    by making it (with its parents) and writing a probe file there
    (:func:`~mstx_marks.export.files.probe_folder`), not by ``os.access``, which tells root yes
    for ``/proc/x``. What activation and ``mstx-marks run --out`` say at once, rather than the
    exit hours later.

    >>> import tempfile
    >>> cannot_write(tempfile.mkdtemp()) is None
    True
    >>> file = tempfile.mkstemp()[1]
    >>> cannot_write(file + "/prof") == f"cannot write {file}/prof: {file} is a file"
    True
    """
    path = _absolute(folder)
    problem = probe_folder(path)
    return None if problem is None else f"cannot write {env.shown(path)}: {problem}"


def _absolute(folder: str | Path) -> Path:
    """``folder`` made absolute now, once: a relative one would follow a later ``os.chdir``."""
    try:
        return Path(os.path.abspath(folder))
    except OSError:  # the current folder was removed: nothing to resolve against
        return Path(folder)


def process_role() -> str:
    """This process's role in the job, which tells apart processes that share a rank (a verl job
    on one GPU runs its trainer, FSDP workers and vLLM's processes all as ``RANK`` 0):

    1. ``MSTX_MARKS_ROLE``, when set;
    2. in a Ray actor, the actor's class (``TaskRunner``, ``WorkerDict``, ``AgentLoopWorkerTQ``,
       ...), else its name; in another Ray worker, ``ray_task``;
    3. a named multiprocessing process's name (vLLM's ``EngineCore_DP0``, ``VllmWorker-0``);
    4. the script's name (``main_ppo``, ``train``; a package run with ``-m``, the package's:
       ``mstx_marks`` for ``python -m mstx_marks``; ``stdin`` for ``python - <<EOF``), else
       ``main`` (``python -c``, a REPL).

    It starts with a letter or a digit (any other leading characters are dropped): the
    process's file names start with it, and ``ls``, ``rm`` and ``cp`` take a name that starts
    with ``-`` for an option. Ray is never imported for this: only a process that already
    imported it is asked. Cheap enough to call at every spill (an actor's role is kept once
    found).
    """
    role = _role()
    start = next((i for i, c in enumerate(role) if c.isascii() and c.isalnum()), None)
    return "main" if start is None else role[start:]


def _role() -> str:
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
    path = Path(sys.argv[0] if sys.argv else "")
    # ``python -m package`` runs package/__main__.py: the package says more than __main__.
    script = path.parent.name if path.stem == "__main__" else path.stem
    if script == "-":  # the program came on standard input
        return "stdin"
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
    """The actor's class: from the name of the task this thread runs (``Class.method``, after
    ``name:`` for a named actor), else from the actor's handle. The task's name first: the
    handle makes Ray load the actor's class again, which may import a framework in the middle
    of its own plugin loading (``import verl`` in an actor's ``__init__`` activates us: verl's
    engines then fixed the device before verl's platform plugin had registered). The role is
    kept once found, so a thread with no task (the spill's) asks the handle only when no task
    of the actor has said it."""
    try:
        name = str(context.get_task_name() or "")
        if "." in name:
            return name.split(".", 1)[0].rsplit(":", 1)[-1]
        descriptor = context.current_actor._ray_actor_creation_function_descriptor
        return str(getattr(descriptor, "class_name", ""))
    except Exception:
        return ""


@dataclass
class View:
    """One request for files: a folder written from the session's spill. ``rank`` is the rank
    the files say (None: the process's, read when written)."""

    out_dir: Path
    rank: int | None = None
    #: What the last write put there (a write with nothing recorded never replaces it).
    written: list[Path] = field(default_factory=list)


class OutSession:
    """One recording's spill and exits, and the views written from it (module docstring).

    ``recorder`` is the process's recorder unless given (a private recording of one's own);
    the spill lives in the first view's folder. Its files are written by its one writer thread
    (:mod:`.writer`): :meth:`flush` and :meth:`close` ask it and wait, with a deadline.
    """

    def __init__(
        self,
        out_dir: str | Path,
        interval: float | None,
        *,
        recorder: Recorder | None = None,
        rank: int | None = None,
    ) -> None:
        self.out_dir = _absolute(out_dir)
        self.interval = interval
        self.recorder = recorder if recorder is not None else default_recorder()
        self.views = [View(self.out_dir, rank)]
        _say_if_unwritable(self.out_dir)
        #: Set when a signal ended a Ray worker: only the spill is written from then on.
        self.spill_only = False
        self._closed = False
        self._late_writes = 0
        self._lost_said = False
        self._exported = -1  # the spill's event count when the views were last written
        #: When the exit's writing must be done by (``time.monotonic()``), from the first
        #: signal that may end the process; None before one.
        self._exit_by: float | None = None
        # Only for the list of views: never held across a wait, nor by the writer.
        self.lock = new_lock(reentrant=True)
        # Serves a request on the asking thread once the writer has stopped (at exit). An RLock
        # for its owner's release alone (see _ask), never entered twice.
        self._inline = new_lock(reentrant=True)
        self._begin()

    def _begin(self) -> None:
        self.spill = Spill(self.out_dir, self.recorder, rank=self._rank(), role=process_role())
        self.beat = Beat(self.out_dir)  # (a live reader's word of how far the spill is written)
        self.writer = Writer(self._serve, self.interval, failed=self._failed,
                             at_exit=self._program_done, name="mstx_marks spill")  # fmt: skip
        # Woken when the recorder is half full, not only every interval: a loop recording a
        # range every 0.6 us fills 50,000 events in 30 ms, and the writer takes 0.2 us each.
        self.recorder.wake_reader = self.writer.wake

    def _rank(self) -> int:
        explicit = [v.rank for v in self.views if v.rank is not None]
        return explicit[0] if explicit else env.rank()

    def view(self, out_dir: str | Path, *, rank: int | None) -> View:
        """The view of ``out_dir`` for that rank, added if new: what a request joins."""
        folder = _absolute(out_dir)
        with self.lock:
            for v in self.views:
                if v.out_dir == folder and v.rank == rank:
                    return v
            view = View(folder, rank)
            self.views.append(view)
        _say_if_unwritable(folder)
        return view

    def write_now(self, *, final: bool = False, blocking: bool = True) -> Path:
        """Spill what completed (and, ``final``, what is still open) on this thread; never
        raises. The writer's own step; elsewhere, for tests and code that owns the session."""
        try:
            # The rank may become known later (torch.distributed initialised after start).
            self.spill.rank, self.spill.role = self._rank(), process_role()
            return self.spill.write_now(final=final, blocking=blocking)
        except Exception:
            return self.spill.path

    def _ask(self, kind: str, arg: Any = None, timeout: float | None = None) -> Any:
        """What the writer did for ``kind``: asked and waited for, at most ``timeout`` seconds
        (the exit's budget by default); None when it did not answer in time, said once."""
        timeout = exit_seconds() if timeout is None else timeout
        if not self.writer.alive():  # stopped (the program is done): on this thread, one at a time
            inline = self._inline
            if inline._is_owned():  # a signal handler's ask on the thread serving one: refused
                return None  # at once (it would write beside the write it interrupted)
            # The acquire inside the try, released by its owner only: CPython runs a signal
            # handler right after a call returns, so a Ctrl-C landing as acquire() returned,
            # before a try began, left the lock held, and every later ask here (a range an
            # exit hook records) waited its whole budget, then was lost.
            try:
                if not inline.acquire(timeout=timeout):
                    return None
                request = Request(kind, arg)
                self._serve([request], False)
                return request.result
            finally:
                try:  # noqa: SIM105 (suppress() is a call before the release: a point to leak at)
                    inline.release()
                except RuntimeError:  # not this thread's: its wait timed out
                    pass
        served, result = self.writer.ask_and_wait(kind, arg, timeout)
        if served:
            return result
        say(f"the files of {self.out_dir} were not all written within {timeout:g} s"
            f" ({env.EXIT_SECONDS}): every event is in the spill {self.spill.path};"
            f" `mstx-marks export {self.out_dir}` writes the rest")  # fmt: skip
        return None

    def flush(self, view: View | None = None, *, timeout: float | None = None) -> list[Path]:
        """Spill now and write ``view`` (every view: None) from the spill; the files written.
        The session goes on: a later flush or the exit writes them again, with more. With
        ``timeout`` (seconds: a signal's flush), the wait and the writing stop then."""
        deadline = None if timeout is None else time.monotonic() + timeout
        wait = _FLUSH_WAIT if timeout is None else timeout
        return self._ask("flush", (view, deadline), wait) or []

    def spill_now(self) -> Path:
        """Spill everything now, open ranges included (flagged), and wait for it (a Ray
        worker's last act, ``os._exit``'s)."""
        result = self._ask("spill")
        return result[0] if result else self.spill.path

    def close(self) -> list[Path]:
        """The last spill, then every view's Chrome trace and database; once (a later close
        writes only what was recorded since)."""
        written: list[Path] = self._ask("close") or []
        if self.recorder is default_recorder() and not self.spill_only:
            _write_late_ranges(self)
        return written

    def late(self) -> None:
        """An event completed after :meth:`close` by an exit hook (one that runs after ours,
        having been registered before the library was imported): spill it and write the views
        again, at once, since nothing runs later to do it. At most :data:`LATE_REWRITES` times;
        after that only the spill takes them (said once). Exit hooks run on the main thread:
        another thread still recording then (a daemon that the shutdown is about to stop)
        asks nothing, or each of its ranges would make a write."""
        if threading.current_thread() is threading.main_thread():
            self._ask("late")

    # -- the writer's side ----------------------------------------------------------------

    def _serve(self, batch: list[Request], signalled: bool) -> None:
        """What the writer does when it wakes: the requests in order (the same request twice in
        one batch is done once), else spill what completed (the interval, or a signal)."""
        if not batch:
            through = self.beat.due()  # (read before the write: see live_beat)
            self.write_now()
            spill = self.spill
            opens = [] if through is None else self.recorder.open_ranges(spill._cursor)
            self.beat.write(through, spill.path.name, spill.instance, os.getpid(), spill.run, opens)
            return
        done: dict[tuple[str, int], Any] = {}
        for request in batch:
            key = (request.kind, id(request.arg))
            if key not in done:
                done[key] = self._do(request.kind, request.arg)
            request.result = done[key]

    def _do(self, kind: str, arg: Any) -> list[Path]:
        if kind == "spill":
            return [self.write_now(final=True)]
        if kind == "flush":
            view, deadline = arg
            spilled = self.write_now(final=True)
            views = [view] if view is not None else list(self.views)
            return self._write_views(views, spilled, deadline)
        # The exit's budget runs from the first signal that began it, when one did (its flush,
        # then the close once the handlers made the program end, share it), else from now.
        deadline = self._exit_by or time.monotonic() + exit_seconds()
        if kind == "close" and not self._closed:
            self._closed = True
            spilled = self.write_now(final=True)
            if self.spill_only:
                return [spilled]
            written = [spilled, *self._write_views(list(self.views), spilled, deadline)]
            if self.spill.lost and not self._lost_said:  # the folder took writes again later
                warn(f"{self.spill.lost} of the {self.spill.events} events recorded are in no"
                     f" file: {env.shown(self.out_dir)} refused them for too long")  # fmt: skip
            return written
        # "late", or a close after the first: what was recorded since, if anything
        spilled = self.write_now(final=True)
        if self.spill.events == self._exported or self.spill_only:
            return [spilled]
        if self._late_writes >= LATE_REWRITES:
            warn_once(
                ("late ranges",),
                f"ranges recorded at exit after {LATE_REWRITES} were written after the"
                f" exports: they are in the spill ({spilled}) only",
            )
            return [spilled]
        self._late_writes += 1
        return [spilled, *self._write_views(list(self.views), spilled, deadline)]

    def _program_done(self) -> None:
        """The exit's write, made by the writer itself once the program is done (its main
        thread and the threads the shutdown waits for have ended): no exit hook of the main
        thread's is needed for it. Hooks that record after this are :class:`_Late`'s. Held
        as a request served on the asking thread is (``_inline``): an exit hook that asks
        meanwhile waits for it, rather than writing beside it (the older write would land
        last)."""
        with self._inline:
            self._do("close", None)
        if self.recorder is default_recorder() and not self.spill_only:
            _write_late_ranges(self)

    def _failed(self, exc: BaseException) -> None:
        what = f"{env.shown(self.out_dir)} failed ({type(exc).__name__}: {env.shown(exc, 200)})"
        warn_once(("writer", id(self)), f"writing {what}; the writer goes on")

    def _write_views(
        self, views: list[View], spilled: Path, deadline: float | None = None
    ) -> list[Path]:
        """Each view's Chrome trace and database, streamed from the spill in bounded memory
        (:func:`~.stream.export_spill`), whatever the run's length; past ``deadline``
        (``time.monotonic()``), what is not written is said and left to ``mstx-marks
        export``, the previous files kept whole."""
        spill = self.spill
        written: list[Path] = []
        try:
            with spill.on_disk() as (path, extra):
                for view in views:
                    done = self._write_view(view, path, extra, deadline)
                    if done is None:  # out of time: this view and the rest get the spill
                        written += self._leave_spill(view, path)
                        continue
                    written += done
        except (OSError, ValueError) as exc:  # the spill cannot be read back (TraceFileError)
            warn_once(("spill unread", str(spilled)), f"no Chrome trace or database written:"
                      f" the spill cannot be read back ({env.shown(exc, 300)})")  # fmt: skip
            return [spilled]
        self._exported = spill.events
        return written

    def _write_view(
        self, view: View, path: Path | None, extra: bytes, deadline: float | None
    ) -> list[Path] | None:
        """The files written for ``view``; None when the deadline passed first."""
        spill = self.spill
        done = None
        if path is not None:
            if deadline is not None and time.monotonic() >= deadline:
                return None
            try:
                done = export_spill(
                    view.out_dir,
                    path,
                    extra=extra,
                    rank=view.rank if view.rank is not None else spill.rank,
                    role=spill.role,
                    deadline=deadline,
                    dropped=self.recorder.dropped,
                )
            except ExportTimedOut:
                return None
            except OSError as exc:  # one folder that cannot be written spoils no other
                self._say_lost(view, exc.strerror or str(exc))
                return []
            for line in done.refused:
                warn_once(("refused", line), line)
        if done is None or not done.paths:
            if spill.unwritten:  # recorded, but in no file: not an empty recording
                self._say_lost(view, spill.failure or "its writes failed")
                return []
            warn_once(
                ("empty recording", str(view.out_dir)),
                f"this process recorded no ranges, so {view.out_dir} gets none:"
                f" {_why_empty(self.recorder)}",
            )
            return view.written  # an empty recording never replaces one with ranges
        view.written[:] = done.paths
        return view.written

    def _leave_spill(self, view: View, path: Path | None) -> list[Path]:
        """``view`` did not get its files in time: it gets the spill (a hard link to it, else
        a copy; the spill's own folder has it already), and one line says how to write the
        rest. Every view gets its files, or a spill and that line."""
        where = view.out_dir
        left: list[Path] = []
        if path is not None and path.parent != where / "spill":
            target = where / "spill" / path.name
            try:
                folder_below(where, target.parent)
                # Made anew unless it is the spill itself: one left by an earlier write (a
                # signal's flush) is a copy, or a link to a spill since replaced, and lacks
                # what came after (the user's handler's last range, then `export` of it).
                if not (target.exists() and os.path.samefile(path, target)):
                    fresh = target.with_name(f".{target.name}.{os.getpid()}.tmp")
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(fresh)
                    try:
                        os.link(path, fresh)
                    except OSError:  # another file system
                        shutil.copyfile(path, fresh, follow_symlinks=False)
                    os.replace(fresh, target)
                left.append(target)
            except OSError as exc:
                self._say_lost(view, exc.strerror or str(exc))
                return []
        say(f"the Chrome trace and database of {where} were not written within"
            f" {env.EXIT_SECONDS}={exit_seconds():g} s; every event is in its spill:"
            f" `mstx-marks export {where}` writes them")  # fmt: skip
        return left

    def _say_lost(self, view: View, reason: str) -> None:
        """At the exit's write, once per folder: what ``view`` did not get, and whether the
        events are in any file at all."""
        spill = self.spill
        text = f"cannot write {env.shown(view.out_dir)}: {reason}: no Chrome trace or database"
        if spill.out_dir == view.out_dir and spill.unwritten:
            text += f"; {spill.unwritten} of the {spill.events} events recorded are in no file"
            self._lost_said = True
        warn_once(("lost at exit", str(view.out_dir)), text)

    def start_over(self, forked: bool) -> None:
        """In a forked child (``forked``): the child's own files, from a new writer. Else (a
        test's fresh start): stop without writing; the writer thread ends."""
        if forked:
            self._forked()
            return
        self._closed = True
        self.writer.unwatch_signals()
        self.writer.stop()
        if self.recorder.wake_reader == self.writer.wake:
            self.recorder.wake_reader = None

    def _forked(self) -> None:
        # The child has its own pid, so its own files; the recorder cleared itself at the fork.
        # Its writer thread did not come along (only the forking thread does): a new one.
        self._closed, self._exported, self._late_writes, self._exit_by = False, -1, 0, None
        for v in self.views:
            v.written = []
        parent = self.writer
        self._begin()
        if self is PROCESS.session:
            parent.unwatch_signals()
            self.writer.watch_signals()


#: How many times events completed after the exit write rewrite the exports (module docstring).
LATE_REWRITES = 16


class _Late(Backend):
    """The backend in force after the exit write: ``inner``'s calls, each completed event then
    written by ``session.late()``. Exit hooks run newest first, so one registered before the
    library was imported runs after its exit write, and its ranges would be lost without it."""

    def __init__(self, inner: Backend, session: OutSession) -> None:
        self.inner, self.session = inner, session
        self.name, self.emits = inner.name, inner.emits

    def emitter(self, stream: object) -> Emitter:
        em, late = self.inner.emitter(stream), self.session.late
        start, end, instant = em.start, em.end, em.instant

        def late_end(handle: Any, domain: str) -> None:
            end(handle, domain)
            late()

        def late_instant(name: str, domain: str) -> None:
            instant(name, domain)
            late()

        return Emitter(self, start, late_end, late_instant)

    def records_into(self) -> Recorder | None:
        return self.inner.records_into()

    def keep_args(self, handle: Any, args: Mapping[str, Any]) -> None:
        self.inner.keep_args(handle, args)

    def instant_with_args(
        self, name: str, domain: str, args: Mapping[str, Any], stream: object
    ) -> None:
        self.inner.instant_with_args(name, domain, args, stream)
        self.session.late()

    def report_faults_to(self, report: FaultReport) -> None:
        self.inner.report_faults_to(report)

    def rearm(self) -> None:
        self.inner.rearm()


def _write_late_ranges(session: OutSession) -> None:
    """From the exit write on, every completed event is written as it completes (:class:`_Late`)."""
    try:
        backend = settings.current_backend()
        if not isinstance(backend, _Late):
            settings.configure(backend=_Late(backend, session))
    except Exception as exc:  # the exit's files are written; the late ones are a bonus
        warn_once(("late",), f"ranges recorded after the exit write may be lost ({exc})")


def _say_if_unwritable(folder: Path) -> None:
    """Say at once, when files are asked for, that ``folder`` cannot take them (not hours later,
    at the exit); keyed as the spill's own first failure, so it is said once."""
    problem = cannot_write(folder)
    if problem:
        warn_once(
            ("cannot write", str(folder)),
            f"{problem}; ranges are recorded, and wait in memory for it to become writable",
        )


def _why_empty(recorder: Recorder) -> str:
    """In plain words, why a process recorded nothing into ``recorder``."""
    if recorder is not default_recorder():
        return "no range or instant was recorded into the recorder given to flush_at_exit"
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


def _session() -> OutSession | None:
    """The process's session (:data:`~mstx_marks.core.process.PROCESS` holds it), if made."""
    session = PROCESS.session
    return session if isinstance(session, OutSession) else None


_real_exit: Callable[[int], object] = os._exit


#: How long a flush the program asked for may wait for its files (it is no exit: longer).
_FLUSH_WAIT = 3600.0


def exit_seconds() -> float:
    """How long the last write may take, at exit, or from a signal to the process's end
    (``MSTX_MARKS_EXIT_SECONDS``, default 5: Kubernetes and Slurm give 30 s between SIGTERM
    and SIGKILL, and the user's own handlers and the interpreter's teardown need their share;
    a process stopped by a signal is gone within 10 s)."""
    return float(env.positive_int(env.EXIT_SECONDS, 5))


def _exit_writing(code: int) -> None:
    # os._exit skips atexit: multiprocessing ends its fork children so. The spill is written
    # first, by the writer, waited for with the exit's deadline. (Ray's workers end in C++, not
    # through here: the writer's wake-up fd covers them, see writer.py.)
    session = _session()
    if session is not None:
        with contextlib.suppress(Exception):
            session.spill_now()
    _real_exit(code)


def record_to(
    out_dir: str | Path,
    *,
    interval: float | None = 0.5,
    signals: Iterable[int] = (signal.SIGTERM,),
) -> OutSession:
    """Record this process's ranges to ``out_dir`` until it exits (what ``MSTX_MARKS_OUT``
    does); returns the process's session. ``interval`` is the spill period in seconds (None:
    only at exit). A later call joins the session: ``out_dir`` becomes one more view of it."""
    session = _join(out_dir, interval, signals, rank=None)
    session.view(out_dir, rank=None)
    return session


def flush_at_exit(
    out_dir: str | Path,
    *,
    rank: int | None = None,
    recorder: Recorder | None = None,
    signals: Iterable[int] = (signal.SIGTERM, signal.SIGINT),
    interval: float | None = 0.5,
) -> Callable[[], list[Path]]:
    """Write this process's recording to ``out_dir`` (a Chrome trace,
    ``chrome/<role>-rank<N>-<host>-<pid>.trace.json``, and an Ascend database: named as
    ``MSTX_MARKS_OUT``'s) at interpreter exit and on each of ``signals``; return the flush, to
    call at any time as well.

    It joins the process's one recording session (:func:`record_to`, ``MSTX_MARKS_OUT``): one
    spill, one exit write, ``out_dir`` one more view of it. Asking for files means recording:
    every range from now on is also kept by the in-process recorder, beside the device backend.
    ``rank`` defaults to the process's (``RANK``, else torch.distributed's, else 0).
    Completed events are spilled every ``interval`` seconds (None: only at a flush) and released
    from the recorder; each flush spills the rest and rewrites the same files from the spill; a
    flush with nothing recorded says why once and never replaces files that hold ranges. On a
    signal the files are written, then the handler that was there before runs (so SIGTERM still
    ends the process and Ctrl-C still raises KeyboardInterrupt). Signal handlers can be set from
    the main thread only: called from another thread it says so once and hooks the exit alone.
    ``recorder`` makes a session of that recorder's own, apart from the process's.
    ``multiprocessing`` children leave with ``os._exit``, which is wrapped to spill first.

    >>> import tempfile
    >>> from mstx_marks.backends.record import Recorder
    >>> rec = Recorder()
    >>> rec.range_end(rec.range_start("step", "default"), "default")
    >>> flush = flush_at_exit(tempfile.mkdtemp(), rank=0, recorder=rec, signals=())
    >>> chrome, db = flush()
    >>> "-rank0-" in chrome.name, db.name
    (True, 'ascend_pytorch_profiler_0.db')
    """
    if recorder is not None:  # a recording of its own: its own session and exit
        own = OutSession(out_dir, interval, recorder=recorder, rank=rank)
        after_fork_in_child(own._forked)
        atexit.register(_closing(own))
        _chain(signals, functools.partial(_signal_write, own))
        return functools.partial(own.flush, own.views[0])
    session = _join(out_dir, interval, signals, rank=rank)
    return functools.partial(session.flush, session.view(out_dir, rank=rank))


_join_lock = new_lock(reentrant=True)
_chained: set[int] = set()


def _join(
    out_dir: str | Path,
    interval: float | None,
    signals: Iterable[int],
    *,
    rank: int | None,
) -> OutSession:
    """The process's session, made (with its exit hooks) by the first request; every request
    adds the signals it asks for."""
    with _join_lock:
        settings.configure(record=True)
        env.run_id()  # made now, so the processes this one starts share it
        session = _session()
        if session is None:
            session = OutSession(out_dir, interval, rank=rank)
            PROCESS.adopt(session)  # it starts over with the process, in a forked child too
            atexit.register(_close_quietly)
            os._exit = _exit_writing  # type: ignore[assignment]
            session.writer.watch_signals()
        _chain([s for s in signals if s not in _chained], _on_signal)
        return session


def _chain(signals: Iterable[int], write: Callable[[object], None]) -> None:
    wanted = list(signals)
    if not wanted:
        return
    if threading.current_thread() is not threading.main_thread():
        warn_once(
            ("signals from a thread",),
            "files were asked for from a thread other than the main one, where Python lets no"
            " signal handler be set: the recording is written at exit and spilled as it goes,"
            " but a SIGTERM or Ctrl-C does not write it first (ask from the main thread)",
        )
        return
    for signum in wanted:
        chain_signal(signum, write)
        _chained.add(signum)


def _closing(session: OutSession) -> Callable[[], None]:
    def close() -> None:
        try:
            session.close()
        except Exception as e:  # an exit hook must not hide the program's own exit status
            say(f"could not write the recording to {session.out_dir}: {e}")

    return close


def _signal_write(session: OutSession, previous: object) -> None:
    """What a signal's handler does before the handler that was there before runs: ask the
    writer for every file and wait, within the exit's budget (the process may die right
    after: SIGTERM's default). Two cases ask less. Ctrl-C's default handler raises
    KeyboardInterrupt, which the program may catch and go on: the exit writes the files if
    it ends, so only a spill is asked for, without waiting. In a Ray worker the raylet SIGKILLs
    20-60 ms after its SIGTERM: an export begun now would be cut short and leave its
    temporaries, so only the final spill is written there (the reader takes it)."""
    if previous is signal.default_int_handler:
        session.writer.wake()
    elif _ray_role():
        session.spill_only = True
        session.spill_now()
    else:
        # The exit's budget starts here: the process may end right after this signal (its
        # default, or the user's handler's sys.exit), and the close shares what is left.
        budget = exit_seconds()
        session._exit_by = session._exit_by or time.monotonic() + budget
        session.flush(timeout=budget)


def _on_signal(previous: object) -> None:
    session = _session()
    if session is not None:
        _signal_write(session, previous)


def _close_quietly() -> None:
    session = _session()
    if session is not None:
        _closing(session)()
