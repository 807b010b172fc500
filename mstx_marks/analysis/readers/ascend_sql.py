"""An Ascend profiler database summarised inside SQLite: no record is built in Python.

``summary`` reads a database (ours, torch_npu's or msprof's, the layout
:mod:`mstx_marks.export.ascend_db` describes) with a handful of queries: the names once
(``STRING_IDS``; a ``BLOB`` name is decoded as UTF-8 with replacement), the ranges once as plain
tuples (thread, start, end, message, domain: their durations give exact per-rank percentiles,
their nesting the self times, see :func:`~mstx_marks.analysis.model.aggregate.breakdown`, and the
stages marked twice, see :mod:`mstx_marks.analysis.model.stages`), the first start of each message
in
each domain, the steps (``STEP_TIME`` with their ids, or a step phase's ranges), and only those
marks that may pair (``X_start``/``X_stop``, see :mod:`mstx_marks.analysis.model.mark_pairs`). It
gives the same :class:`~mstx_marks.analysis.model.aggregate.ProcessPart` as reading the file with
:func:`~mstx_marks.export.read_ascend_db` and aggregating the records (the tests hold the two to
it), in a fraction of the time and memory.

torch_npu creates ``MSTX_EVENTS`` only when a range was recorded: a database without it is read
for its steps alone (``no_mstx``, which the summary notes). The rank is the file name's
(``ascend_pytorch_profiler_<rank>.db``), else ``RANK_DEVICE_MAP``'s (msprof's
``msprof_<time>.db`` names a time, not a rank), else ``profiler_info_<rank>.json``'s, else 0.

It opens a file as :func:`~mstx_marks.export.db_open.open_db` does (read only, nothing written
beside it, no query past its time). Only tables are read (a view or a trigger is another
program's, and a recursive view never ends). The names of marks to pair and of steps, which may
be hundreds of thousands, go into a temporary table to join on, never into one query's
variables.

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

import re
import sqlite3
from pathlib import Path
from typing import Any, Callable, Iterable, NamedTuple

from mstx_marks.analysis.model.aggregate import ProcessPart, phase_agg
from mstx_marks.analysis.model.batches import MODEL_STEPS, Batches
from mstx_marks.analysis.model.mark_pairs import START_SUFFIX, STOP_SUFFIX, pair_marks
from mstx_marks.analysis.model.spans import spans_of_ranges
from mstx_marks.analysis.model.stages import (
    UNCOVERED_DOMAIN,
    UNCOVERED_PREFIX,
    is_automatic,
    nested_repeats,
    range_name,
    unmarked_method,
)
from mstx_marks.analysis.model.steps import (
    PROFILER_STEP,
    Step,
    StepOptions,
    fold_name,
    merge_spans,
    profiler_step,
    steps_from_ranges,
    steps_from_spans,
    with_notes,
)
from mstx_marks.analysis.readers.chrome_json import NothingToRead
from mstx_marks.base.records import (
    CLOCK_DOMAIN,
    InstantRecord,
    RangeRecord,
    RankTrace,
    Record,
    RoundTrip,
    TraceFileError,
)
from mstx_marks.export.ascend_db import (
    EVENT_INSTANT,
    EVENT_MARKER,
    EVENT_PUSH_POP,
    EVENT_RANGE,
    args_join,
    args_of,
    as_trace_error,
    db_process,
    db_role,
    rank_of_db,
    read_ascend_db,
    text,
)
from mstx_marks.export.db_open import open_db

__all__ = ["DbAbout", "aggregate_db", "db_about", "db_events", "db_records"]

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


def _id_table(db: sqlite3.Connection, name: str, ids: Iterable[Any]) -> str:
    """A temporary table ``name`` of ``ids`` (as many as there are: a query of them stays
    within SQLite's variables), for ``IN (SELECT id FROM ...)``; its qualified name."""
    db.execute(f"CREATE TEMP TABLE IF NOT EXISTS {name}(id PRIMARY KEY) WITHOUT ROWID")
    db.execute(f"DELETE FROM temp.{name}")
    db.executemany(f"INSERT OR IGNORE INTO temp.{name} VALUES (?)", ((i,) for i in ids))
    return f"temp.{name}"


def db_events(path: Path) -> int:
    """How many MSTX events the database at ``path`` holds (0 when it cannot be read, or has no
    ``MSTX_EVENTS`` table: then :func:`aggregate_db` names it and why); one ``COUNT``,
    whatever its size."""
    try:
        with open_db(Path(path)) as db:
            if "MSTX_EVENTS" not in _tables(db):
                return 0
            ((n,),) = _query(db, "SELECT COUNT(*) FROM MSTX_EVENTS")
            return int(n)
    except (sqlite3.Error, OSError, TypeError, ValueError):
        return 0


class DbAbout(NamedTuple):
    """What a database says of itself besides its events: whether it has ``MSTX_EVENTS``, the
    steps it lists (``STEP_TIME``, keyed by their ids) and its rank (see the module's
    docstring)."""

    has_events: bool
    steps: list[Step]
    rank: int
    role: str = ""


class _Tables(set[str]):
    """The database's tables: never its views (another program's queries; a recursive one
    never ends), which a query of a table's name would run; ``views`` names those."""

    views: set[str]


def _tables(db: sqlite3.Connection) -> _Tables:
    tables = _Tables()
    tables.views = set()
    for name, kind in _query(db, "SELECT name, type FROM sqlite_master"):
        if kind == "table":
            tables.add(name)
        elif kind == "view":
            tables.views.add(name)
    return tables


def db_about(path: Path) -> DbAbout:
    """:class:`DbAbout` of the database at ``path``; :class:`TraceFileError` naming the file
    when it is not a profiler database, :class:`NothingToRead` when it holds neither MSTX
    events nor steps.

    >>> import tempfile, pathlib, sqlite3
    >>> db = pathlib.Path(tempfile.mkdtemp()) / "ascend_pytorch_profiler_1.db"
    >>> with sqlite3.connect(db) as c:
    ...     _ = c.executescript("CREATE TABLE STRING_IDS(id INTEGER PRIMARY KEY, value TEXT);"
    ...         "CREATE TABLE STEP_TIME(id INTEGER, startNs INTEGER, endNs INTEGER);"
    ...         "INSERT INTO STEP_TIME VALUES (50, 100, 250)")
    >>> about = db_about(db)
    >>> about.has_events, about.rank, [(s.key, s.time_ns) for s in about.steps]
    (False, 1, [('50', 150)])
    """
    path = Path(path)
    if not path.is_file():
        raise TraceFileError(path, "no such file")
    try:
        with open_db(path) as db:
            tables = _tables(db)
            has_events = _has_events(path, tables)
            rank, role = _rank(path, db, tables), db_role(db, tables)
            return DbAbout(has_events, _file_steps(db, tables), rank, role)
    except Exception as e:
        error = as_trace_error(path, e)
        if error is e:
            raise
        raise error from e


def _has_events(path: Path, tables: _Tables) -> bool:
    """Whether the database has ``MSTX_EVENTS``; raises when it is no profiler database."""
    views = sorted({"MSTX_EVENTS", "STRING_IDS", "STEP_TIME"} & tables.views)
    if views:
        raise TraceFileError(
            path,
            f"has {' and '.join(views)} as a view, not a table (a query another program"
            " wrote, which may never end); not read",
        )
    if "STRING_IDS" not in tables:
        missing = " or ".join(sorted({"MSTX_EVENTS", "STRING_IDS"} - tables))
        raise TraceFileError(path, f"has no {missing} table")
    if "MSTX_EVENTS" in tables:
        return True
    if "STEP_TIME" not in tables:
        raise NothingToRead(
            path,
            "is a profiler database with no MSTX_EVENTS table (no MSTX range was recorded) and"
            " no steps; nothing to summarise",
        )
    return False


def _file_steps(db: sqlite3.Connection, tables: set[str]) -> list[Step]:
    """The steps ``STEP_TIME`` lists, keyed by their ids (torch_npu's ProfilerStep numbers)."""
    if "STEP_TIME" not in tables:
        return []
    rows = _query(
        db,
        "SELECT id, startNs, endNs FROM STEP_TIME"
        " WHERE startNs IS NOT NULL AND endNs IS NOT NULL ORDER BY id",
    )
    ids = [i for i, _, _ in rows]
    keys = [str(int(i)) for i in ids] if all(isinstance(i, int) for i in ids) else []
    return steps_from_spans([(int(s), int(e)) for _, s, e in rows], keys)


def _rank(path: Path, db: sqlite3.Connection, tables: set[str]) -> int:
    if not _MSPROF.match(path.name) or "RANK_DEVICE_MAP" not in tables:
        return rank_of_db(path)
    ranks = {r for (r,) in _query(db, "SELECT rankId FROM RANK_DEVICE_MAP") if isinstance(r, int)}
    return ranks.pop() if len(ranks) == 1 else rank_of_db(path)


_MSPROF = re.compile(r"msprof_.*\.db\Z")

_EVENTS = """
SELECT e.startNs, e.endNs, e.eventType, m.value, d.value, e.globalTid, {args}
FROM MSTX_EVENTS e
LEFT JOIN STRING_IDS m ON e.message = m.id
LEFT JOIN STRING_IDS d ON e.domainId = d.id
{join}
WHERE e.eventType IN {kinds}
ORDER BY e.startNs
"""


def db_records(path: Path, sink: Callable[[Record], object]) -> RankTrace:
    """The MSTX events of the database at ``path``, each handed to ``sink`` as its row is read
    (:func:`~mstx_marks.export.read_ascend_db`); the trace (with no records) has its steps,
    role, run, what was skipped, and a note on anything of the file left unread.

    >>> import tempfile, pathlib
    >>> from mstx_marks.base.records import RangeRecord, RankTrace
    >>> from mstx_marks.export import write_ascend_db
    >>> db = pathlib.Path(tempfile.mkdtemp()) / "ascend_pytorch_profiler_2.db"
    >>> _ = write_ascend_db(db, RankTrace(2, [RangeRecord("gen", "default", 100, 250, 1, 2)]))
    >>> got = []
    >>> t = db_records(db, got.append)
    >>> t.rank, [(r.name, r.start_ns, r.end_ns) for r in got]
    (2, [('gen', 100, 250)])
    """
    notes: list[str] = []
    return with_notes(read_ascend_db(path, sink=sink, on_note=notes.append), notes)


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
        with open_db(path) as db:
            part = _aggregate(db, path, fold, steps)
            part.notes += db.notes
            return part
    except TraceFileError:
        raise
    except (TypeError, ValueError, OverflowError) as e:
        raise TraceFileError(path, f"has a malformed row ({type(e).__name__}: {e})") from e
    except sqlite3.Error as e:
        raise TraceFileError(path, f"is not a readable profiler database ({e})") from e


def _aggregate(
    db: sqlite3.Connection, path: Path, fold: Callable[[str], str], steps: StepOptions
) -> ProcessPart:
    tables = _tables(db)
    about = db_process(db, tables, RankTrace(0, []))
    if not _has_events(path, tables):
        part = ProcessPart(
            run=about.run, instance=about.instance, rank=_rank(path, db, tables),
            role=db_role(db, tables), pids=frozenset(), source=path, no_mstx=True,
        )  # fmt: skip
        found = _file_steps(db, tables)
        part.spans = spans_of_ranges([], found) if steps.per_step else None
        if part.spans is not None:
            part.spans.identify(about.origin, (), about.instance)
        return part.set_steps(found).set_breakdown([], merge_spans(s[:2] for s in found))
    names = {i: text(v, "<unnamed>") for i, v in _query(db, "SELECT id, value FROM STRING_IDS")}

    def name_of(message: Any) -> str:
        return names.get(message, "<unnamed>") if message is not None else "<unnamed>"

    def raw_of(message: Any, domain: Any) -> str:
        name = range_name(name_of(message), names.get(domain, "default"))
        return PROFILER_STEP if profiler_step(name) is not None else name

    ((n_rows, first_ns),) = _query(
        db, f"SELECT COUNT(*), MIN(startNs) FROM MSTX_EVENTS WHERE {_VALID}"
    )
    pids = {int(p or 0) >> 32 for (p,) in _query(
        db, f"SELECT DISTINCT globalTid FROM MSTX_EVENTS WHERE {_VALID}"
    )}  # fmt: skip
    where_ranges = f"{_VALID} AND eventType IN {_RANGE_KINDS}"
    firsts = _query(
        db, "SELECT message, domainId, MIN(startNs), MAX(endNs) FROM MSTX_EVENTS"
        f" WHERE {where_ranges} GROUP BY message, domainId"
    )  # fmt: skip
    raw = {(m, d): raw_of(m, d) for m, d, _, _ in firsts}

    # Marks that mstx_sum would pair into ranges.
    pairable = [i for i, v in names.items() if v.endswith(START_SUFFIX) or v.endswith(STOP_SUFFIX)]
    paired: list[RangeRecord] = []
    if pairable:
        args, join = args_join(db, tables)
        marks: list[Record] = [
            InstantRecord(name_of(m), text(d, "default"), int(s), int(g or 0) & 0xFFFFFFFF,
                          int(g or 0) >> 32, args_of(a))
            for s, m, g, d, a in _query(
                db,
                f"SELECT e.startNs, e.message, e.globalTid, s.value, {args} FROM MSTX_EVENTS e"
                f" LEFT JOIN STRING_IDS s ON e.domainId = s.id {join}"
                f" WHERE e.eventType IN {_MARKS} AND e.startNs IS NOT NULL"
                f" AND e.message IN (SELECT id FROM {_id_table(db, 'pairable', pairable)})",
            )
        ]  # fmt: skip
        paired = [r for r in pair_marks(marks) if isinstance(r, RangeRecord)]

    steps = steps.resolved([*raw.values(), *(r.name for r in paired)])
    # What each (message, domain) is: a step, an automatic annotation, or one of the stages.
    phase = {key: fold(name) for key, name in raw.items()}
    step_keys = {key for key, name in raw.items() if steps.is_step(name, fold)}
    auto_keys = {key for key in raw if key not in step_keys and is_automatic(phase[key])}
    first: dict[str, int] = {}
    ends: list[int] = []
    for m, d, lo_ns, hi_ns in firsts:
        name = phase[(m, d)]
        first[name] = min(first.get(name, int(lo_ns)), int(lo_ns))
        ends.append(int(hi_ns))

    # The ranges, read once: the stages' nesting (self times, stages marked twice); the
    # durations of all.
    durations: dict[str, list[int]] = {}
    nested: list[tuple[Any, int, int, str]] = []
    rows = db.execute(
        "SELECT globalTid, startNs, -endNs, message, domainId FROM MSTX_EVENTS"
        f" WHERE {where_ranges}"
    )
    for g, start, neg_end, m, d in rows:
        key = (m, d)
        if key in step_keys or key in auto_keys:
            durations.setdefault(phase[key], []).append(-neg_end - start)
        else:
            nested.append((g or 0, start, neg_end, phase[key]))
    step_phases = {phase[key] for key in step_keys}
    for r in paired:
        name = fold(r.name)
        first[name] = min(first.get(name, r.start_ns), r.start_ns)
        ends.append(r.end_ns)
        if steps.is_step(r.name, fold):
            step_phases.add(name)
        if steps.is_step(r.name, fold) or is_automatic(name):
            durations.setdefault(name, []).append(r.end_ns - r.start_ns)
        else:
            nested.append(((r.pid << 32) | r.thread, r.start_ns, -r.end_ns, name))
    repeats = set(nested_repeats(nested))
    merged: dict[str, int] = {}
    merged_ns: dict[str, int] = {}
    for i, (_, start, neg_end, name) in enumerate(nested):
        if i in repeats:
            merged[name] = merged.get(name, 0) + 1
            merged_ns[name] = merged_ns.get(name, 0) - neg_end - start
        else:
            durations.setdefault(name, []).append(-neg_end - start)

    unmarked = _unmarked(db, names)
    found, windows = _steps(db, tables, names, paired, fold, steps)
    lo = min(first.values(), default=None)
    ((n_all,),) = _query(db, f"SELECT COUNT(*) FROM MSTX_EVENTS WHERE eventType IN {_KINDS}")
    part = (
        ProcessPart(
            run=about.run,
            instance=about.instance,
            dropped=about.dropped,
            skipped=int(n_all) - int(n_rows),
            rank=_rank(path, db, tables),
            role=db_role(db, tables),
            pids=frozenset(pids),
            source=path,
            n_records=int(n_rows) - len(paired),
            span=None if lo is None else (lo, max(ends)),
            first_ns=None if first_ns is None else int(first_ns),
            phases={name: phase_agg(sorted(d), first[name]) for name, d in durations.items()},
            step_phases=frozenset(step_phases),
            merged=merged,
            merged_ns=merged_ns,
            unmarked=unmarked,
        )
        .set_steps(found)
        .set_breakdown(nested, windows)
    )
    if steps.per_step:  # (nested now sorted by thread, then start)
        batches = _batches(db, tables, raw, phase, step_keys | auto_keys, paired, fold, steps)
        part.spans = spans_of_ranges(nested, found, batches=batches, fences=steps.fences)
        part.spans.identify(about.origin, pids, about.instance).round_trips = _round_trips(
            db, tables, names
        )
    return part


def _round_trips(
    db: sqlite3.Connection, tables: set[str], names: dict[int, str]
) -> list[RoundTrip]:
    """The clock round trips the process recorded (instants whose args ``MSTX_ARGS`` keeps)."""
    domains = [i for i, v in names.items() if v == CLOCK_DOMAIN]
    args, join = args_join(db, tables)
    if not domains or not join:
        return []
    rows = _query(
        db,
        f"SELECT m.value, {args} FROM MSTX_EVENTS e {join}"
        " LEFT JOIN STRING_IDS m ON e.message = m.id"
        f" WHERE e.eventType IN {_MARKS} AND e.domainId IN"
        f" (SELECT id FROM {_id_table(db, 'clock_domains', domains)}) ORDER BY e.startNs",
    )
    trips = (RoundTrip.of(text(name, ""), CLOCK_DOMAIN, args_of(a)) for name, a in rows)
    return [t for t in trips if t is not None]


def _batches(
    db: sqlite3.Connection,
    tables: set[str],
    raw: dict[tuple[Any, Any], str],
    phase: dict[tuple[Any, Any], str],
    not_stages: set[tuple[Any, Any]],
    paired: list[RangeRecord],
    fold: Callable[[str], str],
    steps: StepOptions,
) -> Batches:
    """The model steps, counted as :func:`~mstx_marks.analysis.model.aggregate.aggregate_trace`
    counts them: with the requests and tokens their args (``MSTX_ARGS``) carry."""
    found = Batches(steps.fences)
    keys = {key for key in raw if key not in not_stages and phase[key] in MODEL_STEPS}
    rows = []
    if keys:  # (read again for their args: the main pass reads every range without them)
        args, join = args_join(db, tables)
        ids = _id_table(db, "model_steps", {m for m, _ in keys})
        rows = _query(
            db,
            f"SELECT e.startNs, e.endNs, e.message, e.domainId, {args} FROM MSTX_EVENTS e {join}"
            f" WHERE {_VALID} AND e.eventType IN {_RANGE_KINDS}"
            f" AND e.message IN (SELECT id FROM {ids}) ORDER BY e.startNs",
        )
    for start, end, m, d, text_args in rows:
        if (m, d) in keys:
            found.add(int(start), int(end), phase[(m, d)], args_of(text_args))
    for r in paired:
        name = fold(r.name)
        if not steps.is_step(r.name, fold) and not is_automatic(name):
            found.add(r.start_ns, r.end_ns, name, r.args)
    return found


def _unmarked(db: sqlite3.Connection, names: dict[int, str]) -> list[str]:
    """The hot-path methods the process ran unmarked: its ``uncovered`` instants (see
    :func:`~mstx_marks.analysis.model.stages.unmarked_method`), sorted."""
    said = [i for i, v in names.items() if v.startswith(UNCOVERED_PREFIX)]
    domains = [i for i, v in names.items() if v == UNCOVERED_DOMAIN]
    if not said or not domains:
        return []
    rows = _query(
        db,
        f"SELECT DISTINCT message FROM MSTX_EVENTS WHERE eventType IN {_MARKS}"
        f" AND message IN (SELECT id FROM {_id_table(db, 'said', said)})"
        f" AND domainId IN (SELECT id FROM {_id_table(db, 'domains', domains)})",
    )
    found = {unmarked_method(names[m], UNCOVERED_DOMAIN) for (m,) in rows}
    return sorted(m for m in found if m is not None)


def _steps(
    db: sqlite3.Connection,
    tables: set[str],
    names: dict[int, str],
    paired: list[RangeRecord],
    fold: Callable[[str], str],
    options: StepOptions,
) -> tuple[list[Any], list[tuple[int, int]]]:
    """The steps, and the spans they cover."""
    if options.name is None:
        listed = _file_steps(db, tables)
        if listed:
            return listed, merge_spans((s.start_ns, s.end_ns) for s in listed)
    # ProfilerStep#N (torch_npu's MSTX range of each step) is the step ProfilerStep, numbered N.
    numbers = {i: profiler_step(v) for i, v in names.items()}
    ids = [
        i
        for i, v in names.items()
        if options.is_step(PROFILER_STEP if numbers[i] is not None else v, fold)
    ]
    rows: list[tuple[int, int, object]] = []
    if ids:
        rows = [
            (int(s), int(e), None if numbers[m] is None else {"step": numbers[m]})
            for s, e, m in _query(
                db,
                f"SELECT startNs, endNs, message FROM MSTX_EVENTS WHERE {_VALID}"
                f" AND eventType IN {_RANGE_KINDS}"
                f" AND message IN (SELECT id FROM {_id_table(db, 'step_ids', ids)})",
            )
        ]
    rows += [(r.start_ns, r.end_ns, None) for r in paired if options.is_step(r.name, fold)]
    return steps_from_ranges(rows, options.key), merge_spans((s, e) for s, e, _ in rows)
