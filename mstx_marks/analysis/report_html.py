"""``summary DIR --html report.html``: one self-contained page to look at a run.

The page needs no network and loads no file: the data, the script and the style are inline. It
holds:

- **the timeline**, most of the window high: one lane group per role and rank (by role, then
  rank; a header lane with its name and step labels, then a track per thread, named by its
  Python thread name when known; nested ranges one lane below what contains them, overlapping
  ones on lanes of their own, as in :mod:`mstx_marks.analysis.timeline`), drawn on a canvas
  under a time axis with ticks and grid lines. The wheel zooms about the pointer (over the
  labels it scrolls the lanes), dragging pans, the buttons zoom, double-click resets. A bar is
  at least :data:`MIN_BAR_PX` wide, so a phase far shorter than a pixel still shows; hovering
  gives its true duration, name, role, rank, thread, start and ``args``. Instants are marked by
  triangles (hover: name, time, ``args``). Steps are dashed lines labelled with their key. Each
  phase has one colour in every report and in the SVG timeline (:func:`phase_color`, from
  the name: :mod:`~mstx_marks.analysis.colors`). Beyond
  :data:`MAX_BARS` ranges only the longest are drawn (the page says how many were left out;
  the table still counts them all).
- **the per-phase table**: per phase its row across ranks and a row per rank (click the phase to
  fold them), inclusive step %, self time and self %, an ``(unmarked)`` row per role, and a
  note saying why the shares may pass 100 % (click a heading to sort by it). Each role's
  :data:`~mstx_marks.analysis.top_phases.MAX_PHASES` phases of most time have a row, a colour
  and a legend entry; the others one row, one grey, one entry (``max_phases=None``: all);
- **rank imbalance**: per role and phase run on several ranks, each rank's total as a bar on a
  scale (ms, with the mean dashed), the slowest rank named with its total over the fastest's,
  like msprof-analyze's slow-rank view. Roles are never mixed: the trainer, the FSDP workers and
  the rollout engine of one GPU all say rank 0. With one rank per role there is no panel.

Every name reaches the page as data and is inserted as text, never as markup.

>>> from mstx_marks.base.records import RangeRecord, RankTrace
>>> from mstx_marks.analysis.summary import summarize
>>> t = [RankTrace(0, [RangeRecord("gen", "default", 0, 5, 1, 1, args={"tokens": 3})])]
>>> page = render_html(t, summarize(t))
>>> page.startswith("<!DOCTYPE html>") and "http" not in page.split("<script")[0]
True
"""

from __future__ import annotations

import html
import json
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

from mstx_marks.analysis.aggregate import PhaseSummary, Stats, Summary
from mstx_marks.analysis.colors import OTHER_COLOR, PHASE_COLORS, phase_color
from mstx_marks.analysis.mark_pairs import pair_marks
from mstx_marks.analysis.stages import range_name
from mstx_marks.analysis.steps import StepOptions, find_steps, fold_name
from mstx_marks.analysis.summary_text import cut, run_line
from mstx_marks.analysis.timeline import assign_lanes
from mstx_marks.analysis.top_phases import MAX_PHASES, OtherPhases, top_phases
from mstx_marks.base.diagnostics import counted
from mstx_marks.base.records import InstantRecord, RangeRecord, RankTrace, Record
from mstx_marks.export import atomic_write_bytes

