"""Issue 35's long run: 3 million events and 200,000 distinct names through ``flush_at_exit``
and ``MSTX_MARKS_OUT`` at once, the recorder's defaults (capacity 1e6, 65,536 names kept), and
the program's peak resident memory, the exit's writes included.

Runs ``tests/support/crash_program.py loop N K`` and reads back what a user reads, as
``tests/test_crash_only.py`` does (:func:`test_crash_only.long_run`: both folders' Chrome trace,
database and ``summary --json`` hold every event, the names past the cap under the placeholder;
a count that is wrong raises). Prints JSON: the events and names, the program's wall time and its
loop's, its peak and its memory after import (MiB), and the whole check's wall time.

    python3 benchmarks/long_run.py [N] [--names K] [--check]

``--check`` exits 1 when the peak passes :data:`PEAK_MIB`. The unit test holds what a run of any
length keeps at 200,000 events (every event; a peak that does not grow with the run's length).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from test_crash_only import long_run  # noqa: E402

#: The most peak resident memory the program may take (MiB, ``--check``): issue 35's bound.
PEAK_MIB = 512


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("events", nargs="?", type=float, default=3e6)
    p.add_argument("--names", type=int, default=200_000)
    p.add_argument("--check", action="store_true")
    args = p.parse_args()
    n = int(args.events)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        # The exit writes both folders' files itself (its peak counts them), however long.
        run = long_run(Path(tmp), n, args.names, MSTX_MARKS_EXIT_SECONDS="3600")
    peak = run.value("peak_mib")
    print(
        json.dumps(
            {
                "events": n,
                "names": args.names,
                "program_s": round(run.seconds, 1),
                "loop_s": round(run.value("loop_ns") / 1e9, 1),
                "peak_mib": peak,
                "after_import_mib": run.value("start_mib"),
                "checked_s": round(time.perf_counter() - started, 1),
            },
            indent=1,
        )
    )
    if args.check and peak > PEAK_MIB:
        print(f"peak {peak} MiB > {PEAK_MIB} MiB", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
