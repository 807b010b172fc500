"""The summary as a table for people, as CSV and as JSON.

Names are printed with control characters escaped (``\\x1b`` stays four characters, so a name
cannot move the cursor or colour the terminal); CSV and JSON carry them as they are (both quote).

>>> from mstx_marks.base.records import RangeRecord, RankTrace
>>> from mstx_marks.analysis.summary import summarize
>>> t = RankTrace(0, [RangeRecord("gen\\x1b[31m", "default", 0, 10, 1, 1)])
>>> "gen\\\\x1b[31m" in format_table(summarize([t], fold=str))
True
"""

from __future__ import annotations

import csv
import io
import textwrap
from dataclasses import asdict
from typing import Any

from mstx_marks.analysis.model.aggregate import PhaseSummary, Stats, Summary
from mstx_marks.analysis.model.quantiles import RELATIVE_ERROR
from mstx_marks.analysis.model.steps import default_steps
from mstx_marks.analysis.model.top_phases import MAX_PHASES, OtherPhases, top_phases
from mstx_marks.analysis.render.rl_steps_text import format_steps, steps_json
from mstx_marks.base.diagnostics import counted
from mstx_marks.base.records import Member

__all__ = ["format_csv", "format_json", "format_table", "printable", "run_line"]


def printable(name: str) -> str:
    """``name`` with every non-printable character as a Python escape.

    >>> printable("a\\tb\\x00"), printable("é ok")
    ('a\\\\tb\\\\x00', 'é ok')
    """
    if name.isprintable():
        return name
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in name)


#: The widest a phase name is shown in the table (the JSON and CSV keep it whole).
NAME_WIDTH = 80


def cut(name: str, width: int = NAME_WIDTH) -> str:
    """``name`` cut to ``width`` characters for the terminal, its end shown as ``...``.

    >>> cut("x" * 100, 10)
    'xxxxxxx...'
    """
    return name if len(name) <= width else name[: width - 3] + "..."


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3f}"


def _share(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.1f}"


def _steps_phrase(summary: Summary, member: Member) -> str:
    keys = summary.step_keys.get(member, [])
    count = summary.step_count[member]
    if not count:  # the shares are then of the whole recorded span: say so
        return f"rank {member.rank}: no steps, span {_ms(summary.step_time_ns[member])} ms"
    text = f"rank {member.rank}: {counted(count, 'step')}"
    whose = summary.steps_of.get(member)
    if whose is not None:  # the job's steps, its time attributed to them
        text += f" of {printable(whose.label)}"
    if keys:
        shown = ", ".join(printable(k) for k in keys[:4]) + (", ..." if len(keys) > 4 else "")
        text += f" ({shown})"
    return text + f", {_ms(summary.step_time_ns[member])} ms"


_HEAD = ("rank", "count", "total ms", "mean ms", "p50 ms", "p90 ms", "max ms", "step %", "self %")
#: The row of step time no phase covers.
UNMARKED = "(unmarked)"


def _rows(
    phases: list[PhaseSummary], names: dict[str, str], width: int
) -> tuple[list[str], set[str]]:
    """The phases' rows, and which kinds of row (``all``, ``rank``) have p50/p90 from sketches."""
    lines: list[str] = []
    sketched: set[str] = set()
    for p in phases:
        rows: list[tuple[str, str, Stats]] = [(names[p.name], "all", p.overall)]
        rows += [("", str(rank), s) for rank, s in p.per_rank.items()]
        for label, rank, s in rows:
            nums = (s.total_ns, s.mean_ns, s.p50_ns, s.p90_ns, s.max_ns)
            line = (
                f"{label:<{width}} {rank:>4} {s.count:>6} "
                + " ".join(f"{_ms(v):>10}" for v in nums)
                + f" {_share(s.step_share):>7} {_share(s.self_share):>7}"
            )
            if rank == "all":
                ratio = "-" if p.imbalance is None else f"{p.imbalance:.2f}"
                line += f"  {ratio} (rank {p.slowest_rank})"
            if s.percentile_error:
                line += " ~"
                sketched.add("all" if rank == "all" else "rank")
            lines.append(line.rstrip())
    return lines, sketched


