"""The flight recorder's file: completed events appended as they happen, one JSON line each.

A process that records to files spills every completed range and instant from a background
thread, at least once a second, to ``<out>/spill/<host>-<pid>.jsonl`` (append-only, one file per
process, so processes never overwrite each other). A crash, a SIGKILL, an OOM kill or Ray's quick
exit then loses at most the last interval. Anchor: PyTorch's NCCL flight recorder, which keeps
the last collectives of a process that died for the same reason.

What it drained is released from the recorder (``drain(release=True)``): a spilled recording runs
for ever in constant memory, and the exit exports are built from the spill
(:func:`read_spill`). When the spill falls behind, the recorder drops whole chunks; the spill
then warns once and writes ``{"dropped": N}``, which every export carries on.

Lines are written whole or not at all: a write cut short (a full disk) is undone and kept to be
written again, and a reader skips (and counts) a torn line wherever it is. Every line is
bounded: blocks hold at most 8,192 slots (about 260 KB), name and thread tables are split into
lines of at most :data:`TABLE_LINE` bytes, thread names are cut to 200 characters and an
event's arguments past that size are replaced by a note (a reader skips a line past
:data:`MAX_LINE` unread). A reader never drops an event it cannot name: one whose key its
tables do not define (their line was lost) is kept under
:data:`~mstx_marks.backends.record.UNKNOWN_NAME`, counted, and said. The file is opened
with ``O_EXCL | O_NOFOLLOW`` (never through a planted link, never a file that exists: another
process with the same host and pid gets a name of its own) in a folder that is ours. A folder
that refuses the write is named with the reason at the first failure (the lines wait in memory,
up to 64 MB, then are counted as lost); a folder removed while the job runs (``rm -rf``) is
made again at the next write, with what the removed file held copied over, and said once.

The first line is a header (``{"mstx_marks_spill": 2, "pid", "host", "rank", "role", "run",
"instance", "wall_ns", "mono_ns", "anchor_ns", "boot_id"}``: ``boot_id`` names the machine's
boot, the domain of its monotonic clock, see :func:`boot_id`); a final write ends with
``{"complete": true}``; later ``{"rank": N}`` or ``{"role": R}`` lines update what became known
(a rank once torch.distributed is up). Times are the monotonic clock plus ``anchor_ns`` (the
wall clock less the monotonic one when the process began recording:
:func:`~mstx_marks.backends.record.now_ns`), so durations are monotonic and processes share the
wall clock's axis; ``{"clock_step_ns": N}`` says that the wall clock has since moved N ns against
the monotonic one (an NTP step): the times stay on the anchor's axis, N from a wall clock read
now. The reader gives all of these as the trace's :class:`~mstx_marks.base.records.Origin`, and
every file exported from the spill carries it on (the recording process's, not the exporter's).

Events come as blocks, the recorder's columns copied as they are: ``["c", n, keys, starts,
ends, threads]``, each column the base64 of its little-endian array (keys and thread numbers
4 bytes, starts and ends 8: nanoseconds, an instant's end -1, a key of 0 a slot left out), ``n``
the events it holds. Writing a block costs a copy and an encode per column, not a Python object
per event, which keeps the spill ahead of 3e5 ranges a second. Keys and thread numbers are
defined before use by ``{"names": [first_key, [[name, domain], ...]]}`` (from key 1 again after
the recorder was cleared) and ``{"threads": [first, [native_tid, ...]]}``. The few events a block
does not carry are lines of their own, ``[kind, name, domain, start_ns, end_ns, tid]`` with kind
``"r"`` (a range open at an earlier write, ended since), ``"o"`` (a range still open at the last
write, ended then) or ``"i"`` (an instant; ``end_ns`` is null), and a seventh item, an object,
when the event has user arguments (``mark(name, args=...)``; values JSON cannot hold are written
as their ``str``).

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

import base64
import binascii
import contextlib
import functools
import json
import os
import secrets
import socket
import sys
import threading
import time
import weakref
from array import array
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, Sequence

from mstx_marks.backends.record import (
    UNKNOWN_NAME,
    Block,
    DrainCursor,
    Recorder,
    anchor_ns,
    block_records,
    clock_step_ns,
    native_thread_ids,
    thread_names,
)
from mstx_marks.base import VERSION, env
from mstx_marks.base.diagnostics import warn_once
from mstx_marks.base.forking import new_lock
from mstx_marks.base.records import (
    InstantRecord,
    RangeRecord,
    RankTrace,
    Record,
    TraceFileError,
    plain_args,
)
from mstx_marks.export.files import UnsafeOutput, open_new_file, open_regular, our_folder

__all__ = [
    "CLOCK_STEP_NS",
    "MAX_LINE",
    "SPILL_SUFFIX",
    "Spill",
    "boot_id",
    "read_spill",
    "spill_path",
]

SPILL_SUFFIX = ".jsonl"
# Slots per drain: a block line of about 260 KB (under MAX_LINE). Half a chunk: the exit's last
# spill then holds half as much at once, at the same cost per event.
_BATCH = 8192
_FORMAT = 2
_SWAP = sys.byteorder == "big"  # blocks are little-endian on disk
#: A line longer than this is not ours (a spill's lines are short): skipped, counted, never held.
MAX_LINE = 1 << 20
#: The longest table or event line a spill writes (blocks are about 260 KB): well under
#: :data:`MAX_LINE`, whatever the names and arguments recorded.
TABLE_LINE = 256 << 10
#: Unwritten lines kept for the next write when the disk refuses them; past it, they are dropped.
_MAX_PENDING = 64 << 20
_INT64 = 1 << 63
_READ_BATCH_BYTES = 4 << 20
#: A move of the wall clock against the monotonic one this large is a step, written and said
#: (two clocks read one after the other differ by microseconds; NTP steps past 128 ms).
CLOCK_STEP_NS = 100_000_000
#: Where Linux names the current boot of the machine (a random id made at each boot).
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


@functools.cache
def boot_id() -> str:
    """This machine's boot id (read once; ``""`` where the system has none): processes that
    share it share one monotonic clock, whatever their host names (containers copy the host
    name and the machine id from their image, never the boot id).

    >>> boot_id() == boot_id()
    True
    """
    try:
        with open(BOOT_ID_PATH, encoding="ascii", errors="replace") as f:
            return f.read(64).strip()
    except OSError:
        return ""


# The recorders a spill drains: a second spill of the same recorder must not release chunks the
# first has not written yet, so only the sole spill of a recorder releases.
_spills_of: dict[int, weakref.WeakSet[Spill]] = {}
_spills_lock = new_lock()


def spill_path(out_dir: str | Path, pid: int | None = None) -> Path:
    """This process's spill file under ``out_dir`` (its first choice: :class:`Spill` takes
    another name when this one exists)."""
    pid = os.getpid() if pid is None else pid
    return Path(out_dir) / "spill" / f"{_host()}-{pid}{SPILL_SUFFIX}"


_hosts: list[str] = []


def _host() -> str:
    # Asked once: gethostname() is a system call that lets other threads run meanwhile, and a
    # spill made while threads record must take no longer than it needs.
    if not _hosts:
        _hosts.append(socket.gethostname())
    return _hosts[0]


def _line(rec: Record) -> list[Any]:
    if isinstance(rec, InstantRecord):
        line = ["i", rec.name, rec.domain, rec.start_ns, None, rec.thread]
    else:
        kind = "o" if rec.open else "r"
        line = [kind, rec.name, rec.domain, rec.start_ns, rec.end_ns, rec.thread]
    if rec.args:
        line.append(plain_args(rec.args))
    return line


def table_lines(field: str, first: int, values: Sequence[Any]) -> list[str]:
    """``{field: [first, values]}`` as lines of at most :data:`TABLE_LINE` bytes each (a
    reader skips a line past :data:`MAX_LINE`: 300,000 new names in one write made one line
    of 2.2 MB, and every event that used them was lost), split where needed.

    >>> [len(json.loads(line)["names"][1]) for line in table_lines("names", 1, [["a", "d"]] * 1500)]
    [512, 512, 476]
    """
    lines: list[str] = []
    lo, step = 0, 512
    while lo < len(values):
        part = list(values[lo : lo + step])
        line = _dumps({field: [first + lo, part]})
        if len(line) > TABLE_LINE:
            if len(part) > 1:
                step = max(1, step // 2)
                continue
            line = _dumps({field: [first + lo, [_shorten(part[0])]]})  # (no name is this long)
        lines.append(line)
        lo += len(part)
        step = 512
    return lines


def _short(text: str) -> str:
    """A thread's name as the file keeps it: at most 200 characters (a name is a label)."""
    return text if len(text) <= 200 else text[:199] + "\u2026"


