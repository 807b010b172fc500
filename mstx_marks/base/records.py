"""What was recorded, independent of any backend: ranges, instants, and one rank's trace.

The recorder produces these, the exporters write them, and the readers (summary, timeline, the
file readers) consume them; none of those depends on a backend.

A range always has an end: one still running when it was read is ended at that moment and
flagged ``open``, so the step in progress at a crash or a SIGTERM stays visible. An instant has
no end at all. ``kind`` tells the two apart without an ``isinstance``.

>>> r = RangeRecord("step", "default", 100, 250, thread=7, pid=42)
>>> i = InstantRecord("weights_synced", "default", 120, thread=7, pid=42)
>>> t = RankTrace(0, [r, i])
>>> [x.kind for x in t.records], t.ranges[0].duration_ns, t.with_steps().steps
(['range', 'instant'], 150, [(100, 250)])
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, Iterable, List, Literal, Mapping, NamedTuple, Optional, Tuple, Union

__all__ = [
    "CLOCK_DOMAIN",
    "ROUND_TRIP",
    "STEP_PHASE",
    "InstantRecord",
    "Member",
    "Origin",
    "RangeRecord",
    "RankTrace",
    "Record",
    "RoundTrip",
    "Span",
    "TraceFileError",
    "plain_args",
    "step_spans",
]

#: The range name whose occurrences delimit training steps (verl's trainer ``step`` timer).
STEP_PHASE = "step"

#: ``(start_ns, end_ns)`` of one step.
Span = Tuple[int, int]


class RangeRecord(NamedTuple):
    """One range: ``end_ns`` is when it ended, or, when ``open``, when it was read unfinished."""

    name: str
    domain: str
    start_ns: int
    end_ns: int
    thread: int
    pid: int
    open: bool = False
    #: What the user attached (``mark(name, args={...})``); ``None`` when nothing was.
    args: Optional[Mapping[str, Any]] = None

    @property
    def kind(self) -> Literal["range"]:
        return "range"

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


class InstantRecord(NamedTuple):
    """One instant event (an MSTX ``mark``): a point in time, no end."""

    name: str
    domain: str
    start_ns: int
    thread: int
    pid: int
    #: What the user attached (``instant(name, args={...})``); ``None`` when nothing was.
    args: Optional[Mapping[str, Any]] = None

    @property
    def kind(self) -> Literal["instant"]:
        return "instant"


Record = Union[RangeRecord, InstantRecord]


class TraceFileError(ValueError):
    """A trace file that cannot be read; the message starts with the file's path.

    >>> str(TraceFileError("r0.db", "no MSTX_EVENTS table"))
    'r0.db: no MSTX_EVENTS table'
    """

    def __init__(self, path: str | Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = Path(path)
        self.problem = problem


class Member(NamedTuple):
    """Who a trace is in the job: its process's role, then its rank. Reports group by role, then
    rank, and never merge two roles: one GPU's trainer, FSDP workers and vLLM engine processes
    all say rank 0. Sorts by role, then rank (``""``, no role known, first). ``process`` tells
    apart processes that run at once under one role and rank (four engines that all say rank
    0): each is its own lane of the per-step analysis; ``""`` for the one process of a member.

    >>> m = Member("WorkerDict", 1)
    >>> m.label, m.key, Member("", 1).label, Member("", 1).key
    ('WorkerDict rank 1', 'WorkerDict:1', 'rank 1', '1')
    >>> e = Member("EngineCore", 0, "pid 7")
    >>> e.label, e.key
    ('EngineCore rank 0 (pid 7)', 'EngineCore:0:pid 7')
    """

    role: str
    rank: int
    process: str = ""

    @property
    def label(self) -> str:
        """For people: ``WorkerDict rank 1``, or ``rank 1`` when the role is unknown."""
        label = f"{self.role} rank {self.rank}" if self.role else f"rank {self.rank}"
        return f"{label} ({self.process})" if self.process else label

    @property
    def key(self) -> str:
        """For JSON keys: ``WorkerDict:1``, or ``1`` when the role is unknown."""
        key = f"{self.role}:{self.rank}" if self.role else str(self.rank)
        return f"{key}:{self.process}" if self.process else key


class Origin(NamedTuple):
    """Where a process recorded and on which clock: its host's name, the boot id of its
    machine (``/proc/sys/kernel/random/boot_id``: the domain of its monotonic clock; ``""``
    when not known), its clock anchor (the wall clock less the monotonic one when it began:
    its times are the monotonic clock plus this) and how far the wall clock has since moved
    against the monotonic one (a step said, not applied: its times stay on the anchor's axis).

    >>> Origin("h1", "b00t", 5).known, Origin().known
    (True, False)
    """

    host: str = ""
    boot_id: str = ""
    anchor_ns: Optional[int] = None
    clock_step_ns: int = 0

    @property
    def known(self) -> bool:
        """Whether it says anything (a file of another tool, or an older one, says nothing)."""
        return bool(self.host or self.boot_id) or self.anchor_ns is not None

    def fields(self) -> Dict[str, Any]:
        """What a file keeps of it (the fields it knows), as JSON values.

        >>> Origin("h1", "", 5).fields()
        {'host': 'h1', 'anchor_ns': 5}
        """
        said = {k: v for k, v in self._asdict().items() if v is not None and v != ""}
        if not self.clock_step_ns:
            del said["clock_step_ns"]
        return said

    @classmethod
    def of(cls, fields: Mapping[str, Any]) -> Origin:
        """The origin ``fields`` say (:meth:`fields`' keys); a value of the wrong type is not
        taken (read as not known).

        >>> Origin.of({"host": "h1", "anchor_ns": 5, "boot_id": 3})
        Origin(host='h1', boot_id='', anchor_ns=5, clock_step_ns=0)
        """

        def text(key: str) -> str:
            value = fields.get(key)
            return value if isinstance(value, str) else ""

        def integer(key: str) -> Optional[int]:
            value = fields.get(key)
            return value if type(value) is int and -(1 << 63) <= value < 1 << 63 else None

        return cls(text("host"), text("boot_id"), integer("anchor_ns"),
                   integer("clock_step_ns") or 0)  # fmt: skip


#: The domain and name of the instant that records a :class:`RoundTrip`.
CLOCK_DOMAIN = "mstx_marks.clock"
ROUND_TRIP = "clock round trip"


class RoundTrip(NamedTuple):
    """One exchange of clock readings with a peer process (a Ray clock actor), as NTP makes
    them: the recording process read its clock (``sent_ns``), the peer read its own while it
    answered (``peer_ns``), the recording process read its clock again (``received_ns``). Both
    processes' times are on their own axes (monotonic plus anchor: :class:`Origin`), so the
    recording machine's clock runs ahead of the peer's by θ in ``[sent - peer, received -
    peer]``, whatever the delays each way. It is recorded as an instant of :data:`CLOCK_DOMAIN`,
    its fields in the instant's args, so it reaches every file the process writes.

    >>> t = RoundTrip(100, 160, 1_000_120, "head", "b00t", 7)
    >>> t.bounds(), RoundTrip.of(ROUND_TRIP, CLOCK_DOMAIN, t.args()) == t
    ((-1000020, -999960), True)
    """

    sent_ns: int
    received_ns: int
    peer_ns: int
    peer_host: str
    peer_boot_id: str
    #: The peer process's anchor: ``peer_ns`` less it is the peer machine's monotonic clock.
    peer_anchor_ns: int

    def bounds(self) -> tuple[int, int]:
        """θ's bounds, on the two processes' axes."""
        return self.sent_ns - self.peer_ns, self.received_ns - self.peer_ns

    def args(self) -> Dict[str, Any]:
        """The instant's args."""
        return self._asdict()

    @classmethod
    def of(cls, name: str, domain: str, args: Optional[Mapping[str, Any]]) -> Optional[RoundTrip]:
        """The round trip an instant records, or None when it is none (or malformed: a file
        another program edited)."""
        if domain != CLOCK_DOMAIN or name != ROUND_TRIP or not args:
            return None
        values: list[Any] = [args.get(f) for f in cls._fields]
        if not all(isinstance(v, str) for v in values[3:5]):
            return None
        if not all(type(v) is int for v in (*values[:3], values[5])):
            return None
        trip = cls(*values)
        return trip if trip.sent_ns <= trip.received_ns else None


@dataclass
class RankTrace:
    """One rank's events, with the steps they fall in and the file they came from (if any).

    ``steps`` empty means "no step boundaries known"; :meth:`with_steps` then derives them from
    the ranges named :data:`STEP_PHASE`. ``role`` names the process's part in the job
    (``trainer``, ``EngineCore``, ...) when known: one rank may run several processes.
    """

    rank: int
    records: List[Record]
    steps: List[Span] = field(default_factory=list)
    source: Optional[Path] = None
    role: str = ""
    #: The run of the job this trace belongs to (``""``: not known, a foreign file).
    run: str = ""
    #: Tells apart two processes with the same host and pid (containers with their own pid
    #: namespaces sharing a folder); the same in every file one process writes.
    instance: str = ""
    #: Events the recorder dropped because it was full (the spill fell behind).
    dropped: int = 0
    #: Lines or events of the file that could not be read and were skipped (torn, malformed).
    skipped: int = 0
    #: False when the file ends without its writer's final write (a killed process).
    complete: bool = True
    #: Python thread names by thread id, where known (a Chrome trace's ``thread_name``).
    thread_names: Dict[int, str] = field(default_factory=dict)
    #: Where the process recorded and on which clock (see :class:`Origin`), when its file says
    #: it: processes of one machine can then be put on its one monotonic clock, and machines
    #: aligned (:mod:`mstx_marks.analysis.model.clocks`).
    host: str = ""
    anchor_ns: Optional[int] = None
    boot_id: str = ""
    clock_step_ns: int = 0
    #: The processes this trace joins (one role and rank: a restarted worker, processes at
    #: once), each with its own records and origin; empty for the trace of one process.
    lives: List[RankTrace] = field(default_factory=list)

    @property
    def origin(self) -> Origin:
        """Where it recorded and on which clock (see :class:`Origin`)."""
        return Origin(self.host, self.boot_id, self.anchor_ns, self.clock_step_ns)

    @origin.setter
    def origin(self, origin: Origin) -> None:
        self.host, self.boot_id, self.anchor_ns, self.clock_step_ns = origin

    @property
    def member(self) -> Member:
        """Its role and rank: what reports group it by."""
        return Member(self.role, self.rank)

    @property
    def ranges(self) -> list[RangeRecord]:
        """The ranges (open ones included: they end when they were read)."""
        return [r for r in self.records if isinstance(r, RangeRecord)]

    @property
    def instants(self) -> list[InstantRecord]:
        return [r for r in self.records if isinstance(r, InstantRecord)]

    @property
    def step_time_ns(self) -> int:
        """Total time inside steps, or the rank's whole recorded span when it has no steps."""
        if self.steps:
            return sum(end - start for start, end in self.steps)
        ranges = self.ranges
        if not ranges:
            return 0
        return max(r.end_ns for r in ranges) - min(r.start_ns for r in ranges)

    def with_steps(self) -> RankTrace:
        """This trace, with ``steps`` derived from its ``step`` ranges when none were given."""
        if self.steps:
            return self
        return replace(self, steps=step_spans(self.records))


def step_spans(records: Iterable[Record], step_name: str = STEP_PHASE) -> list[Span]:
    """The spans of the ranges named ``step_name``, in start order.

    >>> step_spans([RangeRecord("step", "default", 5, 9, 1, 1)])
    [(5, 9)]
    """
    return sorted(
        (r.start_ns, r.end_ns)
        for r in records
        if isinstance(r, RangeRecord) and r.name == step_name
    )


#: The longest text a value is cut to when its ``str()`` stands for it.
_MAX_TEXT = 4096


def plain_args(args: Mapping[Any, Any] | None) -> dict[str, Any] | None:
    """``args`` as JSON holds them: keys as text, values JSON cannot hold (a tuple key, a set,
    a circular dict, NaN, an object) as their ``str()``, and a value whose ``str()`` raises as
    ``<unprintable TYPE>``. Never raises.

    >>> plain_args({("a", 1): {1, 2}, "x": float("nan"), "ok": [1, "b"]})
    {"('a', 1)": '{1, 2}', 'x': 'nan', 'ok': [1, 'b']}
    """
    if not args:
        return None
    try:
        json.dumps(args, allow_nan=False)
        if all(type(k) is str for k in args):
            return dict(args)
    except (TypeError, ValueError, RecursionError):
        pass
    except Exception:
        pass
    try:
        items = list(args.items())
    except Exception:
        return {"args": _text(args)}
    return {_text(k): _plain(v, 0, set()) for k, v in items}


def _text(value: Any) -> str:
    if type(value) is str:
        return value
    try:
        text = str(value)
    except Exception:
        return f"<unprintable {type(value).__name__}>"
    return text if len(text) <= _MAX_TEXT else text[:_MAX_TEXT] + "..."


def _plain(value: Any, depth: int, seen: set[int]) -> Any:
    if value is None or type(value) in (str, bool, int):
        return value
    if type(value) is float:
        return value if math.isfinite(value) else str(value)
    if depth > 20:
        return "<too deep>"
    if id(value) in seen:
        return "<cycle>"
    if type(value) is dict:
        seen = seen | {id(value)}
        return {_text(k): _plain(v, depth + 1, seen) for k, v in value.items()}
    if type(value) in (list, tuple):
        seen = seen | {id(value)}
        return [_plain(v, depth + 1, seen) for v in value]
    return _text(value)
