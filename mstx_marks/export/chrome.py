"""Chrome Trace Event JSON, as Perfetto UI and chrome://tracing load it.

Ranges become complete events (``"ph": "X"``), instants become thread-scoped instant events
(``"ph": "i"``). Each rank is one process (``pid`` = rank, named ``rank N``), threads keep their
native ids, and the domain goes in ``cat`` and ``args.domain``. What the user attached to a range
(``mark(name, args={...})``) goes in the event's ``args`` beside ``domain`` (and ``open``); should
one of the user's keys be ``domain``, ``open`` or ``args``, the user's whole mapping goes under
``args.args`` instead, so nothing is overwritten and :func:`read_chrome_trace` gives it back.
Values JSON cannot hold are written as their ``str()``.

``otherData.clock`` holds a wall/monotonic clock pair (``time.time_ns()``,
``time.monotonic_ns()``) taken when the file is written: the records are on the wall clock
already, and a reader meeting timestamps on a clock since boot can shift them by the pair's
difference (see :mod:`mstx_marks.analysis.merge`).

Timestamps are microseconds after ``otherData.origin_ns`` rather than since the epoch: a float
holds an epoch time in microseconds only to a quarter of a microsecond, but small offsets keep
every nanosecond, so :func:`read_chrome_trace` gives back exactly what was recorded.

>>> from mstx_marks.base.records import RangeRecord
>>> r = RangeRecord("gen", "default", 2_000_000_500, 2_000_001_750, 7, 42)
>>> ev = chrome_trace([RankTrace(0, [r])])["traceEvents"][-1]
>>> ev["ph"], ev["ts"], ev["dur"], ev["tid"]
('X', 0.5, 1.25, 7)
"""

from __future__ import annotations

import gzip
import json
import os
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from mstx_marks.base.records import InstantRecord, RangeRecord, RankTrace, Record, TraceFileError
from mstx_marks.export.files import atomic_path

__all__ = [
    "GENERATOR",
    "RESERVED_ARGS",
    "chrome_trace",
    "dumps",
    "event_args",
    "is_ours",
    "load_trace_json",
    "read_chrome_doc",
    "read_chrome_trace",
    "trace_event",
    "trace_us",
    "user_args",
    "write_chrome_trace",
]

#: ``otherData.generator`` of the files this module writes; the reader accepts only those.
GENERATOR = "mstx_marks"
_NS_PER_S = 1_000_000_000
#: The ``args`` keys this module writes itself.
RESERVED_ARGS = frozenset({"domain", "open", "args"})
# The merged job timeline's step track (mstx_marks.analysis.merge.STEP_CATEGORY): not records.
_STEP_CATEGORY = "mstx_marks.step"


def trace_us(ns: int) -> float:
    """Nanoseconds as a Chrome trace's microseconds (to the nanosecond)."""
    return round(ns / 1000, 3)


def _ns(us: Any) -> int:
    return round(float(us) * 1000)


