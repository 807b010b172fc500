"""Two runs side by side, per role and phase: how the time per step changed, and whether the
change is more than the runs' own step-to-step noise (``mstx-marks diff``).

Each run is summarised as ``summary`` does, and its per-step model
(:mod:`mstx_marks.analysis.model.rl_steps`) gives, per role and phase, one value per step where the
phase ran (a validation every other step is compared over the steps that ran it, never
diluted by the others' zeros): the time that step waited for, the phase's time on the role's
slowest rank in it. Rows ``(busy)`` and ``(idle)`` are the role's busiest rank's busy time and
its idle time (the bubble no rank of the role filled), every step, and ``(step)`` the step's
length. Per row, the figure compared is the median over those steps; the **noise band** is
``1.4826 * sqrt(MAD_base^2 + MAD_new^2)``, the two runs' per-step spreads (median absolute
deviations, scaled to a standard deviation) combined: a change inside it is what the steps of
one run already differ by. A spread of a few steps is no band (three equal steps make one of
width 0, and any change then looks real), so a row needs :data:`MIN_STEPS` steps in each run
to be judged at all: with fewer it is ``too few steps`` and never gated; the output says so.
Rows are sorted by the size of their change, largest first.

A **gate** (``--threshold PCT``, a finite number of percent, 0 or more): a row is *over* when it
grew by more than the noise band plus ``PCT`` % of the base's median (a phase that only one run
has is shown, ``new`` or ``gone``, but not gated: its time shows in ``(step)`` and ``(busy)``).
Exit status: 0, or 1 when a row is over, or when a file of either run could not be read (the
comparison is then incomplete); 2 when a run has nothing to compare (no trace, or no process
with steps), or when the runs are one.

>>> base = [100, 104, 98, 101, 100]
>>> row = DiffRow("trainer", "update_actor", base, [130, 129, 131, 133, 130])
>>> row.base_ns, row.new_ns, round(row.noise_ns), row.verdict, row.over(5.0)
(100.0, 130.0, 2, 'slower', True)
>>> DiffRow("trainer", "update_actor", base[:3], [130, 129, 131]).verdict
'too few steps'
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from mstx_marks.analysis.model.aggregate import Summary
from mstx_marks.analysis.model.rl_steps import StepAnalysis
from mstx_marks.analysis.model.steps import StepOptions
from mstx_marks.base.diagnostics import counted

if TYPE_CHECKING:
    from mstx_marks.analysis.summary import PartReader

__all__ = [
    "MIN_STEPS",
    "STEP_ROW",
    "DiffRow",
    "RunDiff",
    "check_threshold",
    "diff_models",
    "format_diff",
    "parse_threshold",
    "run_diff",
]

#: The rows that are not phases: the step's length, a role's busy and idle time.
STEP_ROW, BUSY_ROW, IDLE_ROW = "(step)", "(busy)", "(idle)"
#: MAD times this is a standard deviation, for normally distributed values.
_MAD_TO_SD = 1.4826
#: The fewest steps (where its phase ran) a row needs in each run to be judged: the median
#: absolute deviation of fewer is too often near 0 (of 3 steps, whenever 2 are close), which
#: makes a band of nothing and any change a finding.
MIN_STEPS = 5
#: The verdict of a row with fewer than :data:`MIN_STEPS` steps in a run.
TOO_FEW = "too few steps"


def check_threshold(pct: float) -> float:
    """``pct`` as a gate's threshold, or ValueError: a finite number of percent, 0 or more (a
    NaN would never fire, and is no JSON).

    >>> check_threshold(5.0)
    5.0
    >>> check_threshold(float("nan"))
    Traceback (most recent call last):
    ...
    ValueError: --threshold nan: must be a finite number of percent, 0 or more
    """
    if not math.isfinite(pct) or pct < 0:
        raise ValueError(f"--threshold {pct:g}: must be a finite number of percent, 0 or more")
    return pct


def parse_threshold(text: str) -> float:
    """``--threshold``'s text as :func:`check_threshold` takes it, or ValueError naming it.

    >>> parse_threshold("2.5"), parse_threshold(" 0 ")
    (2.5, 0.0)
    """
    try:
        pct = float(text)
    except ValueError:
        raise ValueError(f"--threshold {text!r}: not a number of percent") from None
    return check_threshold(pct)


def _mad(values: Sequence[int]) -> float:
    if not values:
        return 0.0
    mid = statistics.median(values)
    return float(statistics.median(abs(v - mid) for v in values))


@dataclass
class DiffRow:
    """One role's phase (or :data:`STEP_ROW`, :data:`BUSY_ROW`, :data:`IDLE_ROW`) in both runs:
    its per-step values in each (empty: the run does not have it)."""

    role: str
    phase: str
    base: list[int]
    new: list[int]

    @property
    def base_ns(self) -> float | None:
        """The median per step in the base run (None: it does not have the row)."""
        return float(statistics.median(self.base)) if self.base else None

    @property
    def new_ns(self) -> float | None:
        return float(statistics.median(self.new)) if self.new else None

    @property
    def change_ns(self) -> float:
        return (self.new_ns or 0.0) - (self.base_ns or 0.0)

    @property
    def change_pct(self) -> float | None:
        """The change over the base's median, in %; None when that is 0 or absent."""
        return 100 * self.change_ns / self.base_ns if self.base_ns else None

    @property
    def noise_ns(self) -> float:
        """The half-width of the noise band (see the module's docstring)."""
        return _MAD_TO_SD * math.hypot(_mad(self.base), _mad(self.new))

    @property
    def judged(self) -> bool:
        """Whether both runs have the row in :data:`MIN_STEPS` steps or more."""
        return len(self.base) >= MIN_STEPS and len(self.new) >= MIN_STEPS

    @property
    def verdict(self) -> str:
        """``new``, ``gone``, ``too few steps`` (see :data:`MIN_STEPS`), ``within noise``,
        ``slower`` or ``faster``."""
        if not self.base:
            return "new"
        if not self.new:
            return "gone"
        if not self.judged:
            return TOO_FEW
        if abs(self.change_ns) <= self.noise_ns:
            return "within noise"
        return "slower" if self.change_ns > 0 else "faster"

    def beyond_pct(self) -> float | None:
        """How far past the noise band the change goes, in % of the base's median (negative:
        inside it); None when the base's median is 0 or absent."""
        if not self.base_ns or not self.new:
            return None
        return 100 * (abs(self.change_ns) - self.noise_ns) / self.base_ns

    def over(self, threshold_pct: float) -> bool:
        """Whether it grew by more than its noise band plus ``threshold_pct`` % of the base (a
        row judged: see :data:`MIN_STEPS`)."""
        beyond = self.beyond_pct()
        return self.judged and self.change_ns > 0 and beyond is not None and beyond > threshold_pct

    def to_json(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "phase": self.phase,
            "base_ns": self.base_ns,
            "new_ns": self.new_ns,
            "change_ns": self.change_ns,
            "change_pct": self.change_pct,
            "noise_ns": self.noise_ns,
            "beyond_noise_pct": self.beyond_pct(),
            "verdict": self.verdict,
            # the steps where it ran (every step for the rows that are not phases)
            "base_steps": len(self.base),
            "new_steps": len(self.new),
            "judged": self.judged,
        }


