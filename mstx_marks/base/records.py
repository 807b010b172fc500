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

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, List, Literal, Mapping, NamedTuple, Optional, Tuple, Union

__all__ = [
    "STEP_PHASE",
    "InstantRecord",
    "Member",
    "RangeRecord",
    "RankTrace",
    "Record",
    "Span",
    "TraceFileError",
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
    all say rank 0. Sorts by role, then rank (``""``, no role known, first).

    >>> m = Member("WorkerDict", 1)
    >>> m.label, m.key, Member("", 1).label, Member("", 1).key
    ('WorkerDict rank 1', 'WorkerDict:1', 'rank 1', '1')
    """

    role: str
    rank: int

    @property
    def label(self) -> str:
        """For people: ``WorkerDict rank 1``, or ``rank 1`` when the role is unknown."""
        return f"{self.role} rank {self.rank}" if self.role else f"rank {self.rank}"

    @property
    def key(self) -> str:
        """For JSON keys: ``WorkerDict:1``, or ``1`` when the role is unknown."""
        return f"{self.role}:{self.rank}" if self.role else str(self.rank)


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
        return RankTrace(self.rank, self.records, step_spans(self.records), self.source, self.role)


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
