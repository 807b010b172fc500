"""Chrome Trace Event JSON, as Perfetto UI and chrome://tracing load it.

Ranges become complete events (``"ph": "X"``), instants become thread-scoped instant events
(``"ph": "i"``). Each rank is one process (``pid`` = rank, named ``rank N``), threads keep their
native ids and are named (``thread_name``: the Python thread's name when known, see
:attr:`RankTrace.thread_names <mstx_marks.base.records.RankTrace.thread_names>`, else
``thread T``), and the domain goes in ``cat`` and ``args.domain``.

Chrome and Perfetto nest the complete events of one thread by time, so ranges that overlap
without nesting (asyncio tasks gathered on one thread) would be drawn inside each other:
:func:`thread_tracks` splits such a thread into tracks in each of which ranges nest properly,
the extra ones named ``<thread> (overlap K)``, given thread ids from :data:`OVERLAP_TID` up and
listed in ``otherData.threads`` (``"pid:tid"`` to the real thread), so that
:func:`read_chrome_trace` reads them back onto their thread. The per-rank traces and the merged
job timeline (:mod:`mstx_marks.analysis.merge`) both use it. What the user attached to a range
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

import json
import os
import threading
import time
import zlib
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence

from mstx_marks.base.records import InstantRecord, RangeRecord, RankTrace, Record, TraceFileError
from mstx_marks.export.files import atomic_path, open_regular

__all__ = [
    "GENERATOR",
    "MAX_JSON_BYTES",
    "OVERLAP_TID",
    "RESERVED_ARGS",
    "JsonTooLarge",
    "RecordSink",
    "ThreadTrack",
    "chrome_trace",
    "dumps",
    "event_args",
    "is_ours",
    "live_thread_names",
    "load_trace_json",
    "nesting_tracks",
    "read_chrome_doc",
    "read_chrome_trace",
    "thread_label",
    "thread_tracks",
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


#: Tracks split off a thread (ranges overlapping without nesting) get thread ids from here up,
#: far above any real one.
OVERLAP_TID = 1 << 40


def nesting_tracks(ranges: Sequence[RangeRecord]) -> list[list[RangeRecord]]:
    """``ranges`` split into tracks in each of which every two ranges nest or do not overlap;
    each range goes to the first track it fits.

    >>> r = lambda s, e: RangeRecord("x", "d", s, e, 1, 1)
    >>> [[x.start_ns for x in t] for t in nesting_tracks([r(0, 10), r(2, 5), r(4, 12)])]
    [[0, 2], [4]]
    """
    tracks: list[list[RangeRecord]] = []
    stacks: list[list[int]] = []  # per track, the ends of the ranges still open at this start
    for r in sorted(ranges, key=lambda r: (r.start_ns, -r.end_ns)):
        for track, stack in zip(tracks, stacks):
            while stack and stack[-1] <= r.start_ns:
                stack.pop()
            if not stack or r.end_ns <= stack[-1]:
                track.append(r)
                stack.append(r.end_ns)
                break
        else:
            tracks.append([r])
            stacks.append([r.end_ns])
    return tracks


class ThreadTrack(NamedTuple):
    """One Chrome thread track: its ``tid`` in the file, the ``thread`` it belongs to, its
    ``label`` (``thread_name``) and its records (the first track of a thread has its instants)."""

    tid: int
    thread: int
    label: str
    records: list[Record]


def thread_label(thread: int, names: Mapping[int, str] | None = None) -> str:
    """What a thread is called: its Python name when known, else ``thread T``.

    >>> thread_label(7, {7: "MainThread"}), thread_label(8, {7: "MainThread"})
    ('MainThread', 'thread 8')
    """
    name = (names or {}).get(thread)
    return name if name else f"thread {thread}"


def thread_tracks(
    records: Iterable[Record], names: Mapping[int, str] | None = None, next_tid: int = OVERLAP_TID
) -> list[ThreadTrack]:
    """``records`` (of one Chrome process) as thread tracks, by thread id: each thread's ranges
    split by :func:`nesting_tracks`, the tracks past the first given ids from ``next_tid`` up.

    >>> r = lambda s, e: RangeRecord("gen", "d", s, e, 5, 1)
    >>> [(t.tid, t.label, len(t.records)) for t in thread_tracks([r(0, 10), r(5, 15)])]
    [(5, 'thread 5', 1), (1099511627776, 'thread 5 (overlap 1)', 1)]
    """
    by_tid: dict[int, list[Record]] = {}
    for r in records:
        by_tid.setdefault(r.thread, []).append(r)
    out = []
    for tid in sorted(by_tid):
        recs = by_tid[tid]
        ranges = [r for r in recs if isinstance(r, RangeRecord)]
        tracks = nesting_tracks(ranges) if _overlaps(ranges) else [ranges]
        label = thread_label(tid, names)
        for k, track in enumerate(tracks):
            if k == 0:
                marks = [r for r in recs if not isinstance(r, RangeRecord)]
                out.append(ThreadTrack(tid, tid, label, [*track, *marks]))
            else:
                out.append(ThreadTrack(next_tid, tid, f"{label} (overlap {k})", list(track)))
                next_tid += 1
    return out


def _overlaps(ranges: Sequence[RangeRecord]) -> bool:
    """Whether two of ``ranges`` overlap without nesting (one pass, no sort when in order)."""
    ordered = ranges
    if any(a.start_ns > b.start_ns for a, b in zip(ranges, ranges[1:])):
        ordered = sorted(ranges, key=lambda r: (r.start_ns, -r.end_ns))
    ends: list[int] = []
    for r in ordered:
        while ends and ends[-1] <= r.start_ns:
            ends.pop()
        if ends and r.end_ns > ends[-1]:
            return True
        ends.append(r.end_ns)
    return False


def live_thread_names(pid: int) -> dict[int, str]:
    """The names of this process's live threads by native id, when ``pid`` is this process
    (a trace written by the process that recorded it); else none.

    >>> live_thread_names(os.getpid())[threading.get_native_id()]
    'MainThread'
    """
    if pid != os.getpid():
        return {}
    return {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}


def _names_of(t: RankTrace) -> dict[int, str]:
    """The thread names of ``t``: those it carries, and its own live threads' when it is this
    process's trace."""
    names = dict(t.thread_names)
    me = os.getpid()
    if any(r.pid == me for r in t.records):
        for tid, name in live_thread_names(me).items():
            names.setdefault(tid, name)
    return names


