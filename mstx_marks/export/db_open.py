"""Opening a profiler database to read it only, in bounded time.

A capture is read where it lies, on a read-only share too, and nothing is written beside it:
the file is opened read-only, and ``immutable`` when it is in WAL mode (CANN's ``msprof_*.db``:
a reader would otherwise make ``-shm`` and ``-wal`` files beside it and write to the ``-shm``)
or its folder cannot be written. No query may run past :func:`query_seconds` (a progress handler
stops it): the error names the file. Both database readers open files here
(:func:`~mstx_marks.export.read_ascend_db` and the summary's SQL aggregation).

>>> import tempfile, pathlib, sqlite3
>>> from contextlib import closing
>>> path = pathlib.Path(tempfile.mkdtemp()) / "x.db"
>>> with closing(sqlite3.connect(path)) as c:
...     _ = c.execute("CREATE TABLE t(x)")
>>> with open_db(path) as db:
...     db.execute("SELECT COUNT(*) FROM t").fetchall(), db.notes
([(0,)], [])
"""

from __future__ import annotations

import math
import os
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

from mstx_marks.base.records import TraceFileError
from mstx_marks.export.files import open_regular

__all__ = ["QUERY_SECONDS", "BoundedConnection", "open_db", "query_seconds"]

#: The least time one query of a database may take, in seconds; a larger file gets one more
#: second per MB (:func:`query_seconds`). A query of our own runs at millions of rows a second;
#: a query past this is stuck (a pathological file), and is stopped with an error naming it.
QUERY_SECONDS = 60.0
_BYTES_PER_SECOND = 1 << 20
#: How many SQLite virtual-machine steps run between two looks at the clock.
_CHECK_EVERY = 10_000


def query_seconds(size: int) -> float:
    """The most one query of a database of ``size`` bytes may take (see :data:`QUERY_SECONDS`).

    >>> query_seconds(0), query_seconds(300 << 20)
    (60.0, 360.0)
    """
    return QUERY_SECONDS + size / _BYTES_PER_SECOND


class BoundedConnection(sqlite3.Connection):
    """A connection whose every query is stopped past ``limit`` seconds (its rows read
    included): a progress handler looks at the clock; ``expired`` says it stopped one."""

    limit = math.inf
    until = math.inf
    expired = False
    #: What the summary should say of how the file was read (each naming it).
    notes: list[str]

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        self.until = time.monotonic() + self.limit
        return super().execute(sql, parameters)

    def executemany(self, sql: str, parameters: Any, /) -> sqlite3.Cursor:
        self.until = time.monotonic() + self.limit
        return super().executemany(sql, parameters)

    def paced(self, rows: Iterable[Any]) -> Iterator[Any]:
        """``rows`` (a query's cursor) as they come, the time limit counted again every few
        rows: what the caller does with a row is its own time, not the query's."""
        for i, row in enumerate(rows):
            if not i & 255:
                self.until = time.monotonic() + self.limit
            yield row

    def past_deadline(self) -> int:
        if time.monotonic() > self.until:
            self.expired = True
            return 1  # (non-zero: SQLite stops the query, "interrupted")
        return 0


def _wal_mode(path: Path) -> bool:
    """Whether the database file at ``path`` says it is in WAL mode (its header's read and
    write versions, bytes 18 and 19, are 2)."""
    try:
        with open_regular(path) as f:
            head = f.read(20)
    except (OSError, TraceFileError):
        return False  # the connection names it
    return len(head) == 20 and head.startswith(b"SQLite format 3\0") and 2 in head[18:20]


def _uri(path: Path) -> tuple[str, bool]:
    """The URI that opens ``path`` to read only; and whether it is ``immutable``: in WAL mode
    (a reader would make and write ``-shm`` and ``-wal`` beside it) or in a folder that cannot
    be written (even a reader may need to make them there)."""
    immutable = _wal_mode(path) or not os.access(path.resolve().parent, os.W_OK)
    return f"{path.resolve().as_uri()}?mode=ro" + ("&immutable=1" if immutable else ""), immutable


@contextmanager
def open_db(path: Path) -> Iterator[BoundedConnection]:
    """The database at ``path``, opened to read it only and in bounded time (see the module's
    docstring): nothing is written beside it, and a query past :func:`query_seconds` is an
    error naming the file (:class:`TraceFileError`); other SQLite errors come as they are.

    >>> import tempfile, pathlib, sqlite3, os
    >>> from contextlib import closing
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> with closing(sqlite3.connect(folder / "msprof_1.db")) as c:  # as CANN writes it
    ...     _ = c.execute("PRAGMA journal_mode=WAL")
    ...     _ = c.execute("CREATE TABLE t(x)")
    >>> with open_db(folder / "msprof_1.db") as db:
    ...     db.execute("SELECT COUNT(*) FROM t").fetchall()
    [(0,)]
    >>> sorted(os.listdir(folder))  # no -shm nor -wal left beside it
    ['msprof_1.db']
    """
    path = Path(path)
    uri, immutable = _uri(path)
    try:
        limit = query_seconds(os.stat(path).st_size)
    except OSError:
        limit = QUERY_SECONDS
    db = sqlite3.connect(uri, uri=True, factory=BoundedConnection)
    assert isinstance(db, BoundedConnection)
    db.limit, db.notes = limit, []
    db.set_progress_handler(db.past_deadline, _CHECK_EVERY)
    if immutable:
        db.notes += _unread_wal(path)
    try:
        yield db
    except sqlite3.Error as e:
        if db.expired:
            why = f"took more than {limit:.0f} s in one query (a file SQLite cannot read in time)"
            raise TraceFileError(path, f"{why}; not read") from e
        raise
    finally:
        db.close()


def _unread_wal(path: Path) -> list[str]:
    """A note when a WAL file beside ``path``, which an immutable read leaves out, holds
    pages (its writer is still running, or was killed before it checkpointed)."""
    wal = path.with_name(path.name + "-wal")
    try:
        size = os.stat(wal).st_size
    except OSError:
        return []
    if not size:
        return []
    return [
        f"{path}: its write-ahead log {wal.name} holds {size} bytes that are not read (the"
        " capture is read as its database holds it, without writing beside it: its writer"
        " may still be running, or was killed before it checkpointed)"
    ]
