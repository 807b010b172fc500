"""Find every trace file under a folder and read it, whatever wrote it.

Kinds (:func:`find_trace_files` finds them by name, anywhere under the folder):

==========================================  ===================================================
``ascend_pytorch_profiler[_N].db``           an Ascend profiler database, ours or torch_npu's
``*.trace.json[.gz]``, ``trace.json``        a Chrome trace: ours, torch.profiler's
                                             (``*.pt.trace.json``) or any other tool's
``ASCEND_PROFILER_OUTPUT/trace_view.json``   torch_npu's text export
``spill/*.jsonl``                            the flight recorder's spill (``MSTX_MARKS_OUT``)
==========================================  ===================================================

:func:`read_trace_file` gives the file's traces with every record (for timelines);
:func:`part_of_file` gives what ``summary`` keeps of each process in it, reading a database in
SQL (:mod:`.ascend_sql`) and a spill too large to hold in one pass (:mod:`..stream`). Both pair
``X_start``/``X_stop`` marks into ranges. A spill too large to hold (past
:data:`~..stream.MAX_HELD_EVENTS` or :data:`~..stream.MAX_SPILL_BYTES`) is no timeline:
:func:`read_trace_file` refuses it, naming it (:class:`~..stream.TooLargeToHold`). Unfinished
atomic writes (``*.tmp*``, ``*-journal``) are never read, and those whose writer is gone are
removed (:func:`~mstx_marks.export.files.sweep_temps`). A file that cannot be read raises
:class:`~mstx_marks.base.records.TraceFileError` naming it and why; a readable file with nothing
to count raises :class:`~.chrome_json.NothingToRead`.

>>> import tempfile, pathlib
>>> root = pathlib.Path(tempfile.mkdtemp())
>>> (root / "spill").mkdir(); (root / "spill" / "h-1.jsonl").write_text("")
0
>>> [p.name for p in find_trace_files(root, errors=[])]
['h-1.jsonl']
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Callable

from mstx_marks.analysis.aggregate import ProcessPart, aggregate_trace
from mstx_marks.analysis.mark_pairs import pair_marks
from mstx_marks.analysis.readers.ascend_sql import aggregate_db, text
from mstx_marks.analysis.readers.chrome_json import NothingToRead, read_foreign_chrome
from mstx_marks.analysis.steps import StepOptions, fold_name
from mstx_marks.analysis.stream import aggregate_spill, read_spill_held
from mstx_marks.base.records import RankTrace, Record
from mstx_marks.export.ascend_db import read_ascend_db
from mstx_marks.export.chrome import is_ours, load_trace_json, read_chrome_doc
from mstx_marks.export.files import is_temp_name, sweep_temps
from mstx_marks.export.spill import SPILL_SUFFIX

__all__ = [
    "NothingToRead",
    "find_trace_files",
    "is_trace_file",
    "part_of_file",
    "read_trace_file",
]

_DB_FILE = re.compile(r"ascend_pytorch_profiler(?:_\d+)?\.db\Z")
_JSON_FILE = re.compile(r"(?:.*\.trace\.json|trace\.json|trace_view\.json)(?:\.gz)?\Z")


def is_trace_file(path: Path) -> bool:
    """Whether ``path``'s name is one of the kinds above.

    >>> [is_trace_file(Path(n)) for n in ("a.pt.trace.json.gz", "trace.json", "x.json")]
    [True, True, False]
    >>> is_trace_file(Path(".rank0-h-1.trace.json.1@h.x.tmp")), is_trace_file(Path("r.db-journal"))
    (False, False)
    """
    name = path.name
    if is_temp_name(name):
        return False  # an unfinished atomic write (its writer may have been killed): never read
    if _DB_FILE.match(name) or _JSON_FILE.match(name):
        return True
    return path.parent.name == "spill" and name.endswith(SPILL_SUFFIX)


def find_trace_files(path: str | Path, errors: list[str] | None = None) -> list[Path]:
    """``path`` itself if it is a file, else the trace files anywhere under it, sorted.

    A folder that cannot be listed is added to ``errors`` (naming it and why) rather than
    skipped in silence.
    """
    root = Path(path)
    if root.is_file():
        return [root]
    if root.exists() and not root.is_dir():
        if errors is not None:
            errors.append(f"{root}: not a regular file or folder (a FIFO, a device); not read")
        return []
    found: list[Path] = []

    def unreadable(e: OSError) -> None:
        if errors is not None:
            where = e.filename or root
            errors.append(f"{where}: the folder cannot be read ({e.strerror or e})")

    for folder, _dirs, files in os.walk(root, onerror=unreadable):
        base = Path(folder)
        found.extend(base / f for f in files if is_trace_file(base / f) and _regular(base / f))
        if any(is_temp_name(f) for f in files):
            sweep_temps(base)  # what writers killed mid-write left (only theirs: never raises)
    return sorted(found)


def _regular(path: Path) -> bool:
    """Whether ``path`` is a regular file (a FIFO would block its reader for ever)."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return True  # vanished or unreadable: the reader names it


def _clean(trace: RankTrace) -> RankTrace:
    """Names as text (a database may hold BLOBs), and start/stop marks paired."""
    records: list[Record] = []
    for r in trace.records:
        if not isinstance(r.name, str) or not isinstance(r.domain, str):
            r = r._replace(name=text(r.name, "<unnamed>"), domain=text(r.domain, "default"))
        records.append(r)
    trace.records = pair_marks(records)
    return trace


def read_trace_file(path: Path, max_events: int | None = None) -> list[RankTrace]:
    """Every trace in the file at ``path`` (one per process, or per rank in our Chrome traces);
    a spill only when it holds at most ``max_events`` events (default: as many as are held,
    see above)."""
    path = Path(path)
    if path.suffix == ".db":
        return [_clean(read_ascend_db(path))]
    if path.name.endswith(SPILL_SUFFIX):
        return [_clean(read_spill_held(path, max_events))]
    doc = load_trace_json(path)
    if is_ours(doc):
        return [_clean(t) for t in read_chrome_doc(path, doc)]
    return [_clean(t) for t in read_foreign_chrome(path, doc)]


def part_of_file(
    path: Path,
    fold: Callable[[str], str] = fold_name,
    steps: StepOptions | None = None,
) -> list[ProcessPart]:
    """What ``summary`` keeps of each process in the file at ``path``."""
    if Path(path).suffix == ".db":
        return [aggregate_db(Path(path), fold, steps)]
    if Path(path).name.endswith(SPILL_SUFFIX):
        return [aggregate_spill(Path(path), fold, steps)]
    return [aggregate_trace(t, fold, steps) for t in read_trace_file(path)]
