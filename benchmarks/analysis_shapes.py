"""``summary`` on trace shapes that once made it quadratic (issue 36, item 10).

Three shapes, each one process on one thread, written as one of our Chrome traces with the real
writer (:func:`~mstx_marks.export.chrome.write_chrome_trace`):

- ``overlap``: ``N`` (default 100,000) ranges of an agent loop's requests gathered on one
  asyncio thread, each starting 10 us after the one before and lasting 2 ms (staggered: about
  200 open at once, none inside another), in steps of 10,000 requests;
- ``sequential``: the same count back to back (the shape the stack of open ranges was made for);
- ``nested``: ``M`` (default 40,000) ranges each inside the one before, in one step.

It times, in a fresh process each, ``python -m mstx_marks summary DIR --json`` on ``overlap`` and
``sequential`` and ``summary DIR --json --html FILE --svg FILE`` on ``nested`` (wall seconds; a
command past ``--timeout`` is stopped and shown as ``>T``), then the three functions these
shapes stressed, in this process: :func:`~mstx_marks.analysis.model.aggregate.breakdown` and
:func:`~mstx_marks.analysis.model.stages.nested_repeats` on ``overlap``, and
:func:`~mstx_marks.analysis.render.timeline.assign_lanes` on ``nested``.

Run it from the repository root: ``python3 benchmarks/analysis_shapes.py [--n N] [--m M]
[--timeout S]``. Generated folders are kept under ``--work`` and reused.

Measured (Python 3.11, 2 CPUs shared with other work, load 7-10), before -> after the
open-range stacks kept only the ranges that may still hold a later one and the lanes were found
with a heap and a staircase of containers: ``summary`` of ``overlap`` >200 s (stopped) -> 4.0 s
(``sequential``: 8.5 s -> 3.5 s, load alone); ``--html --svg`` of ``nested`` >200 s (stopped)
-> 4.7 s; ``breakdown`` 25.7 s -> 0.08 s, ``nested_repeats`` 30.4 s -> 0.08 s,
``assign_lanes`` >400 s (stopped; 8.1 s for 10,000) -> 0.27 s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from mstx_marks.analysis.model.aggregate import breakdown  # noqa: E402
from mstx_marks.analysis.model.stages import nested_repeats  # noqa: E402
from mstx_marks.analysis.render.timeline import assign_lanes  # noqa: E402
from mstx_marks.base.records import RangeRecord, RankTrace  # noqa: E402
from mstx_marks.export.chrome import write_chrome_trace  # noqa: E402

T0 = 1_750_000_000_000_000_000
US = 1000
#: Requests per step in ``overlap`` and ``sequential``.
PER_STEP = 10_000
PID, TID = 4242, 4243


def overlap(n: int) -> list[RangeRecord]:
    """``n`` staggered requests (see the module's docstring) and their steps."""
    recs = [
        RangeRecord("agent_request", "default", T0 + i * 10 * US, T0 + i * 10 * US + 2000 * US,
                    TID, PID)
        for i in range(n)
    ]  # fmt: skip
    return recs + _steps(recs)


def sequential(n: int) -> list[RangeRecord]:
    recs = [
        RangeRecord("agent_request", "default", T0 + i * 10 * US, T0 + (i + 1) * 10 * US, TID, PID)
        for i in range(n)
    ]
    return recs + _steps(recs)


def nested(m: int) -> list[RangeRecord]:
    """``m`` ranges each inside the one before (each 1 us shorter at both ends), one step."""
    recs = [
        RangeRecord(f"level{i % 7}", "default", T0 + i * US, T0 + (2 * m - i) * US, TID, PID)
        for i in range(m)
    ]
    return [*recs, RangeRecord("step", "default", T0, T0 + 2 * m * US, TID, PID)]


def _steps(recs: list[RangeRecord]) -> list[RangeRecord]:
    out = []
    for k in range(0, len(recs), PER_STEP):
        part = recs[k : k + PER_STEP]
        start, end = part[0].start_ns, max(r.end_ns for r in part)
        out.append(RangeRecord("step", "default", start, end, TID, PID))
    return out


def folder(work: Path, name: str, records: Callable[[], list[RangeRecord]]) -> Path:
    """The shape's folder, written once."""
    root = work / name
    done = root / ".complete"
    if done.exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    recs = sorted(records(), key=lambda r: r.start_ns)
    write_chrome_trace(root / "rank0.trace.json", [RankTrace(0, recs, role="agent", run="b")])
    done.write_text("")
    return root


def command(args: list[str], timeout: float) -> str:
    """Wall seconds of ``python -m mstx_marks ARGS`` in a fresh process, or ``>T`` (then its
    whole process group is stopped: its file-reading workers too)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = time.monotonic()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, "-m", "mstx_marks", *args], stdout=out,
                                stderr=err, env=env, start_new_session=True)  # fmt: skip
        try:
            status = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return f">{timeout:g}"
        if status != 0:
            err.seek(0)
            raise SystemExit(f"{args} failed ({status}): {err.read()[-2000:]!r}")
    return f"{time.monotonic() - start:.2f}"


def timed(fn: Callable[[], Any]) -> str:
    start = time.perf_counter()
    fn()
    return f"{time.perf_counter() - start:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=100_000, help="requests (overlap, sequential)")
    parser.add_argument("--m", type=int, default=40_000, help="nested ranges")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per command")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "mstx_shapes")
    a = parser.parse_args()
    over = folder(a.work, f"overlap_{a.n}", lambda: overlap(a.n))
    seq = folder(a.work, f"sequential_{a.n}", lambda: sequential(a.n))
    nest = folder(a.work, f"nested_{a.m}", lambda: nested(a.m))
    out = a.work / "out"
    out.mkdir(exist_ok=True)

    def say(what: str, seconds: str) -> None:  # (each as measured: a slow one shows the rest)
        print(json.dumps({what: seconds}), flush=True)

    say(f"summary overlap {a.n} s", command(["summary", str(over), "--json"], a.timeout))
    say(f"summary sequential {a.n} s", command(["summary", str(seq), "--json"], a.timeout))
    drawn = ["summary", str(nest), "--json", "--html", str(out / "n.html"), "--svg",
             str(out / "n.svg")]  # fmt: skip
    say(f"summary --html --svg nested {a.m} s", command(drawn, a.timeout))
    ranges = [((r.pid, r.thread), r.start_ns, -r.end_ns, r.name) for r in overlap(a.n)]
    say(f"breakdown overlap {a.n} s", timed(lambda: breakdown(list(ranges), [])))
    say(f"nested_repeats overlap {a.n} s", timed(lambda: nested_repeats(ranges)))
    say(f"assign_lanes nested {a.m} s", timed(lambda: assign_lanes(nested(a.m))))


if __name__ == "__main__":
    main()
