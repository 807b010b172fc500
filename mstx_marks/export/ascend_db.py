"""The Ascend PyTorch profiler's SQLite layout, as torch_npu writes it and msprof-analyze reads it.

Per rank, ``<host>_<pid>_<YYYYmmddHHMMSSfff>_ascend_pt/`` (torch_npu's folder name, local time)
holds ``profiler_info_<rank>.json`` (the fields torch_npu writes: ``config`` with
``common_config`` and ``experimental_config``, ``start_info``, ``end_info``, ``rank_id``),
``profiler_metadata.json`` (the process ``role``, which verl's rl-insight reads, and what
:func:`add_metadata` was given: ``distributed_args``, ``parallel_group_info``, ``pp_info``) and
``ASCEND_PROFILER_OUTPUT/ascend_pytorch_profiler_<rank>.db`` with the tables of a real capture
that a CPU recording can fill honestly:

- ``STRING_IDS(id, value)``: every message and domain name, stored once;
- ``MSTX_EVENTS``: ranges as ``eventType`` 2, instants as 3 (``marker_ex``, what ``mstx_sum``
  reads) except those of domain ``step_process``, written as 0 (``marker``, what ``dp_analysis``
  reads); ``globalTid`` = pid << 32 | tid, and a unique ``connectionId`` per event;
- ``ENUM_MSTX_EVENT_TYPE(id, name)``: 0 marker, 1 push/pop, 2 start/end, 3 marker_ex;
- ``STEP_TIME(id, startNs, endNs)``: step boundaries, which ``mstx_sum`` uses to give each range a
  step id (ids count from 1; ``mstx_sum`` reports ranges outside every step as step 0);
- ``SESSION_TIME_INFO(startTimeNs, endTimeNs)``: the recorded span, MindStudio Insight's time base;
- ``META_DATA(name, value)``: the schema version and the metadata above (values JSON, as
  torch_npu writes them), and where the recording process ran and on which clock
  (``mstx_marks_host``, ``mstx_marks_boot_id``, ``mstx_marks_anchor_ns``,
  ``mstx_marks_clock_step_ns``: its :class:`~mstx_marks.base.records.Origin`, which
  :func:`read_ascend_db` gives back);
- ``RANK_DEVICE_MAP(rankId, deviceId)`` (device -1: none known, as torch_npu writes without a
  device) and ``HOST_INFO(hostUid, hostName)``: the rank and host Insight and
  ``msprof-analyze cluster`` label the data with: the recording process's host (a database
  exported from a spill on another machine names the spill's, not the exporter's).

No device table is written: an empty ``TASK`` makes ``mstx_sum`` fail. **Host-only ranges are
kept** by ``mstx_sum`` because every event gets its own ``connectionId`` (never NULL nor
4294967295, the two it drops); with no ``TASK`` it reports their host durations, so its figures
agree exactly with the recording.

>>> from mstx_marks.base.records import RangeRecord
>>> import tempfile, pathlib
>>> db = ascend_db_path(tempfile.mkdtemp(), rank=3, worker="host_1", timestamp_ms=5)
>>> db.parts[-3][:7], len(db.parts[-3].split("_")[2]), db.parts[-2:]
('host_1_', 17, ('ASCEND_PROFILER_OUTPUT', 'ascend_pytorch_profiler_3.db'))
>>> r = RangeRecord("step", "default", 100, 250, 11, 22)
>>> t = read_ascend_db(write_ascend_db(db, RankTrace(3, [r])))
>>> (t.rank, t.steps, t.records[0].end_ns)
(3, [(100, 250)], 250)
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import sqlite3
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from operator import itemgetter
from pathlib import Path
from time import monotonic_ns, time_ns
from typing import Any

from mstx_marks.base.forking import new_lock
from mstx_marks.base.records import (
    STEP_PHASE,
    InstantRecord,
    Origin,
    RangeRecord,
    RankTrace,
    Record,
    TraceFileError,
    plain_args,
)
from mstx_marks.export.db_open import open_db
from mstx_marks.export.files import atomic_path, atomic_write_bytes
from mstx_marks.export.spill import boot_id
from mstx_marks.export.start_order import (
    ARGS,
    DOMAIN,
    END,
    INSTANT,
    KIND,
    NAME,
    PID,
    START,
    THREAD,
    Event,
    events,
)

__all__ = [
    "DP_DOMAIN",
    "EVENT_INSTANT",
    "EVENT_MARKER",
    "EVENT_PUSH_POP",
    "EVENT_RANGE",
    "HOST_ONLY_CONNECTION",
    "DbWriter",
    "add_metadata",
    "args_join",
    "args_of",
    "ascend_db_path",
    "db_meta_of",
    "db_role",
    "rank_of_db",
    "read_ascend_db",
    "text",
    "write_ascend_db",
    "write_beside",
]

EVENT_MARKER = 0
EVENT_PUSH_POP = 1
EVENT_RANGE = 2
EVENT_INSTANT = 3
#: ``ENUM_MSTX_EVENT_TYPE`` as a real capture holds it.
EVENT_TYPES = ((0, "marker"), (1, "push/pop"), (2, "start/end"), (3, "marker_ex"))
#: The domain whose instants ``dp_analysis`` reads as ``marker`` (type 0) events.
DP_DOMAIN = "step_process"
#: torch_npu's device id when it knows none.
NO_DEVICE = -1
#: The ``connectionId`` torch_npu gives a range that has no device task.
HOST_ONLY_CONNECTION = 4294967295

_DB_NAME = re.compile(r"ascend_pytorch_profiler(?:_(\d+))?\.db\Z")
_PROFILER_INFO = re.compile(r"profiler_info_(\d+)\.json\Z")
_SURROGATE = re.compile("[\ud800-\udfff]")

_SCHEMA = """
CREATE TABLE STRING_IDS (id INTEGER PRIMARY KEY, value TEXT);
CREATE TABLE MSTX_EVENTS (
    startNs INTEGER, endNs INTEGER, eventType INTEGER, rangeId INTEGER, category INTEGER,
    message INTEGER, globalTid INTEGER, endGlobalTid INTEGER, domainId INTEGER,
    connectionId INTEGER
);
CREATE TABLE STEP_TIME (id INTEGER PRIMARY KEY, startNs INTEGER, endNs INTEGER);
CREATE TABLE ENUM_MSTX_EVENT_TYPE (id INTEGER PRIMARY KEY, name TEXT);
CREATE TABLE SESSION_TIME_INFO (startTimeNs INTEGER, endTimeNs INTEGER);
CREATE TABLE META_DATA (name TEXT, value TEXT);
CREATE TABLE RANK_DEVICE_MAP (rankId INTEGER, deviceId INTEGER);
CREATE TABLE HOST_INFO (hostUid TEXT, hostName TEXT);
CREATE TABLE MSTX_ARGS (eventId INTEGER PRIMARY KEY, args TEXT);
"""
_SCHEMA_VERSION = (("SCHEMA_VERSION_MAJOR", "1"), ("SCHEMA_VERSION_MINOR", "0"),
                   ("SCHEMA_VERSION_MICRO", "0"), ("SCHEMA_VERSION", "1.0.0"))  # fmt: skip

_metadata: dict[str, Any] = {}
_metadata_lock = new_lock()


def add_metadata(name: str, value: Any) -> None:
    """Record ``name: value`` for this process's databases, as torch_npu's
    ``prof.add_metadata_json`` does: it goes to ``profiler_metadata.json`` and ``META_DATA``.
    ``value`` must be JSON-serializable (checked here, not at export).

    >>> add_metadata("pp_info", object())  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: metadata 'pp_info' must be JSON-serializable: Object of type object is not ...
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"metadata name must be a non-empty str, got {name!r}")
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"metadata {name!r} must be JSON-serializable: {exc}") from None
    with _metadata_lock:
        _metadata[name] = value


