"""What one process's ranges cover, per phase, in bounded memory: the input of the per-step
analysis (:mod:`mstx_marks.analysis.model.rl_steps`), built where a file is read and merged
anywhere.

A :class:`SpanSet` is the union of some ranges as sorted, disjoint spans ``(start, end,
cover)``: ``cover`` is the time the ranges cover inside the span. While a span is *solid*
(``cover == end - start``) it is exact; the set stays exact up to :data:`BUILD_LIMIT` spans, and
past that neighbours separated by the shortest gaps are joined (:meth:`SpanSet.compact`, exactly
as many as needed: periodic ranges, every gap alike, are not all joined at once): the joined
span keeps its exact cover but no longer says where inside it the gaps were. A step boundary
that later falls inside such a span splits its cover in proportion, which :meth:`SpanSet.clip`
bounds and reports (``uncertain``). A boundary that falls in a gap, as the gaps between an RL
job's steps, is exact whatever was joined; and a set given *fences* (times it must stay exact
at) never joins across one. Ranges that only touch (one ends where the next starts) stay two
spans: a boundary between them cuts neither.

A :class:`ProcessSpans` holds one process's sets: one per phase (the user's stages: not the
step ranges, which are the frame, nor the frameworks' automatic annotations), the union of all
(``busy``, made at :meth:`ProcessSpans.finish`), the process's own steps, and its host and
clock anchor when its file says them. Everything merges (:meth:`ProcessSpans.merge`): the part
of one file read on one machine, and another's read elsewhere, make the same whole as one read
of both. :meth:`ProcessSpans.finish` joins spans down to about :data:`SHIP_LIMIT` per process
(what is sent back from a worker), never across one of the process's own step boundaries
while it has at most :data:`FENCE_LIMIT` steps (its own steps then stay exact), nor across one
of its ``fences``: the job's step edges on its clock, given when a process that needed them is
read a second time (:func:`mstx_marks.analysis.model.rl_steps.fences_needed`).

>>> s = SpanSet()
>>> for a, b in [(0, 10), (5, 20), (30, 40)]:
...     s.add(a, b)
>>> s.spans(), s.cover_ns
([(0, 20, 20), (30, 40, 10)], 30)
>>> s.compact(1)  # one span left (the gap joined: 10): its cover still exact, its gap unplaced
10
>>> s.spans()
[(0, 40, 30)]
"""

from __future__ import annotations

import heapq
from array import array
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from itertools import accumulate
from operator import gt, itemgetter, sub
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

from mstx_marks.analysis.model.batches import (
    MODEL_STEPS,
    Batches,
    all_fences,
    fenced_gaps,
    gaps_to_join,
)
from mstx_marks.analysis.model.steps import Step
from mstx_marks.base.records import Origin, RoundTrip, Span

__all__ = [
    "BUILD_LIMIT",
    "FENCE_LIMIT",
    "SHIP_LIMIT",
    "Clipped",
    "ProcessSpans",
    "SpanSet",
]

#: A set holds at most this many spans while ranges are added (about 400 KB); past it, half.
BUILD_LIMIT = 1 << 14
#: The spans one process sends back from the worker that read it, all sets together (about
#: 50 KB), unless its own step boundaries need more (see :data:`FENCE_LIMIT`).
SHIP_LIMIT = 2048
#: A process with at most this many steps of its own keeps its sets exact at its step
#: boundaries (spans never joined across one); one with more may not.
FENCE_LIMIT = 1024
#: Ranges added out of order wait in a list of this many, then are folded in at once.
_BATCH = 8192


class Clipped(NamedTuple):
    """A set's cover inside each of some windows (:meth:`SpanSet.clip`), as arrays: ``cover``
    per window; ``uncertain`` per window, how far that cover may be off (a joined span cut by
    the window's edge, its cover split in proportion); ``split`` how many spans were cut by a
    window's edge; ``outside`` the cover in no window."""

    cover: array[int]
    uncertain: array[int]
    split: int
    outside: int


