"""The Ascend PyTorch profiler's SQLite layout, as torch_npu writes it and msprof-analyze reads it.

Per rank, ``<worker>_<ms timestamp>_ascend_pt/ASCEND_PROFILER_OUTPUT/`` holds
``ascend_pytorch_profiler_<rank>.db`` with three tables:

- ``STRING_IDS(id, value)``: every message and domain name, stored once;
- ``MSTX_EVENTS``: ranges as ``eventType`` 2 and instants as 3, ``globalTid`` = pid << 32 | tid,
  and a unique ``connectionId`` per event, because msprof-analyze's ``mstx_sum`` drops ranges
  whose ``connectionId`` is NULL or 4294967295 (how torch_npu marks host-only ranges);
- ``STEP_TIME(id, startNs, endNs)``: step boundaries, which ``mstx_sum`` uses to give each range a
  step id (ids count from 1; ``mstx_sum`` reports ranges outside every step as step 0).

>>> from mstx_marks.records import RangeRecord
>>> import tempfile, pathlib
>>> db = ascend_db_path(tempfile.mkdtemp(), rank=3, worker="host_1", timestamp_ms=5)
>>> db.parts[-3:]
('host_1_5_ascend_pt', 'ASCEND_PROFILER_OUTPUT', 'ascend_pytorch_profiler_3.db')
>>> r = RangeRecord("step", "default", 100, 250, 11, 22)
>>> t = read_ascend_db(write_ascend_db(db, RankTrace(3, [r])))
>>> (t.rank, t.steps, t.records[0].end_ns)
(3, [(100, 250)], 250)
"""

from __future__ import annotations

import json
import os
import re
import socket
import sqlite3
import time
from contextlib import closing
from pathlib import Path

from ..records import InstantRecord, RangeRecord, RankTrace, Record, TraceFileError
from .files import atomic_path, atomic_write_bytes

__all__ = [
    "EVENT_INSTANT",
    "EVENT_PUSH_POP",
    "EVENT_RANGE",
    "HOST_ONLY_CONNECTION",
    "ascend_db_path",
    "read_ascend_db",
    "write_ascend_db",
]

EVENT_PUSH_POP = 1
EVENT_RANGE = 2
EVENT_INSTANT = 3
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
"""


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
    if timestamp_ms is None:
        stamp = int(time.time() * 1000)
        # msprof-analyze reads one rank per folder, so ranks exported by one process in the same
        # millisecond must not share one: take the next free millisecond.
        while (Path(out_dir) / f"{worker}_{stamp}_ascend_pt").exists():
            stamp += 1
    else:
        stamp = timestamp_ms
    folder = Path(out_dir) / f"{worker}_{stamp}_ascend_pt"
    return folder / "ASCEND_PROFILER_OUTPUT" / f"ascend_pytorch_profiler_{rank}.db"


def _storable(text: str) -> str:
    # A lone surrogate is a valid str (names are not checked for it) but SQLite takes UTF-8 only.
    return _SURROGATE.sub("\ufffd", text)


def _rows(trace: RankTrace) -> tuple[dict[str, int], list[tuple[object, ...]]]:
    ids: dict[str, int] = {}
    rows: list[tuple[object, ...]] = []
    for rec in trace.records:
        msg = ids.setdefault(rec.name, len(ids) + 1)
        dom = ids.setdefault(rec.domain, len(ids) + 1)
        tid = (rec.pid << 32) | (rec.thread & 0xFFFFFFFF)
        event_id = len(rows) + 1
        if isinstance(rec, InstantRecord):
            kind, end = EVENT_INSTANT, rec.start_ns
        else:
            kind, end = EVENT_RANGE, rec.end_ns
        rows.append((rec.start_ns, end, kind, event_id, None, msg, tid, tid, dom, event_id))
    return ids, rows


def write_ascend_db(path: str | Path, trace: RankTrace) -> Path:
    """Write ``trace`` as an Ascend profiler database at ``path`` (atomically) and return it.

    Ranges still open are left out. ``STEP_TIME`` holds ``trace.steps``, or, when it is empty,
    the spans of the trace's ``step`` ranges. A ``profiler_info_<rank>.json`` goes beside
    ``ASCEND_PROFILER_OUTPUT`` as torch_npu writes it, which text-mode tools use to find the rank.
    """
    path = Path(path)
    ids, rows = _rows(trace)
    steps = trace.with_steps().steps
    with atomic_path(path) as tmp, closing(sqlite3.connect(tmp)) as db, db:
        db.executescript(_SCHEMA)
        strings = [(i, _storable(s)) for s, i in ids.items()]
        db.executemany("INSERT INTO STRING_IDS VALUES (?, ?)", strings)
        db.executemany("INSERT INTO MSTX_EVENTS VALUES (?,?,?,?,?,?,?,?,?,?)", rows)
        db.executemany(
            "INSERT INTO STEP_TIME VALUES (?, ?, ?)",
            [(i, s, e) for i, (s, e) in enumerate(steps, start=1)],
        )
    if path.parent.name == "ASCEND_PROFILER_OUTPUT":
        info = {"rank_id": trace.rank, "generator": "mstx_marks"}
        atomic_write_bytes(
            path.parent.parent / f"profiler_info_{trace.rank}.json", json.dumps(info).encode()
        )
    return path


def _rank_of(path: Path) -> int:
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
SELECT e.startNs, e.endNs, e.eventType, m.value, d.value, e.globalTid
FROM MSTX_EVENTS e
LEFT JOIN STRING_IDS m ON e.message = m.id
LEFT JOIN STRING_IDS d ON e.domainId = d.id
WHERE e.eventType IN (?, ?, ?)
ORDER BY e.startNs
"""


