"""Chrome-trace JSON that other tools wrote: torch.profiler (Kineto), torch_npu, anything else.

- **torch.profiler / Kineto** (CPU or CUDA; ``*.pt.trace.json[.gz]``, also what the library's own
  ``backend="torch"``, ``build_profiler`` and ``capture_steps`` routes write): the ranges are the
  ``user_annotation`` events (``record_function``; the ``gpu_user_annotation`` copies on the
  device are left out so nothing counts twice), ``ProfilerStep#N`` is read as a range named
  ``ProfilerStep`` with ``args={"step": N}`` (a step, see :mod:`mstx_marks.analysis.steps`).
  Timestamps are microseconds since boot plus ``baseTimeNanoseconds``; the rank is
  ``distributedInfo.rank`` when torch.distributed was up.
- **torch_npu's text export** (``ASCEND_PROFILER_OUTPUT/trace_view.json``): events as torch_npu's
  ``TraceEventManager`` writes them (``ts`` a string of microseconds with three decimals, ``dur``
  a float), the document a list or ``{"traceEvents": [...]}``. The MSTX ranges are the events
  of category ``MsTx`` (as MindStudio Insight names them; ``msprof_tx`` and ``mstx`` too, in any
  case, or on a process or thread of that name), with ``user_annotation`` ranges and
  ``ProfilerStep#N`` as above. The rank comes from ``profiler_info_<rank>.json`` beside
  ``ASCEND_PROFILER_OUTPUT``.
- **Any other Chrome trace** (a plain ``trace.json``): every complete event (``X``) and
  begin/end pair (``B``/``E``) is a range, every ``i``/``I`` event an instant.

Timestamps become integer nanoseconds; a string ``ts`` keeps every digit. A file whose events
hold no range is :class:`NothingToRead` (a note, not an error).

>>> doc = {"traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#4",
...        "pid": 1, "tid": 2, "ts": 1.5, "dur": 2}], "baseTimeNanoseconds": 10**18}
>>> (t,) = read_foreign_chrome(Path("k.pt.trace.json"), doc)
>>> r = t.records[0]
>>> r.name, r.args, r.start_ns - 10**18, r.end_ns - r.start_ns
('ProfilerStep', {'step': 4}, 1500, 2000)
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mstx_marks.analysis.steps import PROFILER_STEP
from mstx_marks.base.records import InstantRecord, RangeRecord, RankTrace, Record, TraceFileError

__all__ = ["NothingToRead", "kind_of", "read_foreign_chrome", "ts_ns"]

_PROFILER_STEP = re.compile(r"ProfilerStep#(\d+)\Z")
_TX = re.compile(r"(ms)?(prof)?_?tx\Z", re.IGNORECASE)
_KINETO_KEYS = ("schemaVersion", "deviceProperties", "baseTimeNanoseconds", "distributedInfo")
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
_PROFILER_INFO = re.compile(r"profiler_info_(\d+)\.json\Z")


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


def _events(path: Path, doc: Any) -> list[Any]:
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
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


def _tx_names(events: list[Any]) -> tuple[set[int], set[tuple[int, int]]]:
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


def read_foreign_chrome(path: Path, doc: Any) -> list[RankTrace]:
    """The trace in ``doc`` (loaded from ``path``), read as the module docstring says."""
    kind = kind_of(path, doc)
    events = _events(path, doc)
    base = 0
    if isinstance(doc, dict):
        base = _int(doc.get("baseTimeNanoseconds")) or 0
    tx_pids, tx_tids = _tx_names(events) if kind == "torch_npu" else (set(), set())
    records: list[Record] = []
    begun: dict[tuple[int, int], list[tuple[str, str, int]]] = {}
    skipped = 0
    for ev in events:
        try:
            if not isinstance(ev, dict):
                continue
            ph = ev.get("ph")
            if ph not in ("X", "B", "E", "i", "I"):
                continue
            pid, tid = _int(ev.get("pid")), _int(ev.get("tid"))
            if pid is None or tid is None:
                continue  # Kineto's "Spans"/"Traces" rows: not a process's events
            name, cat = str(ev.get("name", "")), str(ev.get("cat") or "")
            step = _PROFILER_STEP.match(name)
            if kind != "chrome" and ph == "X":
                wanted = step is not None or cat == "user_annotation"
                if kind == "torch_npu":
                    wanted = wanted or bool(_TX.match(cat)) or pid in tx_pids
                    wanted = wanted or (pid, tid) in tx_tids
                if not wanted:
                    continue
            elif kind != "chrome":
                continue
            start = base + ts_ns(ev["ts"])
            if not _in_range(start):
                raise ValueError("past int64")
            domain = cat or "default"
            if ph == "X":
                end = start + ts_ns(ev.get("dur", 0))
                if end < start or not _in_range(start, end):
                    raise ValueError("not a duration")
                if step is not None:
                    records.append(
                        RangeRecord(PROFILER_STEP, domain, start, end, tid, pid,
                                    args={"step": int(step.group(1))})
                    )  # fmt: skip
                else:
                    records.append(RangeRecord(name, domain, start, end, tid, pid))
            elif ph == "B":
                begun.setdefault((pid, tid), []).append((name, domain, start))
            elif ph == "E":
                stack = begun.get((pid, tid))
                if stack:
                    b_name, b_domain, b_start = stack.pop()
                    if start < b_start:
                        raise ValueError("ends before it starts")
                    records.append(RangeRecord(b_name, b_domain, b_start, start, tid, pid))
            else:
                records.append(InstantRecord(name, domain, start, tid, pid))
        except (KeyError, TypeError, ValueError, OverflowError):
            skipped += 1  # one bad event (NaN, a string time, past int64): the rest is read
    if not any(isinstance(r, RangeRecord) for r in records):
        what = {
            "kineto": "no user_annotation ranges (record_function)",
            "torch_npu": "no MSTX (MsTx) or user_annotation ranges",
            "chrome": "no complete (X) or begin/end (B/E) events",
        }[kind]
        raise NothingToRead(path, f"is a {_KIND_NAMES[kind]} with {what}; nothing to summarise")
    records.sort(key=lambda r: r.start_ns)
    return [RankTrace(_rank(path, doc), records, [], path, skipped=skipped)]


_KIND_NAMES = {
    "kineto": "torch.profiler trace",
    "torch_npu": "torch_npu trace_view.json",
    "chrome": "Chrome trace",
}
