"""Chrome-trace JSON that other tools wrote: torch.profiler (Kineto), torch_npu, anything else.

- **torch.profiler / Kineto** (CPU or CUDA; ``*.pt.trace.json[.gz]``, also what the library's own
  ``backend="torch"``, ``build_profiler`` and ``capture_steps`` routes write): the ranges are the
  ``user_annotation`` events (``record_function``; the ``gpu_user_annotation`` copies on the
  device, ``ProfilerStep#N``'s among them on ROCm, are left out so nothing counts twice),
  ``ProfilerStep#N`` is read as a range named
  ``ProfilerStep`` with ``args={"step": N}`` (a step, see :mod:`mstx_marks.analysis.model.steps`).
  Timestamps are microseconds since boot plus ``baseTimeNanoseconds``; the rank is
  ``distributedInfo.rank`` when torch.distributed was up.
- **torch_npu's text export** (``ASCEND_PROFILER_OUTPUT/trace_view.json``): events as torch_npu's
  ``TraceEventManager`` writes them (``ts`` a string of microseconds with three decimals, ``dur``
  a float), the document a list or ``{"traceEvents": [...]}``. The MSTX ranges are the ``X``
  events msprof's ``MsprofTxAssembler`` writes: no ``cat`` (only their flow events carry
  ``MsTx``), ``args`` holding ``event_type`` (``start/end`` or ``push/pop``: a range;
  ``marker`` or ``marker_ex``: an instant at ``ts``) and, for ``mstx`` ranges, ``domain``,
  in a process named after the program and threads named ``Thread N``. torch_npu marks each
  ``ProfilerStep#N`` so too, beside its CPU op of that name: a step is read once. Events of category
  ``MsTx`` (as MindStudio Insight names them; ``msprof_tx`` and ``mstx`` too, in any case, or on
  a process or thread of that name) are MSTX ranges too, with ``user_annotation`` ranges and
  ``ProfilerStep#N`` as above. The rank comes from ``profiler_info_<rank>.json`` beside
  ``ASCEND_PROFILER_OUTPUT``.
- **Any other Chrome trace** (a plain ``trace.json``): every complete event (``X``) and
  begin/end pair (``B``/``E``) is a range, every ``i``/``I`` event an instant. A ``B`` never
  ended (the tracer stopped inside it) has no duration: it is not counted, and a note on the
  trace counts and names them (and ``E`` events that began nothing).

Timestamps become integer nanoseconds; a string ``ts`` keeps every digit. A file whose events
hold no range is :class:`NothingToRead` (a note, not an error).

**Large files.** A file of more than :data:`WHOLE_JSON_BYTES` of JSON is never parsed whole
by ``summary`` and the timelines (a parse takes 8 to 30 times its text):
:func:`stream_trace_json` gives its document with the events as a :class:`JsonEvents`, which
parses them one at a time as a reader goes through them, so memory is that of one event. Its
other keys are read first, in a pass of their own, because some come after the events (our
``otherData``, Kineto's ``baseTimeNanoseconds``) and the events cannot be read without them; a
file is therefore read twice (three times for torch_npu's, whose MsTx processes are named by
metadata events anywhere in it), up to :data:`MAX_STREAMED_JSON_BYTES` and
:data:`MAX_STREAMED_EVENTS`.

>>> doc = {"traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#4",
...        "pid": 1, "tid": 2, "ts": 1.5, "dur": 2}], "baseTimeNanoseconds": 10**18}
>>> (t,) = read_foreign_chrome(Path("k.pt.trace.json"), doc)
>>> r = t.records[0]
>>> r.name, r.args, r.start_ns - 10**18, r.end_ns - r.start_ns
('ProfilerStep', {'step': 4}, 1500, 2000)
"""

from __future__ import annotations

import io
import json
import re
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Iterable, Iterator

from mstx_marks.analysis.model.steps import PROFILER_STEP, FileTrace
from mstx_marks.base.records import InstantRecord, RangeRecord, RankTrace, Record, TraceFileError
from mstx_marks.export.chrome import RecordSink
from mstx_marks.export.files import open_regular

