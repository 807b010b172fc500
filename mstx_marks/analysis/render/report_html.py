"""``summary DIR --html report.html``: one self-contained page to look at a run.

The page needs no network and loads no file: the data, the script and the style are inline. It
holds:

- **the timeline**, most of the window high: one lane group per role and rank (by role, then
  rank; a header lane with its name and step labels, then a track per thread, named by its
  Python thread name when known; nested ranges one lane below what contains them, overlapping
  ones on lanes of their own, as in :mod:`mstx_marks.analysis.render.timeline`), drawn on a canvas
  under a time axis with ticks and grid lines. The wheel zooms about the pointer (over the
  labels it scrolls the lanes), dragging pans, the buttons zoom, double-click resets. A bar is
  at least :data:`MIN_BAR_PX` wide, so a phase far shorter than a pixel still shows; hovering
  gives its true duration, name, role, rank, thread, start and ``args``. Instants are marked by
  triangles (hover: name, time, ``args``). The job's steps are dashed lines labelled with
  their key: the summary's per-step model's (:mod:`~mstx_marks.analysis.model.rl_steps`, never found
  again here), whose clock alignment places every process (each moved by its shift). Each
  phase has one colour in every report and in the SVG timeline (:func:`phase_color`, from
  the name: :mod:`~mstx_marks.analysis.render.colors`). Beyond
  :data:`MAX_BARS` ranges only the longest are drawn (the page says how many were left out;
  the table still counts them all).
- **the pipeline view**, beside it: the per-step model as a picture (an SVG), one lane per
  process (role x rank; the loop role first), each step a column band as wide as the step is
  long, a header with its key and length. Each lane is drawn at true times: its window in the
  step (hatched: idle) holds a fixed number of bins (:mod:`~mstx_marks.analysis.model.step_bins`),
  each where it lay, coloured by its phase of most time and as opaque as its phases cover it;
  the bins' busy times add up to the step's. So an async job's generation overlapping training
  shows as it ran. A critical-path row draws the step's path at its times, and a red tick marks
  in its lane the end of the work of each process the path waited for (at its time: on its
  work); the rank the step's what-if names (the slowest of its role in the phase with the most
  to gain: the long tail) is outlined red and its label flagged. Hover for the figures; eight
  steps at a time, buttons page through them. Every figure is the model's
  (:func:`pipeline_data`): the page only places them.
- **the per-phase table**: per phase its row across ranks and a row per rank (click the phase to
  fold them), inclusive step %, self time and self %, an ``(unmarked)`` row per role, and a
  note saying why the shares may pass 100 % (click a heading to sort by it). Each role's
  :data:`~mstx_marks.analysis.model.top_phases.MAX_PHASES` phases of most time have a row, a colour
  and a legend entry; the others one row, one grey, one entry (``max_phases=None``: all);
- **rank imbalance**: per role and phase run on several ranks, each rank's total as a bar on a
  scale (ms, with the mean dashed), the slowest rank named with its total over the fastest's,
  like msprof-analyze's slow-rank view; its bar red only from :data:`IMBALANCE_FLAG` on (below,
  it is said to be within noise: what ranks doing equal work differ by). Roles are never mixed:
  the trainer, the FSDP workers and the rollout engine of one GPU all say rank 0. With one rank
  per role there is no panel.

Every name reaches the page as data and is inserted as text, never as markup. The style and
the scripts are files of the package (``mstx_marks/analysis/render/report/``: :data:`ASSETS`), read
with :mod:`importlib.resources` and inlined: the page is still one file.

>>> from mstx_marks.base.records import RangeRecord, RankTrace
>>> from mstx_marks.analysis.summary import summarize
>>> t = [RankTrace(0, [RangeRecord("gen", "default", 0, 5, 1, 1, args={"tokens": 3})])]
>>> page = render_html(t, summarize(t))
>>> page.startswith("<!DOCTYPE html>") and "http" not in page.split("<script")[0]
True
"""

from __future__ import annotations

import functools
import html
import json
from collections import Counter
from importlib.resources import files
from pathlib import Path
from typing import Any, Sequence

