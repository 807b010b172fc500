"""Per-phase statistics of recorded ranges, per rank and across ranks: ``mstx_marks summary``.

Reads every trace under a folder or a tree of rank folders (:mod:`mstx_marks.analysis.readers`
lists the kinds: Ascend databases, our Chrome traces, torch.profiler and torch_npu traces, any
Chrome trace, spills), folds phase names through the registry's aliases, and reports for each phase:
count, total, mean, p50, p90, max, share of step time, and how unbalanced the ranks are (slowest
total over fastest, and which rank is slowest). Everything is per role first (the process's
part in the job: ``TaskRunner``, ``WorkerDict``, ``EngineCore_DP0``, ...; see
:func:`mstx_marks.export.out.process_role`), then per rank: the processes of an RL job on one
GPU all say rank 0, and only their roles tell them apart, so two roles are never summed.
A stage marked twice (a range nested directly in one of the same phase of the registry on its
thread, as verl's ``actor_compute_log_prob`` around ours) counts once, which a note says; the
annotations PyTorch and HCCL make by themselves (``nccl:all_reduce``, ``Optimizer.step#...``,
``hccl:<op>``) are shown apart from the user's phases (:mod:`mstx_marks.analysis.model.stages`).

:func:`summarize_path` (what the command runs) streams: each file is reduced where it is read,
in worker processes, to a few numbers per phase (:mod:`mstx_marks.analysis.model.aggregate`; a
database
inside SQLite), so memory does not grow with the number of ranks; a spill or Chrome trace too
large to hold is summarised in one pass (:mod:`mstx_marks.analysis.readers.stream`: no self times
for
it, which a note says), so it does not grow with the events of one process either. Workers read
as many files at once as keep the largest readings' memory within :data:`MEMORY_BUDGET`
(:func:`memory_jobs`). :func:`load_traces` and :func:`summarize` do the same from traces held
in memory (for timelines, or your own traces); they refuse such a file, naming it, and read the
rest.

>>> from mstx_marks.base.records import RangeRecord
>>> from mstx_marks.export import RankTrace
>>> r = lambda name, s, e: RangeRecord(name, "default", s, e, 1, 1)
>>> traces = [RankTrace(0, [r("step", 0, 100), r("gen", 0, 40)]),
...           RankTrace(1, [r("step", 0, 100), r("gen", 0, 80)])]
>>> gen = summarize(traces).phases[1]  # "gen" (verl's trainer timer) folds into its phase
>>> gen.name, gen.overall.total_ns, gen.imbalance, gen.slowest_rank
('generate_sequences', 120, 2.0, 1)
>>> both = summarize([RankTrace(0, [r("gen", 0, 40)], role="TaskRunner"),
...                   RankTrace(0, [r("gen", 0, 30)], role="AgentLoopWorker")])
>>> [(p.role, p.name, sorted(p.per_rank)) for p in both.phases]  # rank 0 twice, never merged
[('AgentLoopWorker', 'generate_sequences', [0]), ('TaskRunner', 'generate_sequences', [0])]
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, NamedTuple, Protocol, Sequence, TypeVar

from mstx_marks.analysis.model.aggregate import (
    PhaseSummary,
    PoolBudget,
    ProcessPart,
    Stats,
    Summary,
    aggregate_trace,
    combine,
)
from mstx_marks.analysis.model.quantiles import RELATIVE_ERROR
from mstx_marks.analysis.model.rl_steps import fences_needed
from mstx_marks.analysis.model.spans import ProcessSpans
from mstx_marks.analysis.model.steps import (
    StepOptions,
    file_notes,
    file_step_keys,
    find_steps,
    fold_name,
    steps_from_spans,
    with_notes,
    with_steps,
)
from mstx_marks.analysis.model.top_phases import MAX_PHASES
from mstx_marks.analysis.readers import (
    find_trace_files,
    part_of_file,
    peak_estimate,
    read_trace_file,
    stream,
    streams_of_file,
)
from mstx_marks.analysis.readers.chrome_json import NothingToRead
from mstx_marks.analysis.readers.copies import Copy, RunPick, pick_copies, pick_run
from mstx_marks.analysis.readers.pool import Progress, default_jobs, map_files
from mstx_marks.analysis.readers.stream import StreamAggregator, TooLargeToHold
from mstx_marks.analysis.render.rl_steps_text import write_json
from mstx_marks.analysis.render.summary_text import format_csv, format_json, format_table, printable
from mstx_marks.base.records import Member, Origin, RankTrace, TraceFileError

__all__ = [
    "MEMORY_BUDGET",
    "FilesRead",
    "LocalReader",
    "Member",
    "MemberFiles",
    "PartReader",
    "PhaseSummary",
    "Reading",
    "Stats",
    "StepOptions",
    "Summary",
    "find_trace_files",
    "fold_name",
    "format_csv",
    "format_json",
    "format_table",
    "load_traces",
    "member_parts",
    "member_streams",
    "memory_jobs",
    "read_files",
    "read_members",
    "run_summary",
    "streamed_member",
    "summarize",
    "summarize_path",
]

T = TypeVar("T")


def summarize(
    traces: Sequence[RankTrace],
    fold: Callable[[str], str] = fold_name,
    steps: StepOptions | None = None,
) -> Summary:
    """Statistics of the ranges in ``traces`` (one per role and rank), per role, phases in order
    of first start.
    Steps are found as :mod:`mstx_marks.analysis.model.steps` says (``steps`` names the step phase
    and
    key)."""
    parts = [aggregate_trace(t, fold, steps) for t in traces]
    for i, lane, fences in _needing_fences(parts):  # (the second pass: see the function)
        trace = traces[i] if lane is None else traces[i].lives[lane]
        fenced = replace(steps or StepOptions(), fences=fences)
        _refill(parts[i], lane, aggregate_trace(trace, fold, fenced).spans)
    return combine(parts)


def _needing_fences(parts: Sequence[ProcessPart]) -> list[tuple[int, int | None, tuple[int, ...]]]:
    """The processes to read a second time, their spans never joined across the job's step
    edges (:func:`~mstx_marks.analysis.model.rl_steps.fences_needed`: those bounding memory joined
    across one): which part (its index), which of its lanes (None: its own spans), and the
    edges on its clock."""
    where: dict[int, tuple[int, int | None]] = {}
    given: list[tuple[Member, ProcessSpans]] = []
    for i, p in enumerate(parts):  # (as combine() gives them to the model)
        for lane, spans in enumerate(p.lanes) if p.lanes else [(None, p.spans)]:
            if spans is not None:
                where[id(spans)] = (i, lane)
                given.append((p.member, spans))
    return [(*where[id(s)], tuple(fences)) for s, fences in fences_needed(given)]


def _refill(part: ProcessPart, lane: int | None, spans: ProcessSpans | None) -> None:
    """``part``'s spans (or its ``lane``'s) as read a second time (the same process)."""
    old = part.spans if lane is None else part.lanes[lane]
    if spans is None or old is None:
        return
    spans.identify(old.origin, [old.pid] if old.pid else [], old.instance)
    if lane is None:
        part.spans = spans
    else:
        part.lanes[lane] = spans


#: What the error for a folder with no trace says (its exit status is 2, as coverage's).
NO_TRACES = "no traces found"


def _no_traces(root: Path) -> str:
    return (
        f"{root}: {NO_TRACES} (looked for *.trace.json, trace.json, trace_view.json, "
        "torch.profiler's JSON under any name, ascend_pytorch_profiler*.db, msprof_*.db and "
        "spill/*.jsonl)"
    )


def _select(
    root: Path,
    loaded: list[tuple[Path, list[Copy[T]]]],
    errors: list[str],
    notes: list[str],
    run: str | None = None,
) -> tuple[dict[Member, list[Copy[T]]], RunPick[T]]:
    """The copies to use, of one run (the newest unless ``run`` says), grouped by role, then
    rank (see :mod:`mstx_marks.analysis.readers.copies`), and the run they are of; what they lost
    goes
    to ``notes``."""
    picked = pick_run(loaded, run, errors, notes)
    chosen, more = pick_copies(picked.loaded, errors)
    notes.extend(more)
    notes.extend(_losses(chosen))
    if not chosen and not errors:
        errors.append(_no_traces(root))
    by_member: dict[Member, list[Copy[T]]] = {}
    for c in chosen:
        by_member.setdefault(Member(c.role, c.rank), []).append(c)
    return dict(sorted(by_member.items())), picked


def _with_run(summary: Summary, picked: RunPick[Any]) -> Summary:
    """``summary`` saying which run it is of, when the folder holds others."""
    if picked.others:
        summary.run, summary.other_runs = picked.run, list(picked.others)
    return summary


def _losses(chosen: Sequence[Copy[T]]) -> list[str]:
    """What the chosen copies say they lost: events the recorder dropped (its spill fell
    behind), lines or events unreadable and skipped."""
    notes = []
    for c in chosen:
        where = f"{Member(c.role, c.rank).label} ({_shown(c.source)})"
        dropped, skipped = getattr(c.payload, "dropped", 0), getattr(c.payload, "skipped", 0)
        if dropped:
            notes.append(
                f"{where}: the recorder dropped {dropped} events (full: its spill fell behind);"
                " they are missing from the figures"
            )
        if skipped:
            notes.append(
                f"{where}: {skipped} unreadable lines or events skipped (torn by a crash or a"
                " full disk, malformed, or ending before they start)"
            )
    return notes


def _shown(path: Path | None) -> str:
    """A file name as the terminal may show it: control characters escaped."""
    return printable(str(path))


def _thread_names(loaded: list[tuple[Path, list[Copy[RankTrace]]]]) -> dict[Any, dict[int, str]]:
    """Thread names by rank and pid, from every copy read (the one used may have none)."""
    named: dict[Any, dict[int, str]] = {}
    for _, copies in loaded:
        for c in copies:
            if c.payload.thread_names and len(c.pids) == 1:
                named.setdefault((c.rank, next(iter(c.pids))), {}).update(c.payload.thread_names)
    return named


def _trace_copy(t: RankTrace) -> Copy[RankTrace]:
    first = min((r.start_ns for r in t.records), default=None)
    pids = frozenset(r.pid for r in t.records)
    return Copy(
        t.rank, pids, len(t.records), t.source, first, t.role, t, t.instance, t.run, t.origin
    )


def _part_copy(p: ProcessPart) -> Copy[ProcessPart]:
    origin = Origin() if p.spans is None else p.spans.origin
    return Copy(
        p.rank, p.pids, p.n_records, p.source, p.first_ns, p.role, p, p.instance, p.run, origin
    )


def _joined(member: Member, group: Sequence[RankTrace]) -> RankTrace:
    """The processes that share a role and a rank (a restarted worker, two processes of one
    script), summed as that member; each is kept as one of its ``lives`` too, with its own
    origin (the per-step analysis places each by its own clock, and keeps apart those that ran
    at once). Processes of different roles are never joined."""
    if len(group) == 1:
        return group[0]
    records = sorted((r for t in group for r in t.records), key=lambda r: r.start_ns)
    keys = {s: k for t in group for s, k in zip(t.steps, file_step_keys(t))}
    steps = sorted({s for t in group for s in t.steps})
    joined = RankTrace(member.rank, records, steps, group[0].source, member.role, group[0].run)
    joined.origin, joined.lives = group[0].origin, list(group)
    joined = with_notes(joined, [n for t in group for n in file_notes(t)])
    if all(s in keys for s in steps):  # each file named its steps: keep their ids
        return with_steps(joined, steps_from_spans(steps, [keys[s] for s in steps]))
    return joined


def load_traces(
    path: str | Path, steps: StepOptions | None = None, run: str | None = None
) -> tuple[list[RankTrace], list[str], list[str]]:
    """Read every trace under ``path``: ``(traces, errors, notes)``, one trace per role and
    rank (sorted so), every record in memory (for timelines; :func:`summarize_path` summarises
    without that).

    A file that cannot be read is an error naming it, and the others are still read; a folder
    that cannot be listed is an error too. Several processes of one role and rank are summed as
    one; a process in several files is used once (:mod:`mstx_marks.analysis.readers.copies`). With
    ``steps``, each trace's ``steps`` are the ones
    :func:`mstx_marks.analysis.model.steps.find_steps`
    finds. ``run`` picks the run (an id, or ``"all"``; default the newest).
    """
    traces, errors, notes, _ = _load(path, steps, run)
    return traces, errors, notes


def _load(
    path: str | Path, steps: StepOptions | None, run: str | None
) -> tuple[list[RankTrace], list[str], list[str], RunPick[RankTrace]]:
    """:func:`load_traces`, and the run it read."""
    errors: list[str] = []
    notes: list[str] = []
    root = Path(path)
    if not root.exists():
        return [], [f"{root}: no such file or folder"], [], RunPick([])
    loaded: list[tuple[Path, list[Copy[RankTrace]]]] = []
    for file in find_trace_files(root, errors):
        try:
            loaded.append((file, [_trace_copy(t) for t in read_trace_file(file)]))
        except NothingToRead as e:
            notes.append(str(e))
        except TraceFileError as e:
            errors.append(printable(str(e)))
        except (MemoryError, RecursionError, ValueError, TypeError, OverflowError) as e:
            errors.append(f"{_shown(file)}: could not be read ({type(e).__name__}: {e})")
    traces = []
    named = _thread_names(loaded)
    selected, picked = _select(root, loaded, errors, notes, run)
    for member, group in selected.items():
        for c in group:
            c.payload.role, c.payload.origin = c.role, c.origin
        trace = _joined(member, [c.payload for c in group])
        for pid in {r.pid for r in trace.records}:  # a database copy keeps no thread names
            for tid, name in named.get((trace.rank, pid), {}).items():
                trace.thread_names.setdefault(tid, name)
        if steps is not None:
            trace = with_steps(trace, find_steps(trace, steps))
        traces.append(trace)
    return traces, errors, notes, picked


#: What reading one file, or one member's files again, came to: ``("ok", its parts)``, or
#: ``("note", why it holds nothing to count)``, or ``("error", why it could not be read)``.
Reading = tuple[str, "list[ProcessPart] | str"]
#: A member (role and rank) whose processes are in several files, to be read again together:
#: each file with the pids and instance that pick its copies there.
MemberFiles = tuple[Member, list[tuple[Path, tuple[frozenset[int], str]]], StepOptions]


def _part_job(item: tuple[Path, StepOptions]) -> Reading:
    path, steps = item
    try:
        return "ok", part_of_file(path, fold_name, steps)
    except NothingToRead as e:
        return "note", str(e)
    except TraceFileError as e:
        return "error", printable(str(e))
    except Exception as e:  # never a traceback for one bad file: name it and read the rest
        return "error", f"{_shown(path)}: could not be read ({type(e).__name__}: {e})"


def _rank_job(item: MemberFiles) -> Reading:
    """One role and rank whose processes are in several files, read again and summed exactly.
    (A copy may have its role from another copy of the process: the pids pick the copies.)"""
    member, files, steps = item
    try:
        try:
            group = _held_group(member, files)
        except TooLargeToHold:  # its spills hold more than one file may: in one pass instead
            return "ok", [streamed_member(member, member_streams(member, files, steps))]
        for t in group:
            t.role = member.role
        return "ok", [aggregate_trace(_joined(member, group), fold_name, steps)]
    except Exception as e:
        return "error", f"{member.label}: could not be read again ({type(e).__name__}: {e})"


def _held_group(
    member: Member, files: list[tuple[Path, tuple[frozenset[int], str]]]
) -> list[RankTrace]:
    """The traces of ``member`` in ``files``, every record held; raises
    :class:`~mstx_marks.analysis.readers.stream.TooLargeToHold` when its spills would hold more than
    :data:`~mstx_marks.analysis.readers.stream.MAX_HELD_EVENTS` events together (one spill may)."""
    budget = stream.MAX_HELD_EVENTS
    group = []
    for path, who in files:
        traces = read_trace_file(path, max(budget, 0))
        budget -= sum(len(t.records) for t in traces)
        group += [
            t
            for t in traces
            if t.rank == member.rank
            and frozenset(r.pid for r in t.records) == who[0]
            and t.instance in (who[1], "")
        ]
    return group


def member_streams(
    member: Member, files: list[tuple[Path, tuple[frozenset[int], str]]], steps: StepOptions
) -> list[tuple[RankTrace, StreamAggregator]]:
    """``member``'s traces in ``files`` (without their records), each with an aggregator of its
    records read in one pass: what :func:`streamed_member` sums, wherever each file was read
    (the aggregators pickle: a node of a cluster sends its own back)."""
    found: list[tuple[RankTrace, StreamAggregator]] = []
    for path, who in files:
        found += [
            (t, agg)
            for t, agg in streams_of_file(path, fold_name, steps)
            if t.rank == member.rank and agg.pids == who[0] and t.instance in (who[1], "")
        ]
    return found


def streamed_member(
    member: Member, found: Sequence[tuple[RankTrace, StreamAggregator]]
) -> ProcessPart:
    """What :func:`_joined` and ``aggregate_trace`` make of ``member``'s traces, from what
    :func:`member_streams` read of its files (their spills and Chrome traces in one pass; a
    database read whole, as it always is): the part of a member summarised in one pass."""
    if not found:
        raise ValueError("none of its processes is in its files any more")
    total = found[0][1]
    for _, agg in found[1:]:
        total.merge(agg)
    first = found[0][0]
    trace = (
        first if len(found) == 1 else RankTrace(member.rank, [], [], first.source, "", first.run)
    )  # as _joined joins them
    if len(found) > 1:
        trace = with_notes(trace, [n for t, _ in found for n in file_notes(t)])
    trace.role = member.role
    return total.part(trace)


def _streamed_notes(parts: Sequence[ProcessPart]) -> list[str]:
    """One note per process summarised in one pass: which figures it lacks, and why."""
    return [
        f"{p.member.label} ({_shown(p.source)}): {p.n_records} events"
        + (", more than are held in memory here" if p.n_records > stream.MAX_HELD_EVENTS else "")
        + ": summarised in one pass, so its self times and its unmarked, concurrent and"
        " outside-step time are not known (shown as -), and the p50/p90 of its phases of many"
        f" ranges are within {100 * RELATIVE_ERROR:g}%"
        for p in parts
        if p.streamed
    ]


#: The memory the files read at once may take together (by
#: :func:`~mstx_marks.analysis.readers.peak_estimate`: what reading each adds to its worker),
#: so that a summary stays within about a gigabyte whatever the files.
MEMORY_BUDGET = 1 << 30


def memory_jobs(
    estimates: Sequence[int], cpus: int | None = None, budget: int = MEMORY_BUDGET
) -> int:
    """How many files to read at once, given each one's peak estimate: one per CPU (``cpus``,
    default those this process may use), but no more than keep the largest estimates, summed,
    within ``budget``; at least one.

    >>> MB = 1 << 20
    >>> memory_jobs([5 * MB] * 64, cpus=16)  # a 64-rank run of small files: every CPU
    16
    >>> memory_jobs([600 * MB, 300 * MB, 300 * MB] + [5 * MB] * 60, cpus=16)
    2
    >>> memory_jobs([2000 * MB], cpus=16)
    1
    """
    cpus = default_jobs() if cpus is None else cpus
    jobs, total = 0, 0
    for estimate in sorted(estimates, reverse=True)[: max(cpus, 1)]:
        total += estimate
        if jobs and total > budget:
            break
        jobs += 1
    return max(jobs, 1)


class FilesRead(NamedTuple):
    """What a :class:`PartReader` made of a folder: each trace file found and what it came to
    (in any order); the errors of the folder itself (not found, not listable); its notes."""

    results: list[tuple[Path, Reading]]
    errors: list[str]
    notes: list[str]


def read_files(
    root: Path,
    steps: StepOptions,
    jobs: int | None = None,
    progress: bool = True,
    cpus: int | None = None,
) -> FilesRead:
    """Every trace file under ``root``, each reduced to its parts by ``jobs`` worker processes
    of this machine (default: one per CPU, ``cpus`` or those this process may use, fewer when
    large files would take more than :data:`MEMORY_BUDGET` together, see :func:`memory_jobs`);
    a progress line goes to stderr when there are more than a few files and ``progress``."""
    errors: list[str] = []
    if not root.exists():
        return FilesRead([], [f"{root}: no such file or folder"], [])
    files = find_trace_files(root, errors)
    meter = Progress(len(files)) if progress else None
    file_jobs = memory_jobs([peak_estimate(f) for f in files], cpus) if jobs is None else jobs
    mapped = map_files(_part_job, [(f, steps) for f in files], file_jobs, meter)
    return FilesRead([(file, value) for (file, _), value in mapped], errors, [])


def read_members(
    items: Sequence[MemberFiles], jobs: int | None = None, cpus: int | None = None
) -> list[Reading]:
    """What each member came to, its files read again together (by ``jobs`` worker processes
    of this machine; default as :func:`memory_jobs` says of each member's files together)."""
    if jobs is None:
        jobs = memory_jobs([sum(peak_estimate(f) for f, _ in item[1]) for item in items], cpus)
    return [value for _, value in map_files(_rank_job, items, jobs)]


class PartReader(Protocol):
    """How the files under a folder become parts: the one step of :func:`summarize_path` that
    depends on where they lie. :class:`LocalReader` reads them with this machine's processes;
    :class:`mstx_marks.analysis.readers.cluster.RayReader` with a task on each node of a Ray
    cluster,
    which runs :func:`read_files` and :func:`read_members` on that node's own disk. Whatever a
    :class:`~mstx_marks.analysis.model.aggregate.ProcessPart` holds travels back alike."""

    def files(
        self, root: Path, steps: StepOptions, jobs: int | None, progress: bool
    ) -> FilesRead: ...

    def members(self, items: Sequence[MemberFiles], jobs: int | None) -> list[Reading]: ...


class LocalReader:
    """The files read where this process runs (what :func:`summarize_path` does by default).

    >>> LocalReader().files(Path("/no/such/folder"), StepOptions(), 1, False).errors
    ['/no/such/folder: no such file or folder']
    """

    def files(self, root: Path, steps: StepOptions, jobs: int | None, progress: bool) -> FilesRead:
        return read_files(root, steps, jobs, progress)

    def members(self, items: Sequence[MemberFiles], jobs: int | None) -> list[Reading]:
        return read_members(items, jobs)


def member_parts(
    path: str | Path,
    steps: StepOptions | None = None,
    jobs: int | None = None,
    progress: bool = True,
    run: str | None = None,
    reader: PartReader | None = None,
) -> tuple[list[ProcessPart], list[str], list[str], RunPick[ProcessPart]]:
    """One part per member (role and rank) of the run read from the traces under ``path``, as
    ``reader`` reads them (default :class:`LocalReader`): ``(parts, errors, notes, run)``;
    what :func:`summarize_path` combines."""
    steps = steps or StepOptions()
    root = Path(path)
    reader = reader or LocalReader()
    read = reader.files(root, steps, jobs, progress)
    errors, notes = list(read.errors), list(read.notes)
    loaded: list[tuple[Path, list[Copy[ProcessPart]]]] = []
    budget = PoolBudget()
    for file, (status, value) in read.results:
        if isinstance(value, str):
            (notes if status == "note" else errors).append(value)
            continue
        for p in value:
            budget.admit(p)
        copies = [_part_copy(p) for p in value]
        loaded.append((file, copies))
    loaded.sort(key=lambda item: item[0])  # workers finish in any order; choose as if in order
    errors.sort()
    parts: list[ProcessPart] = []
    again: list[MemberFiles] = []
    selected, picked = _select(root, loaded, errors, notes, run)
    lanes: dict[Member, list[ProcessSpans]] = {}
    for member, group in selected.items():
        for c in group:  # (what another copy of its process lent it)
            c.payload.role = c.role
            if c.payload.spans is not None:
                c.payload.spans.identify(c.origin, c.pids, c.instance)
        if len(group) == 1:
            parts.append(group[0].payload)
        else:
            # Read again to be summed exactly; each process stays its own lane, as read.
            lanes[member] = [c.payload.spans for c in group if c.payload.spans is not None]
            files_of_member = [
                (c.source, (c.pids, c.instance)) for c in group if c.source is not None
            ]
            again.append((member, files_of_member, steps))
    for _status, value in reader.members(again, jobs) if again else []:
        if isinstance(value, str):
            errors.append(value)
        else:
            for part in value:
                part.lanes = lanes.get(part.member, [])
            parts.extend(value)
    errors += _second_pass(parts, selected, steps, reader, jobs)
    notes.extend(_streamed_notes(parts))
    return parts, errors, notes, picked


def _second_pass(
    parts: list[ProcessPart],
    selected: dict[Member, list[Copy[ProcessPart]]],
    steps: StepOptions,
    reader: PartReader,
    jobs: int | None,
) -> list[str]:
    """Read again the processes whose spans bounding memory joined across the job's step edges,
    with those edges as fences (see :func:`_needing_fences`), each from the file its copy was
    read from; the errors of those that could not be (their first reading stays)."""
    items: list[MemberFiles] = []
    where: dict[tuple[Member, Path], tuple[int, int | None]] = {}
    for i, lane, fences in _needing_fences(parts):
        member = parts[i].member
        copy = [c for c in selected[member] if c.payload.spans is not None][lane or 0]
        if copy.source is not None:
            items.append((member, [(copy.source, (copy.pids, copy.instance))],
                          replace(steps, fences=fences)))  # fmt: skip
            where[(member, copy.source)] = (i, lane)
    errors = []
    for _status, value in reader.members(items, jobs) if items else []:
        if isinstance(value, str):
            errors.append(value)
            continue
        for part in value:
            found = where.get((part.member, Path(part.source or "")))
            if found is not None:
                _refill(parts[found[0]], found[1], part.spans)
    return errors


def summarize_path(
    path: str | Path,
    steps: StepOptions | None = None,
    jobs: int | None = None,
    progress: bool = True,
    run: str | None = None,
    reader: PartReader | None = None,
) -> Summary:
    """The summary of every trace under ``path``, streamed (``errors`` and ``notes`` filled).

    Files are read by ``jobs`` worker processes (default: one per CPU, fewer when large files
    would take more than :data:`MEMORY_BUDGET` together, see :func:`memory_jobs`), each file
    reduced to a :class:`~mstx_marks.analysis.model.aggregate.ProcessPart` where it is read; a
    progress line goes to stderr when there are more than a few files. Workers fold names with
    the built-in phase registry (pass ``jobs=1`` to fold with phases registered in this process).
    ``reader`` says where the files are read (see :class:`PartReader`; default: here).
    """
    parts, errors, notes, picked = member_parts(path, steps, jobs, progress, run, reader)
    summary = combine(parts)
    summary.errors, summary.notes = errors, notes + summary.notes
    return _with_run(summary, picked)


def _check_folder(flag: str, file: str | None) -> bool:
    """Whether ``file``'s folder exists (checked before the work, and not created: a mistyped
    folder should not appear silently); says why not on stderr."""
    if not file:
        return True
    folder = Path(file).parent
    if folder.is_dir():
        return True
    why = "is not a folder" if folder.exists() else "does not exist"
    print(f"error: {flag} {file}: the folder {folder} {why}", file=sys.stderr)
    return False


def run_summary(
    path: str,
    fmt: str = "table",
    svg: str | None = None,
    *,
    html: str | None = None,
    trace: str | None = None,
    steps: StepOptions | None = None,
    jobs: int | None = None,
    run: str | None = None,
    all_phases: bool = False,
    reader: PartReader | None = None,
) -> int:
    """Print the summary of the traces under ``path`` as ``fmt`` (table, csv, json); draw the
    timeline to ``svg``, write the HTML report to ``html`` and the merged job timeline (Chrome /
    Perfetto JSON) to ``trace``. Returns the exit code: 0, or 1 when a file or folder could not
    be read (the others are still summarised), or 2 when no trace was found (as ``coverage``
    says) or an output file's folder does not exist (checked first) or cannot be written.
    ``run``: which run of the job (an id, or ``"all"``; default the newest, named when there
    are several). ``reader`` says where the files are read (see :class:`PartReader`; the
    pictures need every range, so only from files read here).

    The table, the HTML report and the SVG legend show each role's
    :data:`~mstx_marks.analysis.model.top_phases.MAX_PHASES` phases of most time and one row for the
    rest; ``all_phases`` shows every one. The CSV and JSON always hold every phase."""
    max_phases = None if all_phases else MAX_PHASES
    outputs = (("--svg", svg), ("--html", html), ("--trace", trace))
    if not all(_check_folder(flag, file) for flag, file in outputs):
        return 2
    if reader is not None and (svg or html or trace):
        print(
            "error: --svg, --html and --trace draw every range, which only the files read here"
            " hold: copy the folders together and summarise that",
            file=sys.stderr,
        )
        return 2
    traces: list[RankTrace] = []
    if svg or html or trace:  # pictures need every range: read them into memory
        traces, errors, notes, picked = _load(path, None, run)
        summary = _with_run(summarize(traces, steps=steps), picked)
        summary.errors, summary.notes = errors, notes + summary.notes
    else:
        summary = summarize_path(path, steps, jobs, run=run, reader=reader)
    for note in summary.notes:
        print(f"note: {printable(note)}", file=sys.stderr)
    for error in summary.errors:
        print(f"error: {printable(error)}", file=sys.stderr)
    if not summary.step_time_ns:  # nothing read: none found (2, as coverage), or a file failed
        nothing = all(NO_TRACES in e for e in summary.errors)
        return 2 if nothing else 1
    if fmt == "csv":
        sys.stdout.write(format_csv(summary))
    elif fmt == "json":  # (its per-step table one line per step and process: see write_json)
        write_json(format_json(summary), sys.stdout)
    else:
        print(format_table(summary, max_phases))
    files = (svg, html, trace)
    status = _write_outputs(traces, summary, files, max_phases)
    return status or (1 if summary.errors else 0)


def _write_outputs(
    traces: list[RankTrace],
    summary: Summary,
    files: tuple[str | None, str | None, str | None],
    max_phases: int | None = MAX_PHASES,
) -> int:
    from mstx_marks.analysis.render.merge import write_merged_trace
    from mstx_marks.analysis.render.report_html import write_html_report
    from mstx_marks.analysis.render.timeline import write_svg

    svg, html, trace = files

    # Every picture renders the summary's one model: its steps, its clocks (never found again).
    model = summary.per_step

    def svg_of(f: str) -> Path:
        return write_svg(f, traces, fold_name, max_phases=max_phases, model=model)

    def html_of(f: str) -> Path:
        return write_html_report(f, traces, summary, max_phases=max_phases)

    jobs: list[tuple[str, str | None, Callable[[str], Path]]] = [
        ("--svg", svg, svg_of),
        ("--html", html, html_of),
        ("--trace", trace, lambda f: write_merged_trace(f, traces, model)),
    ]
    status = 0
    for flag, file, write in jobs:
        if not file:
            continue
        try:
            print(f"{flag[2:]}: {write(file)}", file=sys.stderr)
        except OSError as e:
            print(f"error: {flag} {file}: cannot write it: {e}", file=sys.stderr)
            status = 2
    return status
