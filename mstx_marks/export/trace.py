"""What the exporters and readers exchange: one rank's recorded events and its steps.

>>> t = RankTrace(rank=0, records=[], steps=[(0, 10)])
>>> t.step_time_ns
10
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, List, Optional, Tuple

from ..backends.record import RangeRecord

__all__ = ["STEP_PHASE", "RankTrace", "Span", "TraceFileError", "step_spans"]

#: The range name whose occurrences delimit training steps (verl's trainer ``step`` timer).
STEP_PHASE = "step"

#: ``(start_ns, end_ns)`` of one step.
Span = Tuple[int, int]


class TraceFileError(ValueError):
    """A trace file that cannot be read; the message starts with the file's path.

    >>> str(TraceFileError("r0.db", "no MSTX_EVENTS table"))
    'r0.db: no MSTX_EVENTS table'
    """

    def __init__(self, path: str | Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = Path(path)
        self.problem = problem


@dataclass
class RankTrace:
    """One rank's events, with the steps they fall in and the file they came from (if any).

    ``steps`` empty means "no step boundaries known"; exporters then derive them from ranges
    named :data:`STEP_PHASE` (see :func:`step_spans`).
    """

    rank: int
    records: List[RangeRecord]
    steps: List[Span] = field(default_factory=list)
    source: Optional[Path] = None

    @property
    def ranges(self) -> list[RangeRecord]:
        """The closed ranges (open ranges and instants have no duration)."""
        return [r for r in self.records if r.kind == "range" and r.end_ns is not None]

    @property
    def step_time_ns(self) -> int:
        """Total time inside steps, or the rank's whole recorded span when it has no steps."""
        if self.steps:
            return sum(end - start for start, end in self.steps)
        spans = [(r.start_ns, r.end_ns) for r in self.ranges if r.end_ns is not None]
        if not spans:
            return 0
        return max(e for _, e in spans) - min(s for s, _ in spans)

    def with_steps(self) -> RankTrace:
        """This trace, with ``steps`` derived from its ``step`` ranges when none were given."""
        if self.steps:
            return self
        return RankTrace(self.rank, self.records, step_spans(self.records), self.source)


def step_spans(records: Iterable[RangeRecord], step_name: str = STEP_PHASE) -> list[Span]:
    """The spans of the closed ranges named ``step_name``, in start order: the explicit step API.

    >>> from mstx_marks.backends.record import RangeRecord
    >>> step_spans([RangeRecord("step", "default", 5, 9, 1, 1, "range")])
    [(5, 9)]
    """
    return sorted(
        (r.start_ns, r.end_ns)
        for r in records
        if r.kind == "range" and r.end_ns is not None and r.name == step_name
    )
