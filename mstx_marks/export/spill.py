"""The flight recorder's file: completed events appended as they happen, one JSON line each.

A process that records to files spills every completed range and instant from a background
thread, at least once a second, to ``<out>/spill/<host>-<pid>.jsonl`` (append-only, one file per
process, so processes never overwrite each other). A crash, a SIGKILL, an OOM kill or Ray's quick
exit then loses at most the last interval, and a torn last line is the only damage a crash can
do: the reader skips it. Anchor: PyTorch's NCCL flight recorder, which keeps the last
collectives of a process that died for the same reason.

The first line is a header (``{"mstx_marks_spill": 1, "pid", "host", "rank", "role", "wall_ns",
"mono_ns"}``); later ``{"rank": N}`` or ``{"role": R}`` lines update what became known (a
rank once torch.distributed is up). Each event is ``[kind, name, domain, start_ns, end_ns, tid]``
with kind ``"r"`` (a range), ``"o"`` (a range still open at the last write, ended then) or ``"i"``
(an instant; ``end_ns`` is null), and a seventh item, an object, when the event has user
arguments (``mark(name, args=...)``; values JSON cannot hold are written as their ``str``).

>>> import tempfile, pathlib
>>> from mstx_marks.backends.record import Recorder
>>> rec = Recorder()
>>> rec.range_end(rec.range_start("step", "default"), "default")
>>> spill = Spill(tempfile.mkdtemp(), rec, rank=0, role="trainer")
>>> path = spill.write_now()
>>> t = read_spill(path)
>>> (t.rank, t.role, [r.name for r in t.records])
(0, 'trainer', ['step'])
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from mstx_marks.backends.record import DrainCursor, Recorder
from mstx_marks.base.records import InstantRecord, RangeRecord, RankTrace, Record, TraceFileError

__all__ = ["SPILL_SUFFIX", "Spill", "read_spill", "spill_path"]

SPILL_SUFFIX = ".jsonl"
_BATCH = 4096  # events per write
_FORMAT = 1


def spill_path(out_dir: str | Path, pid: int | None = None) -> Path:
    """This process's spill file under ``out_dir``."""
    pid = os.getpid() if pid is None else pid
    return Path(out_dir) / "spill" / f"{socket.gethostname()}-{pid}{SPILL_SUFFIX}"


def _line(rec: Record) -> list[Any]:
    if isinstance(rec, InstantRecord):
        line = ["i", rec.name, rec.domain, rec.start_ns, None, rec.thread]
    else:
        kind = "o" if rec.open else "r"
        line = [kind, rec.name, rec.domain, rec.start_ns, rec.end_ns, rec.thread]
    if rec.args:
        line.append(dict(rec.args))
    return line


