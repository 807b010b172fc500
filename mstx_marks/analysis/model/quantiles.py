"""A mergeable quantile sketch with a relative-error guarantee (DDSketch, Masson et al. 2019).

``summary`` gives exact percentiles per rank; across ranks it pools the ranks' durations when
they are few and otherwise merges one sketch per rank, so its memory does not grow with the
number of events. A duration ``x > 0`` falls in bucket ``ceil(log(x) / log(gamma))`` with
``gamma = (1 + a) / (1 - a)``; a bucket is reported as the value whose relative distance to both
of its edges is ``a``, so every order statistic read from the sketch is within a relative error
``a`` (:data:`RELATIVE_ERROR`) of the true one, and so is the linear interpolation between two of
them that :func:`percentile` computes (a weighted mean of two values each within ``a``). Zero
durations are counted apart, exactly. Merging adds bucket counts, so the merge of per-rank
sketches is the sketch of all ranks' durations: order and grouping do not matter.

>>> s = QuantileSketch()
>>> for d in range(1, 1001):
...     s.add(d)
>>> abs(s.quantile(0.5) - 500.5) / 500.5 <= RELATIVE_ERROR
True
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

__all__ = ["RELATIVE_ERROR", "QuantileSketch", "percentile"]

#: The relative error bound of every percentile read from a sketch (0.5 %).
RELATIVE_ERROR = 0.005
_GAMMA = (1 + RELATIVE_ERROR) / (1 - RELATIVE_ERROR)
_LOG_GAMMA = math.log(_GAMMA)


def percentile(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile of sorted values, interpolated linearly between the closest ranks as
    numpy's default does.

    >>> percentile([1, 2, 3, 4], 0.5)
    2.5
    """
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


class QuantileSketch:
    """Counts of durations in logarithmic buckets; :meth:`merge` adds another sketch in."""

    __slots__ = ("buckets", "count", "max", "min", "zeros")

    def __init__(self) -> None:
        self.buckets: dict[int, int] = {}
        self.zeros = 0
        self.count = 0
        self.min = 0
        self.max = 0

    def add(self, value: int) -> None:
        """Count one duration (nanoseconds; a negative one counts as zero)."""
        self.add_many((value,))

    def add_many(self, values: Iterable[int]) -> None:
        """Count several durations."""
        buckets, log, lg = self.buckets, math.log, _LOG_GAMMA
        for v in values:
            if self.count == 0:
                self.min = self.max = v
            elif v < self.min:
                self.min = v
            elif v > self.max:
                self.max = v
            self.count += 1
            if v <= 0:
                self.zeros += 1
                continue
            i = math.ceil(log(v) / lg)
            buckets[i] = buckets.get(i, 0) + 1

    def merge(self, other: QuantileSketch) -> None:
        """Add ``other``'s counts to this sketch."""
        if not other.count:
            return
        if not self.count:
            self.min, self.max = other.min, other.max
        else:
            self.min, self.max = min(self.min, other.min), max(self.max, other.max)
        self.count += other.count
        self.zeros += other.zeros
        for i, n in other.buckets.items():
            self.buckets[i] = self.buckets.get(i, 0) + n

    def _order_statistics(self, ranks: Sequence[int]) -> list[float]:
        """The estimated values of the given 0-based order statistics (ascending ranks)."""
        out: list[float] = []
        wanted = iter(ranks)
        k = next(wanted, None)
        seen = self.zeros
        while k is not None and k < seen:
            out.append(0.0)
            k = next(wanted, None)
        for i in sorted(self.buckets):
            seen += self.buckets[i]
            while k is not None and k < seen:
                value = 2 * _GAMMA**i / (_GAMMA + 1)
                out.append(min(max(value, self.min), self.max))  # the extremes are exact
                k = next(wanted, None)
        return out

    def quantile(self, q: float) -> float:
        """The ``q`` quantile, interpolated as :func:`percentile` does, within
        :data:`RELATIVE_ERROR` of the exact value."""
        if not self.count:
            return 0.0
        pos = q * (self.count - 1)
        lo = int(pos)
        hi = min(lo + 1, self.count - 1)
        v_lo, v_hi = self._order_statistics([lo, hi])
        return v_lo + (v_hi - v_lo) * (pos - lo)