def _default_origin(traces: Sequence[RankTrace]) -> int:
    starts = [r.start_ns for t in traces for r in t.records]
    return (min(starts) // _NS_PER_S) * _NS_PER_S if starts else 0


def event_args(rec: Record) -> dict[str, Any]:
    """The ``args`` of ``rec``'s event: its domain, and what the user attached.

    >>> from mstx_marks.base.records import RangeRecord
    >>> event_args(RangeRecord("gen", "verl", 0, 1, 1, 1, args={"tokens": 8}))
    {'tokens': 8, 'domain': 'verl'}
    """
    user = rec.args
    if not user:
        return {"domain": rec.domain}
    if RESERVED_ARGS.isdisjoint(user):
        return {**user, "domain": rec.domain}
    return {"args": dict(user), "domain": rec.domain}


def user_args(args: Any) -> Mapping[str, Any] | None:
    """What the user attached, from an event's ``args`` (the inverse of :func:`event_args`).

    >>> user_args({"tokens": 8, "domain": "verl"}), user_args({"domain": "verl"})
    ({'tokens': 8}, None)
    """
    if not isinstance(args, dict):
        return None
    nested = args.get("args")
    if isinstance(nested, dict):
        return nested or None
    mine = {k: v for k, v in args.items() if k not in RESERVED_ARGS}
    return mine or None


def trace_event(rec: Record, pid: int, origin_ns: int, tid: int | None = None) -> dict[str, Any]:
    """``rec`` as one Chrome trace event of process ``pid`` (and thread ``tid``, default the
    record's own), its times relative to ``origin_ns``."""
    ev: dict[str, Any] = {
        "name": rec.name,
        "cat": rec.domain,
        "ts": trace_us(rec.start_ns - origin_ns),
        "pid": pid,
        "tid": rec.thread if tid is None else tid,
        "args": event_args(rec),
    }
    if isinstance(rec, InstantRecord):
        ev.update(ph="i", s="t")
    else:
        ev.update(ph="X", dur=trace_us(rec.end_ns - rec.start_ns))
        if rec.open:
            ev["args"]["open"] = True  # still running when recorded: ends at the flush
    return ev


def _process_events(t: RankTrace) -> list[dict[str, Any]]:
    """The metadata events that name and order a rank's process."""
    return [
        {"ph": "M", "name": "process_name", "pid": t.rank, "args": {"name": f"rank {t.rank}"}},
        {"ph": "M", "name": "process_sort_index", "pid": t.rank, "args": {"sort_index": t.rank}},
    ]


def _other_data(traces: list[RankTrace], origin: int) -> dict[str, Any]:
    ranks = {
        str(t.rank): {
            "pids": sorted({r.pid for r in t.records}),
            "steps": [[s, e] for s, e in t.steps],
            "role": t.role,
        }
        for t in traces
    }
    clock = {"wall_ns": time.time_ns(), "mono_ns": time.monotonic_ns()}
    return {"generator": GENERATOR, "origin_ns": origin, "ranks": ranks, "clock": clock}


def chrome_trace(traces: Iterable[RankTrace], origin_ns: int | None = None) -> dict[str, Any]:
    """Build the trace document for ``traces`` (one per rank), ready for :func:`json.dumps`.

    ``origin_ns`` defaults to the earliest event rounded down to a whole second.
    """
    traces = list(traces)
    origin = _default_origin(traces) if origin_ns is None else origin_ns
    events: list[dict[str, Any]] = []
    for t in traces:
        events += _process_events(t)
        events.extend(trace_event(rec, t.rank, origin) for rec in t.records)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": _other_data(traces, origin),
    }


def write_chrome_trace(
    path: str | Path, traces: Iterable[RankTrace], origin_ns: int | None = None
) -> Path:
    """Write :func:`chrome_trace` of ``traces`` to ``path`` atomically and return the path.

    Name files ``*.trace.json`` so that ``python -m mstx_marks summary DIR`` finds them.
    """
    # Written as it is made, with each name's JSON made once: the same document as
    # dumps(chrome_trace(...)), at a fraction of the time and with no copy of it in memory.
    traces = list(traces)
    origin = _default_origin(traces) if origin_ns is None else origin_ns
    quoted: dict[tuple[str, str], tuple[str, str]] = {}
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write('{"traceEvents":[')
        sep = ""
        for t in traces:
            f.write(sep + ",".join(dumps(ev) for ev in _process_events(t)))
            sep = ","
            records = t.records
            for lo in range(0, len(records), 4096):
                batch = records[lo : lo + 4096]
                f.write("," + ",".join(_event_json(r, t.rank, origin, quoted) for r in batch))
        tail = {"displayTimeUnit": "ms", "otherData": _other_data(traces, origin)}
        f.write("]," + dumps(tail)[1:])
        f.flush()
        os.fsync(f.fileno())
    return Path(path)


def _event_json(
    rec: Record, rank: int, origin: int, quoted: dict[tuple[str, str], tuple[str, str]]
) -> str:
    """``dumps(trace_event(rec, rank, origin))``, made directly for the usual event (no user args,
    not open): the one the exporter writes a million times."""
    if rec.args or getattr(rec, "open", False):
        return dumps(trace_event(rec, rank, origin))
    pair = quoted.get((rec.name, rec.domain))
    if pair is None:
        pair = quoted[(rec.name, rec.domain)] = (json.dumps(rec.name), json.dumps(rec.domain))
    name, cat = pair
    head = (
        f'{{"name":{name},"cat":{cat},"ts":{trace_us(rec.start_ns - origin)!r},"pid":{rank},'
        f'"tid":{rec.thread},"args":{{"domain":{cat}}},'
    )
    if type(rec) is InstantRecord:
        return head + '"ph":"i","s":"t"}'
    return head + f'"ph":"X","dur":{trace_us(rec.end_ns - rec.start_ns)!r}}}'  # type: ignore[union-attr]


def dumps(doc: Any) -> str:
    """Compact JSON of a trace document; values JSON cannot hold become their ``str()``."""
    return json.dumps(doc, separators=(",", ":"), default=str)


