"""Atomic file writes: a reader never sees half a trace, even if the writer is killed midway.

A writer killed before its rename (Ray SIGKILLs its workers some 20-60 ms after their SIGTERM,
mid-export) leaves its temporary file behind (and SQLite's ``-journal`` beside it). Each
temporary name is ``.<target>.<pid>@<host>.<random>.tmp``: hidden, ending in ``.tmp`` (readers
skip every name holding ``.tmp``: :func:`is_temp_name`), and naming its writer, so that the next
write into the same folder removes those whose writer is gone (same host, pid no longer alive;
another host's only after a day). A file written into a temporary path that
:func:`atomic_paths` handed out is written in place, never through a temporary of its own: a
temporary name is never nested in another.

>>> import tempfile, pathlib
>>> p = pathlib.Path(tempfile.mkdtemp()) / "a" / "t.json"
>>> atomic_write_bytes(p, b"{}") == p and p.read_bytes()
b'{}'
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator

__all__ = ["atomic_path", "atomic_paths", "atomic_write_bytes", "is_temp_name", "sweep_temps"]

#: ``.<target>.<pid>@<host>.<random>.tmp`` (and SQLite's ``-journal`` beside it).
#: (Before hosts were named, ``.<target>.<pid>.<random>.tmp``: taken as this host's.)
_TEMP = re.compile(
    r"\A\.(?P<target>.+)\.(?P<pid>\d+)(?:@(?P<host>[^/]*?))?\.[^.]+\.tmp(?:-journal)?\Z"
)
#: Another host's leftovers are removed only once they are this old (its pids are not ours).
_FOREIGN_AGE_S = 24 * 3600
# The temporary paths this process is writing now: a write into one of them is in place.
_in_flight: set[str] = set()
_in_flight_lock = threading.Lock()


def is_temp_name(name: str) -> bool:
    """Whether a file name is a temporary (an unfinished atomic write, ours or another tool's):
    readers skip these.

    >>> [is_temp_name(n) for n in (".r0.trace.json.12@h.ab.tmp", "x.db-journal", "r0.trace.json")]
    [True, True, False]
    """
    return ".tmp" in name or name.endswith("-journal")


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is renamed over ``path``.

    The temporary file lives in the same folder so the rename stays on one file system, which is
    what makes it atomic. On error the temporary file is removed and ``path`` is untouched.
    The file gets the mode a plain ``open()`` would give it (the umask's), or keeps the mode of
    the file it replaces: ``mkstemp``'s 0600 would lock colleagues out of a shared trace folder.
    """
    with atomic_paths(path) as (tmp,):
        yield tmp


@contextlib.contextmanager
def atomic_paths(*paths: str | Path) -> Iterator[list[Path]]:
    """:func:`atomic_path` for several files replaced together: all are written first, then
    renamed one after the other with SIGTERM and SIGINT held back, so a signal cannot land
    between the renames (only SIGKILL could, in a window of a few system calls).

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> with atomic_paths(d / "a.json", d / "b.db") as (a, b):
    ...     _ = a.write_text("{}"), b.write_bytes(b"")
    >>> sorted(p.name for p in d.iterdir())
    ['a.json', 'b.db']
    """
    targets = [Path(p) for p in paths]
    with _in_flight_lock:
        in_place = [str(t) in _in_flight for t in targets]
    if any(in_place):
        # Writing into a temporary path handed out above (export_rank's, for two files replaced
        # together): the outer write renames it; a temporary of a temporary would nest names.
        if not all(in_place):
            raise ValueError("atomic_paths: mixing temporary and final targets")
        yield targets
        return
    tmps: list[str] = []
    prefix_tail = f"{os.getpid()}@{_host()}."
    try:
        for target in targets:
            target.parent.mkdir(parents=True, exist_ok=True)
            sweep_temps(target.parent)
            fd, tmp = tempfile.mkstemp(
                prefix=f".{target.name}.{prefix_tail}", suffix=".tmp", dir=target.parent
            )
            os.close(fd)
            tmps.append(tmp)
            with _in_flight_lock:
                _in_flight.add(tmp)
            try:
                mode = target.stat().st_mode & 0o777
            except FileNotFoundError:
                mode = 0o666 & ~_umask()
            os.chmod(tmp, mode)
        yield [Path(t) for t in tmps]
        with _signals_held():
            for tmp, target in zip(tmps, targets):
                os.replace(tmp, target)
    except BaseException:
        for tmp in tmps:
            for leftover in (tmp, tmp + "-journal"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(leftover)
        raise
    finally:
        with _in_flight_lock:
            _in_flight.difference_update(tmps)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    held = {signal.SIGTERM, signal.SIGINT}
    try:
        before = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    except (AttributeError, OSError, ValueError):  # no pthread_sigmask on this platform
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _host() -> str:
    return socket.gethostname().replace("/", "_")


def sweep_temps(folder: str | Path) -> int:
    """Remove the temporaries in ``folder`` that writers which died before their rename left
    behind: this host's whose pid is gone, another host's after a day. Never raises; returns how
    many were removed. A live writer's temporary (this process's included) is never touched.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / f".t.json.{2**22 + 1}@{_host()}.x1.tmp").write_text("half")
    >>> sweep_temps(d), list(d.iterdir())
    (1, [])
    """
    removed = 0
    host, now = _host(), time.time()
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return 0
    for entry in entries:
        found = _TEMP.match(entry.name)
        if found is None:
            continue
        try:
            if found["host"] in (None, host):
                stale = not _alive(int(found["pid"]))
            else:
                stale = now - entry.stat(follow_symlinks=False).st_mtime > _FOREIGN_AGE_S
            with _in_flight_lock:
                stale = stale and os.path.join(folder, entry.name) not in _in_flight
            if stale:
                os.unlink(entry.path)
                removed += 1
        except OSError:
            continue
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _umask() -> int:
    mask = os.umask(0)  # the only way to read it is to set it
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (flushed to disk before the rename) and return it."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return Path(path)
