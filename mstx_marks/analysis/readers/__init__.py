"""Find every trace file under a folder and read it, whatever wrote it.

Kinds (:func:`find_trace_files` finds them by name, anywhere under the folder, and Kineto's by
their first bytes):

==========================================  ===================================================
``ascend_pytorch_profiler[_N].db``           an Ascend profiler database, ours or torch_npu's
``msprof_*.db``                              msprof's database (CANN's own capture,
                                             ``PROF_*/[mindstudio_profiler_output/]``); not
                                             read inside a torch_npu output folder, whose
                                             ``ascend_pytorch_profiler`` database holds its
                                             events again
``*.trace.json[.gz]``, ``trace.json``        a Chrome trace: ours, torch.profiler's
                                             (``*.pt.trace.json``) or any other tool's
``*.json[.gz]`` starting as Kineto's         torch.profiler's under any other name
                                             (``export_chrome_trace("x.json")``,
                                             ``*_kineto.json.gz``): ``{"schemaVersion"`` first
``ASCEND_PROFILER_OUTPUT/trace_view.json``   torch_npu's text export
``spill/*.jsonl``                            the flight recorder's spill (``MSTX_MARKS_OUT``)
==========================================  ===================================================

:func:`read_trace_file` gives the file's traces with every record (for timelines);
:func:`part_of_file` gives what ``summary`` keeps of each process in it, reading a database in
SQL (:mod:`.ascend_sql`), and a spill or Chrome trace too large to hold in one pass
(:mod:`..stream`). Both pair ``X_start``/``X_stop`` marks into ranges. A Chrome trace of more
than :data:`~.chrome_json.WHOLE_JSON_BYTES` of JSON is read an event at a time
(:func:`.chrome_json.stream_trace_json`), never parsed whole. A spill or Chrome trace too large
to hold (past :data:`~..stream.MAX_HELD_EVENTS` events, or a spill past
:data:`~..stream.MAX_SPILL_BYTES`) is no timeline: :func:`read_trace_file` refuses it, naming it
(:class:`~..stream.TooLargeToHold`). :func:`peak_estimate` says about how much memory reading a
file takes, for ``summary`` to choose how many to read at once. Unfinished
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
import zlib
from pathlib import Path
from typing import Any, Callable

from mstx_marks.analysis.model.aggregate import ProcessPart, aggregate_trace
from mstx_marks.analysis.model.mark_pairs import pair_marks
from mstx_marks.analysis.model.steps import StepOptions, fold_name, named_step, with_steps
from mstx_marks.analysis.readers import chrome_json, stream
from mstx_marks.analysis.readers.ascend_sql import aggregate_db, db_about, db_events, db_records
from mstx_marks.analysis.readers.chrome_json import (
    NothingToRead,
    read_foreign_chrome,
    stream_trace_json,
)
from mstx_marks.analysis.readers.stream import (
    HoldOrStream,
    StreamAggregator,
    aggregate_spill,
    read_held,
    read_spill_held,
    spill_trace,
)
from mstx_marks.base.records import RankTrace, Record, TraceFileError
from mstx_marks.export.ascend_db import text
from mstx_marks.export.chrome import (
    JsonTooLarge,
    RecordSink,
    is_ours,
    load_trace_json,
    read_chrome_doc,
)
from mstx_marks.export.files import is_temp_name, open_regular, sweep_temps
from mstx_marks.export.spill import SPILL_SUFFIX

__all__ = [
    "NothingToRead",
    "find_trace_files",
    "is_kineto_json",
    "is_trace_file",
    "part_of_file",
    "peak_estimate",
    "read_trace_file",
    "streams_of_file",
]

_DB_FILE = re.compile(r"(?:ascend_pytorch_profiler(?:_\d+)?|msprof_[^/]*)\.db\Z")
_MSPROF_DB = re.compile(r"msprof_[^/]*\.db\Z")
_JSON_FILE = re.compile(r"(?:.*\.trace\.json|trace\.json|trace_view\.json)(?:\.gz)?\Z")
_ANY_JSON = re.compile(r".*\.json(?:\.gz)?\Z")
#: How Kineto's JSON begins (libkineto writes ``schemaVersion`` as its first key).
_KINETO_START = re.compile(rb'\s*\{\s*"schemaVersion"\s*:')
#: The torch_npu output folder's table of every process event (msprof's database copied in).
_TORCH_NPU_DB = "ASCEND_PROFILER_OUTPUT/ascend_pytorch_profiler*.db"


def is_trace_file(path: Path) -> bool:
    """Whether ``path``'s name is one of the kinds above (Kineto's under another name are found
    by :func:`find_trace_files`, which reads their first bytes).

    >>> [is_trace_file(Path(n)) for n in ("a.pt.trace.json.gz", "trace.json", "x.json")]
    [True, True, False]
    >>> is_trace_file(Path("PROF_1/mindstudio_profiler_output/msprof_20250101.db"))
    True
    >>> is_trace_file(Path(".rank0-h-1.trace.json.1@h.x.tmp")), is_trace_file(Path("r.db-journal"))
    (False, False)
    """
    name = path.name
    if is_temp_name(name):
        return False  # an unfinished atomic write (its writer may have been killed): never read
    if _DB_FILE.match(name) or _JSON_FILE.match(name):
        return True
    return path.parent.name == "spill" and name.endswith(SPILL_SUFFIX)


def is_kineto_json(path: Path) -> bool:
    """Whether the JSON file at ``path`` (gzipped when its name ends in ``.gz``) begins as
    torch.profiler's (Kineto's) does, whatever its name; reads its first bytes only.

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> _ = (folder / "a.json").write_text('{"schemaVersion": 1, "traceEvents": []}')
    >>> _ = (folder / "b.json").write_text('{"rank": 0}')
    >>> is_kineto_json(folder / "a.json"), is_kineto_json(folder / "b.json")
    (True, False)
    """
    try:
        with open_regular(path, gunzip=True) as f:
            return _KINETO_START.match(f.read(256)) is not None
    except (OSError, EOFError, zlib.error, TraceFileError):
        return False  # not Kineto's, or unreadable: not one of ours to name


def _inside_torch_npu_output(path: Path, root: Path) -> bool:
    """Whether the msprof database at ``path`` lies in a torch_npu output folder (under
    ``root``) whose own database holds its events again (``<x>_ascend_pt/PROF_*/...``)."""
    for folder in path.parents:
        if folder == root:  # (a PROF_ folder named to summary is read, whatever is beside it)
            break
        if folder.name.startswith("PROF_"):
            return any(folder.parent.glob(_TORCH_NPU_DB))
    return False


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
        for f in files:
            path = base / f
            if is_trace_file(path):
                if not _regular(path):
                    continue
                if _MSPROF_DB.match(f) and _inside_torch_npu_output(path, root):
                    continue
                found.append(path)
            elif _ANY_JSON.match(f) and not is_temp_name(f) and is_kineto_json(path):
                found.append(path)
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


def _json_doc(path: Path) -> tuple[Any, bool]:
    """The JSON document at ``path``, parsed whole when it is small enough, else with its
    events read one at a time; and whether the latter."""
    try:
        return load_trace_json(path, chrome_json.WHOLE_JSON_BYTES), False
    except JsonTooLarge:
        return stream_trace_json(path), True


def _db_traces(path: Path, sink: RecordSink) -> list[RankTrace]:
    """The database's trace (a :class:`~..steps.FileTrace`: its steps keep their ids), its
    records handed to ``sink`` as :func:`read_held` takes them; only its steps when it recorded
    no MSTX range (no ``MSTX_EVENTS`` table)."""
    about = db_about(path)
    if not about.has_events:
        bare = RankTrace(about.rank, [], source=path, role=about.role)
        return [with_steps(bare, about.steps, no_mstx=True)]
    trace = RankTrace(0, [])
    found = db_records(path, lambda rec: sink(trace, named_step(rec)))
    found.records = trace.records
    return [with_steps(found, about.steps, rank=about.rank)]


def _json_traces(path: Path, doc: Any, sink: RecordSink | None = None) -> list[RankTrace]:
    if is_ours(doc):
        return read_chrome_doc(path, doc, sink)
    return read_foreign_chrome(path, doc, sink)


def read_trace_file(path: Path, max_events: int | None = None) -> list[RankTrace]:
    """Every trace in the file at ``path`` (one per process, or per rank in our Chrome traces);
    a spill or Chrome trace only when it holds at most ``max_events`` events (default: as
    many as are held, see above)."""
    path = Path(path)
    if path.suffix == ".db":
        traces = read_held(path, lambda sink: _db_traces(path, sink), max_events)
        return [_clean(t) for t in traces]
    if path.name.endswith(SPILL_SUFFIX):
        return [_clean(read_spill_held(path, max_events))]
    doc, _ = _json_doc(path)
    traces = read_held(path, lambda sink: _json_traces(path, doc, sink), max_events)
    return [_clean(t) for t in traces]


def part_of_file(
    path: Path,
    fold: Callable[[str], str] = fold_name,
    steps: StepOptions | None = None,
) -> list[ProcessPart]:
    """What ``summary`` keeps of each process in the file at ``path``."""
    path = Path(path)
    if path.suffix == ".db":
        if db_events(path) <= stream.MAX_HELD_EVENTS:
            return [aggregate_db(path, fold, steps)]  # in SQL, self times and all
        return [agg.part(trace) for trace, agg in streams_of_file(path, fold, steps)]
    if path.name.endswith(SPILL_SUFFIX):
        return [aggregate_spill(path, fold, steps)]
    doc, streamed = _json_doc(path)
    if not streamed:
        return [aggregate_trace(_clean(t), fold, steps) for t in _json_traces(path, doc)]
    sink = HoldOrStream(fold, steps)
    traces = _json_traces(path, doc, sink.add)
    return sink.parts(traces, lambda t: aggregate_trace(_clean(t), fold, steps))


def streams_of_file(
    path: Path,
    fold: Callable[[str], str] = fold_name,
    steps: StepOptions | None = None,
) -> list[tuple[RankTrace, StreamAggregator]]:
    """Each trace in the file at ``path`` (without its records) and an aggregator of its
    records and steps, which are not held (but a database's: read whole, as it always is)."""
    path = Path(path)
    if path.name.endswith(SPILL_SUFFIX):
        agg = StreamAggregator(fold, steps)
        return [(spill_trace(path, agg.add), agg)]
    if path.suffix == ".db":
        about = db_about(path)
        agg = StreamAggregator(fold, steps)
        agg.add_file_steps(about.steps)
        add = lambda rec: agg.add(named_step(rec))  # noqa: E731
        trace = db_records(path, add) if about.has_events else RankTrace(0, [])
        trace.rank, trace.role = about.rank, trace.role or about.role
        trace.steps = []  # (its steps, with their ids: given above)
        pairs = [(_clean(trace), agg)]
    else:
        sink = HoldOrStream(fold, steps, hold=0)
        doc, _ = _json_doc(path)
        pairs = [(t, sink.stream_of(t)) for t in _json_traces(path, doc, sink.add)]
    for trace, agg in pairs:
        agg.file_steps.update(trace.steps)
    return pairs


#: Peak memory of reading a file, over a fresh worker's (about 25 MB), per byte of file, by kind;
#: measured (Python 3.11, peak RSS of ``part_of_file`` in a fresh process): our Chrome trace of
#: 16 MB parsed whole, 11 (180 MB; its records and their aggregation beside the parse); a spill
#: held, 18 (550 MB for the 31 MB of a million events); a database summarised in SQL, 10
#: (540 MB for the 57 MB of a million events, 80 MB for 8 MB).
_PER_BYTE = {"json": 12, "spill": 19, "db": 10}
#: The most a spill, Chrome trace or database read in one pass takes: a million records held
#: and aggregated (a spill's, a Chrome trace's read an event at a time, see
#: :class:`~..stream.HoldOrStream`; a database's in SQL); measured 550 MB, 520 to 640 MB, 540 MB.
_HELD_PEAK = 650 << 20
#: A streamed spill's peak (its batches of a few MB, the aggregator): measured 30 MB.
_STREAMED_PEAK = 40 << 20
#: How much a gzip-compressed trace is taken to inflate, for the estimate (JSON traces compress
#: 8 to 15 times).
_GZIP_RATIO = 12


def peak_estimate(path: Path) -> int:
    """About how many bytes reading the file at ``path`` takes at its peak (over what the
    reading process had before), from its kind and size (constants measured, see above): what
    ``summary`` weighs to read several files at once within its memory.

    >>> import tempfile
    >>> f = Path(tempfile.mkdtemp()) / "rank0.trace.json"
    >>> _ = f.write_bytes(b" " * 1000)
    >>> peak_estimate(f)
    12000
    """
    try:
        size = os.stat(path).st_size
    except OSError:
        return 0  # the reader names it
    name = path.name
    if path.suffix == ".db":  # (past MAX_HELD_EVENTS rows it is streamed: no more than that)
        return min(_PER_BYTE["db"] * size, _HELD_PEAK)
    if name.endswith(SPILL_SUFFIX):
        if size > stream.MAX_SPILL_BYTES:
            return _STREAMED_PEAK
        return min(_PER_BYTE["spill"] * size, _HELD_PEAK)
    if name.endswith(".gz"):
        size *= _GZIP_RATIO
    # Parsed whole up to WHOLE_JSON_BYTES, else an event at a time, its records held up to
    # MAX_HELD_EVENTS: about as many records per byte either way.
    return min(_PER_BYTE["json"] * size, _HELD_PEAK)