def _unmarked_rows(summary: Summary, members: list[Member], width: int) -> list[str]:
    """The :data:`UNMARKED` row (``all`` and per rank): step time no phase covers (``-`` where
    not known: a process summarised in one pass)."""
    rows = [("all", members)] + [(str(m.rank), [m]) for m in members] * (len(members) > 1)
    lines = []
    for rank, ms in rows:
        step = sum(summary.step_time_ns[m] for m in ms)
        known = all(m in summary.unmarked_ns for m in ms)
        free = sum(summary.unmarked_ns.get(m, 0) for m in ms)
        share = _share(free / step if step and known else None)
        label = UNMARKED if rank == "all" else ""
        lines.append(
            f"{label:<{width}} {rank:>4} {'':>6} {_ms(free) if known else '-':>10} "
            + " ".join(f"{'':>10}" for _ in range(4))
            + f" {share:>7} {share:>7}"
        )
    return lines


#: The heading of the block of automatic annotations (see :mod:`~.stages`).
AUTOMATIC = "automatic annotations (PyTorch's and HCCL's own, not the user's phases):"


def _other_rows(others: list[OtherPhases], width: int) -> list[str]:
    """The row of a role's phases beyond the cut (of its automatic annotations when those are
    ``others``): their count, total, longest range and shares, summed."""
    return [
        f"{o.label:<{width}} {'all':>4} {o.count:>6} {_ms(o.total_ns):>10} "
        + " ".join(f"{'-':>10}" for _ in range(3))
        + f" {_ms(o.max_ns):>10} {_share(o.step_share):>7} {_share(o.self_share):>7}"
        for o in others
    ]


def _automatic_rows(
    phases: list[PhaseSummary], others: list[OtherPhases], names: dict[str, str], width: int
) -> list[str]:
    """The block of a role's automatic annotations: apart from its phases, and no shares."""
    automatic = [p for p in phases if p.automatic]
    folded = [o for o in others if o.automatic]
    if not automatic and not folded:
        return []
    rows, _ = _rows(automatic, names, width)
    return [AUTOMATIC, *rows, *_other_rows(folded, width)]


def _footnote(summary: Summary, others: list[OtherPhases], limit: int | None) -> list[str]:
    """What the share columns mean, why they add up beyond 100 % when they do, and what the
    row of other phases holds."""
    lines = [
        "step %: inclusive (a phase nested in another counts in both, so the column may pass 100)",
        "self %: exclusive (less the phases inside it on its thread); self % and (unmarked) add",
        "  up to 100 % of step time when the phases run one at a time inside steps",
    ]
    for m in summary.members():
        concurrent = summary.concurrent_ns.get(m, 0)
        outside = summary.outside_ns.get(m, 0)
        if concurrent or outside:
            why = []
            if concurrent:
                why.append(
                    f"{_ms(concurrent)} ms concurrent (ranges overlapping on other threads or"
                    " as asyncio tasks on one thread: inclusive sums pass wall time)"
                )
            if outside:
                why.append(f"{_ms(outside)} ms of phases outside steps")
            lines.append(f"  {printable(m.label)}: beyond 100 % by " + " and ".join(why))
    if not all(summary.step_count[m] for m in summary.members()):
        # Say what would have made steps, so that a run marked otherwise knows what to name.
        say = f"no steps: the shares are of the whole recorded span. Steps are {default_steps()};"
        lines += textwrap.wrap(say + " --step-name PHASE names another", 96, subsequent_indent="  ")
    if any(p.automatic for p in summary.phases):
        lines += [
            "automatic annotations: record_function ranges that DDP, FSDP, the optimizers, the",
            "  DataLoader, process groups and torch.compile make by themselves, and HCCL's",
            "  collectives (hccl:<op>): on any thread, inside steps or not; not in the shares,",
            "  the self times or (unmarked)",
        ]
    if others:
        lines += [
            f"(N other phases): beyond the {limit} of most total time (per role), summed: their",
            "  ranges, total, longest range and shares; --all-phases lists them, and --json and",
            "  --csv hold every phase",
        ]
    unknown = [printable(m.label) for m in summary.members() if m not in summary.unmarked_ns]
    if unknown:
        lines.append(
            f"  - : not known for {', '.join(unknown)} (too many events to hold: summarised in"
            " one pass, see the note)"
        )
    return lines


