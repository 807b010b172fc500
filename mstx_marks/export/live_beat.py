"""A process's word to a live reader of the job's files: how far its spill is written.

A live reader (:mod:`mstx_marks.live`: verl's trainer, logging where each step's time went)
reads every process's spill (:mod:`.spill`) as it grows. A spill alone cannot tell it when a
step's figures are complete: a process that recorded nothing new writes nothing, a range still
open is in no file yet, and a killed process falls silent like an idle one. So while the folder
``<out>/live/`` exists (the live reader makes it; without it nothing here runs), each process's
writer thread, after each periodic spill, replaces one small file there,
``<out>/live/<spill name>-<instance>.beat``::

    {"spill": "host-123.jsonl", "pid": 123, "run": "...", "through_ns": T,
     "opens": [[name, domain, start_ns, thread, args], ...]}

``through_ns`` (the recorder's clock, :func:`~mstx_marks.backends.record.now_ns`, read before the
spill's write): every range that ended before it is in the spill; ``opens`` are the ranges open
at that write (they cover at least up to ``through_ns``), at most :data:`MAX_OPENS` of them. The
file is replaced whole (a temporary file renamed over it, no fsync: it is a heartbeat, not a
record), at most every :data:`MIN_GAP_S`. Off the hot path: only the writer thread writes it.

>>> import tempfile, pathlib
>>> out = pathlib.Path(tempfile.mkdtemp())
>>> beat = Beat(out)
>>> beat.due() is None  # no live reader: nothing is written
True
>>> (out / LIVE_FOLDER).mkdir()
>>> t = beat.due()
>>> path = beat.write(t, "h-1.jsonl", "x1", 1, "r1", [])
>>> read_beat(path)["through_ns"] == t
True
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any, Sequence

from mstx_marks.backends.record import now_ns
from mstx_marks.base.records import RangeRecord

__all__ = ["BEAT_SUFFIX", "LIVE_FOLDER", "MAX_OPENS", "MIN_GAP_S", "Beat", "read_beat"]

#: The folder under the out folder that a live reader makes, and the beats go in.
LIVE_FOLDER = "live"
BEAT_SUFFIX = ".beat"
#: The open ranges a beat names at most (a reader takes the earliest one left out as the limit).
MAX_OPENS = 256
#: Beats come at most this often (the writer also wakes when its recorder fills up).
MIN_GAP_S = 0.2


class Beat:
    """The beats of one process's session writing under ``out_dir`` (see the module)."""

    def __init__(self, out_dir: str | Path) -> None:
        self.folder = Path(out_dir) / LIVE_FOLDER
        self._last = 0.0
        self.path: Path | None = None

    def due(self) -> int | None:
        """``now_ns()`` when a beat is to follow this spill (a live reader is there, the last
        beat is old enough), else None: read it *before* the spill's write."""
        now = time.monotonic()
        if now - self._last < MIN_GAP_S or not self.folder.is_dir():
            return None
        self._last = now
        return now_ns()

    def write(
        self,
        through_ns: int | None,
        spill: str,
        instance: str,
        pid: int,
        run: str,
        opens: Sequence[RangeRecord],
    ) -> Path | None:
        """Replace this process's beat (when ``through_ns`` came from :meth:`due`); never raises."""
        if through_ns is None:
            return None
        stem = spill[: -len(".jsonl")] if spill.endswith(".jsonl") else spill
        path = self.path = self.folder / f"{stem}-{instance}{BEAT_SUFFIX}"
        ordered = sorted(opens, key=lambda r: r.start_ns)
        if len(ordered) > MAX_OPENS:  # the rest are not said: the beat vouches for less
            through_ns = min(through_ns, ordered[MAX_OPENS].start_ns)
            ordered = ordered[:MAX_OPENS]
        doc = {
            "spill": spill,
            "pid": pid,
            "run": run,
            "through_ns": through_ns,
            "opens": [
                [r.name, r.domain, r.start_ns, r.thread, _plain(r.args)]
                for r in ordered
                if r.start_ns < through_ns
            ],
        }
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_bytes(json.dumps(doc).encode())
            os.replace(tmp, path)
        except (OSError, ValueError, TypeError):  # a folder removed meanwhile: no beat this time
            with contextlib.suppress(OSError):
                tmp.unlink()
            return None
        return path


def _plain(args: Any) -> Any:
    """What JSON can hold of a range's args (a model step's ``reqs`` and ``tokens``)."""
    if not args:
        return None
    return {str(k): v for k, v in dict(args).items() if isinstance(v, (int, float, str, bool))}


def read_beat(path: str | Path) -> dict[str, Any] | None:
    """The beat at ``path``, or None when it cannot be read (replaced or removed meanwhile, not
    a beat)."""
    try:
        doc = json.loads(Path(path).read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or type(doc.get("through_ns")) is not int:
        return None
    if not isinstance(doc.get("spill"), str) or not isinstance(doc.get("opens"), list):
        return None
    return doc
