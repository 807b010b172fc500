"""The phases a person reads: the largest of each role, the rest folded into one counted row.

A run may name thousands of phases (a name per request, per layer, per kernel): a table of
50,000 rows is one nobody reads, and an HTML page of them one no browser opens quickly. The
table, the HTML report and the SVG legend show each role's :data:`MAX_PHASES` phases of most
total time (its steps always), and fold the rest into one row (:class:`OtherPhases`):
``(49,950 other phases: 49,950 ranges, 12.345 ms)``. ``max_phases=None`` shows them all (the
command's ``--all-phases``). The JSON and the CSV keep every phase: they are for programs.

Why 200: a job marks tens of phases (the registry knows about forty, an RL job's stages, its
engines' steps), and a model's ``nn.Module`` ranges a few hundred more; the 200 of most time
hold every stage a person looks for, and at one screen line each, as much as anyone scrolls.

>>> from mstx_marks.base.records import RangeRecord, RankTrace
>>> from mstx_marks.analysis.summary import summarize
>>> r = lambda name, s, e: RangeRecord(name, "default", s, e, 1, 1)
>>> s = summarize([RankTrace(0, [r("step", 0, 100)] + [r(f"op{i}", i, 2 * i) for i in range(9)])])
>>> shown, others = top_phases(s, 3)
>>> [p.name for p in shown]  # the step, then the three longest, in their order in the run
['step', 'op6', 'op7', 'op8']
>>> others[0].phrase
'(6 other phases: 6 ranges, 0.000 ms)'
>>> top_phases(s, None)[1]  # all of them
[]
"""

from __future__ import annotations

from dataclasses import dataclass

from mstx_marks.analysis.model.aggregate import PhaseSummary, Summary

__all__ = ["MAX_PHASES", "OtherPhases", "top_phases"]

#: How many phases of each role the table, the HTML report and the SVG legend show (the
#: rest folded into one row); see the module's text for why.
MAX_PHASES = 200


@dataclass
class OtherPhases:
    """The phases of one role beyond the cut (its automatic annotations apart), summed."""

    role: str
    automatic: bool
    #: How many phases, their ranges, and the sum of their totals, the longest range.
    phases: int
    count: int
    total_ns: int
    max_ns: int
    #: The sum of their self times (None when one is not known), and both over the role's step
    #: time (None for automatic annotations, which have no share).
    self_ns: int | None
    step_share: float | None
    self_share: float | None

    @property
    def label(self) -> str:
        """The row's name: ``(49,950 other phases)``."""
        return f"({self.phases:,} other phase{'s' * (self.phases != 1)})"

    @property
    def phrase(self) -> str:
        """The label with the ranges and time: ``(49,950 other phases: 60,000 ranges, 3.2 ms)``."""
        return f"{self.label[:-1]}: {self.count:,} ranges, {self.total_ns / 1e6:.3f} ms)"


def _fold(role: str, automatic: bool, rest: list[PhaseSummary], step_ns: int) -> OtherPhases:
    selfs = [p.overall.self_ns for p in rest]
    self_ns = None if any(s is None for s in selfs) else sum(s or 0 for s in selfs)
    total = sum(p.overall.total_ns for p in rest)
    share = not automatic and step_ns > 0
    return OtherPhases(
        role=role,
        automatic=automatic,
        phases=len(rest),
        count=sum(p.overall.count for p in rest),
        total_ns=total,
        max_ns=max(p.overall.max_ns for p in rest),
        self_ns=self_ns,
        step_share=total / step_ns if share else None,
        self_share=self_ns / step_ns if share and self_ns is not None else None,
    )


def top_phases(
    summary: Summary, limit: int | None = MAX_PHASES
) -> tuple[list[PhaseSummary], list[OtherPhases]]:
    """The phases to show, in the summary's order, and per role (and its automatic annotations
    apart) one :class:`OtherPhases` for those beyond ``limit``: each role's ``limit`` phases of
    most total time (ties: the earlier), its steps besides. ``None``: every phase, no fold."""
    if limit is None:
        return list(summary.phases), []
    keep: set[int] = set()
    others = []
    for role in sorted({p.role for p in summary.phases}):
        step_ns = sum(summary.step_time_ns[m] for m in summary.members(role))
        for automatic in (False, True):
            block = [
                (i, p)
                for i, p in enumerate(summary.phases)
                if p.role == role and p.automatic == automatic and not p.is_step
            ]
            by_time = sorted(block, key=lambda ip: (-ip[1].overall.total_ns, ip[0]))
            keep.update(i for i, _ in by_time[:limit])
            rest = [p for _, p in by_time[limit:]]
            if rest:
                others.append(_fold(role, automatic, rest, step_ns))
    shown = [p for i, p in enumerate(summary.phases) if p.is_step or i in keep]
    return shown, others