__all__ = [
    "MAX_STREAMED_EVENTS",
    "MAX_STREAMED_JSON_BYTES",
    "WHOLE_JSON_BYTES",
    "JsonEvents",
    "NothingToRead",
    "kind_of",
    "read_foreign_chrome",
    "stream_trace_json",
    "ts_ns",
]

_PROFILER_STEP = re.compile(r"ProfilerStep#(\d+)\Z")
_TX = re.compile(r"(ms)?(prof)?_?tx\Z", re.IGNORECASE)
_KINETO_KEYS = ("schemaVersion", "deviceProperties", "baseTimeNanoseconds", "distributedInfo")
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
_PROFILER_INFO = re.compile(r"profiler_info_(\d+)\.json\Z")
#: msprof's ``args.event_type`` of an MSTX event (``MSTX_EVENT_TYPE_TABLE``) that marks an
#: instant; ``push/pop`` and ``start/end`` are ranges.
_TX_MARKERS = frozenset({"marker", "marker_ex"})
#: The device's copy of a host annotation (Kineto on CUDA and ROCm): counted on the host.
_DEVICE_COPY = "gpu_user_annotation"


class NothingToRead(TraceFileError):
    """A trace that was read but holds nothing ``summary`` counts (reported as a note)."""


def ts_ns(value: Any) -> int:
    """Microseconds (a number, or a string as torch_npu writes them) as integer nanoseconds.

    >>> ts_ns("1700000000000000.123"), ts_ns(1.25), ts_ns("7")
    (1700000000000000123, 1250, 7000)
    """
    if isinstance(value, str):
        whole, _, frac = value.strip().partition(".")
        sign = -1 if whole.startswith("-") else 1
        ns = abs(int(whole or "0")) * 1000 + int((frac + "000")[:3] or "0")
        return sign * ns
    return round(float(value) * 1000)


def kind_of(path: Path, doc: Any) -> str:
    """``"torch_npu"``, ``"kineto"`` or ``"chrome"`` for a document that is not ours."""
    if path.name == "trace_view.json":
        return "torch_npu"
    if isinstance(doc, dict) and any(k in doc for k in _KINETO_KEYS):
        return "kineto"
    return "chrome"


def _events(path: Path, doc: Any) -> Iterable[Any]:
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, (list, JsonEvents)):
        raise TraceFileError(path, "is JSON but not a Chrome trace (no traceEvents list)")
    return events


def _rank(path: Path, doc: Any) -> int:
    info = doc.get("distributedInfo") if isinstance(doc, dict) else None
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        return int(info["rank"])
    if path.parent.name == "ASCEND_PROFILER_OUTPUT":
        for sibling in sorted(path.parent.parent.glob("profiler_info_*.json")):
            m = _PROFILER_INFO.match(sibling.name)
            if m:
                return int(m.group(1))
    m = _RANK_IN_NAME.search(path.name)
    return int(m.group(1)) if m else 0


def _int(value: Any) -> int | None:
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if -_INT64 <= number < _INT64 else None


_INT64 = 1 << 63


def _in_range(*values: int) -> bool:
    """Times a database and the summary can hold: int64 nanoseconds."""
    return all(-_INT64 <= v < _INT64 for v in values)


def _tx_names(events: Iterable[Any]) -> tuple[set[int], set[tuple[int, int]]]:
    """The processes and threads that metadata names MsTx / msprof_tx."""
    pids, tids = set(), set()
    for ev in events:
        if not isinstance(ev, dict) or ev.get("ph") != "M":
            continue
        args = ev.get("args")
        name = args.get("name") if isinstance(args, dict) else None
        if not isinstance(name, str) or not _TX.match(name.replace(" ", "")):
            continue
        pid, tid = _int(ev.get("pid")), _int(ev.get("tid"))
        if pid is None:
            continue
        if ev.get("name") == "process_name":
            pids.add(pid)
        elif ev.get("name") == "thread_name" and tid is not None:
            tids.add((pid, tid))
    return pids, tids


