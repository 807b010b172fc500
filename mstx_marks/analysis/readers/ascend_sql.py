"""An Ascend profiler database summarised inside SQLite: no record is built in Python.

``summary`` reads a database (ours or torch_npu's, the layout :mod:`mstx_marks.export.ascend_db`
describes) with a handful of queries: the names once (``STRING_IDS``; a ``BLOB`` name is decoded
as UTF-8 with replacement), the ranges once as plain tuples (thread, start, end, message: their
durations give exact per-rank percentiles, their nesting the self times, see
:func:`~mstx_marks.analysis.aggregate.breakdown`), the first start of each message, the steps
(``STEP_TIME``, or a step phase's ranges), and only those marks that may pair
(``X_start``/``X_stop``, see :mod:`mstx_marks.analysis.mark_pairs`). It gives the same
:class:`~mstx_marks.analysis.aggregate.ProcessPart` as reading the file with
:func:`~mstx_marks.export.read_ascend_db` and aggregating the records (the tests hold the two to
it), in a fraction of the time and memory.

>>> import tempfile, pathlib
>>> from mstx_marks.base.records import RangeRecord, RankTrace
>>> from mstx_marks.export import write_ascend_db
>>> db = pathlib.Path(tempfile.mkdtemp()) / "ascend_pytorch_profiler_3.db"
>>> _ = write_ascend_db(db, RankTrace(3, [RangeRecord("step", "default", 100, 250, 1, 2)]))
>>> part = aggregate_db(db)
>>> part.rank, part.step_time_ns, part.phases["step"].count
(3, 150, 1)
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any, Callable

from mstx_marks.analysis.aggregate import ProcessPart, phase_agg
from mstx_marks.analysis.mark_pairs import START_SUFFIX, STOP_SUFFIX, pair_marks
from mstx_marks.analysis.steps import (
    StepOptions,
    fold_name,
    merge_spans,
    steps_from_ranges,
    steps_from_spans,
)
from mstx_marks.base.records import InstantRecord, RangeRecord, RankTrace, Record, TraceFileError
from mstx_marks.export.ascend_db import (
    EVENT_INSTANT,
    EVENT_MARKER,
    EVENT_PUSH_POP,
    EVENT_RANGE,
    db_process,
    db_role,
    rank_of_db,
    text,
)

__all__ = ["aggregate_db", "db_events"]

_MARKS = f"({EVENT_MARKER}, {EVENT_INSTANT})"
_KINDS = f"({EVENT_MARKER}, {EVENT_PUSH_POP}, {EVENT_RANGE}, {EVENT_INSTANT})"
_RANGE_KINDS = f"({EVENT_PUSH_POP}, {EVENT_RANGE})"
# The rows read_ascend_db keeps: marks of both kinds, ranges with an end not before the start.
_VALID = (
    f"typeof(startNs) = 'integer' AND (eventType IN {_MARKS} OR"
    " (typeof(endNs) = 'integer' AND endNs >= startNs))"
    f" AND eventType IN {_KINDS}"
)


def _query(db: sqlite3.Connection, sql: str, *params: Any) -> list[Any]:
    return db.execute(sql, params).fetchall()


def db_events(path: Path) -> int:
    """How many MSTX events the database at ``path`` holds (0 when it cannot be read: then
    :func:`aggregate_db` names it and why); one ``COUNT``, whatever its size."""
    try:
        with closing(sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True)) as db:
            ((n,),) = _query(db, "SELECT COUNT(*) FROM MSTX_EVENTS")
            return int(n)
    except (sqlite3.Error, OSError, TypeError, ValueError):
        return 0


def aggregate_db(
    path: Path,
    fold: Callable[[str], str] = fold_name,
    steps: StepOptions | None = None,
) -> ProcessPart:
    """The :class:`ProcessPart` of the database at ``path``; :class:`TraceFileError` naming the
    file when it is not one."""
    steps = steps or StepOptions()
    path = Path(path)
    if not path.is_file():
        raise TraceFileError(path, "no such file")
    try:
        with closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as db:
            return _aggregate(db, path, fold, steps)
    except TraceFileError:
        raise
    except (TypeError, ValueError, OverflowError) as e:
        raise TraceFileError(path, f"has a malformed row ({type(e).__name__}: {e})") from e
    except sqlite3.Error as e:
        raise TraceFileError(path, f"is not a readable profiler database ({e})") from e


def _aggregate(
    db: sqlite3.Connection, path: Path, fold: Callable[[str], str], steps: StepOptions
) -> ProcessPart:
    tables = {r[0] for r in _query(db, "SELECT name FROM sqlite_master WHERE type='table'")}
    missing = {"MSTX_EVENTS", "STRING_IDS"} - tables
    if missing:
        raise TraceFileError(path, f"has no {' or '.join(sorted(missing))} table")
    names = {i: text(v, "<unnamed>") for i, v in _query(db, "SELECT id, value FROM STRING_IDS")}

    def name_of(message: Any) -> str:
        return names.get(message, "<unnamed>") if message is not None else "<unnamed>"

    ((n_rows, first_ns),) = _query(
        db, f"SELECT COUNT(*), MIN(startNs) FROM MSTX_EVENTS WHERE {_VALID}"
    )
    pids = {int(p or 0) >> 32 for (p,) in _query(
        db, f"SELECT DISTINCT globalTid FROM MSTX_EVENTS WHERE {_VALID}"
    )}  # fmt: skip
    where_ranges = f"{_VALID} AND eventType IN {_RANGE_KINDS}"
    firsts = _query(
        db, f"SELECT message, MIN(startNs), MAX(endNs) FROM MSTX_EVENTS WHERE {where_ranges}"
        " GROUP BY message"
    )  # fmt: skip
    durations: dict[str, list[int]] = {}
    first: dict[str, int] = {}
    ends: list[int] = []
    for message, lo, hi in firsts:
        name = fold(name_of(message))
        first[name] = min(first.get(name, int(lo)), int(lo))
        ends.append(int(hi))
    # The ranges, read once: their durations here, their nesting for the self times below.
    ranges = db.execute(
        f"SELECT globalTid, startNs, -endNs, message FROM MSTX_EVENTS WHERE {where_ranges}"
    ).fetchall()
    by_message: dict[Any, list[int]] = {}
    for _, start, neg_end, message in ranges:
        by_message.setdefault(message, []).append(-neg_end - start)
    for message, ds in by_message.items():
        name = fold(name_of(message))
        durations[name] = sorted(durations.get(name, []) + ds)
    del by_message

    # Marks that mstx_sum would pair into ranges.
    pairable = [i for i, v in names.items() if v.endswith(START_SUFFIX) or v.endswith(STOP_SUFFIX)]
    paired: list[RangeRecord] = []
    if pairable:
        marks: list[Record] = [
            InstantRecord(name_of(m), text(d, "default"), int(s), int(g or 0) & 0xFFFFFFFF,
                          int(g or 0) >> 32)
            for s, m, g, d in _query(
                db,
                "SELECT e.startNs, e.message, e.globalTid, s.value FROM MSTX_EVENTS e"
                " LEFT JOIN STRING_IDS s ON e.domainId = s.id"
                f" WHERE e.eventType IN {_MARKS} AND e.startNs IS NOT NULL"
                f" AND e.message IN ({','.join('?' * len(pairable))})",
                *pairable,
            )
        ]  # fmt: skip
        paired = [r for r in pair_marks(marks) if isinstance(r, RangeRecord)]
    for r in paired:
        name = fold(r.name)
        durations[name] = sorted([*durations.get(name, []), r.end_ns - r.start_ns])
        first[name] = min(first.get(name, r.start_ns), r.start_ns)
        ends.append(r.end_ns)

    steps = steps.resolved([*(name_of(m) for m, _, _ in firsts), *(r.name for r in paired)])
    found, windows = _steps(db, tables, names, paired, fold, steps)
    nested, step_phases = _nested(ranges, name_of, paired, fold, steps)
    lo = min(first.values(), default=None)
    about = db_process(db, tables, RankTrace(0, []))
    ((n_all,),) = _query(db, f"SELECT COUNT(*) FROM MSTX_EVENTS WHERE eventType IN {_KINDS}")
    return (
        ProcessPart(
            run=about.run,
            instance=about.instance,
            dropped=about.dropped,
            skipped=int(n_all) - int(n_rows),
            rank=rank_of_db(path),
            role=db_role(db, tables),
            pids=frozenset(pids),
            source=path,
            n_records=int(n_rows) - len(paired),
            span=None if lo is None else (lo, max(ends)),
            first_ns=None if first_ns is None else int(first_ns),
            phases={name: phase_agg(d, first[name]) for name, d in durations.items()},
            step_phases=step_phases,
        )
        .set_steps(found)
        .set_breakdown(nested, windows)
    )


def _nested(
    rows: list[Any],
    name_of: Callable[[Any], str],
    paired: list[RangeRecord],
    fold: Callable[[str], str],
    options: StepOptions,
) -> tuple[list[tuple[Any, int, int, str]], frozenset[str]]:
    """The ranges (``rows`` of ``globalTid, startNs, -endNs, message``) as ``(thread, start,
    -end, phase)`` for the self times, step ranges left out, and the phases that are steps."""
    steps: set[str] = set()
    phase: dict[Any, str] = {}  # message -> its phase, for the messages that are not steps
    for message in {row[3] for row in rows}:
        raw = name_of(message)
        if options.is_step(raw, fold):
            steps.add(fold(raw))
        else:
            phase[message] = fold(raw)
    nested = [(g or 0, s, e, phase[m]) for g, s, e, m in rows if m in phase]
    for r in paired:
        if options.is_step(r.name, fold):
            steps.add(fold(r.name))
        else:
            nested.append(((r.pid << 32) | r.thread, r.start_ns, -r.end_ns, fold(r.name)))
    return nested, frozenset(steps)


def _steps(
    db: sqlite3.Connection,
    tables: set[str],
    names: dict[int, str],
    paired: list[RangeRecord],
    fold: Callable[[str], str],
    options: StepOptions,
) -> tuple[list[Any], list[tuple[int, int]]]:
    """The steps, and the spans they cover."""
    if options.name is None and "STEP_TIME" in tables:
        spans = _query(
            db,
            "SELECT startNs, endNs FROM STEP_TIME"
            " WHERE startNs IS NOT NULL AND endNs IS NOT NULL ORDER BY id",
        )
        if spans:
            pairs = [(int(s), int(e)) for s, e in spans]
            return steps_from_spans(pairs), merge_spans(pairs)
    ids = [i for i, v in names.items() if options.is_step(v, fold)]
    rows: list[tuple[int, int, object]] = []
    if ids:
        rows = [
            (int(s), int(e), None)
            for s, e in _query(
                db,
                f"SELECT startNs, endNs FROM MSTX_EVENTS WHERE {_VALID}"
                f" AND eventType IN {_RANGE_KINDS} AND message IN ({','.join('?' * len(ids))})",
                *ids,
            )
        ]
    rows += [(r.start_ns, r.end_ns, None) for r in paired if options.is_step(r.name, fold)]
    return steps_from_ranges(rows, options.key), merge_spans((s, e) for s, e, _ in rows)
