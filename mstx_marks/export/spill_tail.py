"""The recent part of a spill, followed as its process writes it: what a live reader keeps.

A :class:`SpillWindow` reads the lines a spill (:mod:`.spill`) gained since it last looked
(whole lines only: a line still being written waits for its end), keeps them as they are, and
drops the event lines that ended before a time the reader no longer needs
(:meth:`SpillWindow.forget_before`); the header, the name and thread tables and the other
metadata lines are always kept, as later blocks need them. :meth:`SpillWindow.write` writes
what is kept as a spill of its own, which :func:`~.spill.read_spill` (and so ``summary``)
reads as it reads the whole file, less the events forgotten: the live reader analyses a window
of the job with the very code that analyses the job afterwards. Memory: the lines kept, a
block line (about 260 KB) holding half a second of a process's events.

A file replaced under the same name (its folder removed and made again) is read again from its
start; a file that shrank (a write cut short and undone by a full disk) loses the line it was
reading, counted in ``skipped``.

>>> import tempfile, pathlib
>>> from mstx_marks.backends.record import Recorder, now_ns
>>> from mstx_marks.export.spill import Spill, read_spill
>>> rec = Recorder()
>>> spill = Spill(tempfile.mkdtemp(), rec, rank=0, role="trainer")
>>> rec.range_end(rec.range_start("old", "d"), "d")
>>> window = SpillWindow(spill.write_now())
>>> window.follow()
True
>>> horizon = now_ns()
>>> rec.range_end(rec.range_start("new", "d"), "d")
>>> _ = spill.write_now()
>>> window.follow()
True
>>> window.forget_before(horizon)
>>> copy = window.write(pathlib.Path(tempfile.mkdtemp()))
>>> [r.name for r in read_spill(copy).records], read_spill(copy).role
(['new'], 'trainer')
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any, Sequence

from mstx_marks.base.records import TraceFileError
from mstx_marks.export.spill import MAX_LINE, _column, _dumps, _utf8

__all__ = ["SpillWindow"]

#: The time of a line always kept (the tables, the metadata, a line that cannot be read).
_ALWAYS = 1 << 62
#: The most a follow reads at once: a spill that fell far behind is caught up over several.
_READ = 64 << 20


class SpillWindow:
    """One spill's lines a live reader still needs (see the module's docstring)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        #: The spill's header, once its first line is read (None: not yet, or not a spill).
        self.header: dict[str, Any] | None = None
        #: Whether the lines so far end with the writer's final mark (its process ended well).
        self.complete = False
        #: Lines lost to a file that shrank or a line too long.
        self.skipped = 0
        self._header_line = b""
        self._lines: list[tuple[int, bytes]] = []  # (its latest time, the line)
        self._offset = 0
        self._rest = b""
        self._inode: tuple[int, int] | None = None

    def follow(self) -> bool:
        """Read the whole lines written since the last call; whether any came. Raises
        :class:`~mstx_marks.base.records.TraceFileError` when the file is no spill."""
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                if self._inode not in (None, (st.st_dev, st.st_ino)):
                    self.__init__(self.path)  # type: ignore[misc]  # (made again: from its start)
                self._inode = (st.st_dev, st.st_ino)
                if st.st_size < self._offset:  # cut back by a write that failed: resync
                    self._offset, self._rest = st.st_size, b""
                    self.skipped += 1
                f.seek(self._offset)
                data = f.read(_READ)
        except OSError:
            return False  # not there yet, or gone: nothing new
        if not data:
            return False
        self._offset += len(data)
        lines = (self._rest + data).split(b"\n")
        self._rest = lines.pop()
        if len(self._rest) > MAX_LINE:  # a reader skips it anyway: not held
            self._rest = b""
            self.skipped += 1
        came = False
        for line in lines:
            if line.strip():
                self._take(line)
                came = True
        return came

    def _take(self, line: bytes) -> None:
        if self.header is None:
            try:
                header = json.loads(line)
            except ValueError:
                header = None
            if not isinstance(header, dict) or "mstx_marks_spill" not in header:
                raise TraceFileError(self.path, "is not a mstx_marks spill file (no header line)")
            self.header, self._header_line = header, line
            return
        latest = _latest(line)
        if line[:1] == b"{":
            with contextlib.suppress(ValueError):
                item = json.loads(line)
                if isinstance(item, dict) and not {"names", "threads", "thread_names"} & set(item):
                    self.complete = item.get("complete") is True
        else:
            self.complete = False
        self._lines.append((latest, line))

    def forget_before(self, horizon_ns: int) -> None:
        """Drop the event lines whose every event ended (an instant: happened) before
        ``horizon_ns``: no figure of a window from there on depends on them."""
        self._lines = [item for item in self._lines if item[0] >= horizon_ns]

    @property
    def held(self) -> int:
        """The bytes of the lines kept."""
        return sum(len(line) for _, line in self._lines)

    def write(
        self, folder: str | Path, opens: Sequence[Sequence[Any]] = (), until: int = 0
    ) -> Path:
        """What is kept, as ``<folder>/spill/<its name>``: a spill of its own. ``opens``
        (``[name, domain, start_ns, thread, args]``, as a beat names them) are ranges open in
        the process at ``until``: written as ranges open then, before the lines that may end
        them (a reader keeps each range once, as it ended if it did)."""
        target = Path(folder) / "spill" / self.path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        head = [self._header_line]
        for name, domain, start, thread, args in opens:
            line = ["o", name, domain, start, max(until, start), thread]
            if args:
                line.append(args)
            head.append(_utf8(_dumps(line)))
        with open(target, "wb") as f:
            f.write(b"\n".join([*head, *(line for _, line in self._lines), b""]))
        return target


def _latest(line: bytes) -> int:
    """The latest time a line's events reach (an event line's end, a block's latest end or
    instant), or :data:`_ALWAYS` for a line always kept."""
    try:
        if line.startswith(b'["c"'):
            _, _, _, starts, ends, _ = json.loads(line)
            # (an instant's end is -1: its start is its time; a range's end is past its start)
            return max(max(_column(ends, "q"), default=0), max(_column(starts, "q"), default=0))
        if line.startswith(b"["):
            item = json.loads(line)
            end = item[4] if item[4] is not None else item[3]
            return end if type(end) is int else _ALWAYS
    except (ValueError, TypeError, IndexError, KeyError):
        pass
    return _ALWAYS