from mstx_marks.analysis.model.aggregate import PhaseSummary, Stats, Summary
from mstx_marks.analysis.model.mark_pairs import pair_marks
from mstx_marks.analysis.model.rl_steps import StepAnalysis
from mstx_marks.analysis.model.spans import ProcessSpans
from mstx_marks.analysis.model.stages import range_name
from mstx_marks.analysis.model.step_bins import step_bins
from mstx_marks.analysis.model.steps import fold_name
from mstx_marks.analysis.model.top_phases import MAX_PHASES, OtherPhases, top_phases
from mstx_marks.analysis.render.colors import OTHER_COLOR, PHASE_COLORS, phase_color
from mstx_marks.analysis.render.rl_steps_text import steps_json
from mstx_marks.analysis.render.summary_text import cut, run_line
from mstx_marks.analysis.render.timeline import assign_lanes
from mstx_marks.base.diagnostics import counted
from mstx_marks.base.records import InstantRecord, Member, RangeRecord, RankTrace, Record
from mstx_marks.export import atomic_write_bytes

__all__ = [
    "ASSETS",
    "IMBALANCE_FLAG",
    "MAX_BARS",
    "MAX_MARKS",
    "MIN_BAR_PX",
    "OTHER_COLOR",
    "PHASE_COLORS",
    "asset",
    "phase_color",
    "render_html",
    "report_data",
    "write_html_report",
]

#: The narrowest bar, in CSS pixels: a 0.1 ms phase in a minute-long run still shows.
MIN_BAR_PX = 3
#: At most this many ranges are drawn (the longest).
MAX_BARS = 200_000
#: At most this many instants are drawn (the first).
MAX_MARKS = 50_000
#: The slowest rank's total over the fastest's from which the imbalance panel paints it red:
#: ranks doing equal work differ by a few percent from launch skew and scheduling alone (1.02x
#: painted red read as a finding), while a tenth more is a rank that does more, or waits.
IMBALANCE_FLAG = 1.10


def _ms(ns: float) -> float:
    return round(ns / 1e6, 6)


def _stats_row(s: Stats) -> dict[str, Any]:
    return {
        "count": s.count, "total": _ms(s.total_ns), "mean": _ms(s.mean_ns), "p50": _ms(s.p50_ns),
        "p90": _ms(s.p90_ns), "max": _ms(s.max_ns), "share": _pct(s.step_share),
        "self": None if s.self_ns is None else _ms(s.self_ns), "self_share": _pct(s.self_share),
    }  # fmt: skip


def _other_row(o: OtherPhases) -> dict[str, Any]:
    return {
        "role": o.role, "name": o.label, "phases": o.phases, "count": o.count,
        "total": _ms(o.total_ns), "max": _ms(o.max_ns), "share": _pct(o.step_share),
        "self": None if o.self_ns is None else _ms(o.self_ns), "self_share": _pct(o.self_share),
        "automatic": o.automatic,
    }  # fmt: skip


def _pct(share: float | None) -> float | None:
    return None if share is None else round(100 * share, 2)


def _breakdown(summary: Summary) -> tuple[list[dict[str, Any]], list[str]]:
    """Per role, the unmarked step time (all ranks, and each); and why shares pass 100 %."""
    unmarked, beyond = [], []
    for role in summary.roles:
        members = summary.members(role)
        step = sum(summary.step_time_ns[m] for m in members)
        free = sum(summary.unmarked_ns.get(m, 0) for m in members)
        ranks = []
        for m in members:
            t, u = summary.step_time_ns[m], summary.unmarked_ns.get(m, 0)
            ranks.append({"rank": m.rank, "total": _ms(u), "share": _pct(u / t if t else None)})
            concurrent, outside = summary.concurrent_ns.get(m, 0), summary.outside_ns.get(m, 0)
            why = []
            if concurrent:
                why.append(
                    f"{concurrent / 1e6:.3f} ms of ranges concurrent with others (other"
                    " threads, or asyncio tasks on one thread)"
                )
            if outside:
                why.append(f"{outside / 1e6:.3f} ms of phases outside steps")
            if why:
                beyond.append(f"{m.label}: " + " and ".join(why))
        unmarked.append(
            {"role": role, "total": _ms(free), "share": _pct(free / step if step else None),
             "ranks": ranks}
        )  # fmt: skip
    return unmarked, beyond