def read_foreign_chrome(path: Path, doc: Any, sink: RecordSink | None = None) -> list[RankTrace]:
    """The trace in ``doc`` (loaded from ``path``), read as the module docstring says.

    ``doc``'s events may be any iterable (:class:`JsonEvents`: a large file's, parsed one at a
    time). With ``sink``, each record goes to ``sink(trace, record)`` as it is read (``B``/``E``
    pairs once their end is read), and the trace comes back with what the sink put in it.
    """
    kind = kind_of(path, doc)
    events = _events(path, doc)
    base = 0
    if isinstance(doc, dict):
        base = _int(doc.get("baseTimeNanoseconds")) or 0
    tx_pids, tx_tids = _tx_names(events) if kind == "torch_npu" else (set(), set())
    trace = FileTrace(_rank(path, doc), [], [], path)
    add = sink or _keep
    begun: dict[tuple[int, int], list[tuple[str, str, int]]] = {}
    strays = [0]  # E events with no B open on their thread
    skipped = 0
    ranges = False
    # torch_npu writes each ProfilerStep#N twice: its CPU op and its own MSTX range.
    steps_seen: set[Any] | None = set() if kind == "torch_npu" else None
    for ev in events:
        try:
            rec = _foreign_record(ev, kind, base, (tx_pids, tx_tids), begun, strays)
        except (KeyError, TypeError, ValueError, OverflowError):
            skipped += 1  # one bad event (NaN, a string time, past int64): the rest is read
            continue
        if rec is not None:
            if steps_seen is not None and rec.name == PROFILER_STEP and rec.args:
                if rec.args["step"] in steps_seen:
                    continue
                steps_seen.add(rec.args["step"])
            ranges = ranges or isinstance(rec, RangeRecord)
            add(trace, rec)
    unended = _unended_note(begun, strays[0])
    if not ranges:
        what = {
            "kineto": "no user_annotation ranges (record_function)",
            "torch_npu": "no MSTX (MsTx) or user_annotation ranges",
            "chrome": "no complete (X) or begin/end (B/E) events",
        }[kind]
        if unended:
            what = f"no complete (X) or begin/end (B/E) range: {unended}"
        raise NothingToRead(path, f"is a {_KIND_NAMES[kind]} with {what}; nothing to summarise")
    trace.records.sort(key=lambda r: r.start_ns)
    trace.skipped = skipped
    if unended:
        trace.notes.append(f"{path}: {unended}")
    return [trace]


def _unended_note(begun: dict[tuple[int, int], list[tuple[str, str, int]]], strays: int) -> str:
    """What a note says of the ``B`` events left in ``begun`` (never ended) and of ``strays``
    ``E`` events that ended nothing; ``""`` when there are none.

    >>> print(_unended_note({(1, 2): [("fwd", "d", 0), ("fwd", "d", 5)], (1, 3): []}, 1))
    ... # doctest: +ELLIPSIS
    2 ranges begun (B) never ended (no E): ...: fwd (2); 1 end (E) with no begin (B) on its thread
    """
    names: dict[str, int] = {}
    for stack in begun.values():
        for name, _, _ in stack:
            names[name] = names.get(name, 0) + 1
    parts = []
    if names:
        n = sum(names.values())
        common = sorted(names.items(), key=lambda kv: (-kv[1], kv[0]))
        shown = ", ".join(f"{_short(name)} ({k})" for name, k in common[:_NAMES_SHOWN])
        if len(common) > _NAMES_SHOWN:
            shown += f", and {len(common) - _NAMES_SHOWN} more names"
        parts.append(
            f"{n} range{'s' if n != 1 else ''} begun (B) never ended (no E): not counted, as"
            f" they have no duration: {shown}"
        )
    if strays:
        ends = "end (E)" if strays == 1 else "ends (E)"
        parts.append(f"{strays} {ends} with no begin (B) on its thread")
    return "; ".join(parts)


#: How many names of never-ended ranges a note shows (the most frequent).
_NAMES_SHOWN = 5


def _short(name: str, width: int = 60) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


def _keep(trace: RankTrace, rec: Record) -> None:
    trace.records.append(rec)


