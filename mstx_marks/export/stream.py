"""A process's Chrome trace and Ascend database, streamed from its spill: any length, bounded
memory.

Contract: the spill is the one source of truth; :func:`export_spill` is the one way its views are
written (the exit write, ``mstx-marks export``), and holds a bounded number of events whatever
the spill holds (its names are held: they are the database's strings). It reads the spill once
(:func:`~mstx_marks.export.spill.read_spill`, which streams it), putting the events in start
order as they come (:class:`~mstx_marks.export.start_order.StartOrder`, its scratch files
beside the Chrome trace), then feeds each batch to the database
(:class:`~mstx_marks.export.ascend_db.DbWriter`) and to the Chrome trace
(:class:`~mstx_marks.export.chrome.TraceWriter`): the same documents as
:func:`~mstx_marks.export.chrome.write_chrome_trace` and
:func:`~mstx_marks.export.ascend_db.write_ascend_db` make of the spill read whole. Both files are
replaced together (:func:`~mstx_marks.export.files.atomic_paths`), never through a link below
``out_dir``; past the ``deadline``, nothing is replaced and nothing is left
(:class:`ExportTimedOut`).

A process's files are found by name alone (:func:`process_files`): ``[ROLE-]rankN-PROCESS``
and ``[ROLE_]<host>_<pid>_<time>_ascend_pt``. Its database stays in the folder it has (one
folder per process, whoever exported it first: the process at a flush, ``mstx-marks export``
while it ran), and the files it wrote under another rank or role are removed once the new ones
are in place.

>>> import tempfile
>>> from mstx_marks.backends.record import Recorder
>>> from mstx_marks.export.spill import Spill
>>> rec = Recorder()
>>> rec.range_end(rec.range_start("step", "default"), "default")
>>> out = tempfile.mkdtemp()
>>> spill = Spill(out, rec, rank=0, role="trainer").write_now(final=True)
>>> done = export_spill(out, spill, process="h-7")
>>> [p.parent.name for p in done.paths], done.events
(['chrome', 'ASCEND_PROFILER_OUTPUT'], 1)
"""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, NamedTuple

from mstx_marks.base.records import RankTrace
from mstx_marks.export.ascend_db import DbWriter, ascend_db_path, db_meta_of, write_beside
from mstx_marks.export.chrome import TraceWriter, origin_of
from mstx_marks.export.files import (
    UnsafeOutput,
    atomic_paths,
    folder_below,
    scratch_file,
    unlink_below,
)
from mstx_marks.export.process_files import chrome_trace_path, db_worker, this_process
from mstx_marks.export.spill import read_spill
from mstx_marks.export.start_order import Event, StartOrder

__all__ = [
    "ExportTimedOut",
    "Exported",
    "ProcessFiles",
    "export_spill",
    "process_db_path",
    "process_files",
]


class Exported(NamedTuple):
    """What :func:`export_spill` did: the Chrome trace and database written (none when the
    spill holds no event), the events in them, the rank and role they were written as, and
    one line for each link met where this process's files are and left alone."""

    paths: list[Path]
    events: int
    rank: int
    role: str
    refused: list[str]


class ExportTimedOut(TimeoutError):
    """The export passed its deadline: nothing was replaced (the previous files, if any, stand)
    and nothing was left behind. ``stage`` and ``events`` say how far it got."""

    def __init__(self, spill: Path, stage: str, events: int, total: int | None) -> None:
        of = f" of {total}" if total is not None else ""
        super().__init__(
            f"{spill}: stopped at its deadline while {stage} ({events}{of} events done);"
            " its previous Chrome trace and database, if any, are kept"
        )
        self.spill, self.stage, self.events, self.total = spill, stage, events, total


class _Late(Exception):
    """The deadline passed (raised inside the spill's reader, which makes every OSError, and so
    TimeoutError, a TraceFileError: turned into :class:`ExportTimedOut` outside it)."""


class _Unwritable(Exception):
    """The folder of the scratch files refused them (an OSError, carried through the spill's
    reader as :class:`_Late` is)."""


class ProcessFiles(NamedTuple):
    """A process's files under an output folder (:func:`process_files`): its Chrome traces,
    its database files, its database folders (``*_ascend_pt``) and, one line each, the links
    met where they would be (never followed)."""

    chrome: list[Path]
    dbs: list[Path]
    folders: list[Path]
    links: list[str]


