"""The one thread that writes a recording session's files, and how anyone else asks it to.

Code that can run at a bytecode boundary of the main thread (a signal handler, ``__del__``, a
weakref callback, a trace hook, a range that ends after the exit's write) must never block on a
lock without a deadline, nor write a file there: the thread it interrupted may hold any lock,
and a lock the writer then waits for turns a SIGTERM into a process that never ends (it did:
the main thread, interrupted holding the recorder's lock, waited in its handler for the spill's
lock, which the writer held while it waited for the recorder's). Re-entrant locks are no fix:
they turn the deadlock into corrupt state. So, the contract of this module:

- **One writer.** Only the writer thread writes a session's spill and exports. A flush, a
  close, an event after the close: each is a request to it (:meth:`Writer.ask`).
- **Asking never blocks and never raises.** A request is a ``deque`` append and one byte
  written to a non-blocking pipe (asyncio's signal handling wakes its loop so), so it may be
  made anywhere, a signal handler included.
- **Waiting has a deadline.** A caller that must know the files are written (a SIGTERM's
  handler before the process dies, the exit) waits for its request on a lock that the writer
  releases (``release`` never blocks) with a timeout, and past it goes on and says so.
- **The writer never waits on the interrupted thread.** What it needs of the recorder it takes
  without a lock, or with a non-blocking acquire (freeing drained chunks waits for the next
  write when the lock is busy: :meth:`~mstx_marks.backends.record.Recorder.drain_blocks`).
- **Signals wake it even when no Python handler can run.** When ``signal.set_wakeup_fd`` is
  free, the pipe is also the C-level handler's wake-up fd: the writer spills at once on every
  signal, even while the main thread sits in C code that never returns (Ray's workers, which
  are SIGKILLed 20-60 ms after their SIGTERM).

>>> done = []
>>> w = Writer(lambda batch, signalled: done.extend(r.kind for r in batch), None)
>>> w.ask("flush").wait(5.0), done
(True, ['flush'])
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time
from collections import deque
from typing import Any, Callable

__all__ = ["Request", "Writer", "say"]

#: The byte a request writes; the C-level signal handler writes the signal's number (>= 1).
_ASKED = b"\0"


def say(text: str) -> None:
    """Write one line to stderr with ``os.write``: what code in a signal handler or at exit
    may use (``print`` and ``logging`` take locks the interrupted thread may hold)."""
    with contextlib.suppress(OSError):
        os.write(2, f"mstx_marks: {text}\n".encode("utf-8", "replace"))


class Request:
    """One thing asked of the writer: ``kind`` and ``arg`` (the session says what they mean),
    and, once done, ``result`` (and ``served``)."""

    __slots__ = ("arg", "done", "kind", "queued", "result", "served")

    def __init__(self, kind: str, arg: Any = None) -> None:
        self.kind, self.arg = kind, arg
        self.result: Any = None
        self.queued = self.served = False
        self.done = threading.Lock()
        self.done.acquire()  # released by the writer when served: release never blocks

    def wait(self, timeout: float) -> bool:
        """Whether the request was served within ``timeout`` seconds. Asked of ``served``,
        which the writer sets before releasing ``done``, so a wait begun again after an
        interruption that took ``done`` away does not wait in vain."""
        if not self.served:
            self.done.acquire(timeout=min(max(timeout, 0.0), threading.TIMEOUT_MAX))
        return self.served


class Writer:
    """A daemon thread that calls ``serve(batch, signalled)`` each time it wakes: with the
    requests asked since (in order; often none), and whether a signal woke it. It wakes every
    ``interval`` seconds (None: only when asked or signalled), when asked, and on a signal
    when it holds the wake-up fd (:meth:`watch_signals`). ``serve`` runs on the writer thread
    only; an exception from it is passed to ``failed`` and the thread goes on."""

    def __init__(
        self,
        serve: Callable[[list[Request], bool], object],
        interval: float | None,
        *,
        failed: Callable[[BaseException], object] = lambda exc: None,
        at_exit: Callable[[], object] | None = None,
        name: str = "mstx_marks writer",
    ) -> None:
        self.interval = interval
        self._serve, self._failed, self._at_exit = serve, failed, at_exit
        self._requests: deque[Request] = deque()
        # Never closed: a wake racing a close would write into whatever file took the number.
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)  # a full pipe: a wake is pending, nothing is lost
        self._stopped = False
        # Not a daemon, when it has an exit's write to make: the interpreter's shutdown then
        # waits for it (threading's join of non-daemon threads), and it writes once the main
        # thread and every other thread that records are done. So the exit's files need no
        # code of the main thread's: an exit hook that a Ctrl-C cuts short at its first
        # instruction costs nothing. (Its work has a deadline: it cannot hold the exit.)
        self.thread = threading.Thread(target=self._run, name=name, daemon=at_exit is None)
        self.thread.mstx_writer = True  # type: ignore[attr-defined]  # (_program_done)
        self.thread.start()
        if at_exit is not None:
            with contextlib.suppress(Exception):  # (a private hook: woken at once when there)
                threading._register_atexit(self.wake)  # type: ignore[attr-defined]

    def wake(self) -> None:
        """Wake the writer; never blocks, never raises (safe in a signal handler)."""
        try:  # noqa: SIM105 (suppress() costs an object and two calls; a recorder calls this)
            os.write(self._write, _ASKED)
        except OSError:  # full: it will wake anyway
            pass

    def ask(self, kind: str, arg: Any = None) -> Request:
        """Queue a request and wake the writer; never blocks. ``wait`` on the result to know
        it was served (with a deadline)."""
        request = Request(kind, arg)
        self._submit(request)
        return request

    def _submit(self, request: Request) -> None:
        if not request.queued:
            # Flagged first, with no call before the append: a retry after an interruption
            # never queues it twice (the append is done once its call has begun).
            request.queued = True
            self._requests.append(request)
        self.wake()

    def ask_and_wait(self, kind: str, arg: Any, timeout: float) -> tuple[bool, Any]:
        """Ask, and wait at most ``timeout`` seconds for the answer: (whether it came, the
        result). An exception that a signal handler raises meanwhile (Ctrl-C during the exit's
        write) does not cut the wait short, which would leave the files half written: the
        first one is raised again, unchanged, once the wait is over."""
        request = Request(kind, arg)
        deadline = time.monotonic() + timeout
        interrupted: BaseException | None = None
        while True:
            try:
                self._submit(request)
                request.wait(deadline - time.monotonic())
                break
            except BaseException as exc:  # the user's, from a handler: theirs once we are done
                interrupted = interrupted or exc
                if request.served or time.monotonic() >= deadline:
                    break
        if interrupted is not None:
            raise interrupted
        return request.served, request.result

    def alive(self) -> bool:
        """Whether the writer thread is there to serve (not after a fork, nor once stopped)."""
        return not self._stopped and self.thread.is_alive()

    def stop(self) -> None:
        """End the thread after what it is serving (requests still queued are served first)."""
        self._stopped = True
        self.wake()

    def watch_signals(self) -> bool:
        """Make the pipe the process's ``signal.set_wakeup_fd`` (from the main thread, when no
        one else holds it, such as an asyncio loop); whether it now is."""
        if threading.current_thread() is not threading.main_thread():
            return False
        try:
            previous = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        except (ValueError, OSError):
            return False
        if previous != -1:  # someone else's: give it back
            with contextlib.suppress(ValueError, OSError):
                signal.set_wakeup_fd(previous)
            return False
        return True

    def unwatch_signals(self) -> None:
        """Give the wake-up fd back when it is ours (a forked child: its writer is another)."""
        try:
            current = signal.set_wakeup_fd(-1)
        except (ValueError, OSError):
            return
        if current != self._write:
            with contextlib.suppress(ValueError, OSError):
                signal.set_wakeup_fd(current)

    def _sleep(self) -> bool:
        """Wait for a wake or the interval; whether a signal's byte came."""
        interval = self.interval
        if self._at_exit is not None:  # it looks at the main thread once a second at least
            interval = 1.0 if interval is None else min(interval, 1.0)
        try:  # poll: select() refuses a descriptor past 1023, which a busy process may give us
            poller = select.poll()
            poller.register(self._read, select.POLLIN)
            poller.poll(None if interval is None else interval * 1000)
        except (OSError, ValueError, AttributeError):
            return False
        signalled = False
        while True:
            try:
                data = os.read(self._read, 4096)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                return signalled
            if not data:
                break
            signalled = signalled or bool(data.strip(_ASKED))
            if len(data) < 4096:
                break
        return signalled

    def _run(self) -> None:
        while True:
            signalled = self._sleep()
            batch: list[Request] = []
            while self._requests:
                batch.append(self._requests.popleft())
            try:
                self._serve(batch, signalled)
            except BaseException as exc:  # the thread must outlive any one write
                with contextlib.suppress(BaseException):
                    self._failed(exc)
            finally:
                for request in batch:
                    request.served = True  # first: a waiter reads it (Request.wait)
                    request.done.release()
            if self._stopped and not self._requests:
                return
            if self._at_exit is not None and _program_done():
                self._stopped = True  # from now on, who asks is served on their own thread
                try:
                    self._at_exit()
                except BaseException as exc:
                    with contextlib.suppress(BaseException):
                        self._failed(exc)
                return


def _program_done() -> bool:
    """Whether the main thread has ended (the interpreter is shutting down) and no other thread
    that the shutdown waits for is left, but ours: nothing will record after that but exit
    hooks."""
    if threading.main_thread().is_alive():
        return False
    # Not counting the writers, ours and other sessions' (each waits for the others otherwise:
    # the shutdown would wait for ever).
    return not any(
        not t.daemon and t.is_alive() and not getattr(t, "mstx_writer", False)
        for t in threading.enumerate()
        if t is not threading.main_thread()
    )