class Spill:
    """Appends ``recorder``'s completed events to :func:`spill_path`; thread-safe.

    ``write_now()`` appends what completed since the last call. ``start(interval)`` calls it from
    a daemon thread. The file is created at the first event, so a process that records nothing
    leaves no file (and never an empty one beside a real one). Non thread-safe across
    :func:`os.fork`: the child must make its own ``Spill`` (``out.py`` does, at fork).
    """

    def __init__(
        self, out_dir: str | Path, recorder: Recorder, *, rank: int, role: str = ""
    ) -> None:
        self.path = spill_path(out_dir)
        self.recorder = recorder
        self.rank, self.role = rank, role
        self._cursor = DrainCursor()
        # Not an RLock: the writer never re-enters. Signal handlers and os._exit call
        # write_now() with blocking=False, so they can never wait on a lock the thread they
        # interrupted holds.
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._stop = threading.Event()
        self._written_rank, self._written_role = rank, role
        # (name, domain) -> their JSON text: events repeat a few names, and encoding each
        # event with json.dumps costs several times the rest of the spill.
        self._quoted: dict[tuple[str, str], str] = {}

    def _encode(self, events: list[Record]) -> list[str]:
        quoted, out = self._quoted, []
        for e in events:
            if e.args:
                out.append(json.dumps(_line(e), ensure_ascii=False, default=str))
                continue
            nd = quoted.get((e.name, e.domain))
            if nd is None:
                nd = quoted[(e.name, e.domain)] = (
                    json.dumps(e.name, ensure_ascii=False) + "," + json.dumps(e.domain)
                )
            if isinstance(e, InstantRecord):
                out.append(f'["i",{nd},{e.start_ns},null,{e.thread}]')
            else:
                out.append(f'["{"o" if e.open else "r"}",{nd},{e.start_ns},{e.end_ns},{e.thread}]')
        return out

    def _open(self) -> int:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
        header = {
            "mstx_marks_spill": _FORMAT,
            "pid": self.recorder.pid,
            "host": socket.gethostname(),
            "rank": self.rank,
            "role": self.role,
            # One clock pair per process: wall time to align processes, monotonic to order.
            "wall_ns": time.time_ns(),
            "mono_ns": time.monotonic_ns(),
        }
        os.write(fd, (json.dumps(header) + "\n").encode())
        return fd

    def write_now(self, *, final: bool = False, blocking: bool = True) -> Path:
        """Append what completed since the last write; ``final`` adds the ranges still open
        (flagged). Returns the file's path (which may not exist: nothing recorded)."""
        if not self._lock.acquire(blocking=blocking):
            return self.path
        try:
            # In batches: the memory a spill needs stays flat however much it has to write.
            wrote = False
            upto = self.recorder.used  # what is recorded by now: threads still recording wait
            while True:
                before = self._cursor.next
                events = self.recorder.drain(self._cursor, _BATCH, upto)
                if events:
                    self._append(events)
                    wrote = True
                elif self._cursor.next == before:  # nothing new left to look at
                    break
            tail: list[Record] = list(self.recorder.open_ranges(self._cursor)) if final else []
            if tail or not wrote:
                self._append(tail)  # (with nothing to write: a rank or role that changed)
            return self.path
        finally:
            self._lock.release()

    def _append(self, events: list[Record]) -> None:
        meta: list[dict[str, object]] = []
        if self.rank != self._written_rank:
            meta.append({"rank": self.rank})
        if self.role != self._written_role:
            meta.append({"role": self.role})
        if not events and (self._fd is None or not meta):
            return
        if self._fd is None:
            self._fd = self._open()
            meta = []  # the header has them
        lines = [json.dumps(m) for m in meta]
        lines += self._encode(events)
        # One write per batch: a crash tears at most the last line.
        os.write(self._fd, ("\n".join(lines) + "\n").encode("utf-8", "surrogatepass"))
        self._written_rank, self._written_role = self.rank, self.role

    def start(self, interval: float = 0.5) -> None:
        """Write every ``interval`` seconds from a daemon thread until :meth:`stop`."""

        def loop() -> None:
            while not self._stop.wait(interval):
                try:
                    self.write_now()
                except Exception:  # a full disk must not kill the thread for good
                    continue

        threading.Thread(target=loop, name="mstx_marks spill", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()


def read_spill(path: str | Path) -> RankTrace:
    """Read one spill file as one process's trace; a torn last line is skipped.

    Raises :class:`~mstx_marks.base.records.TraceFileError` naming the file when it is not a spill.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise TraceFileError(path, f"cannot be read ({e.strerror})") from e
    lines = raw.split(b"\n")
    try:
        header = json.loads(lines[0])
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("mstx_marks_spill") != _FORMAT:
        raise TraceFileError(path, "is not a mstx_marks spill file (no header line)")
    pid, rank, role = int(header.get("pid", 0)), int(header.get("rank", 0)), header.get("role", "")
    records: list[Record] = []
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError:
            if number == len(lines) or not any(x.strip() for x in lines[number:]):
                break  # the torn last line of a process that died mid-write
            raise TraceFileError(path, f"line {number} is not JSON") from None
        if isinstance(item, dict):
            rank = int(item.get("rank", rank))
            role = str(item.get("role", role))
            continue
        try:
            kind, name, domain, start, end, tid, *more = item
            args = more[0] if more and isinstance(more[0], dict) else None
            if kind == "i":
                records.append(
                    InstantRecord(str(name), str(domain), int(start), int(tid), pid, args)
                )
            else:
                records.append(
                    RangeRecord(str(name), str(domain), int(start), int(end), int(tid), pid,
                                kind == "o", args)
                )  # fmt: skip
        except (TypeError, ValueError) as e:
            raise TraceFileError(path, f"line {number} is not an event ({e})") from None
    records.sort(key=lambda r: r.start_ns)
    return RankTrace(rank, _latest(records), [], path, role=str(role))


def _latest(records: list[Record]) -> list[Record]:
    """Each range once: a range written as open by one final write (a signal's flush, then
    the exit's) and later as ended, or open twice, is kept as its last word."""

    def key(r: RangeRecord) -> tuple[str, str, int, int]:
        return (r.name, r.domain, r.start_ns, r.thread)

    opens = [r for r in records if isinstance(r, RangeRecord) and r.open]
    if not opens:
        return records
    ended = {key(r) for r in records if isinstance(r, RangeRecord) and not r.open}
    latest: dict[tuple[str, str, int, int], RangeRecord] = {}
    for r in opens:
        if key(r) not in ended and r.end_ns >= latest.get(key(r), r).end_ns:
            latest[key(r)] = r
    kept = {id(r) for r in latest.values()}
    return [r for r in records if not (isinstance(r, RangeRecord) and r.open) or id(r) in kept]
