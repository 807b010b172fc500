"""Instants named ``X_start`` and ``X_stop`` are one range ``X``, as msprof-analyze pairs them.

``mstx_sum`` (msprof-analyze 26.2.0, ``handle_mark_data``) pairs marks per thread and per name:
a ``X_stop`` closes the latest unmatched ``X_start`` on its thread, and unmatched marks stay
marks. ``summary`` and the timelines read marks the same way, so a phase marked with two
instants is a phase.

>>> from mstx_marks.base.records import InstantRecord
>>> a = InstantRecord("sync_start", "default", 10, thread=1, pid=2)
>>> b = InstantRecord("sync_stop", "default", 25, thread=1, pid=2)
>>> [(r.name, r.kind, r.start_ns) for r in pair_marks([a, b])]
[('sync', 'range', 10)]
"""

from __future__ import annotations

from typing import Sequence

from mstx_marks.base.records import InstantRecord, RangeRecord, Record

__all__ = ["START_SUFFIX", "STOP_SUFFIX", "pair_marks"]

START_SUFFIX = "_start"
STOP_SUFFIX = "_stop"


def _pairable(rec: Record) -> bool:
    return isinstance(rec, InstantRecord) and (
        rec.name.endswith(START_SUFFIX) or rec.name.endswith(STOP_SUFFIX)
    )


def pair_marks(records: Sequence[Record]) -> list[Record]:
    """``records`` with each matched start/stop pair of instants replaced by one range, in
    start order; the range keeps the start mark's domain and args. Returns the same list when
    there is nothing to pair."""
    if not any(_pairable(r) for r in records):
        return list(records)
    open_: dict[tuple[int, int, str], list[InstantRecord]] = {}
    paired: set[int] = set()  # ids of the marks used up
    ranges: list[RangeRecord] = []
    for rec in sorted((r for r in records if _pairable(r)), key=lambda r: r.start_ns):
        assert isinstance(rec, InstantRecord)
        if rec.name.endswith(START_SUFFIX):
            key = (rec.pid, rec.thread, rec.name[: -len(START_SUFFIX)])
            open_.setdefault(key, []).append(rec)
            continue
        key = (rec.pid, rec.thread, rec.name[: -len(STOP_SUFFIX)])
        starts = open_.get(key)
        if not starts:
            continue  # a stop with no start stays a mark, as in mstx_sum
        start = starts.pop()
        paired.update((id(start), id(rec)))
        ranges.append(
            RangeRecord(
                key[2], start.domain, start.start_ns, rec.start_ns, rec.thread, rec.pid,
                args=start.args,
            )
        )  # fmt: skip
    kept: list[Record] = [r for r in records if id(r) not in paired]
    return sorted([*kept, *ranges], key=lambda r: r.start_ns)
