"""Atomic file writes: a reader never sees half a trace, even if the writer is killed midway.

A writer killed before its rename (Ray SIGKILLs its workers some 20-60 ms after their SIGTERM,
mid-export) leaves its temporary file behind (and SQLite's ``-journal`` beside it). Each
temporary name is ``.<target>.<pid>@<host>.<random>.tmp``: hidden, ending in ``.tmp`` (readers
skip every name holding ``.tmp``: :func:`is_temp_name`), and naming its writer, so that the next
write into the same folder removes those whose writer is gone (same host, pid no longer alive;
another host's only after a day). A file written into a temporary path that
:func:`atomic_paths` handed out is written in place, never through a temporary of its own: a
temporary name is never nested in another.

Below a folder the user named (``root``: ``mstx-marks export DIR``, an ``MSTX_MARKS_OUT``),
every folder is made and checked a part at a time through directory descriptors opened with
``O_NOFOLLOW`` (:func:`folder_below`), and files are removed through their folder's descriptor
(:func:`unlink_below`): a link planted under a shared output folder is never followed, neither to
write nor to delete, whoever runs the export. The user's own ``root`` may be a link.

>>> import tempfile, pathlib
>>> p = pathlib.Path(tempfile.mkdtemp()) / "a" / "t.json"
>>> atomic_write_bytes(p, b"{}") == p and p.read_bytes()
b'{}'
"""

from __future__ import annotations

import contextlib
import errno
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

from mstx_marks.base.env import shown
from mstx_marks.base.forking import new_lock
from mstx_marks.base.records import TraceFileError

__all__ = [
    "UnsafeOutput",
    "atomic_path",
    "atomic_paths",
    "atomic_write_bytes",
    "folder_below",
    "is_temp_name",
    "open_new_file",
    "open_regular",
    "our_folder",
    "probe_folder",
    "scratch_file",
    "sweep_temps",
    "unlink_below",
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
    _check_owner(path, st)
    return path


def _check_owner(path: Path, st: os.stat_result) -> None:
    """Refuse a folder that another user (not root) owns and others may write without the
    sticky bit: they could plant links or files in it."""
    uid = os.getuid() if hasattr(os, "getuid") else st.st_uid
    open_to_others = st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX
    if st.st_uid not in (uid, 0) and open_to_others:
        raise UnsafeOutput(
            f"not writing into {path}: it belongs to another user (uid {st.st_uid}) and others"
            " may write it"
        )


def probe_folder(folder: str | Path) -> str | None:
    """Why ``folder`` cannot take files, in a few words, or None when it can: decided by doing
    what a write does. The folder is made with its parents (as ``mkdir -p``; it stays), and a
    probe file (a temporary's name: readers skip it, :func:`sweep_temps` removes a leftover) is
    written in it and removed. ``os.access`` cannot decide it: it tells root yes for
    ``/proc/x``, where no folder can be made, and for file systems that refuse writes.

    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> probe_folder(root / "new" / "prof"), (root / "new" / "prof").is_dir()
    (None, True)
    >>> (root / "a_file").write_text("")
    0
    >>> probe_folder(root / "a_file" / "prof") == f"{root / 'a_file'} is a file"
    True
    """
    path = Path(folder)
    missing: list[Path] = []
    here = path
    while True:
        try:
            st = os.stat(here)
            break
        except (FileNotFoundError, NotADirectoryError):  # made below: look above
            if here.parent == here:
                return "no folder of its path exists"
            missing.append(here)
            here = here.parent
        except OSError as exc:  # a name too long, a loop of links, a folder we may not search
            return exc.strerror or str(exc)
    if not stat.S_ISDIR(st.st_mode):
        return "it is a file" if here == path else f"{shown(here)} is a file"
    for part in reversed(missing):
        try:
            os.mkdir(part, 0o777)
        except FileExistsError:  # another process of the job made it meanwhile
            continue
        except OSError as exc:
            return _refused(exc, part.parent, path)
    try:
        fd, name = tempfile.mkstemp(
            prefix=f".mstx_marks-probe.{os.getpid()}@{_host()}.", suffix=".tmp", dir=path
        )
    except OSError as exc:
        return _refused(exc, path, path)
    try:
        os.write(fd, b"mstx_marks")
    except OSError as exc:
        return _refused(exc, path, path)
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(name)
    return None


#: How :func:`probe_folder` says the usual refusals (strerror's words for the rest).
_REFUSALS = {
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EROFS: "read-only file system",
    errno.ENOSPC: "no space left on the device",
}


def _refused(exc: OSError, where: Path, path: Path) -> str:
    """``exc``, met making a folder or a file in ``where`` on the way to ``path``, in words."""
    if exc.errno == errno.ENOENT:  # the folder above exists, yet none can be made: /proc
        return f"{shown(where)} takes no new folders"
    reason = _REFUSALS.get(exc.errno or 0) or (exc.strerror or str(exc)).lower()
    return reason if where == path else f"{reason} (in {shown(where)})"


_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def _parts_below(root: Path, path: Path) -> tuple[str, ...]:
    """The names leading from ``root`` to ``path``; :class:`UnsafeOutput` for a path that is
    not below ``root`` (``..`` included)."""
    try:  # both made absolute, links left as they are: `export out` names a relative folder
        parts = Path(os.path.abspath(path)).relative_to(os.path.abspath(root)).parts
    except ValueError:
        raise UnsafeOutput(f"not writing {path}: it is not inside {root}") from None
    if any(part in ("..", ".") for part in parts):
        raise UnsafeOutput(f"not writing {path}: it leaves {root}")
    return parts


def _open_below(root: Path, parts: tuple[str, ...], *, make: bool) -> int:
    """A descriptor of the folder ``root/parts...``, each part opened from the one above it
    with ``O_NOFOLLOW`` (made first when missing, with ``make``): the folder reached is the
    one named, whatever links lie around. :class:`UnsafeOutput` names the part that is a
    link, not a folder, or another user's folder open to others."""
    fd = os.open(root, _DIR_FLAGS)  # the user named root: it may be a link
    here = root
    try:
        for part in parts:
            here = here / part
            if make:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o777, dir_fd=fd)
            try:
                sub = os.open(part, _DIR_FLAGS | _NOFOLLOW, dir_fd=fd)
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                kind = "a link" if os.path.islink(here) else "not a folder"
                raise UnsafeOutput(f"not following {here}: it is {kind}") from None
            os.close(fd)
            fd = sub
            _check_owner(here, os.fstat(fd))
    except BaseException:
        os.close(fd)
        raise
    return fd