@dataclass
class RunDiff:
    """Two runs compared: what each is (``base``, ``new``: a line each) and the rows, largest
    change first."""

    base: str
    new: str
    rows: list[DiffRow]
    clocks: list[str] = field(default_factory=list)

    def over(self, threshold_pct: float) -> list[DiffRow]:
        """The rows over the gate (see the module's docstring)."""
        return [r for r in self.rows if r.over(threshold_pct)]


def _rows_of(model: StepAnalysis) -> dict[tuple[str, str], list[int]]:
    rows = {("", STEP_ROW): [s.length_ns for s in model.steps]}
    for role in model.roles():
        rows[(role, BUSY_ROW)] = model.series(role, None)
        rows[(role, IDLE_ROW)] = model.idle_series(role)
        names = {n for p in model.processes if p.member.role == role for n in p.phases}
        for name in sorted(names):
            # (a step where no rank of the role ran it says 0: not a time of the phase)
            rows[(role, name)] = [v for v in model.series(role, name) if v > 0]
    return rows


def _describe(label: str, model: StepAnalysis) -> str:
    every = f", every {model.every}th analysed" if model.every > 1 else ""
    return (
        f"{label}: {counted(len(model.steps), 'step')} of {model.reference.label}"
        f" ({model.total_steps} in all{every}),"
        f" {counted(len(model.processes), 'process', 'processes')}"
    )


