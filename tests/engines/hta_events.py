"""Run inside the hta venv: HolisticTraceAnalysis parses trace files and says what it read.

No mstx_marks import: the figures are HTA's own parse of the files (its ``Trace`` DataFrame per
rank), handed back as plain rows for ``tests/test_hta_anchor.py`` to add up.

REQUEST is JSON ``{"files": {key: path}, "cats": [category, ...]}``: one ``TraceAnalysis`` over
the files, one HTA rank per key (HTA reads a file's rank from its ``distributedInfo``; files that
share a rank, or name none, need the map). RESULT is JSON ``{"version": HTA's, "min_ts_us":
Trace.min_ts, "files": {key: {"origin_ns": ..., "rows": [[name, cat, ts_us, dur_us,
iteration], ...]}}}``: every host event (HTA's ``stream`` < 0) of those categories, ``ts_us``
HTA's ``ts`` (HTA shifts every rank by the earliest event of all the files, ``min_ts_us``),
``iteration`` HTA's (from the ``ProfilerStep#N`` the event starts in; -1 outside any), and
``origin_ns`` the file's ``otherData.origin_ns`` from HTA's metadata of it (None without one).

usage: python hta_events.py REQUEST RESULT
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

# HTA rounds a trace with sub-microsecond times inward (start up, end down: pytorch#122425),
# up to 1 us off each end of a range; the anchor compares to 1 us, so it reads them as written
# (HTA's own switch).
os.environ["HTA_DISABLE_NS_ROUNDING"] = "1"


def read(files: dict[str, str], cats: list[str]) -> dict[str, Any]:
    from importlib.metadata import version

    from hta.trace_analysis import TraceAnalysis  # type: ignore[import-not-found]

    keys = sorted(files)
    ranks = {i: files[key] for i, key in enumerate(keys)}
    folder = os.path.dirname(ranks[0])
    # The last step too: HTA leaves out the last ProfilerStep's host events by default.
    trace = TraceAnalysis(trace_files=ranks, trace_dir=folder, include_last_profiler_step=True).t
    names = trace.symbol_table.get_sym_table()
    found: dict[str, Any] = {}
    for i, key in enumerate(keys):
        df = trace.get_trace(i)
        df = df[df["stream"] < 0]
        rows = [
            [names[name], names[cat], float(ts), float(dur), int(iteration)]
            for name, cat, ts, dur, iteration in zip(
                df["name"], df["cat"], df["ts"], df["dur"], df["iteration"]
            )
            if names[cat] in cats
        ]
        origin = (trace.meta_data[i].get("otherData") or {}).get("origin_ns")
        found[key] = {"origin_ns": origin, "rows": rows}
    return {
        "version": version("HolisticTraceAnalysis"),
        "min_ts_us": float(trace.min_ts),
        "files": found,
    }


def main(request: str, result: str) -> None:
    with open(request) as f:
        asked = json.load(f)
    with open(result, "w") as f:
        json.dump(read(asked["files"], asked["cats"]), f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