def _thread_events(rank: int, tracks: Sequence[ThreadTrack]) -> list[dict[str, Any]]:
    """The metadata events that name and order a rank's thread tracks."""
    events: list[dict[str, Any]] = []
    for order, t in enumerate(tracks, start=1):
        events.append(
            {"ph": "M", "name": "thread_name", "pid": rank, "tid": t.tid, "args": {"name": t.label}}
        )
        events.append(
            {"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": t.tid,
             "args": {"sort_index": order}}
        )  # fmt: skip
    return events


def _split(tracks: Sequence[ThreadTrack], rank: int) -> dict[str, int]:
    """``otherData.threads`` of split tracks: ``"pid:tid"`` to the real thread."""
    return {f"{rank}:{t.tid}": t.thread for t in tracks if t.tid != t.thread}


def _process_events(t: RankTrace) -> list[dict[str, Any]]:
    """The metadata events that name and order a rank's process."""
    return [
        {"ph": "M", "name": "process_name", "pid": t.rank, "args": {"name": f"rank {t.rank}"}},
        {"ph": "M", "name": "process_sort_index", "pid": t.rank, "args": {"sort_index": t.rank}},
    ]


def _process_info(t: RankTrace) -> dict[str, Any]:
    """What a trace says of its process beyond rank and role, when it says anything: its run,
    its instance (two processes with one host and pid), the events its recorder dropped."""
    info: dict[str, Any] = {}
    if t.run:
        info["run"] = t.run
    if t.instance:
        info["instance"] = t.instance
    if t.dropped:
        info["dropped"] = t.dropped
    return info


def _other_data(
    traces: list[RankTrace], origin: int, threads: dict[str, int] | None = None
) -> dict[str, Any]:
    ranks = {str(t.rank): {**_process_info(t), "pids": sorted({r.pid for r in t.records}),
                           "steps": [[s, e] for s, e in t.steps], "role": t.role}
             for t in traces}  # fmt: skip
    clock = {"wall_ns": time.time_ns(), "mono_ns": time.monotonic_ns()}
    other = {"generator": GENERATOR, "origin_ns": origin, "ranks": ranks, "clock": clock}
    if threads:
        other["threads"] = threads
    return other