class SpanSet:
    """The union of ranges as sorted disjoint spans (see the module's docstring)."""

    __slots__ = ("_sums", "covers", "ends", "fences", "join_gap", "pending", "slack", "starts")

    def __init__(self, fences: Sequence[int] = ()) -> None:
        self.starts: array[int] = array("q")
        self.ends: array[int] = array("q")
        self.covers: array[int] = array("q")
        #: Ranges that came out of order, to fold in (see :meth:`_fold`).
        self.pending: list[tuple[int, int]] = []
        #: How far ``cover_ns`` may be off: ranges that overlapped a joined span (rare: a
        #: range arriving after the spans around it were joined) are counted by estimate.
        self.slack = 0
        self._sums: list[int] | None = None  # the covers' running sums, once asked for
        #: A range this close after the last span is joined to it as it comes (set once the
        #: set was compacted while ranges were added: it would be joined at the next anyway;
        #: before, none is, not even one that touches it).
        self.join_gap = -1
        #: Times (sorted) no span is ever joined across (see :meth:`compact`).
        self.fences: Sequence[int] = fences

    def add(self, start: int, end: int) -> None:
        """Cover ``[start, end)`` too (an empty or reversed range covers nothing)."""
        if end <= start:
            return
        ends = self.ends
        self._sums = None
        if not ends or start >= ends[-1]:  # after every span: the common case
            if ends and start - ends[-1] <= self.join_gap and not self._fenced(end):
                self.covers[-1] += end - start  # joined on, as compact() would
                ends[-1] = end
                return
            self.starts.append(start)
            ends.append(end)
            self.covers.append(end - start)
            if len(ends) > BUILD_LIMIT:  # from now on, gaps this short are joined as they come
                self.join_gap = max(self.join_gap, self.compact(BUILD_LIMIT // 2))
            return
        last = self.starts[-1]
        if start >= last and self.covers[-1] == ends[-1] - last:  # on the last, solid span
            if end > ends[-1]:
                self.covers[-1] += end - ends[-1]
                ends[-1] = end
            return
        self.pending.append((start, end))
        if len(self.pending) >= _BATCH:
            self._fold()

    def _fenced(self, end: int) -> bool:
        """Whether a fence lies inside the last span joined to a range ending at ``end``."""
        fences = self.fences
        i = bisect_right(fences, self.starts[-1])
        return i < len(fences) and fences[i] < end

    def _fold(self) -> None:
        """Fold the ranges that came out of order into the spans."""
        if not self.pending:
            return
        pending, self.pending = sorted(self.pending), []
        solid: list[tuple[int, int, int]] = []
        for s, e in pending:  # their exact union first
            if solid and s < solid[-1][1]:
                if e > solid[-1][1]:
                    solid[-1] = (solid[-1][0], e, e - solid[-1][0])
            else:
                solid.append((s, e, e - s))
        self._set(*_union([self.spans(), solid], self))
        if len(self.starts) > BUILD_LIMIT:
            self.compact(BUILD_LIMIT // 2)

    def _set(self, starts: list[int], ends: list[int], covers: list[int]) -> None:
        self.starts, self.ends, self.covers = (
            array("q", starts),
            array("q", ends),
            array("q", covers),
        )
        self._sums = None

    def _prefix(self) -> list[int]:
        """The cover before each span (``[0, c0, c0 + c1, ...]``), kept until a change."""
        if self._sums is None:
            self._sums = list(accumulate(self.covers, initial=0))
        return self._sums

    @classmethod
    def solid(cls, starts: array[int], ends: array[int]) -> SpanSet:
        """The set of sorted disjoint spans, solid, from their starts and ends (taken).

        >>> SpanSet.solid(array("q", [0, 7]), array("q", [5, 9])).spans()
        [(0, 5, 5), (7, 9, 2)]
        """
        made = cls()
        made.starts, made.ends = starts, ends
        made.covers = array("q", map(sub, ends, starts))
        return made

    def moved(self, shift: int) -> SpanSet:
        """A copy of the set, every span ``shift`` later (another clock's axis).

        >>> s = SpanSet(); s.add(0, 4); s.moved(10).spans()
        [(10, 14, 4)]
        """
        self._fold()
        made = SpanSet()
        moved = [a + shift for a in self.starts], [b + shift for b in self.ends]
        made._set(*moved, list(self.covers))
        made.slack = self.slack
        return made

    def spans(self) -> list[tuple[int, int, int]]:
        """``(start, end, cover)`` of each span, in order (ranges still pending not folded)."""
        return list(zip(self.starts, self.ends, self.covers))

    def settle(self) -> SpanSet:
        """Fold in what is pending; returns itself."""
        self._fold()
        return self

    def __len__(self) -> int:
        return len(self.starts) + len(self.pending)

    def __eq__(self, other: object) -> bool:
        """The same spans, covers and slack (as built: what is pending folded in first)."""
        if not isinstance(other, SpanSet):
            return NotImplemented
        self._fold()
        other._fold()
        mine = (self.starts, self.ends, self.covers, self.slack)
        return mine == (other.starts, other.ends, other.covers, other.slack)

    __hash__ = None  # type: ignore[assignment]  # (mutable)

    @property
    def cover_ns(self) -> int:
        """The time covered (pending ranges folded first)."""
        self._fold()
        return sum(self.covers)

    @property
    def exact(self) -> bool:
        """Whether every span is solid and nothing was estimated: each window's cover exact."""
        self._fold()
        return not self.slack and all(
            c == e - s for s, e, c in zip(self.starts, self.ends, self.covers)
        )

    def merge(self, other: SpanSet) -> SpanSet:
        """Cover what ``other`` covers too; returns itself."""
        self._fold()
        other._fold()
        self.slack += other.slack
        self.join_gap = max(self.join_gap, other.join_gap)
        self._set(*_union([self.spans(), other.spans()], self))
        return self

    def compact(self, limit: int, fences: Sequence[int] = ()) -> int:
        """Join neighbouring spans, those with the shortest gaps between them first (of equal
        gaps, the earliest), until at most ``limit`` are left: exactly as many joins as that
        takes, never across a time in ``fences`` or the set's own (sorted): a gap holding one
        stays (so fewer than ``limit`` may be out of reach). Returns the widest gap joined
        (0: none).

        >>> s = SpanSet()
        >>> for i in range(6):
        ...     s.add(10 * i, 10 * i + 4)  # every gap alike: only as many joined as needed
        >>> s.compact(4, fences=[25]), [(a, b) for a, b, _ in s.spans()]
        (6, [(0, 24), (30, 34), (40, 44), (50, 54)])
        """
        self._fold()
        n = len(self.starts)
        if n <= max(limit, 1):
            return 0
        starts, ends = self.starts, self.ends
        gaps = fenced_gaps(starts, ends, all_fences(fences, self.fences))  # [i]: after span i
        chosen = gaps_to_join(gaps, n - max(limit, 1))
        if not any(chosen):
            return 0
        cuts = [i for i in range(n - 1) if not chosen[i]]
        widest = max(g for g, joined in zip(gaps, chosen) if joined)
        first, last = [0, *(i + 1 for i in cuts)], [*cuts, n - 1]
        prefix = self._prefix()
        self._set(
            [starts[i] for i in first],
            [ends[j] for j in last],
            [prefix[j + 1] - prefix[i] for i, j in zip(first, last)],
        )
        return widest

    def clip(self, windows: Sequence[Span]) -> Clipped:
        """The cover inside each of ``windows`` (sorted, disjoint): see :class:`Clipped`.

        >>> s = SpanSet()
        >>> s.add(0, 10); s.add(15, 25)
        >>> c = s.clip([(0, 20), (20, 40)])
        >>> list(c.cover), list(c.uncertain), c.split, c.outside
        ([15, 5], [0, 0], 1, 0)
        """
        self._fold()
        starts, ends, covers = self.starts, self.ends, self.covers
        prefix = self._prefix()  # the cover before span i: prefix[i]
        # The cover before each edge (window starts and ends, in order) and how far it may be
        # off: an edge inside a joined span splits its cover in proportion, within its gaps.
        at: list[int] = []
        doubt: list[int] = []
        cut = lo = 0
        last_cut = -1
        for t in [t for w in windows for t in w]:
            i = bisect_right(starts, t, lo) - 1
            if i < 0:
                at.append(0)
                doubt.append(0)
                continue
            lo = i
            s, e = starts[i], ends[i]
            if t >= e:
                at.append(prefix[i + 1])
                doubt.append(0)
                continue
            if t > s and i != last_cut:
                cut += 1
                last_cut = i
            part, span, c = t - s, e - s, covers[i]
            if c == span:
                at.append(prefix[i] + part)
                doubt.append(0)
                continue
            # its gaps may lie anywhere in it: from all before t (least) to none (most)
            least = part - (span - c) if part > span - c else 0
            most = c if c < part else part
            guess = (c * part + span // 2) // span
            at.append(prefix[i] + (least if guess < least else most if guess > most else guess))
            doubt.append(most - least)
        cover, uncertain = array("q"), array("q")
        for k, (a, b) in enumerate(windows):
            part = at[2 * k + 1] - at[2 * k]
            cover.append(0 if part < 0 else b - a if part > b - a else part)
            uncertain.append(doubt[2 * k] + doubt[2 * k + 1])
        return Clipped(cover, uncertain, cut, max(0, prefix[-1] - sum(cover)))

    def cover_in(self, start: int, end: int) -> int:
        """The cover inside ``[start, end)`` (see :meth:`clip`).

        >>> s = SpanSet(); s.add(0, 10); s.add(15, 25)
        >>> s.cover_in(5, 20)
        10
        """
        return self.clip([(start, end)]).cover[0]

    def extent(self, start: int, end: int) -> tuple[int, int] | None:
        """``(first, last)`` covered time inside ``[start, end)`` (a joined span taken as
        covering from its start to its end), or None when nothing there is covered.

        >>> s = SpanSet(); s.add(5, 9); s.add(12, 30)
        >>> s.extent(0, 20), s.extent(9, 12)
        ((5, 20), None)
        """
        self._fold()
        i = bisect_right(self.ends, start)
        j = bisect_left(self.starts, end) - 1
        if i > j:
            return None
        return max(self.starts[i], start), min(self.ends[j], end)

    def end_of_last(self, start: int, end: int) -> int | None:
        """Where the last span covering time in ``[start, end)`` ends, past ``end`` if it runs
        on (what :meth:`extent` cuts at ``end``), or None when nothing there is covered.

        >>> s = SpanSet(); s.add(5, 9); s.add(12, 30)
        >>> s.end_of_last(0, 20), s.end_of_last(9, 12)
        (30, None)
        """
        self._fold()
        i = bisect_right(self.ends, start)
        j = bisect_left(self.starts, end) - 1
        return None if i > j else self.ends[j]


def _union(
    lists: Sequence[list[tuple[int, int, int]]], owner: SpanSet
) -> tuple[list[int], list[int], list[int]]:
    """The union of sorted lists of disjoint spans, as starts, ends and covers; where a joined
    span meets another, the cover of the two together is estimated (as if their gaps fell
    independently) and how far it may be off is added to ``owner.slack``."""
    out_s: list[int] = []
    out_e: list[int] = []
    out_c: list[int] = []
    merged = heapq.merge(*lists) if len(lists) > 1 else iter(lists[0] if lists else [])
    for s, e, c in merged:
        if not out_e or s >= out_e[-1]:  # (one that only touches the last stays apart)
            out_s.append(s)
            out_e.append(e)
            out_c.append(c)
            continue
        cs, ce, cc = out_s[-1], out_e[-1], out_c[-1]
        hi = max(ce, e)
        if cc == ce - cs and c == e - s:  # both solid: exact
            out_e[-1], out_c[-1] = hi, hi - cs
            continue
        overlap = min(ce, e) - s
        both = overlap * cc * c // ((ce - cs) * (e - s) or 1)
        least, most = max(cc, c), min(cc + c, hi - cs)
        out_e[-1], out_c[-1] = hi, min(max(cc + c - both, least), most)
        owner.slack += most - least
    return out_s, out_e, out_c


@dataclass
class ProcessSpans:
    """One process's sets (see the module's docstring): :meth:`add` each of its phase ranges,
    give its own steps (:meth:`set_steps`), then :meth:`finish`; :meth:`merge` another part of
    the same process (or of another process of the same role and rank, summed as one).

    >>> p = ProcessSpans(host="h1")
    >>> p.add(0, 40, "gen"); p.add(50, 90, "update_actor"); p.add(60, 70, "update_actor")
    >>> p.set_steps([Step(0, 100, "1", 100)])
    >>> done = p.finish()
    >>> done.busy.spans(), sorted(done.phases), done.steps()
    ([(0, 40, 40), (50, 90, 40)], ['gen', 'update_actor'], [(0, 100, '1')])
    """

    phases: dict[str, SpanSet] = field(default_factory=dict)
    #: The union of every phase's spans: made by :meth:`finish`.
    busy: SpanSet = field(default_factory=SpanSet)
    #: The process's own steps: their starts, ends and keys (None: numbered 1, 2, ...).
    step_starts: array[int] = field(default_factory=lambda: array("q"))
    step_ends: array[int] = field(default_factory=lambda: array("q"))
    step_keys: list[str] | None = None
    #: Where the process ran and on which clock, when its file says it (see
    #: :class:`~mstx_marks.base.records.Origin`); else ``""``, None and 0.
    host: str = ""
    anchor_ns: int | None = None
    boot_id: str = ""
    clock_step_ns: int = 0
    #: Which process it is: its (lowest) pid and its instance (see :meth:`identify`).
    pid: int = 0
    instance: str = ""
    #: Its model-step ranges counted (a rollout engine's: :mod:`mstx_marks.analysis.model.batches`).
    batches: Batches = field(default_factory=Batches)
    #: Times on its clock no span or run is ever joined across (sorted): the job's step edges,
    #: when it is read a second time (see the module's docstring).
    fences: Sequence[int] = ()
    #: Its clock measured against a peer's (a Ray clock actor), on its own axis: see
    #: :class:`~mstx_marks.base.records.RoundTrip` and :mod:`mstx_marks.analysis.model.clocks`.
    round_trips: list[RoundTrip] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.fences:
            self.busy.fences = self.batches.fences = self.fences
            for spans in self.phases.values():
                spans.fences = self.fences

    @property
    def origin(self) -> Origin:
        """Where the process ran and on which clock."""
        return Origin(self.host, self.boot_id, self.anchor_ns, self.clock_step_ns)

    def identify(self, origin: Origin, pids: Iterable[int], instance: str) -> ProcessSpans:
        """Say which process these are (``pids``: its records'; ``instance`` as its file says)
        and where it recorded; returns itself.

        >>> ProcessSpans().identify(Origin("h1", "b1", 5), {9, 7}, "x1").pid
        7
        """
        self.host, self.boot_id, self.anchor_ns, self.clock_step_ns = origin
        self.pid, self.instance = min(pids, default=0), instance
        return self

    def add(self, start: int, end: int, phase: str, args: Mapping[str, Any] | None = None) -> None:
        """Count one range of ``phase`` (a stage: not a step, not an automatic annotation), and
        its ``args`` if it is a model step (its batch's ``reqs`` and ``tokens``)."""
        if phase in MODEL_STEPS:
            self.batches.add(start, end, phase, args)
        spans = self.phases.get(phase)
        if spans is None:
            spans = self.phases[phase] = SpanSet(self.fences)
        spans.add(start, end)

    def set_steps(self, steps: Iterable[Step]) -> None:
        """The process's own steps (as :func:`~mstx_marks.analysis.model.steps.find_steps` finds
        them), in place of any given before."""
        self.step_starts, self.step_ends = array("q"), array("q")
        keys = []
        for s in steps:
            self.step_starts.append(s.start_ns)
            self.step_ends.append(s.end_ns)
            keys.append(s.key)
        ordinal = all(k == str(i) for i, k in enumerate(keys, start=1))
        self.step_keys = None if ordinal else keys

    def set_step_spans(self, starts: Iterable[int], ends: Iterable[int]) -> None:
        """The process's own steps as their spans alone, numbered 1, 2, ... in start order
        (held as arrays, taken as they are when they are: a loop marked per iteration may have
        millions)."""
        s = starts if isinstance(starts, array) else array("q", starts)
        e = ends if isinstance(ends, array) else array("q", ends)
        if any(map(gt, s, s[1:])):
            order = sorted(range(len(s)), key=lambda i: (s[i], e[i]))
            s, e = array("q", (s[i] for i in order)), array("q", (e[i] for i in order))
        self.step_starts, self.step_ends, self.step_keys = s, e, None

    def step_key(self, i: int) -> str:
        """The key of own step ``i`` (in start order)."""
        return self.step_keys[i] if self.step_keys is not None else str(i + 1)

    def step_index(self, key: str) -> int | None:
        """Which own step has ``key`` (None: none); see ``step_keys`` for keyed steps, whose
        index this searches."""
        if self.step_keys is not None:
            return self.step_keys.index(key) if key in self.step_keys else None
        i = int(key) - 1 if key.isdigit() else -1
        return i if 0 <= i < len(self.step_starts) else None

    def step_window(self, i: int) -> Span:
        """Own step ``i``'s span, its end cut at the next step's start (a keyed step in pieces
        may overlap the next; the windows a process's time is attributed to never do)."""
        start, end = self.step_starts[i], self.step_ends[i]
        if i + 1 < len(self.step_starts):
            end = max(start, min(end, self.step_starts[i + 1]))
        return start, end

    def steps(self) -> list[tuple[int, int, str]]:
        """``(start, end, key)`` of each own step."""
        return [
            (s, e, self.step_key(i))
            for i, (s, e) in enumerate(zip(self.step_starts, self.step_ends))
        ]

    def merge(self, other: ProcessSpans) -> ProcessSpans:
        """Add ``other``'s ranges and steps to these (both finished or both not); returns
        itself."""
        for name, spans in other.phases.items():
            mine = self.phases.get(name)
            if mine is None:  # (a copy: merging more into it must not change ``other``)
                mine = self.phases[name] = SpanSet(self.fences)
            mine.merge(spans)
        self.busy.merge(other.busy)
        self.batches.merge(other.batches)
        self.round_trips += other.round_trips
        if len(other.step_starts):
            steps = {(s, e): k for s, e, k in [*self.steps(), *other.steps()]}
            ordered = sorted(steps)
            keyed = self.step_keys is not None or other.step_keys is not None
            self.set_steps(
                Step(s, e, steps[(s, e)] if keyed else str(i), e - s)
                for i, (s, e) in enumerate(ordered, start=1)
            )
        if not self.origin.known:
            self.host, self.boot_id, self.anchor_ns, self.clock_step_ns = other.origin
        self.pid, self.instance = self.pid or other.pid, self.instance or other.instance
        if not self.fences and other.fences:
            self.fences = other.fences
            self.__post_init__()
        return self

    def finish(self, limit: int = SHIP_LIMIT) -> ProcessSpans:
        """Fold, make ``busy`` (the union of the phases) and join spans down to about
        ``limit`` in all (see the module's docstring); returns itself."""
        fences: Sequence[int] = self.fences
        if len(self.step_starts) <= FENCE_LIMIT:
            fences = sorted({*self.step_starts, *self.step_ends, *self.fences})
        phases = [s.settle() for s in self.phases.values()]
        if phases and not len(self.busy.settle()):  # (spans_of_ranges made it already)
            # Their union, once each is within its share: exact while they are whole, an
            # estimate (with its slack) when they were joined to fit.
            _compact_all(phases, limit, fences)
            busy = self.busy = SpanSet(self.fences)
            busy._set(*_union([s.spans() for s in phases], busy))
            busy.slack += sum(s.slack for s in phases)
        _compact_all([self.busy, *phases], limit, fences)
        self.batches.finish(fences)
        return self

    @property
    def exact(self) -> bool:
        """Whether nothing was joined: every set's spans solid, every run of model steps one."""
        sets = [self.busy, *self.phases.values()]
        return all(s.exact for s in sets) and not self.batches.joined

    def joined_across(self, times: Sequence[int]) -> bool:
        """Whether a span or run of model steps joined to bound memory holds one of ``times``
        (sorted) inside it: what is attributed to either side of it is then estimated.

        >>> p = ProcessSpans(); p.add(0, 4, "a"); p.add(10, 14, "a")
        >>> _ = p.finish(); p.phases["a"].compact(1)
        6
        >>> p.joined_across([7]), p.joined_across([20])
        (True, False)
        """
        for s in (self.busy, *self.phases.values()):
            for a, b, c in s.spans():
                if c != b - a and _holds(times, a, b):
                    return True
        return self.batches.joined_across(times)

    @property
    def span_count(self) -> int:
        """The spans held, all sets together."""
        return len(self.busy) + sum(len(s) for s in self.phases.values())


def _holds(times: Sequence[int], a: int, b: int) -> bool:
    """Whether one of ``times`` (sorted) lies strictly inside ``(a, b)``."""
    i = bisect_right(times, a)
    return i < len(times) and times[i] < b


def _compact_all(sets: list[SpanSet], limit: int, fences: Sequence[int]) -> None:
    """Join spans until the sets hold about ``limit`` together, each its share (by size)."""
    total = sum(len(s) for s in sets) or 1
    if total > limit:
        for s in sets:
            s.compact(max(64, limit * len(s) // total), fences)


def spans_of_ranges(
    ranges: Iterable[tuple[object, int, int, str]],
    steps: Iterable[Step],
    host: str = "",
    anchor_ns: int | None = None,
    batches: Batches | None = None,
    fences: Sequence[int] = (),
) -> ProcessSpans:
    """The finished :class:`ProcessSpans` of a process's phase ranges given as the breakdown
    takes them, ``(thread, start, -end, phase)`` (see
    :func:`~mstx_marks.analysis.model.aggregate.breakdown`), and its own ``steps``; its model steps
    are ``batches`` when the reader counted them with their args, else counted here (without);
    its spans are never joined across ``fences`` (see :attr:`ProcessSpans.fences`).

    >>> p = spans_of_ranges([(1, 0, -10, "gen"), (1, 2, -5, "x")], [])
    >>> p.busy.spans(), p.phases["x"].spans()
    ([(0, 10, 10)], [(2, 5, 3)])
    """
    found = ProcessSpans(host=host, anchor_ns=anchor_ns, fences=fences)
    # The union's starts and ends, the last span still growing (arrays: 8 bytes a time), of
    # all the ranges (busy) and per phase; one pass in start order (the hot loop: kept flat).
    busy_s, busy_e = array("q"), array("q")
    last = -(1 << 63)
    flats: dict[str, tuple[array[int], array[int]]] = {}
    count = found.batches.add if batches is None else None
    for _, s, neg_end, phase in sorted(ranges, key=itemgetter(1)):
        e = -neg_end
        if count is not None and phase in MODEL_STEPS:
            count(s, e, phase, None)
        if e <= s:
            continue
        if s >= last:  # (one that only touches the last span stays apart)
            busy_s.append(s)
            busy_e.append(e)
            last = e
        elif e > last:
            busy_e[-1] = last = e
        flat = flats.get(phase)
        if flat is None:
            flats[phase] = (array("q", (s,)), array("q", (e,)))
            continue
        ends = flat[1]
        if s >= ends[-1]:
            flat[0].append(s)
            ends.append(e)
        elif e > ends[-1]:
            ends[-1] = e
    found.phases = {phase: SpanSet.solid(*flat) for phase, flat in flats.items()}
    found.busy = SpanSet.solid(busy_s, busy_e)
    if batches is not None:
        found.batches = batches
    found.__post_init__()  # (the sets made here: the fences on each)
    found.set_steps(steps)
    return found.finish()
