"""Where in each step each process's time lay: the per-step model's busy time cut into bins.

Contract: a per-step model (:mod:`mstx_marks.analysis.model.rl_steps`) and the spans it was built
from
in, per process and step a fixed number of bins out, whose busy times add up exactly to the
model's busy figure of that process and step.

The model keeps how much of each step a process was busy, not where. The HTML pipeline view
(:mod:`mstx_marks.analysis.render.report_html`) draws each lane at true times from these bins: the
step's window (the job's step, or a process's own step when it is attributed to its own) is cut
into ``n`` equal bins, and each bin holds the time the process's phases cover there (``cover``,
from the same :meth:`~mstx_marks.analysis.model.spans.SpanSet.clip` the model's figures come from,
so
the bins' covers telescope to the step's) and its dominant phase (the phase of most time there;
a span joined to bound memory counts in proportion to its length). ``n`` is :data:`BINS`, fewer
when the job has so many steps and processes that the bins would pass :data:`MAX_BINS` in all
(never fewer than :data:`MIN_BINS`).

>>> from mstx_marks.analysis.model.rl_steps import analyse
>>> from mstx_marks.analysis.model.spans import ProcessSpans
>>> from mstx_marks.analysis.model.steps import Step
>>> from mstx_marks.base.records import Member
>>> t = ProcessSpans(); t.add(0, 30, "gen"); t.add(60, 100, "train")
>>> t.set_steps([Step(0, 100, "1", 100)])
>>> spans = [(Member("trainer", 0), t.finish())]
>>> bins = step_bins(analyse(spans), spans, n=4)  # bins of 25: 0-25, 25-50, 50-75, 75-100
>>> lane = bins.lanes[0].steps[0]
>>> lane.cover, [bins.names[k] for k in lane.phase]
([25, 5, 15, 25], ['gen', 'gen', 'train', 'train'])
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Sequence

from mstx_marks.analysis.model.rl_steps import ProcessSteps, StepAnalysis
from mstx_marks.analysis.model.spans import ProcessSpans
from mstx_marks.base.records import Member, Span

__all__ = ["BINS", "MAX_BINS", "MIN_BINS", "LaneBins", "StepBins", "TimeBins", "step_bins"]

#: Bins per process and step (the pipeline view shows eight steps at a time: a bin is then a few
#: pixels wide on a wide screen).
BINS = 48
#: At most about this many bins in all (each a few bytes of the HTML page)...
MAX_BINS = 400_000
#: ...but never fewer than this many per process and step.
MIN_BINS = 8
#: A bin's phase where no phase ran in it.
NO_PHASE = -1


@dataclass
class StepBins:
    """One process's bins in one step: its window ``[start_ns, end_ns)`` on the model's aligned
    axis (bin ``k`` spans ``edges(k)`` to ``edges(k + 1)``), the busy time in each bin, and
    each bin's dominant phase (an index into :attr:`TimeBins.names`; :data:`NO_PHASE`: none)."""

    start_ns: int
    end_ns: int
    cover: list[int]
    phase: list[int]

    def edge(self, k: int) -> int:
        """Where bin ``k`` starts (``k == n``: where the last ends), on the aligned axis."""
        return _edge(self.start_ns, self.end_ns, k, len(self.cover))


@dataclass
class LaneBins:
    """One process's bins per step analysed (None where it has no figures)."""

    steps: list[StepBins | None]


@dataclass
class TimeBins:
    """The bins of every process of a model: ``lanes[i]`` is ``model.processes[i]``'s (None
    where the spans it was built from are not known); ``n`` bins per process and step;
    ``names`` the phases the bins name, sorted."""

    n: int
    names: list[str]
    lanes: list[LaneBins | None]


def _edge(start: int, end: int, k: int, n: int) -> int:
    return start + (end - start) * k // n