def _foreign_record(
    ev: Any,
    kind: str,
    base: int,
    tx: tuple[set[int], set[tuple[int, int]]],
    begun: dict[tuple[int, int], list[tuple[str, str, int]]],
    strays: list[int],
) -> Record | None:
    """The record ``ev`` makes (None: none, or a ``B`` kept in ``begun`` for its ``E``; an
    ``E`` with none open is counted in ``strays``)."""
    if not isinstance(ev, dict):
        return None
    ph = ev.get("ph")
    if ph not in ("X", "B", "E", "i", "I"):
        return None
    pid, tid = _int(ev.get("pid")), _int(ev.get("tid"))
    if pid is None or tid is None:
        return None  # Kineto's "Spans"/"Traces" rows: not a process's events
    name, cat = str(ev.get("name", "")), str(ev.get("cat") or "")
    if cat == _DEVICE_COPY:
        return None
    step = _PROFILER_STEP.match(name)
    tx_type = _tx_event_type(ev) if kind != "kineto" else None
    if kind != "chrome" and ph == "X":
        wanted = step is not None or cat == "user_annotation"
        if kind == "torch_npu":
            wanted = (
                wanted or tx_type is not None or bool(_TX.match(cat))
                or pid in tx[0] or (pid, tid) in tx[1]
            )  # fmt: skip
        if not wanted:
            return None
    elif kind != "chrome":
        return None
    start = base + ts_ns(ev["ts"])
    if not _in_range(start):
        raise ValueError("past int64")
    domain = cat or "default"
    if tx_type is not None:
        domain = _tx_domain(ev) or domain
        if tx_type in _TX_MARKERS:
            return InstantRecord(name, domain, start, tid, pid)
    if ph == "X":
        end = start + ts_ns(ev.get("dur", 0))
        if end < start or not _in_range(start, end):
            raise ValueError("not a duration")
        if step is not None:
            return RangeRecord(PROFILER_STEP, domain, start, end, tid, pid,
                               args={"step": int(step.group(1))})  # fmt: skip
        return RangeRecord(name, domain, start, end, tid, pid)
    if ph == "B":
        begun.setdefault((pid, tid), []).append((name, domain, start))
        return None
    if ph == "E":
        stack = begun.get((pid, tid))
        if not stack:
            strays[0] += 1
            return None
        b_name, b_domain, b_start = stack.pop()
        if start < b_start:
            raise ValueError("ends before it starts")
        return RangeRecord(b_name, b_domain, b_start, start, tid, pid)
    return InstantRecord(name, domain, start, tid, pid)


def _tx_event_type(ev: dict[str, Any]) -> str | None:
    """msprof's ``event_type`` of an MSTX event (None: the event is not one of msprof's)."""
    args = ev.get("args")
    if not isinstance(args, dict):
        return None
    kind = args.get("event_type")
    return kind if isinstance(kind, str) else None


def _tx_domain(ev: dict[str, Any]) -> str | None:
    domain = ev["args"].get("domain")
    return domain if isinstance(domain, str) and domain else None


_KIND_NAMES = {
    "kineto": "torch.profiler trace",
    "torch_npu": "torch_npu trace_view.json",
    "chrome": "Chrome trace",
}


#: The most JSON text (after gunzip) ``summary`` and the timelines parse whole: a larger file is
#: read an event at a time (see the module's docstring). A parse takes 8 times its text for our
#: own traces and up to 30 times for the worst text (measured, see
#: :data:`~mstx_marks.export.chrome.MAX_JSON_BYTES`), so this bounds it near 500 MB whatever
#: the text; one of our traces of 16 MB (140 000 events) is summarised whole in 200 MB of peak
#: RSS, in 3 s.
WHOLE_JSON_BYTES = 16 << 20
#: The most JSON text (after gunzip) a file may hold to be read a piece at a time: in bounded
#: memory, but twice, each pass about 3.5 s per 100 MB, and then its records are made (measured,
#: Python 3.11: our trace of 2e6 events, 226 MB, is summarised in 32 s at 280 MB of peak RSS;
#: parsed whole it took 2.5 GB). This bounds the time (about 70 s), at twice that trace, and
#: stops a gzip that inflates to gigabytes; a longer run's spill is read instead (it streams).
MAX_STREAMED_JSON_BYTES = 512 << 20
#: The most events a file may hold to be read a piece at a time: a pass takes about 1.5 s per
#: million of the smallest (``{}``; measured), so this bounds a file of tiny events as
#: :data:`MAX_STREAMED_JSON_BYTES` bounds one of ours (4.5 million events in 512 MB), at more
#: than twice the most our exporter writes.
MAX_STREAMED_EVENTS = 5_000_000
#: Text is read this many characters at a time.
_CHUNK = 1 << 20
_WS = re.compile(r"[ \t\n\r]*")
_DECODE = json.JSONDecoder().raw_decode
# A parse that stops this near the end of the text read so far may only lack the rest of it.
_NEAR_END = 16
# What may follow the text of a number up to the end of the text read so far, when the number
# may go on in the next chunk ("1" of "1e+30" parses, as 1).
_NUMBER_TAIL = re.compile(r"[0-9.eE+-]*\Z")