def chrome_trace(traces: Iterable[RankTrace], origin_ns: int | None = None) -> dict[str, Any]:
    """Build the trace document for ``traces`` (one per rank), ready for :func:`json.dumps`.

    ``origin_ns`` defaults to the earliest event rounded down to a whole second.
    """
    traces = list(traces)
    origin = _default_origin(traces) if origin_ns is None else origin_ns
    events: list[dict[str, Any]] = []
    threads: dict[str, int] = {}
    for t in traces:
        tracks = thread_tracks(t.records, _names_of(t))
        threads.update(_split(tracks, t.rank))
        events += _process_events(t) + _thread_events(t.rank, tracks)
        for track in tracks:
            events.extend(trace_event(rec, t.rank, origin, track.tid) for rec in track.records)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": _other_data(traces, origin, threads),
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
    threads: dict[str, int] = {}
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write('{"traceEvents":[')
        sep = ""
        for t in traces:
            tracks = thread_tracks(t.records, _names_of(t))
            threads.update(_split(tracks, t.rank))
            meta = _process_events(t) + _thread_events(t.rank, tracks)
            f.write(sep + ",".join(dumps(ev) for ev in meta))
            sep = ","
            for track in tracks:
                records = track.records
                for lo in range(0, len(records), 4096):
                    batch = records[lo : lo + 4096]
                    f.write(
                        ","
                        + ",".join(_event_json(r, t.rank, origin, quoted, track.tid) for r in batch)
                    )
        tail = {"displayTimeUnit": "ms", "otherData": _other_data(traces, origin, threads)}
        f.write("]," + dumps(tail)[1:])
        f.flush()
        os.fsync(f.fileno())
    return Path(path)


def _event_json(
    rec: Record,
    rank: int,
    origin: int,
    quoted: dict[tuple[str, str], tuple[str, str]],
    tid: int | None = None,
) -> str:
    """``dumps(trace_event(rec, rank, origin))``, made directly for the usual event (no user args,
    not open): the one the exporter writes a million times."""
    if rec.args or getattr(rec, "open", False):
        return dumps(trace_event(rec, rank, origin, tid))
    pair = quoted.get((rec.name, rec.domain))
    if pair is None:
        pair = quoted[(rec.name, rec.domain)] = (json.dumps(rec.name), json.dumps(rec.domain))
    name, cat = pair
    head = (
        f'{{"name":{name},"cat":{cat},"ts":{trace_us(rec.start_ns - origin)!r},"pid":{rank},'
        f'"tid":{rec.thread if tid is None else tid},"args":{{"domain":{cat}}},'
    )
    if type(rec) is InstantRecord:
        return head + '"ph":"i","s":"t"}'
    return head + f'"ph":"X","dur":{trace_us(rec.end_ns - rec.start_ns)!r}}}'  # type: ignore[union-attr]


def dumps(doc: Any) -> str:
    """Compact JSON of a trace document; values JSON cannot hold become their ``str()``."""
    return json.dumps(doc, separators=(",", ":"), default=str)


def load_trace_json(path: str | Path, max_bytes: int | None = None) -> Any:
    """The JSON document in ``path`` (gzip-compressed when it ends in ``.gz``), parsed whole.

    Raises :class:`TraceFileError`, naming the file, for a file that cannot be read, is not
    JSON, or nests too deeply for the parser; :class:`JsonTooLarge` past ``max_bytes`` of text
    (default :data:`MAX_JSON_BYTES`; ``summary`` reads a file past its own, smaller, bound a
    piece at a time: :mod:`mstx_marks.analysis.readers.chrome_json`).
    """
    path = Path(path)
    try:
        raw = _read_bounded(path, MAX_JSON_BYTES if max_bytes is None else max_bytes)
        return json.loads(raw)
    except TraceFileError:
        raise
    except (OSError, zlib.error) as e:
        why = getattr(e, "strerror", None) or e
        raise TraceFileError(path, f"cannot be read ({why})") from e
    except (UnicodeDecodeError, json.JSONDecodeError, EOFError) as e:
        raise TraceFileError(path, f"is not valid JSON (truncated or corrupt?): {e}") from e
    except MemoryError:
        raise TraceFileError(path, "is too large to read in the memory here") from None
    except RecursionError:
        raise TraceFileError(path, "is JSON nested too deeply to be a trace") from None


#: The most JSON text (after gunzip) :func:`read_chrome_trace` and :func:`load_trace_json` parse
#: whole. A parse takes many times its text in memory: measured (Python 3.11, peak RSS), 8 times
#: for our own traces (907 MB for the 115 MB of a million events; :func:`read_chrome_trace` of
#: it, records and all, 915 MB), and up to 30 times for the worst text (``[{"a":{}}, ...]``:
#: 1.3 GB for 42 MB). At 96 MB one of our traces (850 000 events) is read in 830 MB (192 MB,
#: the bound before, took about 1.6 GB). ``summary`` and the timelines never parse
#: more than :data:`~mstx_marks.analysis.readers.chrome_json.WHOLE_JSON_BYTES` whole: they
#: read a larger file an event at a time, whatever its size, our exporter's largest included.
MAX_JSON_BYTES = 96 << 20