def _entries(folder: Path, links: list[str]) -> list[os.DirEntry[str]]:
    """The entries of ``folder`` (none when it is missing, a link (said in ``links``) or not a
    folder)."""
    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        return []
    if stat.S_ISLNK(st.st_mode):
        links.append(f"{folder} is a link: not followed")
        return []
    if not stat.S_ISDIR(st.st_mode):
        return []
    with os.scandir(folder) as it:
        return sorted(it, key=lambda e: e.name)


def process_files(out_dir: str | Path, process: str | None = None) -> ProcessFiles:
    """The files ``process`` (``<host>-<pid>``, this one by default) has under ``out_dir``,
    found by name alone (what comes right before the host is a separator, so host ``a-h`` is
    not taken for host ``h``), through no link: a link is listed in ``links``, not followed.

    >>> import tempfile
    >>> process_files(tempfile.mkdtemp(), "h-7")
    ProcessFiles(chrome=[], dbs=[], folders=[], links=[])
    """
    root, process = Path(out_dir), process or this_process()
    host, _, pid = process.rpartition("-")
    chrome_name = re.compile(rf"(?:.*-)?rank[0-9]+-{re.escape(process)}\.trace\.json")
    db_folder = re.compile(rf"(?:.*_)?{re.escape(host)}_{re.escape(pid)}_[0-9]+_ascend_pt")
    db_name = re.compile(r"ascend_pytorch_profiler_[0-9]+\.db")
    found = ProcessFiles([], [], [], [])
    for entry in _entries(root / "chrome", found.links):
        if chrome_name.fullmatch(entry.name):
            _take(entry, found.chrome, found.links)
    for entry in _entries(root / "ascend", found.links):
        if db_folder.fullmatch(entry.name) and _take(entry, found.folders, found.links, True):
            for db in _entries(Path(entry.path) / "ASCEND_PROFILER_OUTPUT", found.links):
                if db_name.fullmatch(db.name):
                    _take(db, found.dbs, found.links)
    return found


def _take(
    entry: os.DirEntry[str], into: list[Path], links: list[str], folder: bool = False
) -> bool:
    """Put ``entry`` in ``into`` when it is a regular file (a folder, with ``folder``); a link
    goes to ``links``."""
    if entry.is_symlink():
        links.append(f"{entry.path} is a link: not followed")
        return False
    if entry.is_dir(follow_symlinks=False) if folder else entry.is_file(follow_symlinks=False):
        into.append(Path(entry.path))
        return True
    return False


def process_db_path(
    out_dir: str | Path, rank: int, role: str = "", process: str | None = None
) -> Path:
    """Where ``process``'s database of ``rank`` goes under ``out_dir/ascend``: in the newest
    folder it has there under its name (:func:`~mstx_marks.export.process_files.db_worker`: its role
    and ``<host>_<pid>``), else in a new one (:func:`ascend_db_path`). One folder per process
    whoever writes it first (msprof-analyze reads one rank per folder).

    >>> import tempfile
    >>> out = tempfile.mkdtemp()
    >>> first = process_db_path(out, 0, "trainer", "h-7")
    >>> first.parent.mkdir(parents=True)
    >>> process_db_path(out, 1, "trainer", "h-7") == first.with_name("ascend_pytorch_profiler_1.db")
    True
    """
    worker = db_worker(role, process)
    own = re.compile(rf"{re.escape(worker)}_[0-9]+_ascend_pt")
    folders = [f for f in process_files(out_dir, process).folders if own.fullmatch(f.name)]
    name = f"ascend_pytorch_profiler_{rank}.db"
    if folders:
        return max(folders, key=lambda f: f.name) / "ASCEND_PROFILER_OUTPUT" / name
    return ascend_db_path(Path(out_dir) / "ascend", rank, worker=worker)