def _may_go_on(value: Any, buf: str, end: int) -> bool:
    """Whether ``value``, parsed from ``buf`` up to ``end``, may be a number cut short."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return number and _NUMBER_TAIL.match(buf, end) is not None


class JsonEvents:
    """The events of the Chrome trace JSON at ``path`` (its ``traceEvents``, or the document
    when it is a list), each parsed as the iteration reaches it: memory is one event's,
    whatever the file. Each iteration reads the file again, and checks it to its end (an error
    names the file: :class:`~mstx_marks.base.records.TraceFileError`).

    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "a.trace.json"
    >>> _ = path.write_text('{"traceEvents": [{"ph": "X"}, {"ph": "i"}], "base": 7}')
    >>> [ev["ph"] for ev in JsonEvents(path)]
    ['X', 'i']
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def __iter__(self) -> Iterator[Any]:
        return _walk(self.path, _Shape())

    def __repr__(self) -> str:
        return f"JsonEvents({str(self.path)!r})"


def stream_trace_json(path: Path) -> Any:
    """The document at ``path`` as :func:`~mstx_marks.export.chrome.load_trace_json` parses
    it, but with its events as a :class:`JsonEvents` (see the module's docstring); its other
    keys are read now, in one pass over the file.

    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "k.pt.trace.json"
    >>> _ = path.write_text('{"schemaVersion": 1, "traceEvents": [{}], "baseTimeNanoseconds": 9}')
    >>> doc = stream_trace_json(path)
    >>> doc["schemaVersion"], doc["baseTimeNanoseconds"], len(list(doc["traceEvents"]))
    (1, 9, 1)
    """
    path = Path(path)
    shape = _Shape()
    for _ in _walk(path, shape):
        pass  # each event parsed and dropped: only the other keys are kept
    if shape.is_list:
        return JsonEvents(path)
    if shape.has_events:
        shape.header["traceEvents"] = JsonEvents(path)
    return shape.header


class _Shape:
    """What a pass finds besides the events: the document's other keys, and its shape."""

    def __init__(self) -> None:
        self.header: dict[str, Any] = {}
        self.is_list = self.has_events = False


def _walk(path: Path, shape: _Shape) -> Iterator[Any]:
    """Each event of the document at ``path``, parsed one at a time; its other keys go to
    ``shape``. Errors name the file."""
    try:
        with _open_text(path) as f:
            text = _Text(path, f)
            if text.take("[{") == "[":
                shape.is_list = True
                yield from _items(text)
            else:
                yield from _keys(text, shape)
            if text.peek():
                raise text.bad("more text after the document")
    except TraceFileError:
        raise
    except (OSError, zlib.error, EOFError) as e:
        why = getattr(e, "strerror", None) or e
        raise TraceFileError(path, f"cannot be read ({why})") from e
    except UnicodeDecodeError as e:
        raise TraceFileError(path, f"is not valid JSON (truncated or corrupt?): {e}") from e
    except RecursionError:
        raise TraceFileError(path, "is JSON nested too deeply to be a trace") from None


def _keys(text: _Text, shape: _Shape) -> Iterator[Any]:
    """The rest of an object, its first ``traceEvents`` list yielded an event at a time."""
    if text.peek() == "}":
        text.pos += 1
        return
    while True:
        if text.peek() != '"':
            raise text.bad("expected a key")
        key = text.value()
        text.take(":")
        if key == "traceEvents" and not shape.has_events and text.peek() == "[":
            shape.has_events = True
            text.pos += 1
            yield from _items(text)
        else:
            shape.header[key] = text.value()
        if text.take(",}") == "}":
            return


