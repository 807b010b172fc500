"""The Chrome trace and Ascend database of every process that left only its spill.

A process ended by a signal it cannot outlive writes its spill and nothing else: Ray SIGKILLs its
workers 20-60 ms after their SIGTERM, too soon for an export (which would be cut short and leave
its temporaries), so a Ray worker writes only its final spill then (:mod:`.out`). The spill is
the record; the exports are views of it, made afterwards by a reader (``mstx-marks export DIR``),
named as the process itself would have named them (its role, rank, host and pid), so
MindStudio Insight, msprof-analyze and Perfetto see every process of the job. Each is streamed
from its spill (:func:`~mstx_marks.export.stream.export_spill`): any length, bounded memory.

The folder may be shared, and the export runs with the rights of whoever types it: no link
under ``DIR`` is followed, to read a spill, to write or to remove a file (each one met is said);
a spill that is empty or cannot be read is said and the others are exported.

>>> import tempfile
>>> from mstx_marks import configure, mark
>>> from mstx_marks.export.out import OutSession
>>> configure(record=True)
>>> folder = tempfile.mkdtemp()
>>> session = OutSession(folder, interval=None)
>>> with mark("update_actor"):
...     pass
>>> session.spill.write_now(final=True).parent.name  # a Ray worker's last act
'spill'
>>> [p.name for p in unexported(folder)] == [session.spill.path.name]
True
>>> [p.parent.name for p in export_spills(folder)]
['chrome', 'ASCEND_PROFILER_OUTPUT']
>>> unexported(folder)
[]
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import NamedTuple

from mstx_marks.base.records import TraceFileError
from mstx_marks.export.spill import SPILL_SUFFIX
from mstx_marks.export.stream import export_spill, process_files

__all__ = ["Problem", "export_spills", "unexported"]


class Problem(NamedTuple):
    """One line :func:`export_spills` has to say: ``failed`` when a process with events got no
    files (its spill unreadable, its folder refusing them), else a note (an empty spill, a link
    left alone)."""

    text: str
    failed: bool


def _spills(root: Path, problems: list[Problem] | None) -> list[Path]:
    """The spill files under ``root/spill``: regular files only, never through a link (each
    link said in ``problems``)."""
    folder = root / "spill"
    try:
        if stat.S_ISLNK(os.lstat(folder).st_mode):
            _say(problems, f"{folder} is a link: not followed, its spills not read")
            return []
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for entry in entries:
        if not entry.name.endswith(SPILL_SUFFIX):
            continue
        if entry.is_symlink():
            _say(problems, f"{entry.path} is a link: not followed, not read")
        elif entry.is_file(follow_symlinks=False):
            found.append(Path(entry.path))
    return found


def _say(problems: list[Problem] | None, text: str, failed: bool = False) -> None:
    if problems is not None and Problem(text, failed) not in problems:
        problems.append(Problem(text, failed))


def unexported(folder: str | Path) -> list[Path]:
    """The spills under ``folder/spill`` whose process has no Chrome trace or no database (by
    their names: no spill is read). A process that wrote its exports keeps them, even when its
    spill took a few more lines after (the exit's own late writes): ``export --all`` redoes
    every process."""
    root = Path(folder)
    found = []
    for spill in _spills(root, None):
        files = process_files(root, spill.stem)
        if not files.chrome or not files.dbs:
            found.append(spill)
    return found


def export_spills(
    folder: str | Path, *, every: bool = False, problems: list[Problem] | None = None
) -> list[Path]:
    """Write the Chrome trace and Ascend database of each process in :func:`unexported` (of
    every process with a spill, ``every``, replacing what it wrote); the files written. A
    spill that cannot be read, or whose files cannot be written, is said in ``problems`` and
    the others are exported all the same. Run it once the job has ended: a live process
    rewrites its own exports at its exit (into the same database folder)."""
    root = Path(folder)
    todo = _spills(root, problems)
    if not every:
        left = set(unexported(root))
        todo = [s for s in todo if s in left]
    written: list[Path] = []
    for spill in todo:
        try:
            if os.lstat(spill).st_size == 0:
                _say(problems, f"{spill} is empty (its process ended before its first write):"
                     " nothing to export")  # fmt: skip
                continue
            done = export_spill(root, spill, process=spill.stem)
        except TraceFileError as e:
            _say(problems, f"{e}: not exported", failed=True)
            continue
        except OSError as e:  # a folder refusing the files, a link in the way
            _say(problems, f"{spill}: not exported: {_why(e)}", failed=True)
            continue
        for text in done.refused:
            _say(problems, text)
        written += done.paths
    return written


def _why(e: OSError) -> str:
    """An OSError in one line, naming its file."""
    if e.strerror and e.filename:
        return f"cannot write {e.filename}: {e.strerror}"
    return str(e) or type(e).__name__
