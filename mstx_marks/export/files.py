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
import gzip
import os
import re
import signal
import socket
import stat
import tempfile
import time
from pathlib import Path
from typing import BinaryIO, Iterator

from mstx_marks.base.forking import new_lock
from mstx_marks.base.records import TraceFileError

__all__ = [
    "UnsafeOutput",
    "atomic_path",
    "atomic_paths",
    "atomic_write_bytes",
    "is_temp_name",
    "open_new_file",
    "open_regular",
    "our_folder",
    "sweep_temps",
]

#: ``.<target>.<pid>@<host>.<random>.tmp`` (and SQLite's ``-journal`` beside it).
#: (Before hosts were named, ``.<target>.<pid>.<random>.tmp``: taken as this host's.)
_TEMP = re.compile(
    r"\A\.(?P<target>.+)\.(?P<pid>\d+)(?:@(?P<host>[^/]*?))?\.[^.]+\.tmp(?:-journal)?\Z"
)
#: Another host's leftovers are removed only once they are this old (its pids are not ours).
_FOREIGN_AGE_S = 24 * 3600
# The temporary paths this process is writing now: a write into one of them is in place.
_in_flight: set[str] = set()
_in_flight_lock = new_lock()


def is_temp_name(name: str) -> bool:
    """Whether a file name is a temporary (an unfinished atomic write, ours or another tool's):
    readers skip these.

    >>> [is_temp_name(n) for n in (".r0.trace.json.12@h.ab.tmp", "x.db-journal", "r0.trace.json")]
    [True, True, False]
    """
    return ".tmp" in name or name.endswith("-journal")


class UnsafeOutput(OSError):
    """An output place that is not safe to write: a folder that another user owns and others
    may write (anyone could plant a link there), a link or something not a folder where our
    folder goes, a file that is not a regular file. The message says why in one line."""


def our_folder(path: str | Path, *, follow: bool = False) -> Path:
    """``path`` as a folder we may write into, created if missing (with the mode the umask
    gives, as ``mkdir`` does). Refused (:class:`UnsafeOutput`): a path that is a link or not a
    folder, and a folder that another user (not root) owns and others may write without the
    sticky bit (they could plant links or files in it). ``follow``: a link to a folder is taken
    (a folder the user named).

    >>> import tempfile, pathlib
    >>> our_folder(pathlib.Path(tempfile.mkdtemp()) / "spill").is_dir()
    True
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o777)
    st = os.stat(path) if follow else os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        kind = "a link" if stat.S_ISLNK(st.st_mode) else "not a folder"
        raise UnsafeOutput(f"not writing into {path}: it is {kind}")
    uid = os.getuid() if hasattr(os, "getuid") else st.st_uid
    open_to_others = st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX
    if st.st_uid not in (uid, 0) and open_to_others:
        raise UnsafeOutput(
            f"not writing into {path}: it belongs to another user (uid {st.st_uid}) and others"
            " may write it"
        )
    return path


def open_new_file(path: str | Path) -> int:
    """A new file at ``path``, opened for appending: never through a link, never a file that
    exists (``FileExistsError``), and refused (:class:`UnsafeOutput`) if not a regular file."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND
    flags |= getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, 0o666)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafeOutput(f"not writing {path}: it is not a regular file")
    return fd


@contextlib.contextmanager
def open_regular(path: str | Path, *, gunzip: bool = False) -> Iterator[BinaryIO]:
    """``path`` opened for reading, gunzipped with ``gunzip`` when its name ends in ``.gz``;
    :class:`~mstx_marks.base.records.TraceFileError` naming it when it is not a regular file
    (a FIFO would block its reader for ever), found without blocking.

    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "a.jsonl"
    >>> _ = path.write_bytes(b"{}")
    >>> with open_regular(path) as f:
    ...     f.read()
    b'{}'
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    with os.fdopen(fd, "rb") as raw:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise TraceFileError(Path(path), "is not a regular file; not read")
        os.set_blocking(fd, True)
        if gunzip and str(path).endswith(".gz"):
            with gzip.GzipFile(fileobj=raw) as inflated:
                yield inflated  # type: ignore[misc]
        else:
            yield raw


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
            our_folder(target.parent, follow=True)
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
