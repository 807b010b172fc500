"""Which file's copy of a process to use, and which files are on another clock.

One process may be in several files: the demo writes each rank as a database and as a Chrome
trace, ``MSTX_MARKS_OUT`` adds a spill, a merged job timeline repeats everything. A process is
known by its rank and its pids. The database wins (it is what msprof-analyze reads), then the
Chrome trace, then the spill (all that is left of a killed process), then the newest file.
Copies that hold as many records as the one used are duplicates and pass silently; when some
differ, one note says so for all ranks.

Timestamps are wall-clock (``time.time_ns()``) nanoseconds; a file whose timestamps are on a
clock since boot cannot be placed beside the others and is left out with an error, whichever
clock the fewer files are on.

>>> from pathlib import Path
>>> a = Copy(0, frozenset({7}), 3, Path("a.db"), 2 * 10**18, "", "db")
>>> b = Copy(0, frozenset({7}), 3, Path("a.trace.json"), 2 * 10**18, "", "chrome")
>>> chosen, notes = pick_copies([(a.source, [a]), (b.source, [b])], errors=[])
>>> [c.payload for c in chosen], notes
(['db'], [])
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from mstx_marks.base.records import TraceFileError
from mstx_marks.export.spill import SPILL_SUFFIX

__all__ = ["EPOCH_NS", "Copy", "pick_copies"]

#: Epoch nanoseconds pass 1e18 in September 2001; a clock since boot stays far below it.
EPOCH_NS = 10**18

T = TypeVar("T")


@dataclass
class Copy(Generic[T]):
    """One process as one file holds it; ``payload`` is what was read (a trace or a part)."""

    rank: int
    pids: frozenset[int]
    n_records: int
    source: Path | None
    first_ns: int | None
    role: str
    payload: T

    @property
    def key(self) -> tuple[int, frozenset[int]]:
        return self.rank, self.pids

    def preference(self) -> tuple[int, float]:
        name = self.source.name if self.source is not None else ""
        kind = 2 if name.endswith(".db") else 0 if name.endswith(SPILL_SUFFIX) else 1
        try:
            mtime = os.path.getmtime(self.source) if self.source is not None else 0.0
        except OSError:
            mtime = 0.0
        return kind, mtime

    @property
    def is_db(self) -> bool:
        return self.source is not None and self.source.suffix == ".db"


def _drop_other_clocks(
    loaded: list[tuple[Path, list[Copy[T]]]], errors: list[str]
) -> list[tuple[Path, list[Copy[T]]]]:
    def on_epoch(copies: list[Copy[T]]) -> bool:
        starts = [c.first_ns for c in copies if c.first_ns is not None]
        return not starts or min(starts) >= EPOCH_NS

    epoch = [item for item in loaded if on_epoch(item[1])]
    boot = [item for item in loaded if not on_epoch(item[1])]
    keep, drop = (epoch, boot) if len(epoch) >= len(boot) else (boot, epoch)
    for path, _ in drop:
        errors.append(
            str(
                TraceFileError(
                    path,
                    f"its timestamps are on a different clock from the other {len(keep)} "
                    "file(s) (time since boot versus since the epoch); left out",
                )
            )
        )
    return keep


def _ranks_phrase(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]} is"
    return f"{len(ranks)} ranks ({', '.join(map(str, ranks))}) are"


def _notes(chosen: dict[tuple[int, frozenset[int]], Copy[T]],
           others: dict[tuple[int, frozenset[int]], list[Copy[T]]]) -> list[str]:  # fmt: skip
    over_chrome, newest = [], []
    for key in sorted(others, key=lambda k: (k[0], sorted(k[1]))):
        kept, rank = chosen[key], key[0]
        differ = [c for c in others[key] if c.n_records != kept.n_records]
        if any(kept.is_db and not c.is_db for c in differ):
            over_chrome.append(rank)
        elif differ:
            newest.append(rank)
    notes = []
    if over_chrome:
        notes.append(
            f"{_ranks_phrase(over_chrome)} in both a database and a Chrome trace that "
            "hold different numbers of records; using the databases"
        )
    if newest:
        notes.append(
            f"{_ranks_phrase(newest)} in several files of one kind that hold different numbers "
            "of records; using the newest file"
        )
    return notes


def pick_copies(
    loaded: list[tuple[Path, list[Copy[T]]]], errors: list[str]
) -> tuple[list[Copy[T]], list[str]]:
    """One copy per process from the files read (``(path, copies in it)``), and the notes.

    Files on the odd clock are added to ``errors``. A copy that loses lends its role to the
    winner when the winner has none.
    """
    chosen: dict[tuple[int, frozenset[int]], Copy[T]] = {}
    others: dict[tuple[int, frozenset[int]], list[Copy[T]]] = {}
    for _, copies in _drop_other_clocks(loaded, errors):
        for c in copies:
            other = chosen.get(c.key)
            if other is not None and other.preference() >= c.preference():
                others.setdefault(c.key, []).append(c)
                other.role = other.role or c.role
                continue
            if other is not None:
                others.setdefault(c.key, []).append(other)
                c.role = c.role or other.role
            chosen[c.key] = c
    return list(chosen.values()), _notes(chosen, others)
