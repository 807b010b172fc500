"""The whole job as one Chrome / Perfetto trace: a process per role and rank, named threads.

``summary DIR --trace job.json`` reads every trace under ``DIR`` (trainer workers, the rollout
engine's processes, the driver) and writes them on one time axis:

- **Clock alignment.** Every record is wall-clock nanoseconds (``time.time_ns()``) when it is
  written, so processes on one host share the axis as they are, and hosts agree to within their
  NTP offset. Each file also carries a wall/monotonic clock pair (the spill's header,
  ``otherData.clock`` of our Chrome traces; torch.profiler's ``baseTimeNanoseconds`` plays that
  part for its boot-clock timestamps, and the reader applies it), so a trace stamped on a clock
  since boot can be moved onto the wall clock; files on another clock that carry no pair are
  left out by ``summary`` with an error. Given the summary's per-step model
  (:mod:`mstx_marks.analysis.model.rl_steps`), each process is placed where the model put it (moved
  by its clock shift, as the HTML report and the SVG place it), and ``otherData.alignment``
  says how far to trust that, in the model's words; without one, as recorded.
- **Processes.** One Chrome process per role, rank and operating-system pid, named
  ``<role> rank R (pid P)`` and sorted by role, then rank (one GPU's trainer, FSDP workers and
  vLLM processes all say rank 0: the role leads).
- **Threads.** Each thread is named (``thread_name`` metadata: its Python name when known, else
  ``thread T``). Chrome nests the complete events of one thread by time, so ranges that overlap
  without nesting (two asyncio tasks on one thread) would be drawn wrongly: the thread is split
  into tracks where each track nests properly, the extra ones named ``thread T (overlap K)`` and
  listed in ``otherData.threads`` so that :func:`~mstx_marks.export.read_chrome_trace` reads
  them back onto their thread (:func:`mstx_marks.export.chrome.thread_tracks`, which the
  per-rank traces use too).
- **Steps** are the model's, never found again here: the job's steps (its reference's, by key)
  on a ``steps`` track of the reference's process (category ``mstx_marks.step``, which the
  reader skips); none without a model.

>>> from mstx_marks.base.records import RangeRecord, RankTrace
>>> a = RangeRecord("update_actor", "default", 0, 20, 5, 9)
>>> b = RangeRecord("compute_score", "default", 10, 40, 5, 9)  # overlaps a, not inside it
>>> doc = merged_chrome_trace([RankTrace(0, [a, b], role="trainer")])
>>> sorted(e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name")
['thread 5', 'thread 5 (overlap 1)']
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from mstx_marks.analysis.model.rl_steps import StepAnalysis
from mstx_marks.base.records import RankTrace, Record
from mstx_marks.export.chrome import (
    GENERATOR,
    OVERLAP_TID,
    dumps,
    nesting_tracks,
    origin_of,
    thread_tracks,
    trace_event,
    trace_us,
)
from mstx_marks.export.files import atomic_write_bytes

__all__ = ["STEP_CATEGORY", "merged_chrome_trace", "nesting_tracks", "write_merged_trace"]

#: The category of the step ranges on each process's ``steps`` track.
STEP_CATEGORY = "mstx_marks.step"
_ALIGNMENT = (
    "wall clock: every file's timestamps are time.time_ns() (boot-clock files shifted by their "
    "clock pair); no cross-rank offset estimate"
)


def _meta(name: str, cpid: int, args: dict[str, Any], tid: int | None = None) -> dict[str, Any]:
    ev: dict[str, Any] = {"ph": "M", "name": name, "pid": cpid, "args": args}
    if tid is not None:
        ev["tid"] = tid
    return ev


def merged_chrome_trace(
    traces: Sequence[RankTrace], model: StepAnalysis | None = None
) -> dict[str, Any]:
    """The trace document of the whole job, ready for :func:`json.dumps`; its processes placed
    and its steps drawn as the per-step ``model`` says (see the module's docstring)."""
    shifts = {} if model is None else model.clock.shifts_ns
    starts = [r.start_ns + shifts.get(t.member, 0) for t in traces for r in t.records]
    origin = origin_of(min(starts)) if starts else 0
    events: list[dict[str, Any]] = []
    processes: dict[str, Any] = {}
    threads: dict[str, int] = {}
    cpid = 0
    extra = OVERLAP_TID
    for trace in sorted(traces, key=lambda t: t.member):
        found = model.steps if model is not None and trace.member == model.reference else []
        at = origin - shifts.get(trace.member, 0)  # its times less this: on the model's axis
        by_pid: dict[int, list[Record]] = {}
        for r in trace.records:
            by_pid.setdefault(r.pid, []).append(r)
        for pid in sorted(by_pid):
            cpid += 1
            processes[str(cpid)] = {
                "rank": trace.rank,
                "pid": pid,
                "role": trace.role,
                "steps": [[s, e] for s, e in trace.steps],
            }
            events.append(
                _meta("process_name", cpid, {"name": f"{trace.member.label} (pid {pid})"})
            )
            events.append(_meta("process_sort_index", cpid, {"sort_index": cpid}))
            tracks = thread_tracks(by_pid[pid], trace.thread_names, extra + 1)
            for order, track in enumerate(tracks, start=1):
                if track.tid != track.thread:
                    extra = track.tid
                    threads[f"{cpid}:{track.tid}"] = track.thread
                label = track.label
                events.append(_meta("thread_name", cpid, {"name": label}, track.tid))
                events.append(_meta("thread_sort_index", cpid, {"sort_index": order}, track.tid))
                events.extend(trace_event(r, cpid, at, track.tid) for r in track.records)
            if found and pid == min(by_pid):
                extra += 1
                events.append(_meta("thread_name", cpid, {"name": "steps"}, extra))
                events.append(_meta("thread_sort_index", cpid, {"sort_index": -1}, extra))
                for s in found:  # (on the model's axis already)
                    events.append({
                        "ph": "X", "name": f"step {s.key}", "cat": STEP_CATEGORY,
                        "ts": trace_us(s.start_ns - origin), "dur": trace_us(s.length_ns),
                        "pid": cpid, "tid": extra, "args": {"step": s.key},
                    })  # fmt: skip
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "generator": GENERATOR,
            "origin_ns": origin,
            "processes": processes,
            "threads": threads,
            "alignment": _ALIGNMENT if model is None else f"per-step model: {model.clock.text()}",
        },
    }


def write_merged_trace(
    path: str | Path, traces: Sequence[RankTrace], model: StepAnalysis | None = None
) -> Path:
    """Write :func:`merged_chrome_trace` of ``traces`` to ``path`` atomically; returns it."""
    return atomic_write_bytes(path, dumps(merged_chrome_trace(traces, model)).encode())