def diff_models(
    base: StepAnalysis, new: StepAnalysis, base_label: str = "base", new_label: str = "new"
) -> RunDiff:
    """The rows of two per-step models, largest change first.

    >>> from mstx_marks.analysis.model.rl_steps import analyse
    >>> from mstx_marks.analysis.model.spans import ProcessSpans
    >>> from mstx_marks.analysis.model.steps import Step
    >>> from mstx_marks.base.records import Member
    >>> def run(gen):  # five steps of 100, gen taking the first ``gen`` of each
    ...     t = ProcessSpans()
    ...     for k in range(5):
    ...         t.add(100 * k, 100 * k + gen, "gen")
    ...     t.set_steps([Step(100 * k, 100 * k + 100, str(k + 1), 100) for k in range(5)])
    ...     return analyse([(Member("trainer", 0), t.finish())])
    >>> d = diff_models(run(40), run(60))
    >>> [(r.phase, r.change_ns, r.verdict) for r in d.rows][:2]
    [('(busy)', 20.0, 'slower'), ('(idle)', -20.0, 'faster')]
    """
    a, b = _rows_of(base), _rows_of(new)
    rows = [DiffRow(role, phase, a.get((role, phase), []), b.get((role, phase), [])) for
            role, phase in sorted({*a, *b})]  # fmt: skip
    rows.sort(key=lambda r: (-abs(r.change_ns), r.role, r.phase))
    clocks = [
        f"{base_label} clocks: {base.clock.text()}",
        f"{new_label} clocks: {new.clock.text()}",
    ]
    return RunDiff(_describe(base_label, base), _describe(new_label, new), rows, clocks)


def _ms(ns: float | None) -> str:
    return "-" if ns is None else f"{ns / 1e6:.3f}"


def _pct(pct: float | None) -> str:
    return "-" if pct is None else f"{pct:+.1f}"


def format_diff(diff: RunDiff, threshold_pct: float | None = None) -> str:
    """The comparison as a table for people (see the module's docstring)."""
    names = [r.phase if r.phase.isprintable() else repr(r.phase) for r in diff.rows]
    roles = [(r.role if r.role.isprintable() else repr(r.role)) or "-" for r in diff.rows]
    pw = max([len("phase"), *(min(len(n), 40) for n in names)])
    rw = max([len("role"), *(min(len(n), 24) for n in roles)])
    lines = [
        diff.base,
        diff.new,
        *diff.clocks,
        "per step: the median over the steps where it ran of the time the step waited for (a"
        " phase on the role's slowest rank); noise: ±1.4826 x the runs' per-step MADs,"
        f" combined; a row with fewer than {MIN_STEPS} such steps in a run is not judged (too"
        " few steps: their spread is no noise band)",
        f"{'role':<{rw}} {'phase':<{pw}} {'base ms':>11} {'new ms':>11} {'change ms':>11}"
        f" {'change %':>8} {'noise ±ms':>10}  verdict",
    ]
    for r, name, role in zip(diff.rows, names, roles):
        verdict = r.verdict
        if threshold_pct is not None and r.over(threshold_pct):
            verdict += f" (over {threshold_pct:g}%)"
        lines.append(
            f"{role[:24]:<{rw}} {name[:40]:<{pw}} {_ms(r.base_ns):>11} {_ms(r.new_ns):>11}"
            f" {_ms(r.change_ns):>11} {_pct(r.change_pct):>8} {_ms(r.noise_ns):>10}  {verdict}"
        )
    if threshold_pct is not None:
        over = diff.over(threshold_pct)
        lines.append(
            f"{len(over)} row(s) grew by more than the noise band plus {threshold_pct:g}% of the"
            " base" + (": " + ", ".join(f"{r.role or '-'} {r.phase}" for r in over) if over else "")
        )
    return "\n".join(lines)