def _shorten(value: Any) -> Any:
    if isinstance(value, str):
        return _short(value)
    if isinstance(value, list):
        return [_shorten(v) for v in value]
    return value


def _event_line(rec: Record) -> str:
    """One event's line, at most :data:`TABLE_LINE` bytes: arguments past that are replaced
    by a note of their size (a dict the program filled with a batch, say)."""
    line = _line(rec)
    text = _dumps(line)
    if len(text) > TABLE_LINE and len(line) > 6:
        line[6] = {"mstx_marks": f"arguments of {len(text)} characters left out"}
        text = _dumps(line)
    return text


def _b64(column: array[int]) -> bytes:
    if _SWAP:
        column = array(column.typecode, column)
        column.byteswap()
    return base64.b64encode(column)


def _block_line(block: Block) -> bytes:
    # Bytes throughout: no text copy of the largest lines a spill writes.
    return b'["c",%d,"%s","%s","%s","%s"]' % (
        block.events,
        _b64(block.keys),
        _b64(block.starts),
        _b64(block.ends),
        _b64(block.threads),
    )


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _column(text: Any, typecode: str) -> array[int]:
    if type(text) is not str:
        raise ValueError
    column = array(typecode, base64.b64decode(text, validate=True))
    if _SWAP:
        column.byteswap()
    return column


