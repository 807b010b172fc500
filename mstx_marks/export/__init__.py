"""Write recorded ranges where real tools read them, and read them back.

- :func:`write_chrome_trace` / :func:`read_chrome_trace`: Chrome Trace Event JSON (Perfetto UI,
  chrome://tracing);
- :func:`write_ascend_db` / :func:`read_ascend_db`: the Ascend PyTorch profiler's database, which
  ``msprof-analyze cluster -m mstx_sum`` reads;
- :func:`flush_at_exit`: write both when the process ends or is stopped.

>>> from mstx_marks.backends.record import Recorder
>>> rec = Recorder()
>>> rec.range_end(rec.range_start("gen", "default"), "default")
>>> trace = RankTrace(rank=0, records=rec.records())
>>> chrome_trace([trace])["traceEvents"][-1]["name"]
'gen'
"""

from mstx_marks.base.records import STEP_PHASE, RankTrace, Span, TraceFileError, step_spans
from mstx_marks.export.ascend_db import ascend_db_path, read_ascend_db, write_ascend_db
from mstx_marks.export.chrome import chrome_trace, read_chrome_trace, write_chrome_trace
from mstx_marks.export.files import atomic_path, atomic_write_bytes
from mstx_marks.export.out import flush_at_exit
from mstx_marks.export.process_files import chrome_trace_path, export_rank

__all__ = [
    "STEP_PHASE",
    "RankTrace",
    "Span",
    "TraceFileError",
    "ascend_db_path",
    "atomic_path",
    "atomic_write_bytes",
    "chrome_trace",
    "chrome_trace_path",
    "export_rank",
    "flush_at_exit",
    "read_ascend_db",
    "read_chrome_trace",
    "step_spans",
    "write_ascend_db",
    "write_chrome_trace",
]
