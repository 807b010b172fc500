"""Read many files in worker processes, with a progress line on stderr.

Each worker reads one file at a time and sends back only what the caller's function returns
(for ``summary``, a few numbers per phase), so memory is that of one file per worker whatever the
number of files. Workers are started with ``spawn`` (never ``fork``: the caller may hold threads
and locks, a training job's for instance). With one file, one job or one CPU the files are read
in this process.

>>> list(map_files(str.upper, ["a", "b"], jobs=1))
[('a', 'A'), ('b', 'B')]
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import IO, Callable, Iterator, Sequence, TypeVar

__all__ = ["PROGRESS_AFTER", "Progress", "default_jobs", "map_files"]

A = TypeVar("A")
R = TypeVar("R")

#: More files than this and reading them prints a progress line.
PROGRESS_AFTER = 4


def default_jobs() -> int:
    """One worker per CPU this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class Progress:
    """``reading traces: 12/64 files (3.1 s)`` on ``stream``: rewritten in place on a terminal,
    else a line at most every ``every`` seconds and one at the end."""

    def __init__(self, total: int, stream: IO[str] | None = None, every: float = 2.0) -> None:
        self.total, self.done = total, 0
        self.stream = sys.stderr if stream is None else stream
        self.every = every
        self.start = self.last = time.monotonic()
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.enabled = total > PROGRESS_AFTER

    def _line(self) -> str:
        elapsed = time.monotonic() - self.start
        return f"reading traces: {self.done}/{self.total} files ({elapsed:.1f} s)"

    def step(self) -> None:
        self.done += 1
        if not self.enabled:
            return
        now = time.monotonic()
        final = self.done == self.total
        if self.tty:
            self.stream.write("\r" + self._line() + ("\n" if final else ""))
        elif final or now - self.last >= self.every:
            self.stream.write(self._line() + "\n")
        else:
            return
        self.last = now
        self.stream.flush()


def map_files(
    fn: Callable[[A], R],
    items: Sequence[A],
    jobs: int | None = None,
    progress: Progress | None = None,
) -> Iterator[tuple[A, R]]:
    """``(item, fn(item))`` for each item, in the order they finish; ``fn`` must be picklable
    (a module-level function) and should catch its own errors."""
    jobs = default_jobs() if jobs is None else jobs
    jobs = max(1, min(jobs, len(items)))
    if jobs == 1:
        for item in items:
            result = fn(item)
            if progress:
                progress.step()
            yield item, result
        return
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        pending: dict[Future[R], A] = {}
        queue = iter(items)
        # A bounded window: results are consumed as they come, never all held at once.
        for item in queue:
            pending[pool.submit(fn, item)] = item
            if len(pending) >= 2 * jobs:
                break
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                item = pending.pop(future)
                if progress:
                    progress.step()
                yield item, future.result()
                nxt = next(queue, None)
                if nxt is not None:
                    pending[pool.submit(fn, nxt)] = nxt