def process_metadata() -> dict[str, Any]:
    """What :func:`add_metadata` recorded in this process so far."""
    with _metadata_lock:
        return dict(_metadata)


def ascend_db_path(
    out_dir: str | Path,
    rank: int,
    *,
    worker: str | None = None,
    timestamp_ms: int | None = None,
) -> Path:
    """Where torch_npu would put rank ``rank``'s database under ``out_dir``.

    ``worker`` defaults to ``<hostname>_<pid>`` and ``timestamp_ms`` to now, as in torch_npu
    (moved on to the first millisecond whose folder does not exist yet); msprof-analyze picks the
    newest timestamp when a rank has several folders.
    """
    worker = worker or f"{socket.gethostname()}_{os.getpid()}"
    stamp = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    # msprof-analyze reads one rank per folder, so ranks exported by one process in the same
    # millisecond must not share one: take the next free millisecond.
    while timestamp_ms is None and (Path(out_dir) / _folder(worker, stamp)).exists():
        stamp += 1
    folder = Path(out_dir) / _folder(worker, stamp)
    return folder / "ASCEND_PROFILER_OUTPUT" / f"ascend_pytorch_profiler_{rank}.db"


def _folder(worker: str, stamp_ms: int) -> str:
    """torch_npu's ``<worker>_<YYYYmmddHHMMSSfff>_ascend_pt`` (local time, as torch_npu)."""
    when = datetime.fromtimestamp(stamp_ms // 1000).strftime("%Y%m%d%H%M%S")
    return f"{worker}_{when}{stamp_ms % 1000:03d}_ascend_pt"


def host_uid(origin: Origin | None = None) -> str:
    """A stable id of the host ``origin`` names (default: this one), as a decimal str like
    torch_npu's ``_get_host_uid()``: this host's from its machine id (else its name); another
    host's, whose machine id is not known here, from its name and boot id.

    >>> host_uid(Origin("h1", "b1")) == host_uid(Origin("h1", "b1")) != host_uid(Origin("h2"))
    True
    """
    if origin is None or _recorded_here(origin):
        seed = socket.gethostname()
        for source in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
            try:
                seed = Path(source).read_text().strip() or seed
                break
            except OSError:
                continue
    else:
        seed = f"{origin.host}/{origin.boot_id}"
    return str(int.from_bytes(hashlib.sha256(seed.encode()).digest()[:8], "big") >> 1)


def _recorded_here(origin: Origin) -> bool:
    """Whether ``origin`` is this machine (its boot id, else its host name)."""
    if origin.boot_id and boot_id():
        return origin.boot_id == boot_id()
    return origin.host == socket.gethostname()


#: Where ``META_DATA`` keeps the recording process's :class:`Origin` fields: under this prefix.
_ORIGIN_META = "mstx_marks_"


def _host_row(meta: Mapping[str, Any]) -> tuple[str, str]:
    """``HOST_INFO``'s row: the recording process's host as ``meta`` says it, else this one."""
    origin = Origin.of({k[len(_ORIGIN_META) :]: v for k, v in meta.items()
                        if k.startswith(_ORIGIN_META)})  # fmt: skip
    if not origin.host:
        return host_uid(), socket.gethostname()
    return host_uid(origin), origin.host


def _storable(text: str) -> str:
    # A lone surrogate is a valid str (names are not checked for it) but SQLite takes UTF-8 only.
    return _SURROGATE.sub("\ufffd", text)


def _args_json(args: Mapping[str, Any]) -> str:
    try:
        return json.dumps(plain_args(args), ensure_ascii=False, default=str)
    except Exception:
        return "{}"


def db_meta_of(trace: RankTrace, metadata: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What ``META_DATA`` and ``profiler_metadata.json`` hold for ``trace``'s process (its
    records are not read): its role, run, instance and drop count when it has them, where it
    recorded and on which clock, what :func:`add_metadata` recorded, and ``metadata``."""
    return {
        **{_ORIGIN_META + k: v for k, v in trace.origin.fields().items()},
        **({"role": trace.role} if trace.role else {}),
        **({"mstx_marks_run": trace.run} if trace.run else {}),
        **({"mstx_marks_instance": trace.instance} if trace.instance else {}),
        **({"mstx_marks_dropped": trace.dropped} if trace.dropped else {}),
        **process_metadata(),
        **(metadata or {}),
    }


def write_ascend_db(
    path: str | Path, trace: RankTrace, *, metadata: Mapping[str, Any] | None = None
) -> Path:
    """Write ``trace`` as an Ascend profiler database at ``path`` (atomically) and return it:
    :class:`DbWriter` fed the trace's records in their order.

    Open ranges are written with the end they were read at. ``STEP_TIME`` holds
    ``trace.steps``, or, when it is empty, the spans of the trace's ``step`` ranges.
    ``metadata`` (JSON values) is added to what :func:`add_metadata` recorded, and to ``role``
    when the trace has one. When ``path`` is in an ``ASCEND_PROFILER_OUTPUT`` folder,
    ``profiler_info_<rank>.json`` (which the tools take the rank from) and
    ``profiler_metadata.json`` go beside that folder, as torch_npu writes them.
    """
    path = Path(path)
    meta = db_meta_of(trace, metadata)
    with atomic_path(path) as tmp, DbWriter(tmp, steps=trace.with_steps().steps) as db:
        records = trace.records
        for lo in range(0, len(records), _BATCH):
            db.add(events(records[lo : lo + _BATCH]))
        span = db.finish(trace.rank, meta)
    write_beside(path, trace.rank, span, meta)
    return path


_BATCH = 16384


def write_beside(
    path: Path,
    rank: int,
    span: tuple[int, int],
    meta: Mapping[str, Any],
    *,
    root: Path | None = None,
) -> None:
    """``profiler_info_<rank>.json`` and ``profiler_metadata.json`` beside the
    ``ASCEND_PROFILER_OUTPUT`` folder of the database at ``path`` (nothing when it is in none);
    ``root`` as for :func:`~mstx_marks.export.files.atomic_path`."""
    if path.parent.name != "ASCEND_PROFILER_OUTPUT":
        return
    folder = path.parent.parent
    info = json.dumps(_profiler_info(rank, span), indent=4)
    atomic_write_bytes(folder / f"profiler_info_{rank}.json", info.encode(), root=root)
    atomic_write_bytes(folder / "profiler_metadata.json", json.dumps(meta).encode(), root=root)


_INSERT_EVENT = "INSERT INTO MSTX_EVENTS VALUES (?1, ?2, ?3, ?4, NULL, ?5, ?6, ?6, ?7, ?4)"
_START, _END, _ARGS = itemgetter(START), itemgetter(END), itemgetter(ARGS)
_SHAPE, _PID_THREAD = itemgetter(NAME, DOMAIN, KIND), itemgetter(PID, THREAD)


class _Shapes(dict):  # type: ignore[type-arg]
    """(name, domain, kind) -> a number, whose event type, message id and domain id are in
    ``codes``, ``messages`` and ``domains``; the strings numbered in ``ids`` in the order they
    first come (the name before the domain)."""

    def __init__(self, ids: dict[str, int]) -> None:
        super().__init__()
        self.ids = ids
        self.codes: list[int] = []
        self.messages: list[int] = []
        self.domains: list[int] = []

    def __missing__(self, key: tuple[str, str, int]) -> int:
        name, domain, kind = key
        ids = self.ids
        self.messages.append(ids.get(name) or ids.setdefault(name, len(ids) + 1))
        self.domains.append(ids.get(domain) or ids.setdefault(domain, len(ids) + 1))
        if kind == INSTANT:
            self.codes.append(EVENT_MARKER if domain == DP_DOMAIN else EVENT_INSTANT)
        else:
            self.codes.append(EVENT_RANGE)
        self[key] = number = len(self.codes) - 1
        return number


class _GlobalTids(dict):  # type: ignore[type-arg]
    """(pid, thread) -> ``globalTid``, as torch_npu makes it: ``pid << 32 | tid``."""

    def __missing__(self, key: tuple[int, int]) -> int:
        self[key] = tid = (key[0] << 32) | (key[1] & 0xFFFFFFFF)
        return tid


class DbWriter:
    """Writes a new Ascend database at ``path`` a batch of events at a time (:meth:`add`, the
    events of :mod:`~mstx_marks.export.start_order`), holding only its strings (the names) and
    a batch: each event becomes its ``MSTX_EVENTS`` row (numbered from 1 in the order given)
    as it comes. ``steps`` are ``STEP_TIME``'s rows; ``None``: the spans of the ``step``
    ranges, which must then come in start order. :meth:`finish` writes the other tables and
    commits; a context manager (leaving it closes the connection).

    >>> import tempfile
    >>> from mstx_marks.export.start_order import events
    >>> path = Path(tempfile.mkdtemp()) / "x.db"
    >>> with DbWriter(path) as db:
    ...     db.add(events([RangeRecord("step", "default", 100, 250, 11, 22)]))
    ...     db.finish(3, {})
    (100, 250)
    >>> read_ascend_db(path).steps
    [(100, 250)]
    """

    def __init__(self, path: str | Path, *, steps: list[tuple[int, int]] | None = None) -> None:
        self._db = sqlite3.connect(path)
        try:
            # A fresh file renamed into place when complete: SQLite's journal and syncs protect
            # nothing here, and cost most of the write (and a -journal file if killed midway).
            self._db.execute("PRAGMA journal_mode=OFF")
            self._db.execute("PRAGMA synchronous=OFF")
            self._db.executescript(_SCHEMA)
        except BaseException:
            self._db.close()
            raise
        self._ids: dict[str, int] = {}
        self._shapes = _Shapes(self._ids)
        self._tids = _GlobalTids()
        self._low, self._high = 2**63 - 1, 0
        self.events = 0
        self._steps = steps
        self._step_rows = 0
        # Step ranges of the latest start: at one start, STEP_TIME goes by end (step_spans).
        self._tied_steps: list[tuple[int, int]] = []

    def __enter__(self) -> DbWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self._db.close()

    def add(self, batch: list[Event]) -> None:
        """The rows of ``batch`` (events, in order). Made a column at a time by ``map`` and
        ``zip`` over the batch (C loops: a Python step per event cost as much as SQLite)."""
        if not batch:
            return
        starts, ends = list(map(_START, batch)), list(map(_END, batch))
        first = self.events + 1
        self.events += len(batch)
        # Each event's (name, domain, kind), numbered in event order: STRING_IDS numbers the
        # strings in the order they first come.
        shapes = self._shapes
        numbers = list(map(shapes.__getitem__, map(_SHAPE, batch)))
        codes = map(shapes.codes.__getitem__, numbers)
        messages = map(shapes.messages.__getitem__, numbers)
        domains = map(shapes.domains.__getitem__, numbers)
        tids = map(self._tids.__getitem__, map(_PID_THREAD, batch))
        ids = range(first, first + len(batch))
        self._db.executemany(_INSERT_EVENT, zip(starts, ends, codes, ids, messages, tids, domains))
        self._low, self._high = min(self._low, min(starts)), max(self._high, max(ends))
        if any(map(_ARGS, batch)):
            with_args = [(i, _storable(_args_json(e[ARGS])))
                         for i, e in zip(ids, batch) if e[ARGS]]  # fmt: skip
            self._db.executemany("INSERT INTO MSTX_ARGS VALUES (?, ?)", with_args)
        if self._steps is None and STEP_PHASE in self._ids:
            for e in batch:
                if e[NAME] == STEP_PHASE and e[KIND] != INSTANT:
                    self._step(e[START], e[END])

    def _step(self, start: int, end: int) -> None:
        tied = self._tied_steps
        if tied and tied[0][0] != start:
            self._write_steps()
        tied.append((start, end))

    def _write_steps(self) -> None:
        rows = []
        for span in sorted(self._tied_steps):
            self._step_rows += 1
            rows.append((self._step_rows, *span))
        self._db.executemany("INSERT INTO STEP_TIME VALUES (?, ?, ?)", rows)
        self._tied_steps.clear()

    def finish(self, rank: int, meta: Mapping[str, Any]) -> tuple[int, int]:
        """Write the tables but ``MSTX_EVENTS`` (``rank``, ``meta``: ``META_DATA``) and commit;
        returns the span of the events (now, now: none)."""
        db = self._db
        if self._steps is None:
            self._write_steps()
        else:
            db.executemany(
                "INSERT INTO STEP_TIME VALUES (?, ?, ?)",
                [(i, s, e) for i, (s, e) in enumerate(self._steps, start=1)],
            )
        strings = [(i, _storable(s)) for s, i in self._ids.items()]
        db.executemany("INSERT INTO STRING_IDS VALUES (?, ?)", strings)
        now = time_ns()
        span = (self._low, self._high) if self.events else (now, now)
        db.executemany("INSERT INTO ENUM_MSTX_EVENT_TYPE VALUES (?, ?)", EVENT_TYPES)
        db.execute("INSERT INTO SESSION_TIME_INFO VALUES (?, ?)", span)
        db.executemany("INSERT INTO META_DATA VALUES (?, ?)", _SCHEMA_VERSION)
        db.executemany(
            "INSERT INTO META_DATA VALUES (?, ?)",
            [(k, _storable(json.dumps(v))) for k, v in meta.items()],
        )
        db.execute("INSERT INTO RANK_DEVICE_MAP VALUES (?, ?)", (rank, NO_DEVICE))
        db.execute("INSERT INTO HOST_INFO VALUES (?, ?)", _host_row(meta))
        db.commit()
        return span


def _profiler_info(rank: int, span: tuple[int, int]) -> dict[str, Any]:
    """``profiler_info_<rank>.json`` with torch_npu's fields, describing what this file holds:
    MSTX only (``Level_none``, ``_mstx`` on), exported as a database, CPU activity."""
    experimental = {
        "_profiler_level": "Level_none", "_aic_metrics": "ACL_AICORE_NONE", "_l2_cache": False,
        "_msprof_tx": False, "_mstx": True, "_data_simplification": True,
        "record_op_args": False, "_export_type": ["db"], "_host_sys": [], "_op_attr": False,
        "_gc_detect_threshold": None, "_mstx_domain_include": [], "_mstx_domain_exclude": [],
        "_sys_io": False, "_sys_interconnection": False,
    }  # fmt: skip
    common = {
        "activities": ["ProfilerActivity.CPU"], "schedule": None, "record_shapes": False,
        "profile_memory": False, "with_stack": False, "with_flops": False, "with_modules": False,
    }  # fmt: skip
    return {
        "config": {"common_config": common, "experimental_config": experimental},
        "start_info": {"syscnt_enable": False, "freq": 100, "start_cnt": 0, "start_monotonic": 0},
        "end_info": {"collectionTimeEnd": span[1], "MonotonicTimeEnd": monotonic_ns()},
        "torch_npu_version": "",
        "cann_version": "",
        "rank_id": rank,
        "generator": "mstx_marks",
    }


def rank_of_db(path: Path) -> int:
    """The rank a database holds, as the tools read it: from its file name, else from the
    ``profiler_info_<rank>.json`` beside its ``ASCEND_PROFILER_OUTPUT`` folder, else 0."""
    m = _DB_NAME.match(path.name)
    if m and m.group(1) is not None:
        return int(m.group(1))
    # A single-device run names its file without a rank; torch_npu records it beside the output.
    for sibling in sorted(path.parent.parent.glob("profiler_info_*.json")):
        m = _PROFILER_INFO.match(sibling.name)
        if m:
            return int(m.group(1))
    return 0


_EVENTS_QUERY = """
SELECT e.startNs, e.endNs, e.eventType, m.value, d.value, e.globalTid, {args}
FROM MSTX_EVENTS e
LEFT JOIN STRING_IDS m ON e.message = m.id
LEFT JOIN STRING_IDS d ON e.domainId = d.id
{join}
WHERE e.eventType IN (?, ?, ?, ?)
ORDER BY e.startNs
"""


def db_meta(db: sqlite3.Connection, tables: set[str], name: str) -> Any:
    """The JSON value ``META_DATA`` holds under ``name`` (None when none or unreadable)."""
    if "META_DATA" not in tables:
        return None
    try:
        row = db.execute("SELECT value FROM META_DATA WHERE name = ? LIMIT 1", (name,)).fetchone()
        return json.loads(row[0]) if row and row[0] is not None else None
    except (sqlite3.Error, ValueError, TypeError):
        return None


def db_process(db: sqlite3.Connection, tables: set[str], trace: RankTrace) -> RankTrace:
    """``trace`` with the run, instance, dropped count and origin (where the process recorded
    and on which clock) our database keeps in ``META_DATA``."""
    run, instance = (
        db_meta(db, tables, "mstx_marks_run"),
        db_meta(db, tables, "mstx_marks_instance"),
    )
    dropped = db_meta(db, tables, "mstx_marks_dropped")
    trace.run = run if isinstance(run, str) else ""
    trace.instance = instance if isinstance(instance, str) else ""
    trace.dropped = dropped if type(dropped) is int and dropped > 0 else 0
    trace.origin = Origin.of({f: db_meta(db, tables, _ORIGIN_META + f) for f in Origin._fields})
    return trace


def db_role(db: sqlite3.Connection, tables: set[str]) -> str:
    """The process role our database keeps in ``META_DATA`` (``""`` when none: torch_npu's)."""
    if "META_DATA" not in tables:
        return ""
    try:
        row = db.execute("SELECT value FROM META_DATA WHERE name = 'role' LIMIT 1").fetchone()
        role = json.loads(row[0]) if row and row[0] is not None else ""
    except (sqlite3.Error, ValueError, TypeError):
        return ""
    return role if isinstance(role, str) else ""


def read_ascend_db(
    path: str | Path,
    *,
    sink: Callable[[Record], object] | None = None,
    on_note: Callable[[str], object] | None = None,
) -> RankTrace:
    """Read the MSTX events and steps of one database, ours or torch_npu's.

    Push/pop ranges (type 1) count as ranges, and so do host-only ones (``connectionId``
    4294967295): ``mstx_sum`` drops those, but they are phases the user marked. Marks of both
    kinds (``marker`` 0 and ``marker_ex`` 3) are instants. The rank comes
    from the file name, else from ``profiler_info_<rank>.json``, else is 0.
    With ``sink``, each record is handed to it as its row is read instead of kept (the trace
    returned has none): memory stays that of a row, whatever the database holds.
    The file is opened as :func:`~mstx_marks.export.db_open.open_db` opens it (read only,
    nothing written beside it, in bounded time); what could not be read of it (a write-ahead
    log left beside it) is handed to ``on_note``, a line naming the file.
    Raises :class:`TraceFileError`, naming the file, when it is not such a database.
    """
    path = Path(path)
    if not path.is_file():
        raise TraceFileError(path, "no such file")
    records: list[Record] = []
    try:
        with open_db(path) as db:
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            missing = {"MSTX_EVENTS", "STRING_IDS"} - tables
            if missing:
                raise TraceFileError(path, f"has no {' or '.join(sorted(missing))} table")
            kinds = (EVENT_MARKER, EVENT_PUSH_POP, EVENT_RANGE, EVENT_INSTANT)
            args, join = args_join(db, tables)
            query = _EVENTS_QUERY.format(args=args, join=join)
            try:
                skipped = event_records(db.paced(db.execute(query, kinds)), sink or records.append)
            except (TypeError, ValueError, OverflowError) as e:
                raise TraceFileError(path, f"has a malformed MSTX_EVENTS row ({e})") from e
            steps = []
            if "STEP_TIME" in tables:
                query = (
                    "SELECT startNs, endNs FROM STEP_TIME"
                    " WHERE startNs IS NOT NULL AND endNs IS NOT NULL ORDER BY id"
                )
                steps = [(int(s), int(e)) for s, e in db.execute(query)]
            role = db_role(db, tables)
            about = db_process(db, tables, RankTrace(0, []))
            if on_note is not None:
                for note in db.notes:
                    on_note(note)
    except Exception as e:
        error = as_trace_error(path, e)
        if error is e:
            raise
        raise error from e
    trace = RankTrace(rank_of_db(path), records, steps, path, role, skipped=skipped)
    trace.run, trace.instance, trace.dropped = about.run, about.instance, about.dropped
    trace.origin = about.origin
    return trace


def as_trace_error(path: Path, e: Exception) -> Exception:
    """What a database reader raises for ``e``: a :class:`TraceFileError` naming ``path``
    (a bad row, a file SQLite cannot read), or ``e`` itself when it is none of those."""
    if isinstance(e, TraceFileError):
        return e
    if isinstance(e, (TypeError, ValueError, OverflowError)):
        return TraceFileError(path, f"has a malformed STEP_TIME row ({e})")
    if isinstance(e, sqlite3.Error):
        return TraceFileError(path, f"is not a readable profiler database ({e})")
    return e


def text(value: Any, default: str) -> str:
    """A name as read from a database: ``None`` is ``default``, bytes are decoded.

    >>> text(b"gen\\xff", "x"), text(None, "<unnamed>"), text(7, "")
    ('gen\\ufffd', '<unnamed>', '7')
    """
    if value is None:
        return default
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def event_records(rows: Iterable[Any], sink: Callable[[Record], object]) -> int:
    """Hand the records of ``rows`` to ``sink``; how many were skipped (a range ending before it
    starts). A row is ``(startNs, endNs, eventType, message, domain, globalTid, args JSON)``,
    as this module's query and the summary's read them."""
    skipped = 0
    for start, end, kind, name, domain, gtid, args_text in rows:
        instant = kind in (EVENT_INSTANT, EVENT_MARKER)
        if start is None or (not instant and end is None):
            continue
        args = args_of(args_text)
        gtid = int(gtid or 0)
        name = text(name, "<unnamed>")  # a BLOB (another tool's) as UTF-8, with replacement
        domain = text(domain or None, "default")
        tid, pid = gtid & 0xFFFFFFFF, gtid >> 32
        if instant:
            sink(InstantRecord(name, domain, int(start), tid, pid, args))
        elif int(end) >= int(start):
            sink(RangeRecord(name, domain, int(start), int(end), tid, pid, False, args))
        else:
            skipped += 1  # ends before it starts: not a duration
    return skipped


def args_join(db: sqlite3.Connection, tables: set[str]) -> tuple[str, str]:
    """The column and the join that give each ``MSTX_EVENTS e`` row its args: ours
    (``MSTX_ARGS(eventId, args)``), or ``("NULL", "")`` where there is none (another tool's
    table of that name, with other columns, is not read)."""
    if "MSTX_ARGS" not in tables:
        return "NULL", ""
    try:
        columns = {row[1] for row in db.execute("PRAGMA table_info(MSTX_ARGS)")}
    except sqlite3.Error:
        return "NULL", ""
    if not {"eventId", "args"} <= columns:
        return "NULL", ""
    return "a.args", "LEFT JOIN MSTX_ARGS a ON a.eventId = e.rangeId"


def args_of(text: Any) -> dict[str, Any] | None:
    """An event's args as ``MSTX_ARGS`` holds them (JSON), or None when there are none or they
    are not an object.

    >>> args_of('{"tokens": 8}'), args_of("[1]"), args_of(None)
    ({'tokens': 8}, None, None)
    """
    if not isinstance(text, str):
        return None
    try:
        args = json.loads(text)
    except (ValueError, RecursionError):  # (nested deeper than the parser goes: not ours)
        return None
    return args if isinstance(args, dict) and args else None
