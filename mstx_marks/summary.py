"""Per-phase statistics of recorded ranges, per rank and across ranks: ``mstx_marks summary``.

Reads the Chrome traces (``*.trace.json``) and Ascend databases (``ascend_pytorch_profiler*.db``,
ours or torch_npu's) in one folder or a tree of rank folders, folds phase names through the
registry's aliases, and reports for each phase: count, total, mean, p50, p90, max, share of step
time, and how unbalanced the ranks are (slowest total over fastest, and which rank is slowest).

>>> from mstx_marks.records import RangeRecord
>>> from mstx_marks.export import RankTrace
>>> r = lambda name, s, e: RangeRecord(name, "default", s, e, 1, 1)
>>> traces = [RankTrace(0, [r("step", 0, 100), r("gen", 0, 40)]),
...           RankTrace(1, [r("step", 0, 100), r("gen", 0, 80)])]
>>> gen = summarize(traces).phases[1]  # "gen" (verl's trainer timer) folds into its phase
>>> gen.name, gen.overall.total_ns, gen.imbalance, gen.slowest_rank
('generate_sequences', 120, 2.0, 1)
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from . import phases
from .export import read_ascend_db, read_chrome_trace
from .export.spill import SPILL_SUFFIX, read_spill
from .records import RankTrace, TraceFileError
from .timeline import write_svg

__all__ = [
    "PhaseSummary",
    "Stats",
    "Summary",
    "find_trace_files",
    "fold_name",
    "format_csv",
    "format_json",
    "format_table",
    "load_traces",
    "summarize",
    "summary_cli",
]

_DB_FILE = re.compile(r"ascend_pytorch_profiler(?:_\d+)?\.db\Z")
_CHROME_SUFFIX = ".trace.json"
# Epoch nanoseconds pass 1e18 in September 2001; a clock since boot stays far below it.
_EPOCH_NS = 10**18


def fold_name(name: str) -> str:
    """The registry's canonical name for ``name``, or ``name`` itself when it is not a phase.

    >>> fold_name("no_such_phase_anywhere")
    'no_such_phase_anywhere'
    """
    try:
        return phases.canonical(name)
    except KeyError:
        return name


@dataclass
class Stats:
    """Durations of one phase (nanoseconds); ``step_share`` is ``total_ns`` over step time."""

    count: int
    total_ns: int
    mean_ns: float
    p50_ns: float
    p90_ns: float
    max_ns: int
    step_share: float | None


@dataclass
class PhaseSummary:
    """One phase across ranks (``overall``) and on each rank; ``imbalance`` is the slowest
    rank's total over the fastest's, among the ranks that ran the phase."""

    name: str
    overall: Stats
    per_rank: dict[int, Stats]
    imbalance: float | None
    slowest_rank: int


@dataclass
class Summary:
    """Everything ``summary`` reports; ``errors`` name the files that were left out."""

    phases: list[PhaseSummary]
    step_time_ns: dict[int, int]
    step_count: dict[int, int]
    sources: dict[int, str]
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _percentile(ordered: Sequence[int], q: float) -> float:
    # Linear interpolation between closest ranks, as numpy's default does.
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _stats(durations: list[int], step_time: int) -> Stats:
    ordered = sorted(durations)
    total = sum(ordered)
    return Stats(
        count=len(ordered),
        total_ns=total,
        mean_ns=total / len(ordered),
        p50_ns=_percentile(ordered, 0.5),
        p90_ns=_percentile(ordered, 0.9),
        max_ns=ordered[-1],
        step_share=total / step_time if step_time else None,
    )


def summarize(traces: Sequence[RankTrace], fold: Callable[[str], str] = fold_name) -> Summary:
    """Statistics of the closed ranges in ``traces`` (one per rank), phases in order of first
    start. Steps come from each trace's ``steps`` or else its ``step`` ranges."""
    traces = [t.with_steps() for t in traces]
    durations: dict[str, dict[int, list[int]]] = {}
    first_start: dict[str, int] = {}
    for t in traces:
        for r in t.ranges:
            name = fold(r.name)
            durations.setdefault(name, {}).setdefault(t.rank, []).append(r.end_ns - r.start_ns)
            first_start[name] = min(first_start.get(name, r.start_ns), r.start_ns)
    step_time = {t.rank: t.step_time_ns for t in traces}
    result = []
    for name in sorted(durations, key=first_start.__getitem__):
        by_rank = durations[name]
        per_rank = {rank: _stats(d, step_time[rank]) for rank, d in sorted(by_rank.items())}
        pooled = [d for ds in by_rank.values() for d in ds]
        overall = _stats(pooled, sum(step_time[rank] for rank in by_rank))
        totals = {rank: s.total_ns for rank, s in per_rank.items()}
        slowest = max(totals, key=totals.__getitem__)
        fastest = min(totals.values())
        imbalance = totals[slowest] / fastest if fastest else None
        result.append(PhaseSummary(name, overall, per_rank, imbalance, slowest))
    return Summary(
        phases=result,
        step_time_ns=step_time,
        step_count={t.rank: len(t.steps) for t in traces},
        sources={t.rank: str(t.source) for t in traces},
    )