def folder_below(root: str | Path, path: str | Path) -> Path:
    """``path``, a folder inside ``root``, made where missing and checked one part at a time
    (see the module's docstring): no part below ``root`` may be a link or not a folder, nor
    another user's folder open to others (:class:`UnsafeOutput` names it).

    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> folder_below(root, root / "chrome").is_dir()
    True
    >>> (root / "ascend").symlink_to(tempfile.mkdtemp())
    >>> folder_below(root, root / "ascend" / "x")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    mstx_marks.export.files.UnsafeOutput: not following .../ascend: it is a link
    """
    root, path = Path(root), Path(path)
    our_folder(root, follow=True)
    os.close(_open_below(root, _parts_below(root, path), make=True))
    return path


def unlink_below(root: str | Path, path: str | Path) -> None:
    """Remove the file ``path`` inside ``root`` through its folder's descriptor, reached
    without following a link (:class:`UnsafeOutput` otherwise): never a file outside ``root``.
    A link at ``path`` itself is refused too (it is not a file we wrote)."""
    root, path = Path(root), Path(path)
    parts = _parts_below(root, path)
    if not parts:
        raise UnsafeOutput(f"not removing {path}: it is {root} itself")
    fd = _open_below(root, parts[:-1], make=False)
    try:
        st = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode):
            kind = "a link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
            raise UnsafeOutput(f"not removing {path}: it is {kind}")
        os.unlink(parts[-1], dir_fd=fd)
    finally:
        os.close(fd)


def scratch_file(folder: str | Path) -> BinaryIO:
    """A file with no name in ``folder`` (``O_TMPFILE``, else named and removed at once) for an
    export's scratch data: nothing is left behind however the export ends, and the space it
    takes is on the disk the user chose (``/tmp`` may be memory).

    >>> import tempfile
    >>> with scratch_file(tempfile.mkdtemp()) as f:
    ...     f.write(b"x")
    1
    """
    return tempfile.TemporaryFile(dir=folder, prefix=".mstx_marks-scratch.", suffix=".tmp")


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
def atomic_path(path: str | Path, *, root: str | Path | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is renamed over ``path``.

    The temporary file lives in the same folder so the rename stays on one file system, which is
    what makes it atomic. On error the temporary file is removed and ``path`` is untouched.
    The file gets the mode a plain ``open()`` would give it (the umask's), or keeps the mode of
    the file it replaces: ``mkstemp``'s 0600 would lock colleagues out of a shared trace folder.
    With ``root`` (the folder the user named, ``path`` inside it), the folders below ``root``
    are made and checked by :func:`folder_below`: no link under it is followed. Without, the
    folder of ``path`` may be a link the user made (it is the path the user gave).
    """
    with atomic_paths(path, root=root) as (tmp,):
        yield tmp


@contextlib.contextmanager
def atomic_paths(*paths: str | Path, root: str | Path | None = None) -> Iterator[list[Path]]:
    """:func:`atomic_path` for several files replaced together: all are written first, then
    renamed one after the other with SIGTERM and SIGINT held back, so a signal cannot land
    between the renames (only SIGKILL could, in a window of a few system calls). A target that
    is a link is replaced by the file (the link's target is never touched).

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
            if root is None:
                our_folder(target.parent, follow=True)
            else:
                folder_below(root, target.parent)
            sweep_temps(target.parent)
            fd, tmp = tempfile.mkstemp(
                prefix=f".{target.name}.{prefix_tail}", suffix=".tmp", dir=target.parent
            )
            os.close(fd)
            tmps.append(tmp)
            with _in_flight_lock:
                _in_flight.add(tmp)
            try:
                st = target.lstat()  # a link's target is not ours to read
                mode = st.st_mode & 0o777 if stat.S_ISREG(st.st_mode) else 0o666 & ~_umask()
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


def atomic_write_bytes(path: str | Path, data: bytes, *, root: str | Path | None = None) -> Path:
    """Write ``data`` to ``path`` atomically (flushed to disk before the rename) and return it;
    ``root`` as for :func:`atomic_path`."""
    with atomic_path(path, root=root) as tmp, open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return Path(path)
