"""``summary --html`` of a run of 50,000 distinct phase names (issue 27, item 14): its time, the
page's size and the table's.

Builds the trace ``tests/test_scale_phases.py`` builds (:func:`test_scale_phases.many_names`: 10
steps, a name per range) with the real writer, then runs the summary with its HTML report in this
process and prints, as JSON: the names, the summary's wall time, the page's bytes and the
table's. The unit test holds the folding at 10,000 names.

    python3 benchmarks/summary_names.py [N] [--check]

``--check`` exits 1 when the page passes :data:`PAGE_BYTES`, the table :data:`TABLE_BYTES` or the
time :data:`SECONDS` (before: a 24.6 MB page that took headless Chromium 75 s to open, 11.2 MB of
table).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from test_scale_phases import many_names  # noqa: E402

from mstx_marks.analysis.summary import run_summary  # noqa: E402
from mstx_marks.export.chrome import write_chrome_trace  # noqa: E402

#: Targets for 50,000 names (``--check``).
PAGE_BYTES, TABLE_BYTES, SECONDS = 10_000_000, 200_000, 20.0


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("names", nargs="?", type=float, default=5e4)
    p.add_argument("--check", action="store_true")
    args = p.parse_args()
    n = int(args.names)
    with tempfile.TemporaryDirectory() as tmp:
        run, page = Path(tmp) / "run", Path(tmp) / "report.html"
        write_chrome_trace(run / "rank0.trace.json", [many_names(n)])
        table = io.StringIO()
        began = time.perf_counter()
        with contextlib.redirect_stdout(table), contextlib.redirect_stderr(io.StringIO()):
            code = run_summary(str(run), html=str(page))
        took = time.perf_counter() - began
        got = {
            "names": n,
            "exit": code,
            "seconds": round(took, 1),
            "page_bytes": page.stat().st_size,
            "table_bytes": len(table.getvalue().encode()),
        }
    print(json.dumps(got, indent=1))
    bounds = {"page_bytes": PAGE_BYTES, "table_bytes": TABLE_BYTES, "seconds": SECONDS}
    over = [f"{key} {got[key]} > {bound}" for key, bound in bounds.items() if got[key] > bound]
    if args.check and (over or code != 0):
        print("; ".join(over) or f"exit {code}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