def _coloured(
    drawn: Sequence[tuple[RankTrace, Record]],
    shown: Sequence[PhaseSummary],
    limit: int | None,
) -> set[str] | None:
    """The names the timeline colours and its legend lists, when not every drawn one (None):
    past ``limit`` names, the phases the table shows and the ``limit`` most frequent instants;
    the others are drawn grey, one legend entry for them all."""
    named: Counter[str] = Counter()
    instants: Counter[str] = Counter()
    for _, r in drawn:
        name = _drawn_name(r)
        named[name] += 1
        if isinstance(r, InstantRecord):
            instants[name] += 1
    if limit is None or len(named) <= limit:
        return None
    return {p.name for p in shown} | {name for name, _ in instants.most_common(limit)}


def _drawn_name(r: Record) -> str:
    """The phase a range or an instant is drawn as (folded as the summary folds it)."""
    if isinstance(r, RangeRecord):
        return fold_name(range_name(r.name, r.domain))
    return fold_name(r.name)


def pipeline_data(
    model: StepAnalysis | None,
    origin_ns: int = 0,
    spans: Sequence[tuple[Member, ProcessSpans]] = (),
) -> dict[str, Any] | None:
    """What the pipeline view draws: the per-step model in its one JSON form
    (:func:`~mstx_marks.analysis.render.rl_steps_text.steps_json`, as ``summary --json`` writes it)
    with its times (the steps' and their critical paths') less ``origin_ns``: JavaScript reads
    numbers as doubles, which hold an epoch in ns to 256 ns only, a time since the run's start
    exactly. Then the order of its lanes (indices into its ``processes``: by role as
    :meth:`~mstx_marks.analysis.model.rl_steps.StepAnalysis.roles` orders them, the loop role first,
    then by rank), each phase's colour, and ``bins``: where in each step each process's time
    lay, cut from the ``spans`` the model was built from
    (:mod:`~mstx_marks.analysis.model.step_bins`):
    ``n`` per process and step, ``lanes[i]`` process ``i``'s, per step ``[start, end, covers,
    phases]`` (its window less ``origin_ns``, each bin's busy ns, each bin's phase as an index
    into ``names``, -1 none) or null where it has no figures; a process whose spans are not
    given has null. None without a model.

    >>> from mstx_marks.analysis.model.rl_steps import analyse
    >>> from mstx_marks.analysis.model.steps import Step
    >>> t = ProcessSpans(); t.add(100, 140, "gen"); t.set_steps([Step(100, 150, "1", 50)])
    >>> w = ProcessSpans(); w.add(105, 135, "gen")
    >>> spans = [(Member("a_worker", 0), w.finish()), (Member("trainer", 0), t.finish())]
    >>> view = pipeline_data(analyse(spans), origin_ns=100, spans=spans)
    >>> view["lanes"], view["model"]["processes"][1]["idle_ns"], view["colors"]["gen"][0]
    ([1, 0], [10], '#')
    >>> step = view["model"]["steps"][0]
    >>> step["start_ns"], step["end_ns"], step["critical_path"][0]["waited"]["end_ns"]
    (0, 50, 35)
    >>> start, end, covers, phases = view["bins"]["lanes"][0][0]  # the worker's
    >>> start, end, sum(covers), view["bins"]["n"], covers[:4], phases[:4]
    (0, 50, 30, 48, [0, 0, 0, 0], [-1, -1, -1, -1])
    """
    if model is None:
        return None
    lanes = [
        i for role in model.roles() for i, p in enumerate(model.processes) if p.member.role == role
    ]
    names = {name for p in model.processes for name in p.phases}
    names |= {link.phase for step in model.steps for link in step.path}
    doc = steps_json(model)
    for step in doc["steps"]:
        for timed in [step, *step["critical_path"]]:
            timed["start_ns"] -= origin_ns
            timed["end_ns"] -= origin_ns
            if timed.get("waited"):
                timed["waited"]["end_ns"] -= origin_ns
    bins = step_bins(model, spans)
    return {
        "model": doc,
        "origin_ns": origin_ns,
        "lanes": lanes,
        "colors": {name: phase_color(name) for name in sorted(names)},
        "bins": {
            "n": bins.n,
            "names": bins.names,
            "lanes": [
                None
                if lane is None
                else [
                    None
                    if b is None
                    else [b.start_ns - origin_ns, b.end_ns - origin_ns, b.cover, b.phase]
                    for b in lane.steps
                ]
                for lane in bins.lanes
            ],
        },
    }


