"""Which spans of a trace are training steps, and what numbers them.

A step comes from, in this order:

1. the ranges of a phase the user names (``summary --step-name train_step``, or
   ``StepOptions(name="train_step")``), compared by name or by the phase registry's fold;
2. the steps the file itself lists: an Ascend database's ``STEP_TIME`` rows (numbered by their
   ``id``, torch_npu's ``ProfilerStep`` numbers), or the steps our Chrome traces carry;
3. the ranges named ``step`` (verl's trainer timer), ``ProfilerStep`` (torch.profiler's
   ``ProfilerStep#N``, read with ``args={"step": N}``), ``train_step``, ``training_step`` or
   ``global_step`` (:data:`DEFAULT_STEP_NAMES`), so a loop marked ``train_step`` has steps with
   no flag; of these, the first name in that order the trace has (a ``train_step`` inside
   torch.profiler's ``ProfilerStep`` is not a second step).

The **step key** (``--step-key``, default ``step``) is the ``args`` entry of a step range that
numbers it: a global step, a weight version, a rollout id (``mark("train_step",
args={"global_step": gs})`` with ``--step-key global_step``). Step ranges that share a key are
one step (a rollout in several pieces): its time is the union of their spans. A step range
without the key, and a step of a file's own list that has no id, is numbered by its order (from
1). A reader gives a file's step ids with its steps as a :class:`FileTrace`.

>>> from mstx_marks.base.records import RangeRecord, RankTrace
>>> r = lambda s, e, v: RangeRecord("train_step", "default", s, e, 1, 1, args={"version": v})
>>> t = RankTrace(0, [r(0, 10, 7), r(20, 25, 7), r(30, 40, 8)])
>>> [(s.key, s.time_ns) for s in find_steps(t, StepOptions("train_step", "version"))]
[('7', 15), ('8', 10)]
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, replace
from typing import Callable, Iterable, List, NamedTuple, Sequence

from mstx_marks.base import phases
from mstx_marks.base.records import STEP_PHASE, RangeRecord, RankTrace, Record, Span

__all__ = [
    "DEFAULT_STEP_NAMES",
    "PROFILER_STEP",
    "FileTrace",
    "Step",
    "StepOptions",
    "default_steps",
    "file_notes",
    "file_step_keys",
    "find_steps",
    "fold_name",
    "merge_spans",
    "named_step",
    "profiler_step",
    "step_time_ns",
    "step_windows",
    "union_ns",
    "with_notes",
    "with_steps",
]

#: The name torch.profiler's ``ProfilerStep#N`` ranges are read under (``N`` in ``args["step"]``).
PROFILER_STEP = "ProfilerStep"
#: The range names that are steps when no ``--step-name`` is given, the first present winning.
DEFAULT_STEP_NAMES = (STEP_PHASE, PROFILER_STEP, "train_step", "training_step", "global_step")
_PROFILER_STEP_N = re.compile(r"ProfilerStep#(\d+)\Z")
#: Who makes the default step names that are not plain words (what :func:`default_steps` says).
_MADE_BY = {STEP_PHASE: "verl's trainer timer", PROFILER_STEP: "torch.profiler's ProfilerStep#N"}


def default_steps() -> str:
    """Where steps come from when no step phase is named, in words: what the summary says of a
    process with none, and the ``--step-name`` help (from :data:`DEFAULT_STEP_NAMES`).

    >>> "else ranges named step (verl's trainer timer), ProfilerStep (" in default_steps()
    True
    """
    names = [f"{n} ({_MADE_BY[n]})" if n in _MADE_BY else n for n in DEFAULT_STEP_NAMES]
    return (
        "the files' own (an Ascend database's STEP_TIME, our Chrome traces' steps), else ranges"
        f" named {', '.join(names[:-1])} or {names[-1]}, the first of these present"
    )


def profiler_step(name: str) -> int | None:
    """``N`` of torch.profiler's (and torch_npu's MSTX) ``ProfilerStep#N`` range name, else None.

    >>> profiler_step("ProfilerStep#50"), profiler_step("ProfilerStep")
    (50, None)
    """
    m = _PROFILER_STEP_N.match(name)
    return int(m.group(1)) if m else None


def named_step(rec: Record) -> Record:
    """``rec``, a ``ProfilerStep#N`` range read as the range ``ProfilerStep`` with
    ``args={"step": N}`` (as the Chrome reader reads it: one step phase, numbered N).

    >>> named_step(RangeRecord("ProfilerStep#7", "default", 0, 5, 1, 1)).args
    {'step': 7}
    """
    if isinstance(rec, RangeRecord):
        n = profiler_step(rec.name)
        if n is not None:
            return rec._replace(name=PROFILER_STEP, args={**(rec.args or {}), "step": n})
    return rec


def fold_name(name: str) -> str:
    """The registry's canonical name for ``name``, or ``name`` itself when it is not a phase.

    >>> fold_name("no_such_phase_anywhere")
    'no_such_phase_anywhere'
    """
    try:
        return phases.canonical(name)
    except (KeyError, TypeError, ValueError):
        return name


@dataclass(frozen=True)
class StepOptions:
    """How steps are found: ``name`` is the step phase (None: the file's steps, else ``step`` or
    ``ProfilerStep`` ranges), ``key`` the ``args`` entry that numbers a step."""

    name: str | None = None
    key: str = "step"
    #: With no ``name``: the one default step name to use (see :meth:`resolved`).
    default: str | None = None
    #: Whether each process keeps what the per-step analysis needs (its phases' spans, see
    #: :mod:`mstx_marks.analysis.model.spans`); ``summary --no-per-step`` turns it off.
    per_step: bool = True
    #: Times on the process's own clock its spans are never joined across (sorted): the job's
    #: step edges, when a process is read a second time for them (see
    #: :func:`mstx_marks.analysis.model.rl_steps.fences_needed`).
    fences: tuple[int, ...] = ()

    def is_step(self, name: str, fold: Callable[[str], str] = fold_name) -> bool:
        """Whether ranges called ``name`` are steps (by default, :data:`DEFAULT_STEP_NAMES`).

        >>> StepOptions("train_step").is_step("train_step"), StepOptions().is_step("step")
        (True, True)
        """
        if self.name is None:
            return name == self.default if self.default else name in DEFAULT_STEP_NAMES
        return name == self.name or fold(name) == fold(self.name)

    def resolved(self, names: Iterable[str]) -> StepOptions:
        """These options for a trace whose ranges have ``names``: with no step phase named, the
        first of :data:`DEFAULT_STEP_NAMES` among them is the one.

        >>> StepOptions().resolved(["train_step", "ProfilerStep", "gen"]).default
        'ProfilerStep'
        """
        if self.name is not None or self.default is not None:
            return self
        present = set(names)
        first = next((n for n in DEFAULT_STEP_NAMES if n in present), None)
        return self if first is None else replace(self, default=first)


class Step(NamedTuple):
    """One step: its first start, last end, key, and time (the union of its ranges' spans)."""

    start_ns: int
    end_ns: int
    key: str
    time_ns: int


def union_ns(spans: Iterable[Span]) -> int:
    """The time covered by ``spans`` (overlaps counted once).

    >>> union_ns([(0, 10), (5, 20), (30, 31)])
    21
    """
    total, end = 0, None
    for s, e in sorted(spans):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def steps_from_ranges(ranges: Iterable[tuple[int, int, object]], key: str) -> list[Step]:
    """Steps from ``(start, end, args)`` of step ranges: grouped by ``args[key]`` (else by order).

    >>> steps_from_ranges([(5, 9, None), (0, 3, None)], "step")
    [Step(start_ns=0, end_ns=3, key='1', time_ns=3), Step(start_ns=5, end_ns=9, key='2', time_ns=4)]
    """
    groups: dict[str, list[Span]] = {}
    for n, (s, e, args) in enumerate(sorted(ranges, key=lambda r: (r[0], r[1])), start=1):
        value = args.get(key) if isinstance(args, dict) else None
        groups.setdefault(f"#{n}" if value is None else str(value), []).append((s, e))
    steps = []
    ordered = sorted(groups.items(), key=lambda kv: min(kv[1]))
    for ordinal, (label, spans) in enumerate(ordered, start=1):
        name = str(ordinal) if label.startswith("#") else label
        steps.append(
            Step(min(s for s, _ in spans), max(e for _, e in spans), name, union_ns(spans))
        )
    return steps


def steps_from_spans(spans: Sequence[Span], keys: Sequence[str] = ()) -> list[Step]:
    """Steps a file lists (``STEP_TIME``): keyed by ``keys`` (their ids) when there is one per
    span, else numbered in order.

    >>> steps_from_spans([(0, 4)]), steps_from_spans([(0, 4)], ["50"])[0].key
    ([Step(start_ns=0, end_ns=4, key='1', time_ns=4)], '50')
    """
    if len(keys) != len(spans):
        keys = [str(i) for i in range(1, len(spans) + 1)]
    return [Step(s, e, key, e - s) for (s, e), key in zip(spans, keys)]


@dataclass
class FileTrace(RankTrace):
    """A trace as its file has it, with what a :class:`~mstx_marks.base.records.RankTrace`
    does not hold: ``step_keys[i]`` is the id of ``steps[i]`` (a database's ``STEP_TIME.id``);
    ``no_mstx`` says that the file recorded no MSTX range at all (a torch_npu database without
    ``MSTX_EVENTS``), so that its steps are all it holds; ``notes`` say what its reader could
    not use (each naming the file), for the summary's notes."""

    step_keys: List[str] = field(default_factory=list)
    no_mstx: bool = False
    notes: List[str] = field(default_factory=list)


def file_notes(trace: RankTrace) -> list[str]:
    """What the reader of ``trace``'s file could not use (see :class:`FileTrace`)."""
    return trace.notes if isinstance(trace, FileTrace) else []


def with_notes(trace: RankTrace, notes: Sequence[str]) -> RankTrace:
    """``trace`` with ``notes`` added (a :class:`FileTrace` when there are any; else itself).

    >>> t = with_notes(RankTrace(3, []), ["r3.jsonl: a note"])
    >>> t.rank, file_notes(t), with_notes(t, ["more"]).notes
    (3, ['r3.jsonl: a note'], ['r3.jsonl: a note', 'more'])
    """
    if not notes:
        return trace
    values = {f.name: getattr(trace, f.name) for f in fields(trace) if f.init}
    values["notes"] = [*file_notes(trace), *notes]
    return FileTrace(**values)


def file_step_keys(trace: RankTrace) -> list[str]:
    """The ids of ``trace``'s steps, one per step, when its file gave them (else empty)."""
    keys = trace.step_keys if isinstance(trace, FileTrace) else []
    return keys if len(keys) == len(trace.steps) else []


def with_steps(trace: RankTrace, steps: Sequence[Step], **changes: object) -> FileTrace:
    """``trace`` (with ``changes``) whose file steps are ``steps``, their keys kept.

    >>> t = with_steps(RankTrace(0, []), [Step(5, 9, "50", 4)])
    >>> t.steps, t.step_keys, find_steps(t)[0].key
    ([(5, 9)], ['50'], '50')
    """
    values = {f.name: getattr(trace, f.name) for f in fields(trace) if f.init}
    values.update(changes)
    values["steps"] = [(s.start_ns, s.end_ns) for s in steps]
    values["step_keys"] = [s.key for s in steps]
    return FileTrace(**values)


def find_steps(
    trace: RankTrace, options: StepOptions | None = None, fold: Callable[[str], str] = fold_name
) -> list[Step]:
    """The steps of ``trace`` as the module docstring orders the sources."""
    options = options or StepOptions()
    if options.name is None and trace.steps:
        return steps_from_spans(trace.steps, file_step_keys(trace))
    options = options.resolved(r.name for r in trace.records if isinstance(r, RangeRecord))
    chosen = [
        (r.start_ns, r.end_ns, dict(r.args) if r.args else None)
        for r in trace.records
        if isinstance(r, RangeRecord) and options.is_step(r.name, fold)
    ]
    return steps_from_ranges(chosen, options.key)


def step_windows(
    trace: RankTrace, options: StepOptions | None = None, fold: Callable[[str], str] = fold_name
) -> list[Span]:
    """The spans the steps of ``trace`` cover (what :func:`find_steps` counts as step time),
    merged and sorted; empty when it has no steps.

    >>> r = lambda s, e: RangeRecord("train_step", "default", s, e, 1, 1)
    >>> step_windows(RankTrace(0, [r(0, 10), r(5, 12), r(20, 30)]))
    [(0, 12), (20, 30)]
    """
    options = options or StepOptions()
    if options.name is None and trace.steps:
        return merge_spans(trace.steps)
    options = options.resolved(r.name for r in trace.records if isinstance(r, RangeRecord))
    return merge_spans(
        (r.start_ns, r.end_ns)
        for r in trace.records
        if isinstance(r, RangeRecord) and options.is_step(r.name, fold)
    )


def merge_spans(spans: Iterable[Span]) -> list[Span]:
    """``spans`` as sorted disjoint spans covering the same time.

    >>> merge_spans([(5, 9), (0, 3), (2, 4)])
    [(0, 4), (5, 9)]
    """
    out: list[Span] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def step_time_ns(steps: list[Step], span: Span | None) -> int:
    """Time inside steps, or the whole recorded ``span`` when there are no steps.

    >>> step_time_ns([], (10, 30))
    20
    """
    if steps:
        return sum(s.time_ns for s in steps)
    return span[1] - span[0] if span else 0