class JsonTooLarge(TraceFileError):
    """More JSON text than a reader parses whole (:func:`load_trace_json`)."""


def _read_bounded(path: Path, limit: int) -> bytes:
    """The file's bytes (gunzipped for ``.gz``), refused past ``limit`` (a gzip that inflates
    to gigabytes is stopped there) and when it is not a regular file (a FIFO)."""
    with open_regular(path, gunzip=True) as source:
        raw = source.read(limit + 1)
    if len(raw) > limit:
        raise JsonTooLarge(
            path, f"holds more than {limit >> 20} MB of JSON, more than is read here"
        )
    return bytes(raw)


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
    if not _is_events(doc.get("traceEvents")):
        raise TraceFileError(path, "has no traceEvents list")
    checked: dict[str, Any] = doc
    return checked


def _is_events(events: Any) -> bool:
    """Whether ``events`` is a list, or the events of a file read a piece at a time (an iterable
    that JSON never makes: not a string, bytes or object)."""
    if isinstance(events, list):
        return True
    return isinstance(events, Iterable) and not isinstance(events, (str, bytes, dict))


def read_chrome_trace(path: str | Path) -> list[RankTrace]:
    """Read a file written by :func:`write_chrome_trace`: one :class:`RankTrace` per rank.

    Raises :class:`TraceFileError`, naming the file, for anything else (a truncated file, JSON
    that is not one of ours, events missing their fields).
    """
    path = Path(path)
    return read_chrome_doc(path, _load(path))


_INT64 = 1 << 63


def _checked_int(value: Any) -> int:
    """An int64 from a JSON value: NaN, infinities, strings that are not ints and values past
    int64 raise ValueError."""
    if isinstance(value, float) and not value.is_integer():
        raise ValueError(f"not an int: {value!r}")
    number = int(value)
    if not -_INT64 <= number < _INT64:
        raise ValueError("past int64")
    return number


#: Names shared by the records of one file read (JSON makes a string per event: 100 bytes a
#: record), up to this many different ones (so reading a file of unique names, its records
#: not held, does not hold them all either).
_SHARED_NAMES = 4096


def _shared(name: str, names: dict[str, str]) -> str:
    """``name``, as the first record read with it has it (while ``names`` has room)."""
    known = names.get(name)
    if known is not None:
        return known
    if len(names) < _SHARED_NAMES:
        names[name] = name
    return name


def _record(
    ev: Any,
    origin: int,
    processes: dict[str, Any],
    threads: dict[str, Any],
    names: dict[str, str] | None = None,
) -> tuple[Record | None, int]:
    """One event of our trace as a record (None: not a record), and its Chrome pid; its name
    and domain shared through ``names`` (see :func:`_shared`)."""
    ph = ev.get("ph")
    if ph not in ("X", "i") or ev.get("cat") == _STEP_CATEGORY:
        return None, 0
    cpid = _checked_int(ev["pid"])
    pid = _checked_int(processes.get(str(cpid), {}).get("pid", 0))
    start = _checked_int(origin + _ns(ev["ts"]))
    args = ev.get("args", {})
    domain = str(args.get("domain", ev.get("cat", "default")))
    name = str(ev["name"])
    if names is not None:
        name, domain = _shared(name, names), _shared(domain, names)
    tid = _checked_int(threads.get(f"{cpid}:{ev['tid']}", ev["tid"]))
    attached = user_args(args)
    if ph == "X":
        end, is_open = _checked_int(start + _ns(ev["dur"])), bool(args.get("open", False))
        if end < start:
            raise ValueError("ends before it starts")
        return RangeRecord(name, domain, start, end, tid, pid, is_open, attached), cpid
    return InstantRecord(name, domain, start, tid, pid, attached), cpid


def _thread_name(ev: Any, threads: Any, names: dict[int, dict[int, str]]) -> None:
    """Keep the name a ``thread_name`` event gives a thread (not a split track's, nor the
    ``thread T`` written for a thread with no name)."""
    try:
        cpid, tid, name = _checked_int(ev["pid"]), _checked_int(ev["tid"]), ev["args"]["name"]
        if isinstance(name, str) and name != f"thread {tid}" and f"{cpid}:{tid}" not in threads:
            names.setdefault(cpid, {})[tid] = name[:256]
    except (KeyError, TypeError, ValueError, OverflowError):
        return


