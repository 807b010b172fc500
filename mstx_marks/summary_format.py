"""The summary as a table for people, as CSV and as JSON.

Names are printed with control characters escaped (``\\x1b`` stays four characters, so a name
cannot move the cursor or colour the terminal); CSV and JSON carry them as they are (both quote).

>>> from mstx_marks.records import RangeRecord, RankTrace
>>> from mstx_marks.summary import summarize
>>> t = RankTrace(0, [RangeRecord("gen\\x1b[31m", "default", 0, 10, 1, 1)])
>>> "gen\\\\x1b[31m" in format_table(summarize([t], fold=str))
True
"""

from __future__ import annotations

import csv
import io
from dataclasses import asdict
from typing import Any

from .aggregate import Stats, Summary
from .sketch import RELATIVE_ERROR

__all__ = ["format_csv", "format_json", "format_table", "printable"]


def printable(name: str) -> str:
    """``name`` with every non-printable character as a Python escape.

    >>> printable("a\\tb\\x00"), printable("é ok")
    ('a\\\\tb\\\\x00', 'é ok')
    """
    if name.isprintable():
        return name
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in name)


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3f}"


def _share(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.1f}"


def _steps_phrase(summary: Summary, rank: int) -> str:
    keys = summary.step_keys.get(rank, [])
    count = summary.step_count[rank]
    text = f"rank {rank}: {count} steps"
    if keys:
        shown = ", ".join(printable(k) for k in keys[:4]) + (", ..." if len(keys) > 4 else "")
        text += f" ({shown})"
    return text + f", {_ms(summary.step_time_ns[rank])} ms"


def format_table(summary: Summary) -> str:
    """The human-readable table: per phase, an ``all`` row and one row per rank."""
    ranks = sorted(summary.step_time_ns)
    lines = [
        f"{len(ranks)} rank(s); steps and step time: "
        + ", ".join(_steps_phrase(summary, r) for r in ranks)
    ]
    names = {p.name: printable(p.name) for p in summary.phases}
    width = max([len("phase"), *(len(n) for n in names.values())])
    head = ("rank", "count", "total ms", "mean ms", "p50 ms", "p90 ms", "max ms", "step %")
    lines.append(
        f"{'phase':<{width}} {head[0]:>4} {head[1]:>6} "
        + " ".join(f"{h:>10}" for h in head[2:7])
        + f" {head[7]:>7}  imbalance (slowest rank)"
    )
    sketched = False
    for p in summary.phases:
        rows: list[tuple[str, str, Stats]] = [(names[p.name], "all", p.overall)]
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
                if s.percentile_error:
                    line += " ~"
                    sketched = True
            lines.append(line.rstrip())
    if sketched:
        lines.append(
            f"~ p50/p90 of this 'all' row are within {100 * RELATIVE_ERROR:g}% (merged "
            "per-rank sketches); every other figure is exact"
        )
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
                "step_keys": summary.step_keys.get(r, []),
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
        "notes": summary.notes,
    }