def report_data(
    traces: Sequence[RankTrace],
    summary: Summary,
    max_phases: int | None = MAX_PHASES,
) -> dict[str, Any]:
    """What the page draws, as plain JSON data (times in microseconds from ``origin_ns``, on
    the axis the summary's per-step model put the processes on: each moved by its clock
    shift, :class:`~mstx_marks.analysis.model.rl_steps.ClockNote`).

    ``groups`` are the lane groups, one per role and rank (a header lane, then each thread's
    lanes); ``bars`` are ``[lane, start, duration, name, args, open, raw name or 0]`` and
    ``marks`` (instants) ``[lane, time, name, args, raw name or 0]``, ``name`` an index into
    ``names``, ``args`` into ``args`` (-1: none).

    ``steps`` are the job's steps, ``[start, key]``, and ``pipeline`` the per-step model (see
    :func:`pipeline_data`): both the summary's own (``summary.per_step``), never found again
    here; with no model (no process has steps), there are none.

    ``phases`` (the table) are each role's ``max_phases`` phases of most time, ``others`` a row
    per role for the rest (:mod:`~mstx_marks.analysis.model.top_phases`; ``None``: every phase). The
    names past ``colors`` (``folded`` of them, cut to a table's width) are drawn in
    ``other_color`` under one legend entry: a page of 50,000 names stays a few MB and opens at
    once.

    >>> from mstx_marks.analysis.summary import summarize
    >>> t = [RankTrace(0, [RangeRecord(f"op{i}", "default", i, 2 * i, 1, 1) for i in range(9)])]
    >>> data = report_data(t, summarize(t), max_phases=3)
    >>> [p["name"] for p in data["phases"]], data["others"][0]["name"], data["folded"]
    (['op6', 'op7', 'op8'], '(6 other phases)', 6)
    >>> data["names"][:3], len(data["colors"])  # coloured first; hovering a grey bar names it
    (['op6', 'op7', 'op8'], 3)
    """
    traces = sorted(traces, key=lambda t: t.member)
    model = summary.per_step
    shifts = {} if model is None else model.clock.shifts_ns
    paired = [(t, pair_marks(t.records)) for t in traces]
    every = [(t, r) for t, recs in paired for r in recs if isinstance(r, RangeRecord)]
    left_out = max(0, len(every) - MAX_BARS)
    if left_out:
        every = sorted(every, key=lambda tr: tr[1].end_ns - tr[1].start_ns)[left_out:]
    instants = [(t, r) for t, recs in paired for r in recs if isinstance(r, InstantRecord)]
    instants = instants[:MAX_MARKS]
    drawn: list[tuple[RankTrace, Record]] = [*every, *instants]
    times = [r.start_ns + shifts.get(t.member, 0) for t, r in drawn]
    origin = min(times, default=0)
    end = max([r.end_ns + shifts.get(t.member, 0) for t, r in every] + times, default=origin)
    shown, others = top_phases(summary, max_phases)
    coloured = _coloured([*every, *instants], shown, max_phases)
    names: dict[str, int] = {}  # by first drawn, as named here; numbered below
    args: dict[str, int] = {}

    def arg_index(r: Record) -> int:
        if not r.args:
            return -1
        text = json.dumps(dict(r.args), default=str, sort_keys=True)
        return args.setdefault(text, len(args))

    by_member: dict[Any, dict[tuple[int, int], list[Record]]] = {}
    for t, r in drawn:
        by_member.setdefault(t.member, {}).setdefault((r.pid, r.thread), []).append(r)
    thread_names = {t.member: t.thread_names for t in traces}
    groups: list[dict[str, Any]] = []
    bars: list[list[Any]] = []
    marks: list[list[Any]] = []
    lane = 0
    for member, threads in sorted(by_member.items()):
        at = origin - shifts.get(member, 0)  # its times less this: on the page's axis
        top = lane
        lane += 1  # the group's header lane: its name and step labels
        pids = {pid for pid, _ in threads}
        tracks = []
        for (pid, tid), recs in sorted(threads.items()):
            placed = assign_lanes([r for r in recs if isinstance(r, RangeRecord)])
            depth = 1 + max((d for _, d in placed), default=0)
            label = thread_names[member].get(tid) or f"thread {tid}"
            if len(pids) > 1:
                label += f" (pid {pid})"
            tracks.append({"pid": pid, "tid": tid, "name": label, "lane": lane, "lanes": depth})
            for r, d in placed:
                name = fold_name(range_name(r.name, r.domain))
                bars.append([
                    lane + d,
                    round((r.start_ns - at) / 1000, 3),
                    round((r.end_ns - r.start_ns) / 1000, 3),
                    names.setdefault(name, len(names)),
                    arg_index(r),
                    1 if r.open else 0,
                    r.name if r.name != name else 0,
                ])  # fmt: skip
            for r in recs:
                if isinstance(r, InstantRecord):
                    name = fold_name(r.name)
                    marks.append([
                        lane, round((r.start_ns - at) / 1000, 3),
                        names.setdefault(name, len(names)), arg_index(r),
                        r.name if r.name != name else 0,
                    ])  # fmt: skip
            lane += depth
        groups.append({
            "rank": member.rank, "role": member.role, "label": member.label, "top": top,
            "lanes": lane - top, "tracks": tracks, "pids": sorted(pids),
        })  # fmt: skip
    # The coloured names first, so that a name's index says whether it has a colour.
    order = sorted(names, key=lambda n: (coloured is not None and n not in coloured, names[n]))
    number = {n: i for i, n in enumerate(order)}
    index = [number[n] for n in names]
    for bar in bars:
        bar[3] = index[bar[3]]
    for mark in marks:
        mark[2] = index[mark[2]]
    n_coloured = len(order) if coloured is None else sum(n in coloured for n in order)
    job_steps = [] if model is None else model.steps
    step_marks = [[round((s.start_ns - origin) / 1000, 3), s.key] for s in job_steps]
    phases = []
    for p in shown:
        o = p.overall
        phases.append({
            "role": p.role, "name": p.name, **_stats_row(o),
            "err": o.percentile_error, "imbalance": p.imbalance, "slowest": p.slowest_rank,
            "is_step": p.is_step, "automatic": p.automatic,
            "ranks": [[rank, _ms(s.total_ns)] for rank, s in p.per_rank.items()],
            "per_rank": [{"rank": rank, **_stats_row(s)} for rank, s in p.per_rank.items()],
        })  # fmt: skip
    unmarked, beyond = _breakdown(summary)
    return {
        "origin_ns": origin,
        "span_us": max(round((end - origin) / 1000, 3), 0.001),
        "lanes": lane,
        "groups": groups,
        "bars": bars,
        "marks": marks,
        "names": order[:n_coloured] + [cut(n) for n in order[n_coloured:]],
        "colors": [phase_color(n) for n in order[:n_coloured]],
        "folded": len(order) - n_coloured,
        "other_color": OTHER_COLOR,
        "others": [_other_row(o) for o in others],
        "args": list(args),
        "steps": step_marks,
        "pipeline": pipeline_data(model, origin, summary.step_spans),
        "phases": phases,
        "unmarked": unmarked,
        "beyond": beyond,
        "left_out": left_out,
        "ranks": sorted({m.rank for m in summary.step_time_ns}),
        "roles": summary.roles,
        "members": [m.label for m in summary.members()],
        "min_bar_px": MIN_BAR_PX,
        "max_phases": max_phases,
        "imbalance_flag": IMBALANCE_FLAG,
    }