def bin_count(processes: int, steps: int) -> int:
    """Bins per process and step for a model of this size (see the module's docstring).

    >>> bin_count(8, 10), bin_count(64, 1024)
    (48, 8)
    """
    return max(MIN_BINS, min(BINS, MAX_BINS // max(1, processes * steps)))


def _spans_of(
    model: StepAnalysis, spans: Sequence[tuple[Member, ProcessSpans]]
) -> list[ProcessSpans | None]:
    """The spans each of the model's processes was built from: by member (its role and rank),
    and among several processes of one member by the process's pid and instance (None when
    that does not tell). The one place the model's processes meet their spans."""
    by_member: dict[tuple[str, int], list[tuple[Member, ProcessSpans]]] = {}
    for m, s in spans:
        by_member.setdefault((m.role, m.rank), []).append((m, s))
    out: list[ProcessSpans | None] = []
    for p in model.processes:
        found = by_member.get((p.member.role, p.member.rank), [])
        if len(found) > 1:  # the process itself: by its name, its pid or its instance
            pid, instance = getattr(p, "pid", None), getattr(p, "instance", None)
            found = [
                (m, s)
                for m, s in found
                if m == p.member
                or (s.pid, s.instance) == (pid, instance)
                or (p.member.process and p.member.process in (f"pid {s.pid}", s.instance))
            ]
        out.append(found[0][1] if len(found) == 1 else None)
    return out


def _windows(model: StepAnalysis, p: ProcessSteps, s: ProcessSpans) -> list[Span | None]:
    """Per step, the process's window on its own clock, as the model attributed it (None where
    it has no figures)."""
    if not p.own:
        shift = model.clock.shifts_ns.get(p.member, 0)
        return [(st.start_ns - shift, st.end_ns - shift) for st in model.steps]
    index = None if s.step_keys is None else {k: j for j, k in enumerate(s.step_keys)}
    out: list[Span | None] = []
    for st in model.steps:
        j = s.step_index(st.key) if index is None else index.get(st.key)
        out.append(None if j is None else s.step_window(j))
    return out


def step_bins(
    model: StepAnalysis, spans: Sequence[tuple[Member, ProcessSpans]], n: int | None = None
) -> TimeBins:
    """The bins of ``model``'s processes, from the ``spans`` (each member's, as
    :func:`~mstx_marks.analysis.model.rl_steps.analyse` took them) it was built from; ``n`` bins per
    process and step (default :func:`bin_count`)."""
    n = bin_count(len(model.processes), len(model.steps)) if n is None else n
    names = sorted({name for p in model.processes for name in p.phases})
    number = {name: i for i, name in enumerate(names)}
    lanes: list[LaneBins | None] = []
    for p, s in zip(model.processes, _spans_of(model, spans)):
        if s is None:
            lanes.append(None)
            continue
        shift = model.clock.shifts_ns.get(p.member, 0)
        windows = _windows(model, p, s)
        present = [(j, w) for j, w in enumerate(windows) if w is not None]
        edges = [[_edge(a, b, k, n) for k in range(n + 1)] for _, (a, b) in present]
        bins = [(e[k], e[k + 1]) for e in edges for k in range(n)]
        cover = s.busy.clip(bins).cover
        phase = _dominant(s, [w for _, w in present], edges, n, number)
        steps: list[StepBins | None] = [None] * len(model.steps)
        for i, (j, (a, b)) in enumerate(present):
            steps[j] = StepBins(
                a + shift, b + shift, list(cover[i * n : (i + 1) * n]), phase[i * n : (i + 1) * n]
            )
        lanes.append(LaneBins(steps))
    return TimeBins(n, names, lanes)


def _dominant(
    s: ProcessSpans,
    windows: list[Span],
    edges: list[list[int]],
    n: int,
    number: dict[str, int],
) -> list[int]:
    """Each bin's phase of most time (windows sorted and disjoint, as the model's are): each
    phase's spans walked once, each to the bins it meets."""
    best = [0.0] * (len(windows) * n)
    phase = [NO_PHASE] * (len(windows) * n)
    starts = [a for a, _ in windows]
    ends = [b for _, b in windows]
    for name in sorted(s.phases):
        got: dict[int, float] = {}
        for st, en, cv in s.phases[name].spans():
            if en <= st:
                continue
            density = cv / (en - st)
            i = bisect_right(ends, st)
            while i < len(windows) and starts[i] < en:
                e = edges[i]
                first = bisect_right(e, st) - 1
                last = bisect_left(e, en) - 1
                first = first if first > 0 else 0
                last = last if last < n - 1 else n - 1
                base = i * n
                for k in range(first, last + 1):  # (the hot loop: no calls)
                    lo, hi = e[k], e[k + 1]
                    lo = lo if lo > st else st
                    hi = hi if hi < en else en
                    if hi > lo:
                        got[base + k] = got.get(base + k, 0.0) + (hi - lo) * density
                i += 1
        index = number.get(name, NO_PHASE)
        for cell, time in got.items():
            if time > best[cell]:
                best[cell], phase[cell] = time, index
    return phase