def load_trace_json(path: str | Path) -> Any:
    """The JSON document in ``path`` (gzip-compressed when it ends in ``.gz``).

    Raises :class:`TraceFileError`, naming the file, for a file that cannot be read, is not
    JSON, or nests too deeply for the parser.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
        if path.name.endswith(".gz"):
            raw = gzip.decompress(raw)
        return json.loads(raw)
    except OSError as e:
        raise TraceFileError(path, f"cannot be read ({e.strerror or e})") from e
    except (UnicodeDecodeError, json.JSONDecodeError, EOFError) as e:
        raise TraceFileError(path, f"is not valid JSON (truncated or corrupt?): {e}") from e
    except RecursionError:
        raise TraceFileError(path, "is JSON nested too deeply to be a trace") from None


def is_ours(doc: Any) -> bool:
    """Whether a loaded JSON document is a Chrome trace this module wrote."""
    other = doc.get("otherData") if isinstance(doc, dict) else None
    return isinstance(other, dict) and other.get("generator") == GENERATOR


def _load(path: Path) -> dict[str, Any]:
    return _check(path, load_trace_json(path))


def _check(path: Path, doc: Any) -> dict[str, Any]:
    other = doc.get("otherData") if isinstance(doc, dict) else None
    if not isinstance(other, dict) or other.get("generator") != GENERATOR:
        raise TraceFileError(path, "is not a Chrome trace written by mstx_marks")
    if not isinstance(doc.get("traceEvents"), list):
        raise TraceFileError(path, "has no traceEvents list")
    checked: dict[str, Any] = doc
    return checked


def read_chrome_trace(path: str | Path) -> list[RankTrace]:
    """Read a file written by :func:`write_chrome_trace`: one :class:`RankTrace` per rank.

    Raises :class:`TraceFileError`, naming the file, for anything else (a truncated file, JSON
    that is not one of ours, events missing their fields).
    """
    path = Path(path)
    return read_chrome_doc(path, _load(path))


def read_chrome_doc(path: Path, doc: Any) -> list[RankTrace]:
    """:func:`read_chrome_trace` of a document already loaded from ``path``.

    A merged job timeline (:mod:`mstx_marks.analysis.merge`) lists its processes in
    ``otherData.processes`` (Chrome pid to rank, pid, role, steps) and the threads it split into
    tracks in ``otherData.threads``; it reads back as one trace per process.
    """
    doc = _check(path, doc)
    other = doc["otherData"]
    by_process: dict[int, list[Record]] = {}
    try:
        origin = int(other.get("origin_ns", 0))
        processes = other.get("processes")
        if not isinstance(processes, dict):  # one Chrome process per rank
            processes = {
                k: {"rank": int(k), "pid": (v.get("pids") or [0])[0], **v}
                for k, v in other.get("ranks", {}).items()
            }
        threads = other.get("threads", {})
        for ev in doc["traceEvents"]:
            ph = ev.get("ph")
            if ph not in ("X", "i") or ev.get("cat") == _STEP_CATEGORY:
                continue
            cpid = int(ev["pid"])
            pid = int(processes.get(str(cpid), {}).get("pid", 0))
            start = origin + _ns(ev["ts"])
            args = ev.get("args", {})
            domain = str(args.get("domain", ev.get("cat", "default")))
            name = str(ev["name"])
            tid = int(threads.get(f"{cpid}:{ev['tid']}", ev["tid"]))
            attached = user_args(args)
            rec: Record
            if ph == "X":
                end, is_open = start + _ns(ev["dur"]), bool(args.get("open", False))
                rec = RangeRecord(name, domain, start, end, tid, pid, is_open, attached)
            else:
                rec = InstantRecord(name, domain, start, tid, pid, attached)
            by_process.setdefault(cpid, []).append(rec)
        info = {
            int(k): (
                int(v.get("rank", k)),
                [(int(s), int(e)) for s, e in v.get("steps", [])],
                str(v.get("role", "")),
            )
            for k, v in processes.items()
        }
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
        raise TraceFileError(path, f"has a malformed event ({type(e).__name__}: {e})") from e
    out = []
    for cpid, recs in sorted(by_process.items()):
        rank, steps, role = info.get(cpid, (cpid, [], ""))
        out.append(RankTrace(rank, sorted(recs, key=lambda r: r.start_ns), steps, path, role))
    return sorted(out, key=lambda t: t.rank)