#: The page's style and scripts: package data (``report/`` beside this module), inlined.
ASSETS = ("report.css", "errors.js", "report.js", "pipeline.js")


@functools.cache
def asset(name: str) -> str:
    """The text of one of the page's files, as shipped in the package (``report/NAME``).

    Inside ``<script>`` or ``<style>``, ``</`` could end the block and ``<!--`` hide it: a
    file holding either is refused rather than inlined.

    >>> "data-errors" in asset("errors.js")
    True
    """
    text = (files("mstx_marks.analysis.render") / "report" / name).read_text(encoding="utf-8")
    if "</" in text or "<!--" in text:
        raise ValueError(f"report/{name} holds '</' or '<!--': it cannot be inlined")
    return text


def render_html(
    traces: Sequence[RankTrace],
    summary: Summary,
    title: str = "mstx_marks report",
    max_phases: int | None = MAX_PHASES,
) -> str:
    """The page for ``traces`` and their ``summary``, as one string (``max_phases``: as
    :func:`report_data` says). Its steps are the summary's own (its per-step model, made with
    the options the summary was): never found again here."""
    data = report_data(traces, summary, max_phases)
    # Inside <script>, "</" ends the block and "<!--" starts an escaped state that hides it:
    # "<" as \u003c (JSON's own escape) leaves neither, and the data the same.
    payload = json.dumps(data, default=str, separators=(",", ":")).replace("<", "\\u003c")
    left = data["left_out"]
    note = (
        f"<p class='note'>{left} of the shortest ranges are not drawn (the table counts them).</p>"
        if left
        else ""
    )
    beyond = "".join(f"<br>{html.escape(line)}" for line in data["beyond"])
    shares = (
        "<p class='note'>step % is inclusive: a phase nested in another counts in both, so the"
        " column may add up to more than 100. self is exclusive: a phase's time less the phases"
        " inside it on its thread; self % and (unmarked), the step time no phase covers, add up"
        " to 100 % when the phases run one at a time inside steps."
        + (" Here they add up to more:" + beyond if beyond else "")
        + "</p>"
    )
    sketch = any(p["err"] for p in data["phases"])
    err_note = (
        "<p class='note'>~: the p50/p90 across ranks are within 0.5% (merged sketches).</p>"
        if sketch
        else ""
    )
    ranks, roles = data["ranks"], [r for r in data["roles"] if r]
    who = counted(len(ranks), "rank")
    if roles:  # roles first: several roles may share one rank
        who = (
            f"{counted(len(data['members']), 'process', 'processes')} in"
            f" {counted(len(roles), 'role')} ("
            + ", ".join(html.escape(r) for r in roles)
            + f") on {who}"
        )
    runs = run_line(summary)
    runs = f"{html.escape(runs)}.<br>" if runs else ""
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{asset('report.css')}</style>"
        f"<script>{asset('errors.js')}</script></head><body>"
        f"<h1>{html.escape(title)}</h1>"
        f"<p>{runs}{who}, {len(data['bars'])} ranges and {len(data['marks'])} instants drawn.</p>"
        f"{note}<div class='legend' id='legend'></div>"
        "<div id='bar'><button id='zin' title='zoom in'>+</button>"
        "<button id='zout' title='zoom out'>&minus;</button>"
        "<button id='zreset' title='the whole run'>reset</button><span id='view'></span>"
        "<span class='note'>wheel: zoom, drag: pan, double-click: reset; hover for details"
        "</span></div><div id='tl'></div><div id='tip'></div>"
        "<h2 id='pipehead'>Steps across the job: where each step's time went, per process</h2>"
        "<p class='note' id='pipenote'></p><div id='pipebar'>"
        "<button id='pprev' title='earlier steps'>&#9664;</button>"
        "<button id='pnext' title='later steps'>&#9654;</button><span id='pview'></span></div>"
        "<div id='pipewrap'><svg id='pipesvg'></svg></div>"
        f"<h2>Phases</h2>{err_note}<table id='phases'></table>{shares}"
        "<h2 id='imbhead'>Rank imbalance (per role, total time per rank; red: the slowest, from"
        f" {IMBALANCE_FLAG:.2f}x the fastest)</h2>"
        "<div id='imbalance'></div>"
        f"<script type='application/json' id='data'>{payload}</script>"
        f"<script>{asset('report.js')}</script><script>{asset('pipeline.js')}</script>"
        "</body></html>\n"
    )


def write_html_report(
    path: str | Path,
    traces: Sequence[RankTrace],
    summary: Summary,
    *,
    max_phases: int | None = MAX_PHASES,
) -> Path:
    """Write :func:`render_html` to ``path`` atomically and return the path."""
    page = render_html(traces, summary, max_phases=max_phases)
    return atomic_write_bytes(path, page.encode())
