"""Atomic file writes: a reader never sees half a trace, even if the writer is killed midway.

>>> import tempfile, pathlib
>>> p = pathlib.Path(tempfile.mkdtemp()) / "a" / "t.json"
>>> atomic_write_bytes(p, b"{}") == p and p.read_bytes()
b'{}'
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator

__all__ = ["atomic_path", "atomic_write_bytes"]


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is renamed over ``path``.

    The temporary file lives in the same folder so the rename stays on one file system, which is
    what makes it atomic. On error the temporary file is removed and ``path`` is untouched.
    The file gets the mode a plain ``open()`` would give it (the umask's), or keeps the mode of
    the file it replaces: ``mkstemp``'s 0600 would lock colleagues out of a shared trace folder.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        try:
            mode = target.stat().st_mode & 0o777
        except FileNotFoundError:
            mode = 0o666 & ~_umask()
        os.chmod(tmp, mode)
        yield Path(tmp)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


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