def export_spill(
    out_dir: str | Path,
    spill: str | Path,
    *,
    extra: bytes = b"",
    rank: int | None = None,
    role: str | None = None,
    db_path: str | Path | None = None,
    process: str | None = None,
    deadline: float | None = None,
    dropped: int = 0,
) -> Exported:
    """Write the Chrome trace and Ascend database of the spill at ``spill`` (see the module's
    docstring), with ``extra`` (spill lines not on disk yet) read after the file.

    ``rank`` and ``role``: those to write (default: the spill's, its latest word). ``db_path``:
    the database (inside ``out_dir``; default: :func:`process_db_path`). ``process``: the
    ``<host>-<pid>`` in the file names (default: this process's). ``deadline``: a
    :func:`time.monotonic` time; past it, :class:`ExportTimedOut`. ``dropped``: events the
    recorder dropped, when it knows more than the spill says.

    Raises :class:`~mstx_marks.base.records.TraceFileError` for a file that is not a spill,
    :class:`~mstx_marks.export.files.UnsafeOutput` (an OSError) where a link below
    ``out_dir`` stands in the way, another OSError when the folder refuses the files.
    """
    root, spill = Path(out_dir), Path(spill)
    clock = _Clock(deadline)

    def scratch() -> IO[bytes]:
        try:
            return scratch_file(folder_below(root, root / "chrome"))
        except OSError as e:  # (carried as _Late is, through the spill's reader)
            raise _Unwritable(e) from e

    try:
        with StartOrder(scratch, check=lambda n: clock.check("reading the spill", n)) as order:
            try:
                trace = read_spill(spill, extra=extra, sink=order.add)
            except _Late as late:
                raise ExportTimedOut(spill, "reading the spill", order.count, None) from late
            trace.rank = trace.rank if rank is None else rank
            trace.role = trace.role if role is None else role
            trace.dropped = max(trace.dropped, dropped)
            if not order.count:
                return Exported([], 0, trace.rank, trace.role, [])
            paths = [
                chrome_trace_path(root, trace.rank, process, trace.role),
                Path(db_path)
                if db_path is not None
                else process_db_path(root, trace.rank, trace.role, process),
            ]
            try:
                _write(root, paths, trace, order, scratch, clock)
            except _Late as late:
                stage, done = late.args
                raise ExportTimedOut(spill, stage, done, order.count) from late
    except _Unwritable as e:
        raise e.args[0] from None
    refused = _remove_stale(root, process, paths)
    return Exported(paths, order.count, trace.rank, trace.role, refused)


def _write(
    root: Path,
    paths: list[Path],
    trace: RankTrace,
    order: StartOrder,
    scratch: Callable[[], IO[bytes]],
    clock: _Clock,
) -> None:
    """Write the Chrome trace and the database (``paths``) of ``order``'s events, replaced
    together; ``trace`` says the process (its records are not read)."""
    writing = "writing the Chrome trace and database"
    meta = db_meta_of(trace)
    with atomic_paths(*paths, root=root) as (chrome_tmp, db_tmp):
        with open(chrome_tmp, "wb") as f, DbWriter(db_tmp) as rows:

            def batches() -> Iterator[list[Event]]:
                for batch in order.batches():
                    clock.check(writing, rows.events)
                    rows.add(batch)
                    yield batch

            writer = TraceWriter(f, origin_of(order.first or 0), scratch)
            writer.add_process(trace, batches())
            writer.close()
            span = rows.finish(trace.rank, meta)
            f.flush()
            os.fsync(f.fileno())
        clock.check(writing, rows.events)  # the last moment at which nothing is replaced
        write_beside(db_tmp, trace.rank, span, meta, root=root)


class _Clock:
    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline

    def check(self, stage: str, done: int) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise _Late(stage, done)


def _remove_stale(root: Path, process: str | None, kept: list[Path]) -> list[str]:
    """Remove the Chrome traces and database files ``process`` wrote before under another
    name (its rank or role was another then), never through a link; the links met, one line
    each."""
    found = process_files(root, process)
    said = list(found.links)
    new = {_identity(p) for p in kept}
    for old in found.chrome + found.dbs:
        if _identity(old) in new:
            continue
        try:
            unlink_below(root, old)
        except FileNotFoundError:
            continue
        except UnsafeOutput as e:
            said.append(str(e))
    return said


def _identity(path: Path) -> tuple[int, int] | None:
    """The file at ``path`` (not a link's target): the same file however its path is spelled."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)