def run_line(summary: Summary) -> str | None:
    """Which run the summary is of, when the folder holds several (None when it holds one).

    >>> run_line(Summary([], {}, {}, {}, run="r2", other_runs=["r1"]))
    'run r2, one of 2 runs here (the other: r1; --run ID for another, --run all for every one)'
    """
    if not summary.other_runs:
        return None
    others = ", ".join(printable(r) for r in summary.other_runs)
    if summary.run == "all":
        return f"every run here, summed: {others}"
    n = len(summary.other_runs) + 1
    return (
        f"run {printable(summary.run)}, one of {n} runs here (the other{'s' * (n > 2)}: {others};"
        " --run ID for another, --run all for every one)"
    )


def format_table(summary: Summary, max_phases: int | None = MAX_PHASES) -> str:
    """The human-readable table: per phase, an ``all`` row and one row per rank. When the
    processes have roles, one block per role (``== role ==``), each with its ranks' steps and
    its phases: a role's figures are never mixed with another's, even on the same rank. The
    annotations PyTorch and HCCL make by themselves follow the ``(unmarked)`` row, under
    :data:`AUTOMATIC`, without shares. Each role shows its ``max_phases`` phases of most total
    time, the rest summed in one row (:mod:`~mstx_marks.analysis.model.top_phases`; ``None``: all).
    When a process has steps, the table ends with where each step's time goes, per process
    (:func:`~mstx_marks.analysis.render.rl_steps_text.format_steps`).

    >>> from mstx_marks.base.records import RangeRecord, RankTrace
    >>> from mstx_marks.analysis.summary import summarize
    >>> r = lambda name, s, e: RangeRecord(name, "default", s, e, 1, 1)
    >>> text = format_table(summarize([
    ...     RankTrace(0, [r("step", 0, 10**6)], role="TaskRunner"),
    ...     RankTrace(0, [r("vllm_one_step", 0, 2 * 10**5)], role="EngineCore_DP0")]))
    >>> for line in text.splitlines()[:3]:
    ...     print(line)
    2 roles, 2 processes: EngineCore_DP0 (1 rank), TaskRunner (1 rank)
    <BLANKLINE>
    == EngineCore_DP0 == rank 0: 1 step of TaskRunner rank 0, 1.000 ms
    >>> [line for line in text.splitlines() if line.startswith("==")][1]
    '== TaskRunner == rank 0: 1 step, 1.000 ms'
    """
    shown, others = top_phases(summary, max_phases)
    names = {p.name: cut(printable(p.name)) for p in shown}
    labels = ["phase", UNMARKED, *names.values(), *(o.label for o in others)]  # every row's
    width = max(len(label) for label in labels)
    header = (
        f"{'phase':<{width}} {_HEAD[0]:>4} {_HEAD[1]:>6} "
        + " ".join(f"{h:>10}" for h in _HEAD[2:7])
        + f" {_HEAD[7]:>7} {_HEAD[8]:>7}  imbalance (slowest rank)"
    )
    roles = summary.roles
    if roles in ([], [""]):  # no process has a role: one table, as by rank alone
        members = summary.members()
        lines = [
            f"{counted(len(members), 'rank')}; steps and step time: "
            + ", ".join(_steps_phrase(summary, m) for m in members),
            header,
        ]
        rows, sketched = _rows([p for p in shown if not p.automatic], names, width)
        lines += rows + _other_rows([o for o in others if not o.automatic], width)
        lines += _unmarked_rows(summary, members, width)
        lines += _automatic_rows(shown, others, names, width)
    else:
        members = summary.members()
        lines = [
            f"{counted(len(roles), 'role')}, {counted(len(members), 'process', 'processes')}: "
            + ", ".join(
                f"{printable(role) or '(no role)'} ({counted(len(summary.members(role)), 'rank')})"
                for role in roles
            )
        ]
        sketched = set()
        for role in roles:
            steps = ", ".join(_steps_phrase(summary, m) for m in summary.members(role))
            lines += ["", f"== {printable(role) or '(no role)'} == {steps}", header]
            mine = [p for p in shown if p.role == role]
            folded = [o for o in others if o.role == role]
            rows, more = _rows([p for p in mine if not p.automatic], names, width)
            lines += rows + _other_rows([o for o in folded if not o.automatic], width)
            lines += _unmarked_rows(summary, summary.members(role), width)
            lines += _automatic_rows(mine, folded, names, width)
            sketched |= more
    lines += _footnote(summary, others, max_phases)
    runs = run_line(summary)
    if runs:
        lines.insert(0, runs)
    if sketched == {"all"}:
        lines.append(
            f"~ p50/p90 of this 'all' row are within {100 * RELATIVE_ERROR:g}% (merged "
            "per-rank sketches); every other figure is exact"
        )
    elif sketched:  # a process summarised in one pass: its own rows are read from sketches
        lines += [
            f"~ p50/p90 of this row are within {100 * RELATIVE_ERROR:g}% (from sketches: per-rank"
            " ones merged, or those of a",
            "  process summarised in one pass); every other figure is exact",
        ]
    if summary.per_step is not None:  # where each step's time goes, across the processes
        lines += ["", *format_steps(summary.per_step)]
    return "\n".join(lines)