#: Where a reader hands each record as it reads it, with the trace of its process (whose
#: ``records`` it leaves to the sink), instead of keeping it.
RecordSink = Callable[[RankTrace, Record], None]


def _keep(trace: RankTrace, rec: Record) -> None:
    trace.records.append(rec)


def _processes_of(
    processes: dict[str, Any],
) -> tuple[dict[int, tuple[int, list[tuple[int, int]], str, Any]], int]:
    """What ``otherData`` says of each Chrome process (rank, steps, role, the rest), and how
    many of its entries are malformed."""
    info = {}
    bad = 0
    for k, v in processes.items():
        try:
            cpid = int(k)
            info[cpid] = (
                _checked_int(v.get("rank", k)),
                [(_checked_int(s), _checked_int(e)) for s, e in v.get("steps", [])],
                str(v.get("role", "")),
                v,
            )
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
            bad += 1
    return info, bad


def _process_trace(path: Path, cpid: int, info: dict[int, Any]) -> RankTrace:
    """The (empty) trace of Chrome process ``cpid``."""
    rank, steps, role, more = info.get(cpid, (cpid, [], "", {}))
    trace = RankTrace(rank, [], steps, path, role)
    trace.run, trace.instance = str(more.get("run") or ""), str(more.get("instance") or "")
    dropped = more.get("dropped")
    trace.dropped = dropped if type(dropped) is int and dropped > 0 else 0
    return trace


def read_chrome_doc(path: Path, doc: Any, sink: RecordSink | None = None) -> list[RankTrace]:
    """:func:`read_chrome_trace` of a document already loaded from ``path``.

    A merged job timeline (:mod:`mstx_marks.analysis.merge`) lists its processes in
    ``otherData.processes`` (Chrome pid to rank, pid, role, steps) and the threads it split into
    tracks in ``otherData.threads``; it reads back as one trace per process.

    ``doc["traceEvents"]`` may be any iterable of events (a large file's, parsed one at a
    time). With ``sink``, each record goes to ``sink(trace, record)`` as it is read, and the
    traces come back with the records the sink put in them (sorted by start).

    >>> doc = chrome_trace([RankTrace(3, [RangeRecord("gen", "d", 10**9, 10**9 + 5, 1, 9)])])
    >>> seen = []
    >>> sink = lambda t, r: seen.append((t.rank, r.name))
    >>> (t,) = read_chrome_doc(Path("r3.trace.json"), doc, sink)
    >>> seen, t.rank, t.records
    ([(3, 'gen')], 3, [])
    """
    doc = _check(path, doc)
    other = doc["otherData"]
    add = _keep if sink is None else sink
    try:
        origin = int(other.get("origin_ns", 0))
        processes = other.get("processes")
        if not isinstance(processes, dict):  # one Chrome process per rank
            processes = {
                k: {"rank": k, "pid": (v.get("pids") or [0])[0], **v}
                for k, v in other.get("ranks", {}).items()
                if isinstance(v, dict)
            }
        threads = other.get("threads", {})
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
        raise TraceFileError(path, f"has malformed otherData ({type(e).__name__}: {e})") from e
    info, skipped = _processes_of(processes)
    by_process: dict[int, RankTrace] = {}
    names: dict[int, dict[int, str]] = {}  # Chrome pid -> thread -> its Python name
    shared: dict[str, str] = {}
    first_error: Exception | None = None
    for ev in doc["traceEvents"]:
        try:
            rec, cpid = _record(ev, origin, processes, threads, shared)
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
            skipped += 1  # one bad event (NaN, a string pid, past int64): the rest is read
            first_error = first_error or e
            continue
        if rec is not None:
            trace = by_process.get(cpid)
            if trace is None:
                trace = by_process[cpid] = _process_trace(path, cpid, info)
            add(trace, rec)
        elif ev.get("ph") == "M" and ev.get("name") == "thread_name":
            _thread_name(ev, threads, names)
    if first_error is not None and not by_process:  # nothing readable at all: the file is bad
        why = f"{type(first_error).__name__}: {first_error}"
        raise TraceFileError(path, f"has a malformed event ({why})")
    for cpid, trace in by_process.items():
        trace.records.sort(key=lambda r: r.start_ns)
        trace.skipped = skipped
        trace.thread_names = names.get(cpid, {})
    return sorted((by_process[k] for k in sorted(by_process)), key=lambda t: t.rank)