def _items(text: _Text) -> Iterator[Any]:
    """The rest of a list of events, an event at a time (up to :data:`MAX_STREAMED_EVENTS`)."""
    if text.peek() == "]":
        text.pos += 1
        return
    count = 0
    while True:
        count += 1
        if count > MAX_STREAMED_EVENTS:
            why = f"holds more than {MAX_STREAMED_EVENTS} events, more than is read here"
            raise TraceFileError(text.path, why)
        yield text.value()
        buf, pos = text.buf, text.pos
        if pos < len(buf) and buf[pos] == ",":  # (the usual case, read without a regex)
            text.pos = pos + 1
        elif text.take(",]") == "]":
            return


@contextmanager
def _open_text(path: Path) -> Iterator[IO[str]]:
    """The file's text (gunzipped for ``.gz``, decoded as :func:`json.loads` decodes UTF-8);
    refused when it is not a regular file (a FIFO), as the whole parse refuses it."""
    with (
        open_regular(path, gunzip=True) as source,
        io.TextIOWrapper(source, "utf-8-sig", "surrogatepass", newline="") as f,
    ):
        yield f


class _Text:
    """JSON text read a chunk at a time: ``buf[pos:]`` is what is not parsed yet (what was is
    dropped as the next chunk comes)."""

    def __init__(self, path: Path, f: IO[str]) -> None:
        self.path, self.f = path, f
        self.buf, self.pos = "", 0
        self.before = 0  # characters read and dropped before buf
        self.eof = False

    def more(self, n: int = 0) -> bool:
        """Read ``n`` characters more (default :data:`_CHUNK`; False at the end of the file)."""
        if self.eof:
            return False
        chunk = self.f.read(n or _CHUNK)
        if not chunk:
            self.eof = True
            return False
        self.before += self.pos
        self.buf = self.buf[self.pos :] + chunk
        self.pos = 0
        if self.before + len(self.buf) > MAX_STREAMED_JSON_BYTES:
            raise TraceFileError(
                self.path,
                f"holds more than {MAX_STREAMED_JSON_BYTES >> 20} MB of JSON, more than is read"
                " here",
            )
        return True

    def peek(self) -> str:
        """The next character past whitespace (``""`` at the end), not taken."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()  # type: ignore[union-attr]
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.more():
                return ""

    def take(self, allowed: str) -> str:
        """The next character past whitespace, which must be one of ``allowed``."""
        c = self.peek()
        if not c or c not in allowed:
            raise self.bad(f"expected {' or '.join(map(repr, allowed))}")
        self.pos += 1
        return c

    def value(self) -> Any:
        """The next JSON value, parsed whole (at most :data:`WHOLE_JSON_BYTES` of text)."""
        at_value = self.pos < len(self.buf) and self.buf[self.pos] not in " \t\n\r"
        if not at_value and not self.peek():  # (a value right here: no regex, the usual case)
            raise self.bad("the text ends where a value should be")
        while True:
            try:
                value, end = _DECODE(self.buf, self.pos)
            except json.JSONDecodeError as e:
                near_end = e.pos >= len(self.buf) - _NEAR_END
                if not (near_end or e.msg.startswith("Unterminated string")) or not self._grow():
                    raise self.bad(f"{e.msg}", e.pos) from None
                continue
            if not _may_go_on(value, self.buf, end) or not self._grow():
                self.pos = end
                return value

    def _grow(self) -> bool:
        """Read on within the value at ``pos`` (doubling, so a long value is parsed a few
        times, not once per chunk); False at the end of the file."""
        held = len(self.buf) - self.pos
        if held > WHOLE_JSON_BYTES:
            raise TraceFileError(
                self.path,
                f"holds one value (an event, or a key's) of more than {WHOLE_JSON_BYTES >> 20}"
                " MB of JSON, more than is parsed whole here",
            )
        return self.more(max(_CHUNK, held))

    def bad(self, why: str, at: int | None = None) -> TraceFileError:
        where = self.before + (self.pos if at is None else at)
        return TraceFileError(
            self.path, f"is not valid JSON (truncated or corrupt?): {why} at character {where}"
        )
