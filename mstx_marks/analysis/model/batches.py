"""A rollout engine's model steps counted in bounded memory: how many ranges of vLLM's / SGLang's
model-step phases (:data:`MODEL_STEPS`) ran, how many of them decode, and the requests and tokens
their batches held where the ranges carry them (``args={"reqs": n, "tokens": n}``, see
:func:`mstx_marks.capture.presets.vllm.batch_args`); the per-step analysis
(:mod:`mstx_marks.analysis.model.rl_steps`) attributes them to the job's steps.

The ranges are kept as *runs*: a run is some consecutive ranges, its first start and last end
and their counts summed. Up to :data:`~mstx_marks.analysis.model.spans.BUILD_LIMIT` runs are kept
while
ranges are added (each range its own run at first); past that, the runs separated by the
shortest gaps are joined, as :class:`~mstx_marks.analysis.model.spans.SpanSet` joins its spans
(exactly as many as needed, and never across one of the ``fences``: the job's step edges, when
the process is read a second time for them), so a step's counts stay exact unless a run spans
its edge; such a run goes to the step holding its middle (and is counted: ``cut``). Without
fences that happens: decode steps evenly spaced through the job's steps have every gap alike.

>>> b = Batches()
>>> b.add(0, 10, "prefill_batch", {"reqs": 2, "tokens": 64})
>>> b.add(12, 15, "decode_batch", {"reqs": 2, "tokens": 2})
>>> b.add(100, 103, "decode_batch", None)
>>> c = b.clip([(0, 50), (50, 200)])
>>> list(c.model_steps), list(c.decode), list(c.tokens), list(c.known)
([2, 1], [1, 1], [66, 0], [2, 0])
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from operator import sub
from typing import Any, Mapping, NamedTuple, Sequence

from mstx_marks.base import phases

__all__ = [
    "DECODE",
    "MODEL_STEPS",
    "BatchCounts",
    "Batches",
    "all_fences",
    "fenced_gaps",
    "gaps_to_join",
]

#: The phases one model step of a rollout engine is marked as (the registry's names).
MODEL_STEPS = frozenset(
    p.name
    for p in (
        phases.PREFILL_BATCH,
        phases.DECODE_BATCH,
        phases.MIXED_BATCH,
        phases.VERIFY_BATCH,
        phases.DRAFT_EXTEND_BATCH,
    )
)
#: The decode model step's phase.
DECODE = phases.DECODE_BATCH.name
#: Runs kept while ranges are added (past it, half), and what a finished process ships.
_BUILD = 1 << 14
_SHIP = 2048
#: Ranges added out of order wait in a list of this many, then are folded in at once.
_BATCH = 8192
#: The join gap before any compaction: no range joined as it comes.
_NEVER = -(1 << 62)
#: A run's fields, in the order of :attr:`Batches.fields`.
_FIELDS = ("starts", "ends", "model_steps", "decode", "tokens", "reqs", "known")


def all_fences(given: Sequence[int], own: Sequence[int]) -> Sequence[int]:
    """The fences of both (each sorted), sorted.

    >>> all_fences([5, 9], [7]), all_fences([], [7])
    ([5, 7, 9], [7])
    """
    return sorted({*given, *own}) if given and own else given or own


def fenced_gaps(starts: Sequence[int], ends: Sequence[int], fences: Sequence[int]) -> list[int]:
    """The gaps between neighbouring spans (or runs; sorted, disjoint), ``[i]`` the one after
    the i-th, -1 where a join would hold one of ``fences`` (sorted) inside it: the gap holds
    it, or a neighbour does (one over a fence stays apart from both sides, each side whole).

    >>> fenced_gaps([0, 10, 20, 30], [4, 14, 24, 34], [7, 32])
    [-1, 6, -1]
    """
    n = len(starts)
    gaps = list(map(sub, starts[1:], ends[:-1]))
    for f in fences:
        i = bisect_right(ends, f) - 1  # the last one ending at or before f
        if i + 1 >= n:
            continue
        if i >= 0:
            gaps[i] = -1  # f lies in the gap after it, or inside the next one
        if starts[i + 1] < f and i + 1 < n - 1:
            gaps[i + 1] = -1  # inside the next one: the gap after that too
    return gaps


def gaps_to_join(gaps: Sequence[int], need: int) -> bytearray:
    """Which of ``gaps`` to join (1) to remove ``need`` of them: the shortest, of equal ones
    the earliest, never a negative one (a fence's); fewer when too few are open.

    >>> list(gaps_to_join([5, 3, -1, 3, 9], 3))
    [1, 1, 0, 1, 0]
    """
    chosen = bytearray(len(gaps))
    if need > 0:
        open_gaps = [i for i, g in enumerate(gaps) if g >= 0]
        for i in sorted(open_gaps, key=gaps.__getitem__)[:need]:  # (a stable sort: by index)
            chosen[i] = 1
    return chosen


class BatchCounts(NamedTuple):
    """Model steps counted in each of some windows (:meth:`Batches.clip`): ``model_steps``,
    ``decode`` (of them decode), ``tokens`` and ``reqs`` summed over the ``known`` ranges that
    carried them, per window; ``cut`` runs a window's edge cut (each given to one window)."""

    model_steps: array[int]
    decode: array[int]
    tokens: array[int]
    reqs: array[int]
    known: array[int]
    cut: int


def _int(args: Mapping[str, Any], key: str) -> int | None:
    value = args.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class Batches:
    """One process's model-step ranges as runs (see the module's docstring)."""

    __slots__ = ("fences", "join_gap", "pending", *_FIELDS)

    def __init__(self, fences: Sequence[int] = ()) -> None:
        for name in _FIELDS:
            setattr(self, name, array("q"))
        self.starts: array[int]
        self.ends: array[int]
        self.model_steps: array[int]
        self.decode: array[int]
        self.tokens: array[int]
        self.reqs: array[int]
        self.known: array[int]
        #: Runs that came out of order, to fold in.
        self.pending: list[tuple[int, ...]] = []
        #: A range this close after the last run is joined to it as it comes (set once the
        #: runs were compacted: it would be joined at the next compaction anyway; before, none).
        self.join_gap = _NEVER
        #: Times (sorted) no run is ever joined across.
        self.fences: Sequence[int] = fences

    def __len__(self) -> int:
        return len(self.starts) + len(self.pending)

    def __eq__(self, other: object) -> bool:
        """The same runs (what is pending folded in first): a process read whole and one read
        an event at a time are the same part."""
        if not isinstance(other, Batches):
            return NotImplemented
        self._fold()
        other._fold()
        return all(getattr(self, name) == getattr(other, name) for name in _FIELDS)

    __hash__ = None  # type: ignore[assignment]  # (mutable)

    def add(self, start: int, end: int, phase: str, args: Mapping[str, Any] | None) -> None:
        """Count one range of ``phase`` (nothing unless one of :data:`MODEL_STEPS`)."""
        if phase not in MODEL_STEPS or end < start:
            return
        tokens = reqs = None
        if args:
            tokens, reqs = _int(args, "tokens"), _int(args, "reqs")
        known = tokens is not None
        run = (start, end, 1, phase == DECODE, tokens or 0, reqs or 0, known)
        starts = self.starts
        if starts and start < starts[-1]:
            self.pending.append(run)
            if len(self.pending) >= _BATCH:
                self._fold()
            return
        if starts and start - self.ends[-1] <= self.join_gap and not self._fenced(end):
            self._join_last(run)
            return
        for name, value in zip(_FIELDS, run):
            getattr(self, name).append(value)
        if len(starts) > _BUILD:
            self.join_gap = max(self.join_gap, self.compact(_BUILD // 2))

    def _fenced(self, end: int) -> bool:
        """Whether a fence lies inside the last run joined to a range ending at ``end``."""
        i = bisect_right(self.fences, self.starts[-1])
        return i < len(self.fences) and self.fences[i] < end

    def _join_last(self, run: tuple[int, ...]) -> None:
        if run[1] > self.ends[-1]:
            self.ends[-1] = run[1]
        for name, value in zip(_FIELDS[2:], run[2:]):
            getattr(self, name)[-1] += value

    def runs(self) -> list[tuple[int, ...]]:
        """Each run's fields (start, end, model steps, decode, tokens, reqs, known), in
        order (out-of-order ranges folded first)."""
        self._fold()
        return list(zip(*(getattr(self, name) for name in _FIELDS)))

    def _set(self, runs: Sequence[tuple[int, ...]]) -> None:
        columns = list(zip(*runs)) if runs else [()] * len(_FIELDS)
        for name, column in zip(_FIELDS, columns):
            setattr(self, name, array("q", column))

    def _fold(self) -> None:
        if self.pending:
            pending, self.pending = self.pending, []
            self._set(sorted([*zip(*(getattr(self, n) for n in _FIELDS)), *pending]))
            if len(self.starts) > _BUILD:
                self.compact(_BUILD // 2)

    def merge(self, other: Batches) -> Batches:
        """Count ``other``'s ranges too (another part of the same process); returns itself."""
        self.pending += other.runs()
        self.join_gap = max(self.join_gap, other.join_gap)
        self._fold()
        return self

    def compact(self, limit: int, fences: Sequence[int] = ()) -> int:
        """Join neighbouring runs, the shortest gaps first (of equal gaps, the earliest), until
        at most ``limit`` are left: exactly as many joins as that takes, never across a time in
        ``fences`` or the runs' own (sorted; a gap holding one stays, so fewer than ``limit``
        may be out of reach). Returns the widest gap joined (0: none).

        >>> b = Batches()
        >>> for i in range(6):  # decode steps every 10 ns: every gap alike
        ...     b.add(10 * i, 10 * i + 4, "decode_batch", None)
        >>> b.compact(4, fences=[25]), list(b.model_steps)
        (6, [3, 1, 1, 1])
        """
        self._fold()
        n = len(self.starts)
        if n <= max(limit, 1):
            return 0
        gaps = fenced_gaps(self.starts, self.ends, all_fences(fences, self.fences))
        chosen = gaps_to_join(gaps, n - max(limit, 1))
        if not any(chosen):
            return 0
        widest = max(g for g, joined in zip(gaps, chosen) if joined)
        out: list[list[int]] = []
        for i, run in enumerate(zip(*(getattr(self, name) for name in _FIELDS))):
            if out and chosen[i - 1]:
                last = out[-1]
                last[1] = max(last[1], run[1])
                for k in range(2, len(_FIELDS)):
                    last[k] += run[k]
            else:
                out.append(list(run))
        self._set([tuple(r) for r in out])
        return max(int(widest), 0)

    def finish(self, fences: Sequence[int] = ()) -> Batches:
        """Join runs down to what a worker ships (never across ``fences``); returns itself."""
        self.compact(_SHIP, fences)
        return self

    @property
    def joined(self) -> bool:
        """Whether a run holds more than one range (joined to bound memory)."""
        self._fold()
        return any(n > 1 for n in self.model_steps)

    def joined_across(self, times: Sequence[int]) -> bool:
        """Whether a run of several ranges holds one of ``times`` (sorted) inside it."""
        self._fold()
        for start, end, n in zip(self.starts, self.ends, self.model_steps):
            if n > 1:
                i = bisect_right(times, start)
                if i < len(times) and times[i] < end:
                    return True
        return False

    def clip(self, windows: Sequence[tuple[int, int]]) -> BatchCounts:
        """The counts in each of ``windows`` (sorted, disjoint): each run goes to the window
        holding its middle (none: counted nowhere)."""
        self._fold()
        n = len(windows)
        sums = [array("q", [0]) * n for _ in range(5)]
        firsts = [a for a, _ in windows]
        cut = 0
        for run in zip(*(getattr(self, name) for name in _FIELDS)):
            start, end = run[0], run[1]
            w = bisect_right(firsts, (start + end) // 2) - 1
            if w < 0 or (start + end) // 2 >= windows[w][1]:
                continue
            if start < windows[w][0] or end > windows[w][1]:
                cut += 1
            for column, value in zip(sums, run[2:]):
                column[w] += value
        steps, decode, tokens, reqs, known = sums
        return BatchCounts(steps, decode, tokens, reqs, known, cut)