def read_ascend_db(path: str | Path) -> RankTrace:
    """Read the MSTX events and steps of one database, ours or torch_npu's.

    Push/pop ranges (type 1) count as ranges, and so do host-only ones (``connectionId``
    4294967295): ``mstx_sum`` drops those, but they are phases the user marked. The rank comes
    from the file name, else from ``profiler_info_<rank>.json``, else is 0.
    Raises :class:`TraceFileError`, naming the file, when it is not such a database.
    """
    path = Path(path)
    if not path.is_file():
        raise TraceFileError(path, "no such file")
    try:
        with closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as db:
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            missing = {"MSTX_EVENTS", "STRING_IDS"} - tables
            if missing:
                raise TraceFileError(path, f"has no {' or '.join(sorted(missing))} table")
            kinds = (EVENT_PUSH_POP, EVENT_RANGE, EVENT_INSTANT)
            rows = db.execute(_EVENTS_QUERY, kinds).fetchall()
            steps = []
            if "STEP_TIME" in tables:
                query = (
                    "SELECT startNs, endNs FROM STEP_TIME"
                    " WHERE startNs IS NOT NULL AND endNs IS NOT NULL ORDER BY id"
                )
                steps = [(int(s), int(e)) for s, e in db.execute(query)]
    except TraceFileError:
        raise
    except (TypeError, ValueError, OverflowError) as e:
        raise TraceFileError(path, f"has a malformed STEP_TIME row ({e})") from e
    except sqlite3.Error as e:
        raise TraceFileError(path, f"is not a readable profiler database ({e})") from e
    records: list[Record] = []
    try:
        for start, end, kind, name, domain, gtid in rows:
            if start is None or (kind != EVENT_INSTANT and end is None):
                continue
            gtid = int(gtid or 0)
            name = name if name is not None else "<unnamed>"
            domain = domain or "default"
            tid, pid = gtid & 0xFFFFFFFF, gtid >> 32
            if kind == EVENT_INSTANT:
                records.append(InstantRecord(name, domain, int(start), tid, pid))
            else:
                records.append(RangeRecord(name, domain, int(start), int(end), tid, pid))
    except (TypeError, ValueError, OverflowError) as e:
        raise TraceFileError(path, f"has a malformed MSTX_EVENTS row ({e})") from e
    return RankTrace(_rank_of(path), records, steps, path)
