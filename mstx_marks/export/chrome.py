"""Chrome Trace Event JSON, as Perfetto UI and chrome://tracing load it.

Ranges become complete events (``"ph": "X"``), instants become thread-scoped instant events
(``"ph": "i"``). Each rank is one process (``pid`` = rank, named ``rank N``), threads keep their
native ids, and the domain goes in ``cat`` and ``args.domain``.

Timestamps are microseconds after ``otherData.origin_ns`` rather than since the epoch: a float
holds an epoch time in microseconds only to a quarter of a microsecond, but small offsets keep
every nanosecond, so :func:`read_chrome_trace` gives back exactly what was recorded.

>>> from mstx_marks.records import RangeRecord
>>> r = RangeRecord("gen", "default", 2_000_000_500, 2_000_001_750, 7, 42)
>>> ev = chrome_trace([RankTrace(0, [r])])["traceEvents"][-1]
>>> ev["ph"], ev["ts"], ev["dur"], ev["tid"]
('X', 0.5, 1.25, 7)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Sequence

from ..records import InstantRecord, RangeRecord, RankTrace, Record, TraceFileError
from .files import atomic_write_bytes

__all__ = ["GENERATOR", "chrome_trace", "read_chrome_trace", "write_chrome_trace"]

#: ``otherData.generator`` of the files this module writes; the reader accepts only those.
GENERATOR = "mstx_marks"
_NS_PER_S = 1_000_000_000


def _us(ns: int) -> float:
    return round(ns / 1000, 3)


def _ns(us: Any) -> int:
    return round(float(us) * 1000)


def _default_origin(traces: Sequence[RankTrace]) -> int:
    starts = [r.start_ns for t in traces for r in t.records]
    return (min(starts) // _NS_PER_S) * _NS_PER_S if starts else 0


def _event(rec: Record, rank: int, origin_ns: int) -> dict[str, Any]:
    ev: dict[str, Any] = {
        "name": rec.name,
        "cat": rec.domain,
        "ts": _us(rec.start_ns - origin_ns),
        "pid": rank,
        "tid": rec.thread,
        "args": {"domain": rec.domain},
    }
    if isinstance(rec, InstantRecord):
        ev.update(ph="i", s="t")
    else:
        ev.update(ph="X", dur=_us(rec.end_ns - rec.start_ns))
        if rec.open:
            ev["args"]["open"] = True  # still running when recorded: ends at the flush
    return ev


def chrome_trace(traces: Iterable[RankTrace], origin_ns: int | None = None) -> dict[str, Any]:
    """Build the trace document for ``traces`` (one per rank), ready for :func:`json.dumps`.

    ``origin_ns`` defaults to the earliest event rounded down to a whole second.
    """
    traces = list(traces)
    origin = _default_origin(traces) if origin_ns is None else origin_ns
    events: list[dict[str, Any]] = []
    ranks: dict[str, Any] = {}
    for t in traces:
        pids = sorted({r.pid for r in t.records})
        ranks[str(t.rank)] = {"pids": pids, "steps": [[s, e] for s, e in t.steps], "role": t.role}
        events.append(
            {"ph": "M", "name": "process_name", "pid": t.rank, "args": {"name": f"rank {t.rank}"}}
        )
        events.append(
            {"ph": "M", "name": "process_sort_index", "pid": t.rank, "args": {"sort_index": t.rank}}
        )
        events.extend(_event(rec, t.rank, origin) for rec in t.records)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"generator": GENERATOR, "origin_ns": origin, "ranks": ranks},
    }


def write_chrome_trace(
    path: str | Path, traces: Iterable[RankTrace], origin_ns: int | None = None
) -> Path:
    """Write :func:`chrome_trace` of ``traces`` to ``path`` atomically and return the path.

    Name files ``*.trace.json`` so that ``python -m mstx_marks summary DIR`` finds them.
    """
    doc = chrome_trace(traces, origin_ns)
    return atomic_write_bytes(path, json.dumps(doc, separators=(",", ":")).encode())


def _load(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_bytes())
    except OSError as e:
        raise TraceFileError(path, f"cannot be read ({e.strerror})") from e
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TraceFileError(path, f"is not valid JSON (truncated or corrupt?): {e}") from e
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
    doc = _load(path)
    other = doc["otherData"]
    by_rank: dict[int, list[Record]] = {}
    try:
        origin = int(other.get("origin_ns", 0))
        meta = other.get("ranks", {})
        for ev in doc["traceEvents"]:
            ph = ev.get("ph")
            if ph not in ("X", "i"):
                continue
            rank = int(ev["pid"])
            pids = meta.get(str(rank), {}).get("pids") or [0]
            start = origin + _ns(ev["ts"])
            args = ev.get("args", {})
            domain = str(args.get("domain", ev.get("cat", "default")))
            name, tid = str(ev["name"]), int(ev["tid"])
            rec: Record
            if ph == "X":
                end, is_open = start + _ns(ev["dur"]), bool(args.get("open", False))
                rec = RangeRecord(name, domain, start, end, tid, pids[0], is_open)
            else:
                rec = InstantRecord(name, domain, start, tid, pids[0])
            by_rank.setdefault(rank, []).append(rec)
        steps = {int(k): [(int(s), int(e)) for s, e in v.get("steps", [])] for k, v in meta.items()}
        roles = {int(k): str(v.get("role", "")) for k, v in meta.items()}
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
        raise TraceFileError(path, f"has a malformed event ({type(e).__name__}: {e})") from e
    return [
        RankTrace(
            rank,
            sorted(recs, key=lambda r: r.start_ns),
            steps.get(rank, []),
            path,
            roles.get(rank, ""),
        )
        for rank, recs in sorted(by_rank.items())
    ]