def find_trace_files(path: str | Path) -> list[Path]:
    """``path`` itself if it is a file, else the trace files anywhere under it, sorted."""
    root = Path(path)
    if root.is_file():
        return [root]
    found = [
        p
        for p in root.rglob("*")
        if p.is_file()
        and (
            _DB_FILE.match(p.name)
            or p.name.endswith(_CHROME_SUFFIX)
            or (p.parent.name == "spill" and p.name.endswith(SPILL_SUFFIX))
        )
    ]
    return sorted(found)


def _read(path: Path) -> list[RankTrace]:
    if path.suffix == ".db":
        return [read_ascend_db(path)]
    if path.name.endswith(SPILL_SUFFIX):
        return [read_spill(path)]
    return read_chrome_trace(path)


#: One process of one rank: the files a process writes (database, Chrome trace, spill) share it.
_Key = tuple[int, frozenset[int]]


def _key(t: RankTrace) -> _Key:
    return t.rank, frozenset(r.pid for r in t.records)


def _by_rank(traces: list[RankTrace]) -> list[RankTrace]:
    """One trace per rank: the processes that share a rank (a trainer rank and the rollout
    engine processes it started, Ray actors without RANK) are summed as that rank."""
    grouped: dict[int, list[RankTrace]] = {}
    for t in traces:
        grouped.setdefault(t.rank, []).append(t)
    out = []
    for rank in sorted(grouped):
        group = grouped[rank]
        if len(group) == 1:
            out.append(group[0])
            continue
        records = sorted((r for t in group for r in t.records), key=lambda r: r.start_ns)
        steps = sorted({s for t in group for s in t.steps})
        roles = "+".join(sorted({t.role for t in group if t.role}))
        out.append(RankTrace(rank, records, steps, group[0].source, roles))
    return out


def _drop_other_clocks(
    loaded: list[tuple[Path, list[RankTrace]]], errors: list[str]
) -> list[tuple[Path, list[RankTrace]]]:
    def on_epoch(traces: list[RankTrace]) -> bool:
        starts = [r.start_ns for t in traces for r in t.records]
        return not starts or min(starts) >= _EPOCH_NS

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


def _duplicate_notes(
    chosen: dict[_Key, RankTrace], others: dict[_Key, list[RankTrace]]
) -> list[str]:
    """At most one line per reason, for the ranks whose files disagree (not the same number of
    records): a copy that agrees (the demo writes each rank as a database and Chrome traces) is
    worth no note."""
    over_chrome, newest = [], []
    for key in sorted(others, key=lambda k: (k[0], sorted(k[1]))):
        kept, rank = chosen[key], key[0]
        differ = [t for t in others[key] if len(t.records) != len(kept.records)]
        kept_db = kept.source is not None and kept.source.suffix == ".db"
        if any(kept_db and t.source is not None and t.source.suffix != ".db" for t in differ):
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


def load_traces(path: str | Path) -> tuple[list[RankTrace], list[str], list[str]]:
    """Read every trace under ``path``: ``(traces, errors, notes)``, one trace per rank.

    A file that cannot be read is an error naming it, and the others are still read. Spill
    files (``MSTX_MARKS_OUT``'s ``spill/*.jsonl``) are read too. Several processes of one rank
    are summed as that rank. When one process is in several files (the demo writes each rank as
    a database and as a Chrome trace), the Ascend database wins, then the newest file. Copies
    that hold as many records as the file used are duplicates and pass silently; when some
    differ, ``notes`` says so in one line for all ranks.
    """
    errors: list[str] = []
    root = Path(path)
    if not root.exists():
        return [], [f"{root}: no such file or folder"], []
    loaded = []
    for file in find_trace_files(root):
        try:
            loaded.append((file, _read(file)))
        except TraceFileError as e:
            errors.append(str(e))
    chosen: dict[_Key, RankTrace] = {}
    others: dict[_Key, list[RankTrace]] = {}

    def preference(t: RankTrace) -> tuple[int, float]:
        assert t.source is not None  # read from a file
        # A process's database and Chrome trace are written at its end; its spill may be all
        # that is left of a process that was killed.
        kind = 2 if t.source.suffix == ".db" else 0 if t.source.name.endswith(SPILL_SUFFIX) else 1
        return kind, os.path.getmtime(t.source)

    for _, traces in _drop_other_clocks(loaded, errors):
        for t in traces:
            key = _key(t)
            other = chosen.get(key)
            if other is not None and preference(other) >= preference(t):
                others.setdefault(key, []).append(t)
                other.role = other.role or t.role
                continue
            if other is not None:
                others.setdefault(key, []).append(other)
                t.role = t.role or other.role
            chosen[key] = t
    if not chosen and not errors:
        errors.append(
            f"{root}: no traces found (looked for *{_CHROME_SUFFIX} and "
            "ascend_pytorch_profiler*.db)"
        )
    notes = _duplicate_notes(chosen, others)
    return _by_rank(list(chosen.values())), errors, notes


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3f}"