_CSV_FIELDS = (
    "phase", "rank", *Stats.__dataclass_fields__, "imbalance", "slowest_rank", "automatic",
    "role",
)  # fmt: skip


def format_csv(summary: Summary) -> str:
    """One CSV row per role, phase and rank (``rank`` is ``all`` for the row across the role's
    ranks; ``automatic`` is ``True`` for an annotation the frameworks make by themselves, see
    :mod:`~mstx_marks.analysis.model.stages`; ``role`` is the last column, empty when unknown).
    Every
    phase, however many: the CSV is for programs (the table folds beyond its cut)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(_CSV_FIELDS)
    for p in summary.phases:
        overall = asdict(p.overall).values()
        writer.writerow([p.name, "all", *overall, p.imbalance, p.slowest_rank, p.automatic, p.role])
        for rank, s in p.per_rank.items():
            writer.writerow([p.name, rank, *asdict(s).values(), "", "", p.automatic, p.role])
    return out.getvalue()


def format_json(summary: Summary) -> dict[str, Any]:
    """The summary as plain JSON data (durations nanoseconds). ``ranks`` is keyed by role and
    rank, ``ROLE:RANK`` (just ``RANK`` when the role is unknown), each with its ``role`` and
    ``rank``; each phase is one role's (its ``role``), its ``ranks`` keyed by that role's ranks.
    What is not known is null: the breakdown and self times of a process summarised in one pass
    (:mod:`mstx_marks.analysis.readers.stream`). Every phase, however many: the JSON is for programs
    (the table folds beyond its cut). ``per_step`` is where each step's time goes, per process
    (:func:`~mstx_marks.analysis.render.rl_steps_text.steps_json`), null when no process has
    steps."""
    return {
        "roles": summary.roles,
        "ranks": {
            m.key: {
                "role": m.role,
                "rank": m.rank,
                "source": summary.sources[m],
                "steps": summary.step_count[m],
                "step_keys": summary.step_keys.get(m, []),
                "step_time_ns": summary.step_time_ns[m],
                # whose steps they are when they are the job's, not its own (else null)
                "steps_of": None if m not in summary.steps_of else summary.steps_of[m].key,
                # null where not known (a process summarised in one pass)
                "unmarked_ns": summary.unmarked_ns.get(m),
                "concurrent_ns": summary.concurrent_ns.get(m),
                "outside_steps_ns": summary.outside_ns.get(m),
            }
            for m in summary.members()
        },
        "phases": [
            {
                "name": p.name,
                "role": p.role,
                "all": asdict(p.overall),
                "ranks": {str(rank): asdict(s) for rank, s in p.per_rank.items()},
                "imbalance": p.imbalance,
                "slowest_rank": p.slowest_rank,
                "is_step": p.is_step,
                "automatic": p.automatic,
            }
            for p in summary.phases
        ],
        # the run read, when the folder holds others (their ids, newest first)
        "run": summary.run or None,
        "other_runs": summary.other_runs,
        "errors": summary.errors,
        "notes": summary.notes,
        # per step x process: busy, idle, phases; critical path (null: no process has steps)
        "per_step": None if summary.per_step is None else steps_json(summary.per_step),
    }
