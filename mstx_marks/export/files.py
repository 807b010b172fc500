"""Atomic file writes: a reader never sees half a trace, even if the writer is killed midway.

A writer killed before its rename leaves its temporary file behind (and SQLite's ``-journal``
beside it); each temporary name carries the writer's pid, and the next write of the same file
removes those whose writer is gone.

>>> import tempfile, pathlib
>>> p = pathlib.Path(tempfile.mkdtemp()) / "a" / "t.json"
>>> atomic_write_bytes(p, b"{}") == p and p.read_bytes()
b'{}'
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
from pathlib import Path
from typing import Iterator

__all__ = ["atomic_path", "atomic_paths", "atomic_write_bytes"]


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
    tmps: list[str] = []
    try:
        for target in targets:
            target.parent.mkdir(parents=True, exist_ok=True)
            _sweep(target)
            fd, tmp = tempfile.mkstemp(
                prefix=f".{target.name}.{os.getpid()}.", suffix=".tmp", dir=target.parent
            )
            os.close(fd)
            tmps.append(tmp)
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


def _sweep(target: Path) -> None:
    """Remove what writers of ``target`` that died before their rename left behind."""
    with contextlib.suppress(OSError):
        for leftover in target.parent.glob(f".{target.name}.*.tmp*"):
            pid = leftover.name[len(target.name) + 2 :].split(".", 1)[0]
            if pid.isdigit() and not _alive(int(pid)):
                with contextlib.suppress(OSError):
                    leftover.unlink()


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
