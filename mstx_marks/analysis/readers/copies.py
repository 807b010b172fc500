"""Which run to read, which file's copy of a process to use, and which files are on another
clock.

A folder may hold several runs: a program run again into it, or two jobs writing into it at
once. Each file names its run (the spill header's ``run``, a Chrome trace's ``otherData.run``, a
database's ``mstx_marks_run``); runs are never summed together (:func:`run_groups`,
:func:`pick_run`).

One process may be in several files: the demo writes each rank as a database and as a Chrome
trace, ``MSTX_MARKS_OUT`` adds a spill, a merged job timeline repeats everything. A process is
known by its rank and its pids. A file of ours (it names its run) wins over another tool's: a
profiler's capture of the same process (``MSTX_MARKS_CAPTURE``'s windows, torch_npu's) holds only
its window. Then the database wins (it is what msprof-analyze reads), then the Chrome trace, then
the spill (all that is left of a killed process), then the newest file.
Copies that hold as many records as the one used are duplicates and pass silently; when some
differ, one note says so for all ranks. A copy that loses lends what the winner does not say:
its role, and where the process recorded and on which clock (its
:class:`~mstx_marks.base.records.Origin`: a spill's header says it; a database or Chrome trace
written before they carried it does not), so that which copy is read never moves a process
on the time axis.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

from mstx_marks.base.records import Origin, TraceFileError
from mstx_marks.export.spill import SPILL_SUFFIX

__all__ = ["EPOCH_NS", "Copy", "RunPick", "pick_copies", "pick_run", "run_groups"]

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
    #: Tells apart processes with the same host and pid (their own pid namespaces).
    instance: str = ""
    run: str = ""
    #: Where the process recorded and on which clock, as this file says it.
    origin: Origin = field(default_factory=Origin)

    @property
    def key(self) -> tuple[int, frozenset[int], str]:
        return self.rank, self.pids, self.instance

    def preference(self) -> tuple[bool, int, float]:
        name = self.source.name if self.source is not None else ""
        kind = 2 if name.endswith(".db") else 0 if name.endswith(SPILL_SUFFIX) else 1
        try:
            mtime = os.path.getmtime(self.source) if self.source is not None else 0.0
        except OSError:
            mtime = 0.0
        return bool(self.run), kind, mtime

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


def _notes(chosen: dict[tuple[int, frozenset[int], str], Copy[T]],
           others: dict[tuple[int, frozenset[int], str], list[Copy[T]]]) -> list[str]:  # fmt: skip
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

    Files on the odd clock are added to ``errors``. A copy that loses lends its role and its
    origin to the winner when the winner has none: the caller gives the winner's payload
    its ``role`` and ``origin``.

    >>> old = Copy(0, frozenset({7}), 3, Path("a.db"), 2 * 10**18, "", "db")
    >>> spill = Copy(0, frozenset({7}), 3, Path("7.jsonl"), 2 * 10**18, "actor", "spill",
    ...              origin=Origin("h1", "b1", 5))
    >>> (won,), _ = pick_copies([(old.source, [old]), (spill.source, [spill])], errors=[])
    >>> won.payload, won.role, won.origin.host
    ('db', 'actor', 'h1')
    """
    chosen: dict[tuple[int, frozenset[int], str], Copy[T]] = {}
    others: dict[tuple[int, frozenset[int], str], list[Copy[T]]] = {}
    found: list[Copy[T]] = [c for _, copies in _drop_other_clocks(loaded, errors) for c in copies]
    # A copy that names its instance first: one that names none (another tool's file, an older
    # one) is then taken as a copy of the process with its rank and pids, whichever instance.
    instances: dict[tuple[int, frozenset[int]], str] = {}
    for c in found:
        if c.instance:
            instances.setdefault((c.rank, c.pids), c.instance)
    for c in found:
        if not c.instance and (c.rank, c.pids) in instances:
            c.instance = instances[(c.rank, c.pids)]
    for c in found:
        other = chosen.get(c.key)
        if other is not None and other.preference() >= c.preference():
            others.setdefault(c.key, []).append(c)
            _lend(c, other)
            continue
        if other is not None:
            others.setdefault(c.key, []).append(other)
            _lend(other, c)
        chosen[c.key] = c
    return list(chosen.values()), _notes(chosen, others)


def _lend(loser: Copy[T], winner: Copy[T]) -> None:
    """What ``winner`` does not say of its process and ``loser`` does."""
    winner.role = winner.role or loser.role
    if not winner.origin.known:
        winner.origin = loser.origin


def _end_ns(payload: object) -> int | None:
    """The latest end of what a copy holds (a trace's records, or a part's span)."""
    span = getattr(payload, "span", None)
    if span is not None:
        return int(span[1])
    records = getattr(payload, "records", None)
    ends = [getattr(r, "end_ns", r.start_ns) for r in records] if records else []
    return max(ends) if ends else None