__all__ = [
    "MAX_BARS",
    "MAX_MARKS",
    "MIN_BAR_PX",
    "OTHER_COLOR",
    "PHASE_COLORS",
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


def report_data(
    traces: Sequence[RankTrace],
    summary: Summary,
    steps: StepOptions | None = None,
    max_phases: int | None = MAX_PHASES,
) -> dict[str, Any]:
    """What the page draws, as plain JSON data (times in microseconds from ``origin_ns``);
    ``steps`` says how steps are found (:mod:`mstx_marks.analysis.steps`).

    ``groups`` are the lane groups, one per role and rank (a header lane, then each thread's
    lanes); ``bars`` are ``[lane, start, duration, name, args, open, raw name or 0]`` and
    ``marks`` (instants) ``[lane, time, name, args, raw name or 0]``, ``name`` an index into
    ``names``, ``args`` into ``args`` (-1: none).

    ``phases`` (the table) are each role's ``max_phases`` phases of most time, ``others`` a row
    per role for the rest (:mod:`~mstx_marks.analysis.top_phases`; ``None``: every phase). The
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
    paired = [(t, pair_marks(t.records)) for t in traces]
    every = [(t, r) for t, recs in paired for r in recs if isinstance(r, RangeRecord)]
    left_out = max(0, len(every) - MAX_BARS)
    if left_out:
        every = sorted(every, key=lambda tr: tr[1].end_ns - tr[1].start_ns)[left_out:]
    instants = [(t, r) for t, recs in paired for r in recs if isinstance(r, InstantRecord)]
    instants = instants[:MAX_MARKS]
    times = [r.start_ns for _, r in every] + [r.start_ns for _, r in instants]
    origin = min(times, default=0)
    end = max([r.end_ns for _, r in every] + [r.start_ns for _, r in instants], default=origin)
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
    drawn: list[tuple[RankTrace, Record]] = [*every, *instants]
    for t, r in drawn:
        by_member.setdefault(t.member, {}).setdefault((r.pid, r.thread), []).append(r)
    thread_names = {t.member: t.thread_names for t in traces}
    groups: list[dict[str, Any]] = []
    bars: list[list[Any]] = []
    marks: list[list[Any]] = []
    lane = 0
    for member, threads in sorted(by_member.items()):
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
                    round((r.start_ns - origin) / 1000, 3),
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
                        lane, round((r.start_ns - origin) / 1000, 3),
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
    step_marks = []
    for t in traces:
        for s in find_steps(t, steps):
            step_marks.append([t.rank, round((s.start_ns - origin) / 1000, 3), s.key, t.role])
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
        "phases": phases,
        "unmarked": unmarked,
        "beyond": beyond,
        "left_out": left_out,
        "ranks": sorted({m.rank for m in summary.step_time_ns}),
        "roles": summary.roles,
        "members": [m.label for m in summary.members()],
        "min_bar_px": MIN_BAR_PX,
        "max_phases": max_phases,
    }


_STYLE = """
body{font:13px system-ui,sans-serif;margin:16px;color:#222;background:#fff}
h1{font-size:18px;margin:0 0 8px}h2{font-size:15px;margin:20px 0 6px}
#bar{display:flex;align-items:center;gap:6px;margin:6px 0;flex-wrap:wrap}
#bar button{font:12px system-ui,sans-serif;padding:1px 8px;cursor:pointer}
#view{color:#555;margin-left:8px}
#tl{position:relative;border:1px solid #ccc;user-select:none;overflow-y:auto;max-height:72vh}
#tl canvas{display:block}#axis{position:sticky;top:0;z-index:1;background:#fff}
#lanes{cursor:grab}
#tip{position:fixed;pointer-events:none;background:#fffbe6;border:1px solid #aaa;padding:4px 6px;
font:12px monospace;white-space:pre;display:none;z-index:3;max-width:640px;overflow:hidden}
.legend span{display:inline-block;margin:2px 10px 2px 0}
.legend i{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:middle}
table{border-collapse:collapse}th,td{padding:2px 8px;text-align:right;border-bottom:1px solid #eee}
th{cursor:pointer;background:#f4f4f4;position:sticky;top:0}
th:first-child,td:first-child,th[data-key=name]{text-align:left}
td.name{text-align:left;white-space:nowrap}td.name b{cursor:pointer;color:#555;font-weight:normal}
tr.rank td{color:#666;font-size:12px;background:#fafafa}
tr.unmarked td,tr.other td{font-style:italic}
#imbalance{display:flex;flex-wrap:wrap;gap:12px 28px}.card{width:300px;font-size:12px}
.chart{display:flex;gap:4px;margin:4px 0 0}.yaxis{display:flex;flex-direction:column;
justify-content:space-between;text-align:right;color:#666;font-size:10px;height:60px;min-width:44px}
.imb{position:relative;display:flex;align-items:flex-end;gap:1px;height:60px;flex:1;
border-left:1px solid #999;border-bottom:1px solid #999}
.imb div{background:#4e79a7;min-width:2px;flex:1}.imb div.slow{background:#e15759}
.imb hr{position:absolute;left:0;right:0;margin:0;border:0;border-top:1px dashed #333}
.xaxis{display:flex;justify-content:space-between;color:#666;font-size:10px;margin-left:48px}
.note{color:#666}
"""

_SCRIPT = r"""
(function(){
const D = JSON.parse(document.getElementById('data').textContent);
const color = i => D.colors[i] || D.other_color;  // past the colours: the other phases
const inkOf = c => {  // dark text on light colours, white on dark ones
  const n = parseInt(c.slice(1), 16);
  return 0.299 * (n >> 16) + 0.587 * (n >> 8 & 255) + 0.114 * (n & 255) > 160 ? '#111' : '#fff';
};
const ink = D.colors.map(inkOf), otherInk = inkOf(D.other_color);
const LEFT = 230, AXIS = 26, RIGHT = 12;
const tl = document.getElementById('tl'), tip = document.getElementById('tip');
const ax = document.createElement('canvas'); ax.id = 'axis'; tl.appendChild(ax);
const cv = document.createElement('canvas'); cv.id = 'lanes'; tl.appendChild(cv);
const ctx = cv.getContext('2d'), actx = ax.getContext('2d');
const nLanes = Math.max(D.lanes, 1);
const LANE = Math.max(16, Math.min(30, Math.floor((window.innerHeight * 0.72 - AXIS) / nLanes)));
// per lane: [group index, label or '', track]; bars and marks by lane, by start, for hit tests
const laneInfo = [], byLane = [], marksByLane = [];
D.groups.forEach((g, gi) => {
  laneInfo[g.top] = [gi, g.label, null, true];
  g.tracks.forEach(t => {
    for (let k = 0; k < t.lanes; k++) laneInfo[t.lane + k] = [gi, k === 0 ? t.name : '', t, false];
  });
});
for (let i = 0; i < nLanes; i++) { byLane.push([]); marksByLane.push([]); }
D.bars.forEach(b => byLane[b[0]].push(b));
D.marks.forEach(m => marksByLane[m[0]].push(m));
byLane.forEach(l => l.sort((a, b) => a[1] - b[1]));
marksByLane.forEach(l => l.sort((a, b) => a[1] - b[1]));
const maxDur = byLane.map(l => l.reduce((m, b) => Math.max(m, b[2]), 0));
let v0 = 0, v1 = D.span_us;
const H = nLanes * LANE + 6;
function size() {
  const w = tl.clientWidth, r = window.devicePixelRatio || 1;
  for (const [c, h, x] of [[cv, H, ctx], [ax, AXIS, actx]]) {
    c.width = w * r; c.height = h * r; c.style.width = w + 'px'; c.style.height = h + 'px';
    x.setTransform(r, 0, 0, r, 0, 0);
  }
}
const plotW = () => Math.max(cv.clientWidth - LEFT - RIGHT, 10);
const X = t => LEFT + (t - v0) / (v1 - v0) * plotW();
const T = px => v0 + (px - LEFT) / plotW() * (v1 - v0);
function niceStep(span, n) {
  const raw = span / n, p = Math.pow(10, Math.floor(Math.log10(raw))), f = raw / p;
  return p * (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10);
}
function fmtAt(us, step) {  // a tick label: in the unit of the tick step
  const [unit, per] = step >= 1e6 ? [' s', 1e6] : step >= 1e3 ? [' ms', 1e3] : [' µs', 1];
  return +(us / per).toFixed(Math.max(0, -Math.floor(Math.log10(step / per)))) + unit;
}
function fmtDur(us) {
  if (us >= 1e6) return (us / 1e6).toFixed(3) + ' s';
  if (us >= 1e3) return (us / 1e3).toFixed(3) + ' ms';
  if (us >= 1) return us.toFixed(3) + ' µs';
  return Math.round(us * 1e3) + ' ns';
}
function ticks() {
  const step = niceStep(v1 - v0, Math.max(2, plotW() / 110)), out = [];
  for (let t = Math.ceil(v0 / step) * step; t <= v1; t += step) out.push(t);
  return [out, step];
}
function drawAxis(tk, step) {
  const W = ax.clientWidth;
  actx.clearRect(0, 0, W, AXIS); actx.fillStyle = '#fff'; actx.fillRect(0, 0, W, AXIS);
  actx.font = '11px sans-serif'; actx.textBaseline = 'middle'; actx.fillStyle = '#444';
  actx.fillText('time since first event', 6, AXIS / 2);
  actx.strokeStyle = '#888'; actx.beginPath(); actx.moveTo(LEFT, AXIS - 0.5);
  actx.lineTo(W - RIGHT, AXIS - 0.5); actx.stroke();
  actx.textAlign = 'center';
  for (const t of tk) {
    const x = Math.round(X(t)) + 0.5;
    actx.beginPath(); actx.moveTo(x, AXIS - 6); actx.lineTo(x, AXIS); actx.stroke();
    actx.fillText(fmtAt(t, step), Math.min(Math.max(x, LEFT + 20), W - 30), AXIS / 2 - 2);
  }
  actx.textAlign = 'left';
}
function draw() {
  const W = cv.clientWidth;
  const [tk, step] = ticks();
  drawAxis(tk, step);
  ctx.clearRect(0, 0, W, H);
  ctx.font = '11px sans-serif'; ctx.textBaseline = 'middle';
  D.groups.forEach((g, gi) => {  // bands: every other group tinted, header lane darker
    ctx.fillStyle = gi % 2 ? '#f7f9fc' : '#fff';
    ctx.fillRect(0, g.top * LANE, W, g.lanes * LANE);
    ctx.fillStyle = '#eef1f6'; ctx.fillRect(0, g.top * LANE, W, LANE);
    ctx.strokeStyle = '#c9ced8'; ctx.beginPath(); ctx.moveTo(0, g.top * LANE + 0.5);
    ctx.lineTo(W, g.top * LANE + 0.5); ctx.stroke();
  });
  ctx.strokeStyle = '#e3e3e3';
  for (const t of tk) {
    const x = Math.round(X(t)) + 0.5;
    ctx.beginPath(); ctx.moveTo(x, 0); ctx.lineTo(x, H); ctx.stroke();
  }
  for (let i = 0; i < nLanes; i++) {
    const info = laneInfo[i];
    if (!info || !info[1]) continue;
    ctx.fillStyle = info[3] ? '#111' : '#555';
    ctx.font = info[3] ? 'bold 12px sans-serif' : '11px sans-serif';
    ctx.fillText(clip(info[1], LEFT - 14, ctx), info[3] ? 6 : 16, i * LANE + LANE / 2);
  }
  ctx.font = '11px sans-serif';
  ctx.save(); ctx.beginPath(); ctx.rect(LEFT, 0, W - LEFT, H); ctx.clip();
  let drawn = 0, shown = 0;
  const minPx = D.min_bar_px;
  for (const b of D.bars) {
    const s = b[1], e = b[1] + b[2];
    if (e < v0 || s > v1) continue;
    const x = X(s), w = Math.max(X(e) - x, minPx), y = b[0] * LANE + 1;
    ctx.fillStyle = color(b[3]);
    ctx.fillRect(x, y, w, LANE - 3);
    if (b[5]) { ctx.strokeStyle = '#111'; ctx.setLineDash([3, 2]);
      ctx.strokeRect(x, y, w, LANE - 3); ctx.setLineDash([]); }
    if (w > 36) { ctx.fillStyle = ink[b[3]] || otherInk;
      const label = clip(b[6] || D.names[b[3]], w - 6, ctx);
      ctx.fillText(label, Math.max(x, LEFT) + 3, y + LANE / 2 - 1); }
    drawn++;
  }
  for (const m of D.marks) {
    if (m[1] < v0 || m[1] > v1) continue;
    const x = X(m[1]), y = m[0] * LANE + 1;
    ctx.fillStyle = color(m[2]); ctx.strokeStyle = '#111';
    ctx.beginPath(); ctx.moveTo(x - 5, y); ctx.lineTo(x + 5, y); ctx.lineTo(x, y + 8);
    ctx.closePath();
    ctx.fill(); ctx.stroke();
    ctx.beginPath(); ctx.moveTo(x + 0.5, y + 8); ctx.lineTo(x + 0.5, y + LANE - 2); ctx.stroke();
    shown++;
  }
  ctx.setLineDash([4, 3]); ctx.strokeStyle = '#333';
  for (const st of D.steps) {
    if (st[1] < v0 || st[1] > v1) continue;
    const g = D.groups.find(g => g.rank === st[0] && g.role === st[3]);
    if (!g) continue;
    const x = X(st[1]);
    ctx.beginPath(); ctx.moveTo(x, g.top * LANE + 2); ctx.lineTo(x, (g.top + g.lanes) * LANE);
    ctx.stroke(); ctx.fillStyle = '#333';
    ctx.fillText('step ' + st[2], x + 3, g.top * LANE + LANE / 2);
  }
  ctx.restore(); ctx.setLineDash([]);
  document.getElementById('view').textContent = 'showing ' + fmtDur(v0) + ' … ' + fmtDur(v1) +
    ' (' + fmtDur(v1 - v0) + ' wide)';
  document.body.setAttribute('data-drawn', String(drawn));
  document.body.setAttribute('data-marks', String(shown));
}
function clip(text, px, c) {
  if (c.measureText(text).width <= px) return text;
  let n = Math.max(0, Math.floor(px / 6));
  while (n > 0 && c.measureText(text.slice(0, n) + '…').width > px) n--;
  return n ? text.slice(0, n) + '…' : '';
}
function zoom(f, at) {
  const t = at === undefined ? (v0 + v1) / 2 : at;
  const span = Math.min(Math.max((v1 - v0) * f, 0.001), D.span_us * 1.2);
  v0 = t - (t - v0) / (v1 - v0) * span; v1 = v0 + span; draw();
}
cv.addEventListener('wheel', ev => {
  const rect = cv.getBoundingClientRect(), px = ev.clientX - rect.left;
  if (px < LEFT) return;  // over the labels the wheel scrolls the lanes
  ev.preventDefault();
  if (Math.abs(ev.deltaX) > Math.abs(ev.deltaY)) {  // a sideways wheel pans
    const dt = ev.deltaX / plotW() * (v1 - v0); v0 += dt; v1 += dt; draw(); return;
  }
  zoom(Math.exp(ev.deltaY * 0.002), T(px));
}, {passive: false});
document.getElementById('zin').onclick = () => zoom(0.5);
document.getElementById('zout').onclick = () => zoom(2);
document.getElementById('zreset').onclick = () => { v0 = 0; v1 = D.span_us; draw(); };
let drag = null;
cv.addEventListener('mousedown', ev => {
  drag = [ev.clientX, v0, v1]; cv.style.cursor = 'grabbing';
});
window.addEventListener('mouseup', () => { drag = null; cv.style.cursor = 'grab'; });
cv.addEventListener('dblclick', () => { v0 = 0; v1 = D.span_us; draw(); });
cv.addEventListener('mousemove', ev => {
  const rect = cv.getBoundingClientRect(), px = ev.clientX - rect.left, py = ev.clientY - rect.top;
  if (drag) {
    const dt = (ev.clientX - drag[0]) / plotW() * (drag[2] - drag[1]);
    v0 = drag[1] - dt; v1 = drag[2] - dt; draw(); return;
  }
  const lane = Math.floor(py / LANE);
  const info = lane >= 0 && lane < nLanes ? laneInfo[lane] : null;
  if (!info || px < LEFT) { tip.style.display = 'none'; return; }
  const g = D.groups[info[0]], track = info[2] || laneTrack(lane);
  const where = g.label +
    (track ? ', ' + track.name + ' (tid ' + track.tid + ', pid ' + track.pid + ')' : '');
  let text = null;
  const m = findMark(lane, px);
  if (m) {
    text = 'instant ' + (m[4] || D.names[m[2]]) + '\n' + where + '\nat ' + fmtDur(m[1]);
    if (m[3] >= 0) text += argText(m[3]);
  } else {
    const hit = find(lane, px);
    if (hit) {
      text = (hit[6] || D.names[hit[3]]) + '\n' + where + '\n' + fmtDur(hit[2]) +
        ' (from ' + fmtDur(hit[1]) + ')';
      if (hit[4] >= 0) text += argText(hit[4]);
      if (hit[5]) text += '\nopen: still running when read';
    }
  }
  if (!text) { tip.style.display = 'none'; return; }
  tip.textContent = text; tip.style.display = 'block';
  const tw = tip.offsetWidth;
  tip.style.left = Math.min(ev.clientX + 12, window.innerWidth - tw - 8) + 'px';
  tip.style.top = (ev.clientY + 14) + 'px';
});
cv.addEventListener('mouseleave', () => { tip.style.display = 'none'; });
function laneTrack(lane) {
  for (let i = lane; i >= 0; i--) if (laneInfo[i] && laneInfo[i][2]) return laneInfo[i][2];
  return null;
}
function argText(i) {
  let a; try { a = JSON.parse(D.args[i]); } catch (e) { return '\nargs ' + D.args[i]; }
  return '\n' + Object.keys(a).map(k => '  ' + k + ': ' + JSON.stringify(a[k])).join('\n');
}
function find(lane, px) {
  const bars = byLane[lane], per = (v1 - v0) / plotW(), slack = per * 2;
  const t = T(px), minDur = per * D.min_bar_px;
  let lo = 0, hi = bars.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (bars[mid][1] <= t + slack) lo = mid + 1; else hi = mid;
  }
  for (let i = lo - 1; i >= 0; i--) {
    const b = bars[i];
    if (b[1] + Math.max(b[2], minDur) + slack >= t) return b;
    if (b[1] + Math.max(maxDur[lane], minDur) + slack < t) break;
  }
  return null;
}
function findMark(lane, px) {
  let best = null, dist = 6;
  for (const m of marksByLane[lane]) {
    const d = Math.abs(X(m[1]) - px);
    if (d < dist) { dist = d; best = m; }
  }
  return best;
}
// legend
const legend = document.getElementById('legend');
const entries = D.colors.map((c, i) => [D.names[i], c]);
if (D.folded) entries.push(['(' + D.folded.toLocaleString('en') + ' other phases)', D.other_color]);
entries.forEach(([n, col]) => {
  const s = document.createElement('span'), c = document.createElement('i');
  c.style.background = col; s.appendChild(c); s.appendChild(document.createTextNode(n));
  legend.appendChild(s);
});
// phase table: per phase, its row across ranks and one row per rank (click the phase to fold)
const manyRoles = D.roles.some(r => r);
const cols = [...(manyRoles ? [['role', 'role']] : []), ['name', 'phase'], ['rank', 'rank'],
  ['count', 'count'], ['total', 'total ms'], ['mean', 'mean ms'], ['p50', 'p50 ms'],
  ['p90', 'p90 ms'], ['max', 'max ms'], ['share', 'step % (incl.)'], ['self', 'self ms'],
  ['self_share', 'self %'], ['imbalance', 'imbalance'], ['slowest', 'slowest rank']];
const table = document.getElementById('phases');
const head = table.createTHead().insertRow(), body = table.createTBody();
let order = [null, 1];
const open = new Set();
D.phases.forEach((p, i) => { if (p.per_rank.length <= 4) open.add(i); });
cols.forEach(([k, label]) => {
  const th = document.createElement('th'); th.textContent = label; th.dataset.key = k;
  th.addEventListener('click', () => { order = [k, order[0] === k ? -order[1] : -1]; rows(); });
  head.appendChild(th);
});
function cell(tr, k, v, p) {
  const td = tr.insertCell();
  if (v === null || v === undefined) v = '-';
  else if (typeof v !== 'number') v = String(v);
  else if (k === 'imbalance') v = v.toFixed(2) + 'x';
  else if (k === 'share' || k === 'self_share') v = v.toFixed(1);
  else if (k !== 'count' && k !== 'slowest' && k !== 'rank') v = v.toFixed(3);
  if (p && (k === 'p50' || k === 'p90') && p.err) v += ' ~';
  td.textContent = v;
  return td;
}
function rows() {
  const list = D.phases.map((p, i) => [p, i]);
  // PyTorch's and HCCL's own annotations after the user's phases
  if (!order[0]) list.sort(([a], [b]) => (a.automatic ? 1 : 0) - (b.automatic ? 1 : 0));
  if (order[0]) list.sort(([a], [b]) => {
    const x = a[order[0]], y = b[order[0]];
    if (x === y) return 0; if (x === null || x === undefined) return 1;
    if (y === null || y === undefined) return -1;
    return (x < y ? -1 : 1) * order[1];
  });
  body.textContent = '';
  for (const [p, i] of list) {
    const tr = body.insertRow();
    for (const [k] of cols) {
      if (k === 'name') {
        const td = tr.insertCell(); td.className = 'name';
        const t = document.createElement('b'); t.textContent = open.has(i) ? '▾ ' : '▸ ';
        td.appendChild(t);
        td.appendChild(document.createTextNode(p.automatic ? p.name + ' (automatic)' : p.name));
        td.title = p.is_step ? 'the steps: the 100 % the shares are of'
          : p.automatic ? 'an annotation PyTorch or HCCL makes by itself: not in the shares'
            + ' or self times; click: per-rank rows' : 'click: per-rank rows';
        td.addEventListener('click', () => { open.has(i) ? open.delete(i) : open.add(i); rows(); });
      } else if (k === 'rank') cell(tr, k, 'all');
      else cell(tr, k, p[k], p);
    }
    if (!open.has(i)) continue;
    for (const r of p.per_rank) {
      const rt = body.insertRow(); rt.className = 'rank';
      for (const [k] of cols) {
        if (k === 'role' || k === 'name' || k === 'imbalance' || k === 'slowest') cell(rt, k, '');
        else cell(rt, k, r[k]);
      }
    }
  }
  for (const o of D.others) {  // the phases past the cut, summed: after the others shown
    const tr = body.insertRow(); tr.className = 'other';
    for (const [k] of cols) cell(tr, k, k === 'rank' ? 'all' : o[k] === undefined ? '' : o[k]);
    const label = tr.cells[manyRoles ? 1 : 0]; label.className = 'name';
    label.title = o.phases + ' phases beyond the ' + D.max_phases +
      ' of most total time, summed (the JSON and CSV hold every one)';
  }
  for (const u of D.unmarked) {
    const tr = body.insertRow(); tr.className = 'unmarked';
    const vals = {role: u.role, name: '(unmarked)', rank: 'all', total: u.total, share: u.share,
      self: u.total, self_share: u.share};
    for (const [k] of cols) cell(tr, k, vals[k] === undefined ? '' : vals[k]);
    const label = tr.cells[manyRoles ? 1 : 0];
    label.title = 'step time no phase covers'; label.className = 'name';
  }
}
rows();
// imbalance: per role and phase run on several ranks, each rank's total on one scale
const imb = document.getElementById('imbalance');
const several = D.phases.filter(p => p.ranks.length > 1);
if (!several.length) {
  document.getElementById('imbhead').textContent = 'Rank imbalance';
  const n = document.createElement('p'); n.className = 'note';
  n.textContent = 'Every role ran on one rank here: no imbalance to show.';
  imb.appendChild(n);
}
for (const p of several) {
  const card = document.createElement('div'); card.className = 'card';
  const h = document.createElement('div');
  const ratio = p.imbalance === null ? '-' : p.imbalance.toFixed(2) + 'x';
  const totals = p.ranks.map(r => r[1]);
  const fastest = p.ranks[totals.indexOf(Math.min(...totals))];
  h.textContent = (p.role ? p.role + ' ' : '') + p.name + ': slowest rank ' + p.slowest +
    ' (' + ratio + ' the fastest, rank ' + fastest[0] + ')';
  card.appendChild(h);
  const chart = document.createElement('div'); chart.className = 'chart';
  const top = Math.max(...totals, 1e-9);
  const y = document.createElement('div'); y.className = 'yaxis';
  for (const v of [top, top / 2, 0]) {
    const l = document.createElement('span');
    l.textContent = v.toPrecision(3) + ' ms'; y.appendChild(l);
  }
  chart.appendChild(y);
  const box = document.createElement('div'); box.className = 'imb';
  for (const [rank, total] of p.ranks) {
    const b = document.createElement('div');
    b.style.height = Math.max(1, 100 * total / top) + '%';
    b.title = 'rank ' + rank + ': ' + total.toFixed(3) + ' ms';
    if (rank === p.slowest) b.className = 'slow';
    box.appendChild(b);
  }
  const mean = totals.reduce((a, b) => a + b, 0) / totals.length;
  const line = document.createElement('hr'); line.style.bottom = (100 * mean / top) + '%';
  line.title = 'mean ' + mean.toFixed(3) + ' ms'; box.appendChild(line);
  chart.appendChild(box); card.appendChild(chart);
  const x = document.createElement('div'); x.className = 'xaxis';
  const last = p.ranks[p.ranks.length - 1][0];
  for (const t of ['rank ' + p.ranks[0][0], 'dashed: mean', 'rank ' + last]) {
    const l = document.createElement('span'); l.textContent = t; x.appendChild(l);
  }
  card.appendChild(x);
  imb.appendChild(card);
}
size(); draw();
window.addEventListener('resize', () => { size(); draw(); });
document.body.setAttribute('data-rendered', 'ok');
})();
"""

_CATCH = (
    "window.addEventListener('error',e=>{document.documentElement.setAttribute("
    "'data-errors',(document.documentElement.getAttribute('data-errors')||'')+e.message+';')});"
)


def render_html(
    traces: Sequence[RankTrace],
    summary: Summary,
    steps: StepOptions | None = None,
    title: str = "mstx_marks report",
    max_phases: int | None = MAX_PHASES,
) -> str:
    """The page for ``traces`` and their ``summary``, as one string (``max_phases``: as
    :func:`report_data` says)."""
    data = report_data(traces, summary, steps, max_phases)
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
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style>"
        f"<script>{_CATCH}</script></head><body>"
        f"<h1>{html.escape(title)}</h1>"
        f"<p>{runs}{who}, {len(data['bars'])} ranges and {len(data['marks'])} instants drawn.</p>"
        f"{note}<div class='legend' id='legend'></div>"
        "<div id='bar'><button id='zin' title='zoom in'>+</button>"
        "<button id='zout' title='zoom out'>&minus;</button>"
        "<button id='zreset' title='the whole run'>reset</button><span id='view'></span>"
        "<span class='note'>wheel: zoom, drag: pan, double-click: reset; hover for details"
        "</span></div><div id='tl'></div><div id='tip'></div>"
        f"<h2>Phases</h2>{err_note}<table id='phases'></table>{shares}"
        "<h2 id='imbhead'>Rank imbalance (per role, total time per rank; red: the slowest)</h2>"
        "<div id='imbalance'></div>"
        f"<script type='application/json' id='data'>{payload}</script>"
        f"<script>{_SCRIPT}</script></body></html>\n"
    )


def write_html_report(
    path: str | Path,
    traces: Sequence[RankTrace],
    summary: Summary,
    steps: StepOptions | None = None,
    *,
    max_phases: int | None = MAX_PHASES,
) -> Path:
    """Write :func:`render_html` to ``path`` atomically and return the path."""
    page = render_html(traces, summary, steps, max_phases=max_phases)
    return atomic_write_bytes(path, page.encode())