def _load(
    path: str, run: str | None, steps: StepOptions, jobs: int | None, reader: PartReader | None
) -> Summary:
    from mstx_marks.analysis.summary import summarize_path

    return summarize_path(path, steps, jobs, run=run, reader=reader)


def _same_folder(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` name one folder (``DIR`` and ``DIR/``, ``./DIR``, a link)."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # (one is missing: said when it is read)
        return Path(a).resolve() == Path(b).resolve()


def _refused(what: str) -> int:
    print(
        f"error: {what}: name two folders, or two runs of it with --base-run"
        " and --new-run (or name it once: its two newest runs)",
        file=sys.stderr,
    )
    return 2


def run_diff(
    base: str,
    new: str | None = None,
    *,
    base_run: str | None = None,
    new_run: str | None = None,
    threshold_pct: float | None = None,
    as_json: bool = False,
    steps: StepOptions | None = None,
    jobs: int | None = None,
    reader: PartReader | None = None,
) -> int:
    """Compare the runs in folders ``base`` and ``new`` and print the comparison; return the
    exit status (see the module's docstring). One folder (``new`` None) compares two of its
    runs: ``base_run`` and ``new_run``, each the newest when not named, and with neither named
    its two newest (the older as the base). ``new`` naming ``base`` again (``DIR/``, ``./DIR``,
    a link to it) is refused unless the runs are named; a run against itself is refused.
    ``threshold_pct``: see :func:`check_threshold`. ``reader``: where the files are read
    (``--ray``: on each node of a Ray cluster, :mod:`mstx_marks.analysis.readers.cluster`)."""
    if threshold_pct is not None:
        check_threshold(threshold_pct)
    steps = steps or StepOptions()
    named = new is not None
    new = base if new is None else new
    one = _same_folder(base, new)
    # (the folder named twice and no run named, or one run named twice)
    if one and base_run == new_run and (named or base_run is not None):
        return _refused(
            f"{base} against itself" if new == base else f"{base} and {new} are one folder"
        )
    labels = ("base", "new")
    if one and base_run is None and new_run is None:  # its two newest runs
        newest = _load(new, None, steps, jobs, reader)
        if newest.other_runs:
            summaries = [_load(base, newest.other_runs[0], steps, jobs, reader), newest]
        elif newest.per_step is not None:
            print(
                f"error: {base} holds one run: name a second folder to compare it with",
                file=sys.stderr,
            )
            return 2
        else:
            summaries = [newest]  # (why it has nothing to compare is said below)
    else:
        summaries = [
            _load(base, base_run, steps, jobs, reader),
            _load(new, new_run, steps, jobs, reader),
        ]
        if one and summaries[0].run == summaries[1].run:  # one named, and it is the newest
            return _refused(f"{base}: run {summaries[0].run or '(one)'} against itself")
    models = []
    failed = False
    for label, where, summary in zip(labels, (base, new), summaries):
        for error in summary.errors:
            print(f"error: {label} ({where}): {error}", file=sys.stderr)
        failed = failed or bool(summary.errors)
        run = f" (run {summary.run})" if summary.run else ""
        if summary.per_step is None:
            why = "no trace" if not summary.step_time_ns else "no process with steps"
            print(f"error: {label} ({where}{run}): {why}: nothing to compare", file=sys.stderr)
            return 2
        models.append(summary.per_step)
    diff = diff_models(
        models[0],
        models[1],
        f"base {base}" + (f" (run {summaries[0].run})" if summaries[0].run else ""),
        f"new {new}" + (f" (run {summaries[1].run})" if summaries[1].run else ""),
    )
    if as_json:
        doc = {
            "base": diff.base,
            "new": diff.new,
            "clocks": diff.clocks,
            "threshold_pct": threshold_pct,
            # a row with fewer steps (where it ran) in a run is not judged: "too few steps"
            "min_steps": MIN_STEPS,
            "rows": [r.to_json() for r in diff.rows],
            "over": []
            if threshold_pct is None
            else [r.to_json() for r in diff.over(threshold_pct)],
        }
        # (every figure is finite: a NaN or an infinity would be no JSON)
        print(json.dumps(doc, indent=1, allow_nan=False))
    else:
        print(format_diff(diff, threshold_pct))
    over = threshold_pct is not None and bool(diff.over(threshold_pct))
    return 1 if over or failed else 0