@dataclass
class _Group:
    """Run ids taken as one run: their span, and the processes (role, rank) they hold."""

    ids: list[str]
    reach: int
    members: set[tuple[str, int]]


def run_groups(loaded: list[tuple[Path, list[Copy[T]]]]) -> list[list[str]]:
    """The run ids of the copies, grouped into runs, oldest first (by first start).

    Each id is a run of its own, whenever it ran: two jobs writing into one folder at once are
    two runs. One case only is joined: ids that overlap in time and share no process (role and
    rank), which are the ranks of one job whose launcher made no id (a multi-node torchrun:
    each node's ranks make their own); two jobs both have a rank 0.

    >>> from types import SimpleNamespace as Part
    >>> def c(run, rank, start, end):  # one process's copy: its rank, run and span
    ...     part = Part(span=(start, end))
    ...     return Copy(rank, frozenset({rank}), 1, None, start, "", part, "", run)
    >>> def groups(*copies):
    ...     return run_groups([(Path("f"), list(copies))])
    >>> groups(c("a", 0, 0, 10), c("b", 0, 5, 15))  # rank 0 twice at once: two jobs
    [['a'], ['b']]
    >>> groups(c("a", 0, 0, 10), c("b", 1, 5, 15))  # rank 0, then rank 1: one job's ranks
    [['a', 'b']]
    >>> groups(c("a", 0, 0, 10), c("b", 1, 20, 30))  # one after the other: two runs
    [['a'], ['b']]
    """
    spans: dict[str, list[int]] = {}
    roles: dict[tuple[str, int, frozenset[int], str], str] = {}
    for _, copies in loaded:
        for c in copies:
            if not c.run or c.first_ns is None:
                continue
            end = _end_ns(c.payload)
            span = spans.setdefault(c.run, [c.first_ns, c.first_ns])
            span[0] = min(span[0], c.first_ns)
            span[1] = max(span[1], c.first_ns if end is None else end)
            # a database copy may lack the role its process's other copies name
            key = (c.run, *c.key)
            roles[key] = roles.get(key) or c.role
    members: dict[str, set[tuple[str, int]]] = {}
    for (run, rank, _, _), role in roles.items():
        members.setdefault(run, set()).add((role, rank))
    groups: list[_Group] = []
    for run in sorted(spans, key=lambda r: (spans[r][0], r)):
        start, end = spans[run]
        home = next(
            (g for g in reversed(groups) if start <= g.reach and not g.members & members[run]),
            None,
        )
        if home is None:
            groups.append(_Group([run], end, set(members[run])))
        else:
            home.ids.append(run)
            home.reach = max(home.reach, end)
            home.members |= members[run]
    return [g.ids for g in groups]


@dataclass
class RunPick(Generic[T]):
    """What :func:`pick_run` kept: the copies of the run read, which run that is (its first
    id; ``"all"``; ``""`` when no file names one), and the ids of the other runs here, newest
    first (every run's, with ``"all"``)."""

    loaded: list[tuple[Path, list[Copy[T]]]]
    run: str = ""
    others: list[str] = field(default_factory=list)


def pick_run(
    loaded: list[tuple[Path, list[Copy[T]]]], run: str | None, errors: list[str], notes: list[str]
) -> RunPick[T]:
    """The copies of one run: ``run`` (an id, or ``"all"``), else the newest (the one whose
    processes started last). Files that name no run (another tool's, older ones) are kept.
    Runs are told apart as :func:`run_groups` says; several in the folder (a program run again
    into it, or two jobs writing into it at once) are never summed together: a note says which
    was read and which others there are.
    """
    groups = run_groups(loaded)
    if run == "all":
        several = len(groups) > 1
        return RunPick(loaded, "all", [g[0] for g in groups[::-1]]) if several else RunPick(loaded)
    if not groups:
        if run is not None:
            errors.append(f"no run {run!r} here (no file names its run)")
            return RunPick([])
        return RunPick(loaded)
    if run is None:
        chosen = groups[-1]
        if len(groups) > 1:
            others = ", ".join(g[0] for g in reversed(groups[:-1]))
            notes.append(
                f"{len(groups)} runs are here; reading the newest, {chosen[0]} (--run ID for"
                f" another, --run all for every one); the others: {others}"
            )
    else:
        found = [g for g in groups if run in g]
        if not found:
            known = ", ".join(g[0] for g in reversed(groups))
            errors.append(f"no run {run!r} here (runs: {known})")
            return RunPick([])
        chosen = found[0]
    keep = {*chosen, ""}
    kept = [(path, [c for c in copies if c.run in keep]) for path, copies in loaded]
    return RunPick(kept, chosen[0], [g[0] for g in reversed(groups) if g is not chosen])