def _share(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.1f}"


def format_table(summary: Summary) -> str:
    """The human-readable table: per phase, an ``all`` row and one row per rank."""
    ranks = sorted(summary.step_time_ns)
    lines = [
        f"{len(ranks)} rank(s); steps and step time: "
        + ", ".join(
            f"rank {r}: {summary.step_count[r]} steps, {_ms(summary.step_time_ns[r])} ms"
            for r in ranks
        )
    ]
    width = max([len("phase"), *(len(p.name) for p in summary.phases)])
    head = ("rank", "count", "total ms", "mean ms", "p50 ms", "p90 ms", "max ms", "step %")
    lines.append(
        f"{'phase':<{width}} {head[0]:>4} {head[1]:>6} "
        + " ".join(f"{h:>10}" for h in head[2:7])
        + f" {head[7]:>7}  imbalance (slowest rank)"
    )
    for p in summary.phases:
        rows: list[tuple[str, str, Stats]] = [(p.name, "all", p.overall)]
        rows += [("", str(rank), s) for rank, s in p.per_rank.items()]
        for label, rank, s in rows:
            nums = (s.total_ns, s.mean_ns, s.p50_ns, s.p90_ns, s.max_ns)
            line = (
                f"{label:<{width}} {rank:>4} {s.count:>6} "
                + " ".join(f"{_ms(v):>10}" for v in nums)
                + f" {_share(s.step_share):>7}"
            )
            if rank == "all":
                ratio = "-" if p.imbalance is None else f"{p.imbalance:.2f}"
                line += f"  {ratio} (rank {p.slowest_rank})"
            lines.append(line.rstrip())
    return "\n".join(lines)


_CSV_FIELDS = ("phase", "rank", *Stats.__dataclass_fields__, "imbalance", "slowest_rank")


def format_csv(summary: Summary) -> str:
    """One CSV row per phase and rank (``rank`` is ``all`` for the across-ranks row)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(_CSV_FIELDS)
    for p in summary.phases:
        writer.writerow([p.name, "all", *asdict(p.overall).values(), p.imbalance, p.slowest_rank])
        for rank, s in p.per_rank.items():
            writer.writerow([p.name, rank, *asdict(s).values(), "", ""])
    return out.getvalue()


def format_json(summary: Summary) -> dict[str, Any]:
    """The summary as plain JSON data (rank keys are strings, durations nanoseconds)."""
    return {
        "ranks": {
            str(r): {
                "source": summary.sources[r],
                "steps": summary.step_count[r],
                "step_time_ns": summary.step_time_ns[r],
            }
            for r in sorted(summary.step_time_ns)
        },
        "phases": [
            {
                "name": p.name,
                "all": asdict(p.overall),
                "ranks": {str(rank): asdict(s) for rank, s in p.per_rank.items()},
                "imbalance": p.imbalance,
                "slowest_rank": p.slowest_rank,
            }
            for p in summary.phases
        ],
        "errors": summary.errors,
    }


def summary_cli(argv: list[str]) -> int:
    """``mstx-marks summary``: the command line lives in :mod:`mstx_marks.cli`."""
    from .cli import main

    return main(["summary", *argv])


def run_summary(path: str, fmt: str = "table", svg: str | None = None) -> int:
    """Print the summary of the traces under ``path`` as ``fmt`` (table, csv, json), and draw
    the timeline to ``svg``; returns the exit code: 0, or 1 when a file could not be read (the
    others are still summarised) or none was found, or 2 when the ``svg`` file's folder does not
    exist (checked first) or it cannot be written."""
    if svg:
        # Checked before the work, and not created: a mistyped folder should not appear silently.
        folder = Path(svg).parent
        if not folder.is_dir():
            why = "is not a folder" if folder.exists() else "does not exist"
            print(f"error: --svg {svg}: the folder {folder} {why}", file=sys.stderr)
            return 2

    traces, errors, notes = load_traces(path)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    for error in errors:
        print(f"error: {error}", file=sys.stderr)
    if not traces:
        return 1
    summary = summarize(traces)
    summary.errors, summary.notes = errors, notes
    if fmt == "csv":
        sys.stdout.write(format_csv(summary))
    elif fmt == "json":
        print(json.dumps(format_json(summary), indent=1))
    else:
        print(format_table(summary))
    if svg:
        try:
            print(f"timeline: {write_svg(svg, traces, fold_name)}", file=sys.stderr)
        except OSError as e:
            print(f"error: --svg {svg}: cannot write it: {e}", file=sys.stderr)
            return 2
    return 1 if errors else 0