def _dumps(item: Any) -> str:
    try:
        return json.dumps(item, ensure_ascii=False, default=str)
    except Exception:  # a value whose str() raises, a circle: plain_args made it plain
        return json.dumps(item, ensure_ascii=False, default=lambda v: "<unprintable>")


class Spill:
    """Appends ``recorder``'s completed events to :func:`spill_path`; thread-safe.

    ``write_now()`` appends what completed since the last call. ``start(interval)`` calls it from
    a daemon thread. The file is created at the first event, so a process that records nothing
    leaves no file (and never an empty one beside a real one). Non thread-safe across
    :func:`os.fork`: the child must make its own ``Spill`` (``out.py`` and ``stream.py`` do).
    """

    def __init__(
        self,
        out_dir: str | Path,
        recorder: Recorder,
        *,
        rank: int,
        role: str = "",
        run: str | None = None,
    ) -> None:
        self.path = spill_path(out_dir)
        self.out_dir = Path(out_dir)
        self.recorder = recorder
        self.rank, self.role = rank, role
        self._run = run
        self._instance = ""
        #: Events this spill has written (or holds to write) so far.
        self.events = 0
        self._cursor = DrainCursor()
        # Not an RLock: the writer never re-enters. Signal handlers and os._exit call
        # write_now() with blocking=False, and the exit's signal handling defers signals, so
        # nothing waits on a lock its own thread holds.
        self._lock = new_lock()
        self._fd: int | None = None
        self._stop = threading.Event()
        self._written_rank, self._written_role = rank, role
        self._dropped_written = 0
        #: Encoded lines the disk refused (full): written first at the next write.
        self._pending = b""
        #: Events in ``_pending``, events in the file, and events given up (they waited past
        #: ``_MAX_PENDING`` for a folder that would not take them).
        self._pending_events = self._file_events = self.lost = 0
        #: Why the last write failed (None after a write that worked).
        self.failure: str | None = None
        #: The descriptor of our file after its folder was removed (it still holds what was
        #: written): copied into the file made again in its place.
        self._orphan: int | None = None
        self._started = False  # whether the file has its first lines
        self._step_written = 0  # the wall clock's step the file last said (clock_step_ns)
        #: Whether the last line on disk is the ``complete`` mark (nothing written since).
        self._complete = False
        self._registered = False
        #: How many of the recorder's names (in its generation) and of the process's thread
        #: numbers the file defines so far.
        self._names_sent, self._names_of = 1, recorder.generation
        self._threads_sent = 0

    @property
    def instance(self) -> str:
        """Tells this process apart from another with the same host and pid (made when first
        asked: creating a spill makes no system call)."""
        if not self._instance:
            self._instance = secrets.token_hex(6)
        return self._instance

    @property
    def run(self) -> str:
        """The run of the job this process belongs to (:func:`~mstx_marks.base.env.run_id`)."""
        if self._run is None:
            self._run = env.run_id()
        return self._run

    def _releases(self) -> bool:
        """Whether this spill may release what it drained: it is its recorder's only one."""
        with _spills_lock:
            spills = _spills_of.setdefault(id(self.recorder), weakref.WeakSet())
            if not self._registered:  # at the first write: making a spill stays cheap
                spills.add(self)
                self._registered = True
            return len(spills) <= 1

    def _header(self) -> dict[str, Any]:
        return {
            "mstx_marks_spill": _FORMAT,
            "version": VERSION,  # which mstx_marks wrote it: named when another cannot read it
            "pid": self.recorder.pid,
            "host": socket.gethostname(),
            "rank": self.rank,
            "role": self.role,
            "run": self.run,
            "instance": self.instance,
            # One clock pair per process: wall time to align processes, monotonic to order.
            "wall_ns": time.time_ns(),
            "mono_ns": time.monotonic_ns(),
            # The events' times are mono + anchor (record.now_ns): durations monotonic.
            "anchor_ns": anchor_ns(),
            "boot_id": boot_id(),
        }

    def _open(self) -> int:
        folder = our_folder(self.path.parent)
        candidates = [self.path.name]
        while True:
            name = candidates.pop() if candidates else None
            if name is None:  # taken (another process with our host and pid, or a plant)
                host_pid = self.path.name[: -len(SPILL_SUFFIX)].rsplit("-", 1)
                name = f"{host_pid[0]}-{secrets.token_hex(4)}-{host_pid[-1]}{SPILL_SUFFIX}"
            try:
                fd = open_new_file(folder / name)
            except FileExistsError:
                continue
            self.path = folder / name
            return fd

    def write_now(self, *, final: bool = False, blocking: bool = True) -> Path:
        """Append what completed since the last write; ``final`` adds the ranges still open
        (flagged) and the ``complete`` mark. Returns the file's path (which may not exist:
        nothing recorded)."""
        if not blocking and self._lock.locked():
            return self.path
        # Taken by a ``with``, never ``acquire()`` then ``try``: CPython runs a signal handler
        # right after a call returns, so a Ctrl-C landing as acquire() returned left the lock
        # held for good, and the next write (a range an exit hook records) waited on it for
        # ever. ``with`` enters with no such check before its cleanup covers the block. (Not
        # ``blocking``: a look first; a write another thread begins meanwhile is waited for,
        # and no writer waits on this thread.)
        with self._lock:
            upto = self.recorder.used  # what is recorded by now: threads still recording wait
            # In batches: the memory a spill needs stays flat however much it has to write.
            release = self._releases()
            wrote = False
            while True:
                before = self._cursor.next
                blocks, events = self.recorder.drain_blocks(
                    self._cursor, _BATCH, upto, release=release
                )
                if blocks or events:
                    self._append(events, blocks)
                    wrote = True
                elif self._cursor.next == before:  # nothing new left to look at
                    break
            tail: list[Record] = list(self.recorder.open_ranges(self._cursor)) if final else []
            if tail or not wrote or final:
                # (with nothing to write: a rank, role or drop count that changed)
                self._append(tail, final=final)
            return self.path

    def _meta(self) -> list[dict[str, object]]:
        meta: list[dict[str, object]] = []
        step = clock_step_ns()
        if abs(step - self._step_written) >= CLOCK_STEP_NS:
            meta.append({"clock_step_ns": step})
            self._step_written = step
            warn_once(
                ("clock step", id(self)),
                f"the wall clock moved {step / 1e9:+.3f} s against the monotonic clock while"
                " this process recorded (an NTP step, a clock set by hand, a suspend):"
                " durations are unaffected (monotonic); this process's times stay on the wall"
                " clock as it read at the start, which may put them that far from those of"
                f" processes started since (the spill says it: clock_step_ns in {self.path})",
            )
        if self.rank != self._written_rank:
            meta.append({"rank": self.rank})
        if self.role != self._written_role:
            meta.append({"role": self.role})
        dropped = self.recorder.dropped
        if dropped > self._dropped_written:
            meta.append({"dropped": dropped})
            warn_once(
                ("spill fell behind", id(self)),
                f"the recorder was full and dropped {dropped} events: the spill to {self.path}"
                " fell behind (the drop is counted in the spill, the exports and the summary)",
            )
        return meta

    def _tables(self) -> list[str]:
        """The lines defining the names and thread numbers the file does not define yet (all
        the blocks drained so far use: both only grow, and a key is set before it is used)."""
        lines = []
        rec = self.recorder
        if rec.generation != self._names_of:  # cleared: keys start at 1 again
            self._names_sent, self._names_of = 1, rec.generation
        names = rec.names(self._names_sent)
        if names:
            lines += table_lines("names", self._names_sent, names)
            self._names_sent += len(names)
        threads = native_thread_ids(self._threads_sent)
        if threads:
            first = self._threads_sent
            lines += table_lines("threads", first, threads)
            named = [_short(n) for n in thread_names(first)[: len(threads)]]
            lines += table_lines("thread_names", first, named)
            self._threads_sent += len(threads)
        return lines

    def _append(
        self, events: list[Record], blocks: Sequence[Block] = (), *, final: bool = False
    ) -> None:
        if self._fd is None and not (events or blocks or self.recorder.dropped or self._pending):
            return  # a file is made for events only
        meta = self._meta()
        if final and not self._complete:
            meta.append({"complete": True})
        if not events and not blocks and not meta and not self._pending:
            return
        parts = [_utf8("\n".join(self._tables()))] if blocks else []
        parts += [_block_line(b) for b in blocks]
        # Events a block does not carry are few (ranges that outlived a write, events with args).
        lines = [_event_line(e) for e in events] + [json.dumps(m) for m in meta]
        parts.append(_utf8("\n".join(lines)))
        count = len(events) + sum(b.events for b in blocks)
        self.events += count
        self._pending_events += count
        data = b"\n".join([p for p in parts if p] + [b""])  # (the last line's end)
        if self._pending:
            data = self._pending + data
        self._pending = data  # until it is on disk
        self._complete = final
        self._written_rank, self._written_role = self.rank, self.role
        self._dropped_written = self.recorder.dropped
        try:
            if self._fd is not None and not self._still_there(self._fd):
                self._orphan, self._fd = self._fd, None
            if self._fd is None:
                self._fd, self._started = self._open(), False
            if not self._started:  # the file's first lines: its header, or the removed file's
                removed = self._orphan is not None
                if not self._copy_orphan(self._fd):
                    self._write_whole(self._first_lines(tables=removed))
                self._started = True
            self._write_whole(data)
        except OSError as exc:
            self._failed(exc)
            self._give_up_past_limit()
            raise
        self._pending, self.failure = b"", None
        self._file_events += self._pending_events
        self._pending_events = 0

    def _first_lines(self, *, tables: bool) -> bytes:
        """A new file's header; with ``tables``, also every name and thread number defined so
        far (a file made again whose old content was lost: later blocks use those keys)."""
        lines = [json.dumps(self._header())]
        if tables and self._names_sent > 1:
            lines += table_lines("names", 1, self.recorder.names(1)[: self._names_sent - 1])
        if tables and self._threads_sent:
            sent = self._threads_sent
            lines += table_lines("threads", 0, native_thread_ids(0)[:sent])
            lines += table_lines("thread_names", 0, [_short(n) for n in thread_names(0)[:sent]])
        return _utf8("\n".join(lines) + "\n")

    def _give_up_past_limit(self) -> None:
        """Lines that waited past :data:`_MAX_PENDING` are given up: their events counted in
        :attr:`lost` and said, and the name and thread tables sent again with the next block
        (the lines given up defined some of the keys later blocks use)."""
        if len(self._pending) <= _MAX_PENDING:
            return
        self._pending = b""
        self.lost += self._pending_events
        self._pending_events = 0
        self._names_sent, self._threads_sent = 1, 0
        warn_once(
            ("spill lost", id(self)),
            f"cannot write {env.shown(self.out_dir)}: {self.failure}: {self.lost} events waited"
            f" past {_MAX_PENDING >> 20} MB for it and are lost (the exit says how many in"
            " all)",
        )

    def _failed(self, exc: OSError) -> None:
        first = self.failure is None
        self.failure = exc.strerror or str(exc) or type(exc).__name__
        if first:  # (said once for the folder: activation may have said it already)
            warn_once(
                ("cannot write", str(self.out_dir)),
                f"cannot write {env.shown(self.out_dir)}: {self.failure}; the events wait in"
                f" memory (at most {_MAX_PENDING >> 20} MB) for a write there that works",
            )

    def _still_there(self, fd: int) -> bool:
        """Whether our file is still at :attr:`path` (its folder may have been removed, say by
        ``rm -rf`` while the job ran: writes would go on into a file no one can open)."""
        try:
            here, ours = os.stat(self.path), os.fstat(fd)
        except OSError:
            return False
        return (here.st_dev, here.st_ino) == (ours.st_dev, ours.st_ino)

    def _copy_orphan(self, fd: int) -> bool:
        """Copy what the removed file held into ``fd``, the file made again in its place; whether
        it was (no orphan, or none to copy: the caller writes a header). Read through
        ``/proc/self/fd``, where the open descriptor still reaches the removed file (Linux)."""
        orphan = self._orphan
        if orphan is None:
            return False
        self._orphan = None
        copied = False
        try:
            with open(f"/proc/self/fd/{orphan}", "rb") as src:
                while chunk := src.read(1 << 20):
                    self._write_whole(chunk)
                    copied = True
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            copied = False
        finally:
            with contextlib.suppress(OSError):
                os.close(orphan)
        if copied:
            kept = f"the {self._file_events} events spilled before are kept (copied)"
        else:
            kept = f"the {self._file_events} events spilled before are lost"
            self.lost += self._file_events
            self._file_events = 0
        warn_once(
            ("folder removed", str(self.out_dir)),
            f"{env.shown(self.out_dir)} was removed while the job ran: made again; {kept}",
        )
        return copied

    @property
    def unwritten(self) -> int:
        """Events recorded but in no file: waiting for a write that works, or given up."""
        return self._pending_events + self.lost

    def _write_whole(self, data: bytes) -> None:
        """Write ``data`` (whole lines) or nothing: a write cut short (a full disk) is undone
        (the caller keeps the lines to write first next time, up to :data:`_MAX_PENDING`)."""
        fd = self._fd
        assert fd is not None
        start = os.lseek(fd, 0, os.SEEK_END)
        done = 0
        try:
            while done < len(data):
                n = os.write(fd, data[done:])
                if n <= 0:
                    raise OSError("no progress")
                done += n
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)  # undo the torn part: lines whole, or none
            raise

    @property
    def pending(self) -> bytes:
        """Encoded lines not on disk yet (the disk refused them): the exit export reads them."""
        return self._pending

    @contextlib.contextmanager
    def on_disk(self) -> Iterator[tuple[Path | None, bytes]]:
        """Everything this spill wrote, as a file and the lines the disk still refused (what
        the exports are streamed from, once the recorder released what was spilled): the
        spill itself; or, when its folder never took a line, a file of its own with the
        header and those lines, so the exports can still go to folders that can be written;
        or None when nothing was recorded."""
        with self._lock:
            pending, started = self._pending, self._started
        if started and self.path.exists():
            yield self.path, pending
            return
        if not pending:
            yield None, b""
            return
        import tempfile

        with tempfile.TemporaryDirectory(prefix="mstx_marks-") as tmp:
            alone = Path(tmp) / self.path.name
            alone.write_bytes((json.dumps(self._header()) + "\n").encode() + pending)
            yield alone, b""

    def start(self, interval: float = 0.5) -> None:
        """Write every ``interval`` seconds from a daemon thread until :meth:`stop` (or until
        nothing else holds this spill: the thread keeps only a weak reference)."""
        ref, stop = weakref.ref(self), self._stop

        def loop() -> None:
            while not stop.wait(interval):
                spill = ref()
                if spill is None:
                    return
                with contextlib.suppress(Exception):  # a full disk must not end the thread
                    spill.write_now()
                del spill

        threading.Thread(target=loop, name="mstx_marks spill", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()


def _lines(f: BinaryIO, skipped: list[int]) -> Iterator[bytes]:
    """The file's lines, each at most :data:`MAX_LINE` long (longer ones are skipped and
    counted): memory stays that of one block, whatever the file holds."""
    rest = b""
    too_long = False
    while True:
        block = f.read(1 << 20)
        if not block:
            break
        parts = (rest + block).split(b"\n")
        rest = parts.pop()
        for part in parts:
            if too_long:
                too_long = False
                skipped[0] += 1
                continue
            yield part
        if len(rest) > MAX_LINE:
            rest, too_long = b"", True
    if too_long:
        skipped[0] += 1
    elif rest:
        yield rest


class _Reader:
    """One spill's lines turned into records (see :func:`read_spill`)."""

    def __init__(self, path: Path, header: dict[str, Any]) -> None:
        self.path = path
        #: The header's values that cannot be used, each said (what it holds, what is used).
        self.unusable: list[str] = []
        self.pid = self._count(header, "pid")
        self.rank = self._count(header, "rank")
        self.role = str(header.get("role") or "")
        self.run = str(header.get("run") or "")
        self.instance = str(header.get("instance") or "")
        self.host = str(header.get("host") or "")
        anchor = header.get("anchor_ns")
        self.anchor_ns = anchor if type(anchor) is int else None
        self.boot_id = str(header.get("boot_id") or "")
        #: The last ``clock_step_ns`` said (see the module's docstring).
        self.clock_step_ns = 0
        self.records: list[Record] = []
        #: Where records go: ``records.append``, or a caller's sink (then only open ranges,
        #: few, are held here until the end, to keep each range once: see :func:`_latest`).
        self.sink: Callable[[Record], object] = self.records.append
        self.opens: list[RangeRecord] = []
        #: Ranges written open and then ended (by their key): kept once, as ended.
        self.ended: set[tuple[str, str, int, int]] = set()
        self.skipped = self.dropped = 0
        #: Events whose name (or thread) the file's tables do not define: kept, as
        #: :data:`~mstx_marks.backends.record.UNKNOWN_NAME`.
        self.unnamed = [0]
        self.complete = False
        #: The file's tables so far (see the module's docstring).
        self.names: dict[int, tuple[str, str]] = {}
        self.threads: dict[int, int] = {}
        #: Thread number -> the name the thread had when it first recorded.
        self.thread_names: dict[int, str] = {}

    def _count(self, header: dict[str, Any], field: str) -> int:
        """The header's ``field``, an int >= 0; else 0, and said in ``unusable`` (a rank of
        ``Infinity`` or ``"3"`` is not rank 0 without a word)."""
        value = header.get(field)
        if value is None or (type(value) is int and 0 <= value < _INT64):
            return value or 0
        shown = json.dumps(value)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        self.unusable.append(f"its header's {field} is {shown}, not an int >= 0: read as 0")
        return 0

    def feed(self, lines: list[bytes]) -> None:
        if not lines:
            return
        try:
            items = json.loads(b"[" + b",".join(lines) + b"]")
        except ValueError:
            items = None
        if items is None or len(items) != len(lines):  # a torn or junk line among them
            items = []
            for line in lines:
                try:
                    items.append(json.loads(line))
                except ValueError:
                    self.skipped += 1
        for item in items:
            self._item(item)

    def _item(self, item: Any) -> None:
        if type(item) is dict:
            self._meta(item)
            return
        self.complete = False
        try:
            if item[0] == "c":
                self._block(item)
                return
            kind, name, domain, start, end, tid = item[:6]
            args = item[6] if len(item) > 6 and type(item[6]) is dict else None
            if type(name) is not str or type(domain) is not str or not _ok(start, tid):
                raise ValueError
            if kind == "i":
                rec: Record = InstantRecord(name, domain, start, tid, self.pid, args)
            elif kind == "o" and _ok(end) and end >= start:
                self.opens.append(RangeRecord(name, domain, start, end, tid, self.pid, True, args))
                return
            elif kind == "r" and _ok(end) and end >= start:
                rec = RangeRecord(name, domain, start, end, tid, self.pid, False, args)
                if self.opens:  # its open copy, written by an earlier final write, is void
                    self.ended.add((name, domain, start, tid))
            else:
                raise ValueError
        except (TypeError, ValueError, KeyError, IndexError):
            self.skipped += 1
            return
        self.sink(rec)

    def _block(self, item: list[Any]) -> None:
        try:
            _, _, keys, starts, ends, threads = item
            block = Block(
                _column(keys, "I"), _column(starts, "q"), _column(ends, "q"), _column(threads, "I")
            )
            if not len(block.keys) == len(block.starts) == len(block.ends) == len(block.threads):
                raise ValueError
        except (ValueError, TypeError, binascii.Error):
            held = _int(item[1], 1) if len(item) > 1 else 1
            self.skipped += min(max(held, 1), MAX_LINE)  # the events it said it held
            return
        self.skipped += block_records(
            block, self.names, self.threads, self.pid, self.sink, self.unnamed
        )

    def _table(self, item: dict[str, Any]) -> bool:
        """Take a ``names``, ``threads`` or ``thread_names`` line; whether it was one."""
        field = next((f for f in ("names", "threads", "thread_names") if f in item), None)
        if field is None:
            return False
        try:
            first, values = item[field]
            for i, value in enumerate(values, _int(first, 0)):
                if field == "threads":
                    self.threads[i] = _int(value, 0)
                elif field == "thread_names":
                    if type(value) is str:
                        self.thread_names[i] = value
                elif type(value) is list and len(value) == 2 and all(type(v) is str for v in value):
                    self.names[i] = (value[0], value[1])
        except (TypeError, ValueError):
            self.skipped += 1
        return True

    def _meta(self, item: dict[str, Any]) -> None:
        if self._table(item):
            return
        if item.get("complete") is True:
            self.complete = True
            return
        self.complete = False
        if "rank" in item:
            self.rank = _int(item["rank"], self.rank)
        if "role" in item:
            self.role = str(item["role"])
        if "dropped" in item:
            self.dropped = max(self.dropped, _int(item["dropped"], 0))
        step = item.get("clock_step_ns")
        if type(step) is int and _ok(step):
            self.clock_step_ns = step


def _ok(*values: Any) -> bool:
    return all(type(v) is int and -_INT64 <= v < _INT64 for v in values)


def _int(value: Any, default: int) -> int:
    return value if type(value) is int and -_INT64 <= value < _INT64 else default


def _other_format(header: dict[str, Any]) -> str:
    """What to say of a spill of another format: which format (and mstx_marks) wrote it, and
    which this one reads. A spill is a crash-safe scratch file, read back by the version that
    wrote it; its Chrome trace and database are the files kept across versions.

    >>> print(_other_format({"mstx_marks_spill": 1}))  # doctest: +NORMALIZE_WHITESPACE
    is a mstx_marks spill of format 1 (from a mstx_marks before 0.1.0); this mstx_marks 0.1.0
    reads format 2 only: summarise it with the mstx_marks that wrote it, or use its Chrome
    trace or database
    """
    written = header.get("mstx_marks_spill")
    by = header.get("version")
    source = (
        f"mstx_marks {env.shown(by, 40)}"
        if isinstance(by, str)
        else f"a mstx_marks before {VERSION}"
    )
    return (
        f"is a mstx_marks spill of format {env.shown(written, 40)} (from {source}); this"
        f" mstx_marks {VERSION} reads format {_FORMAT} only: summarise it with the mstx_marks"
        " that wrote it, or use its Chrome trace or database"
    )


def read_spill(
    path: str | Path,
    *,
    extra: bytes = b"",
    sink: Callable[[Record], object] | None = None,
    unusable: list[str] | None = None,
) -> RankTrace:
    """Read one spill file as one process's trace, in bounded memory per line: a torn or
    malformed line (anywhere: a crash mid-write, a disk that filled) is skipped and counted in
    ``skipped``; ``dropped`` says how many events the recorder dropped; ``complete`` whether
    the file ends with its writer's final write. ``extra`` is more lines, read after the file.

    With ``sink``, each record is handed to it instead of kept (in file order, not sorted; the
    ranges flagged open come last), and the trace returned has no records: memory stays that of
    one batch of lines, whatever the file holds.

    A header value that cannot be used (a rank of ``Infinity``, a negative pid) is read as 0,
    and said in ``unusable`` when given (the field, the value, what was used).

    Raises :class:`~mstx_marks.base.records.TraceFileError` naming the file when it is not a spill.
    """
    path = Path(path)
    skipped = [0]
    try:
        with open_regular(path) as f:
            lines = _lines(f, skipped)
            first = next(lines, b"")
            try:
                header = json.loads(first)
            except ValueError:
                header = None
            if not isinstance(header, dict) or "mstx_marks_spill" not in header:
                raise TraceFileError(path, "is not a mstx_marks spill file (no header line)")
            if header["mstx_marks_spill"] != _FORMAT:
                raise TraceFileError(path, _other_format(header))
            reader = _Reader(path, header)
            if unusable is not None:
                unusable += reader.unusable
            if sink is not None:
                reader.sink = sink
            batch: list[bytes] = []
            size = 0
            for line in lines:
                if line.strip():
                    batch.append(line)
                    size += len(line)
                # Batches of a few MB at most: a block line holds thousands of events.
                if len(batch) >= 4096 or size >= _READ_BATCH_BYTES:
                    reader.feed(batch)
                    batch, size = [], 0
            reader.feed(batch)
    except OSError as e:
        raise TraceFileError(path, f"cannot be read ({e.strerror or e})") from e
    if extra:
        reader.feed([line for line in extra.split(b"\n") if line.strip()])
    reader.skipped += skipped[0]
    if reader.unnamed[0] and unusable is not None:
        unusable.append(
            f"{reader.unnamed[0]} events name a name its tables do not define (a lost line):"
            f" kept, named {UNKNOWN_NAME!r}"
        )
    records = reader.records
    records += _latest_open(reader.opens, reader.ended)
    if sink is not None:
        for rec in records:
            sink(rec)
        records = []
    records.sort(key=lambda r: r.start_ns)
    return RankTrace(
        reader.rank,
        records,
        [],
        path,
        role=reader.role,
        run=reader.run,
        instance=reader.instance,
        host=reader.host,
        anchor_ns=reader.anchor_ns,
        boot_id=reader.boot_id,
        clock_step_ns=reader.clock_step_ns,
        dropped=reader.dropped,
        skipped=reader.skipped,
        complete=reader.complete,
        thread_names={
            reader.threads[n]: name
            for n, name in reader.thread_names.items()
            if n in reader.threads
        },
    )


def _latest_open(
    opens: list[RangeRecord], ended: set[tuple[str, str, int, int]]
) -> list[RangeRecord]:
    """Each range once: a range written as open by one final write (a signal's flush, then
    the exit's) and later as ended (its key in ``ended``), or open twice, is kept as its last
    word."""
    latest: dict[tuple[str, str, int, int], RangeRecord] = {}
    for r in opens:
        key = (r.name, r.domain, r.start_ns, r.thread)
        if key not in ended and r.end_ns >= latest.get(key, r).end_ns:
            latest[key] = r
    return list(latest.values())


__all__ += ["UnsafeOutput"]
