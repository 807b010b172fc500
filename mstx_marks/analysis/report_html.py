"""``summary DIR --html report.html``: one self-contained page to look at a run.

The page needs no network and loads no file: the data, the script and the style are inline. It
holds:

- **the timeline**: a lane per role and rank (one row group per process, by role, then rank,
  a track per thread, nested ranges one lane below what contains them, overlapping ones on lanes
  of their own, as in :mod:`mstx_marks.analysis.timeline`), drawn on a canvas; the wheel zooms
  about the pointer, dragging pans, double-click resets. A bar is at least :data:`MIN_BAR_PX`
  wide, so a phase far shorter than a pixel still shows. Steps are dashed lines labelled with
  their key. Hovering a bar shows its name, role, rank, thread, duration and its ``args``.
  Beyond :data:`MAX_BARS` ranges only the longest are drawn (the page says how many were left
  out; the table still counts them all).
- **the per-phase table** (click a heading to sort by it);
- **rank imbalance**: per role and phase, each rank's total as a bar, the slowest rank named
  with its total over the fastest's, like msprof-analyze's slow-rank view. Roles are never
  mixed: the trainer, the FSDP workers and the rollout engine of one GPU all say rank 0.

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
from pathlib import Path
from typing import Any, Sequence

from mstx_marks.analysis.aggregate import Summary
from mstx_marks.analysis.mark_pairs import pair_marks
from mstx_marks.analysis.steps import StepOptions, find_steps, fold_name
from mstx_marks.analysis.timeline import assign_lanes
from mstx_marks.base.records import RangeRecord, RankTrace
from mstx_marks.export import atomic_write_bytes

__all__ = ["MAX_BARS", "MIN_BAR_PX", "render_html", "report_data", "write_html_report"]

#: The narrowest bar, in CSS pixels.
MIN_BAR_PX = 1
#: At most this many ranges are drawn (the longest).
MAX_BARS = 200_000


def _ms(ns: float) -> float:
    return round(ns / 1e6, 6)


def report_data(
    traces: Sequence[RankTrace], summary: Summary, steps: StepOptions | None = None
) -> dict[str, Any]:
    """What the page draws, as plain JSON data (times in microseconds from ``origin_ns``);
    ``steps`` says how steps are found (:mod:`mstx_marks.analysis.steps`)."""
    traces = sorted(traces, key=lambda t: t.member)
    every = [(t, r) for t in traces for r in pair_marks(t.records) if isinstance(r, RangeRecord)]
    left_out = max(0, len(every) - MAX_BARS)
    if left_out:
        every = sorted(every, key=lambda tr: tr[1].end_ns - tr[1].start_ns)[left_out:]
    origin = min((r.start_ns for _, r in every), default=0)
    end = max((r.end_ns for _, r in every), default=origin)
    names: dict[str, int] = {}
    args: dict[str, int] = {}
    groups: list[dict[str, Any]] = []
    bars: list[list[Any]] = []
    by_process: dict[tuple[str, int, int], list[RangeRecord]] = {}
    for t, r in every:
        by_process.setdefault((t.role, t.rank, r.pid), []).append(r)
    lane = 0
    for (role, rank, pid), ranges in sorted(by_process.items()):
        lane += 1  # an empty lane above each process: its step labels go there
        by_thread: dict[int, list[RangeRecord]] = {}
        for r in ranges:
            by_thread.setdefault(r.thread, []).append(r)
        threads = []
        for tid, rs in sorted(by_thread.items()):
            placed = assign_lanes(rs)
            depth = 1 + max(d for _, d in placed)
            threads.append({"tid": tid, "lane": lane, "lanes": depth})
            for r, d in placed:
                name = fold_name(r.name)
                a = -1
                if r.args:
                    text = json.dumps(dict(r.args), default=str, sort_keys=True)
                    a = args.setdefault(text, len(args))
                bars.append([
                    lane + d,
                    round((r.start_ns - origin) / 1000, 3),
                    round((r.end_ns - r.start_ns) / 1000, 3),
                    names.setdefault(name, len(names)),
                    a,
                    1 if r.open else 0,
                    r.name if r.name != name else 0,
                ])  # fmt: skip
            lane += depth
        groups.append({"rank": rank, "pid": pid, "role": role, "threads": threads})
    step_marks = []
    for t in traces:
        for s in find_steps(t, steps):
            step_marks.append([t.rank, round((s.start_ns - origin) / 1000, 3), s.key, t.role])
    phases = []
    for p in summary.phases:
        o = p.overall
        phases.append({
            "role": p.role, "name": p.name, "count": o.count, "total": _ms(o.total_ns),
            "mean": _ms(o.mean_ns),
            "p50": _ms(o.p50_ns), "p90": _ms(o.p90_ns), "max": _ms(o.max_ns),
            "share": None if o.step_share is None else round(100 * o.step_share, 2),
            "err": o.percentile_error, "imbalance": p.imbalance, "slowest": p.slowest_rank,
            "ranks": [[rank, _ms(s.total_ns)] for rank, s in p.per_rank.items()],
        })  # fmt: skip
    return {
        "origin_ns": origin,
        "span_us": max(round((end - origin) / 1000, 3), 0.001),
        "lanes": lane,
        "groups": groups,
        "bars": bars,
        "names": list(names),
        "args": list(args),
        "steps": step_marks,
        "phases": phases,
        "left_out": left_out,
        "ranks": sorted({m.rank for m in summary.step_time_ns}),
        "roles": summary.roles,
        "members": [m.label for m in summary.members()],
        "min_bar_px": MIN_BAR_PX,
    }


_STYLE = """
body{font:13px system-ui,sans-serif;margin:16px;color:#222;background:#fff}
h1{font-size:18px;margin:0 0 8px}h2{font-size:15px;margin:20px 0 6px}
#tl{position:relative;border:1px solid #ccc;user-select:none}
#tl canvas{display:block;cursor:grab}
#tip{position:fixed;pointer-events:none;background:#fffbe6;border:1px solid #aaa;padding:4px 6px;
font:12px monospace;white-space:pre;display:none;z-index:2;max-width:600px}
.legend span{display:inline-block;margin:2px 10px 2px 0}
.legend i{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:middle}
table{border-collapse:collapse}th,td{padding:2px 8px;text-align:right;border-bottom:1px solid #eee}
th{cursor:pointer;background:#f4f4f4;position:sticky;top:0}
th:first-child,td:first-child{text-align:left}
#imbalance{display:flex;flex-wrap:wrap;gap:8px 24px}.card{width:280px;font-size:12px}
.imb{display:flex;align-items:flex-end;gap:1px;height:40px;margin:2px 0 6px;
border-bottom:1px solid #999}
.imb div{background:#4e79a7;min-width:3px;flex:1;max-width:24px}.imb div.slow{background:#e15759}
.note{color:#666}
"""

_SCRIPT = r"""
(function(){
const D = JSON.parse(document.getElementById('data').textContent);
const PAL = ['#4e79a7','#f28e2b','#59a14f','#e15759','#76b7b2','#edc948','#b07aa1','#ff9da7',
  '#9c755f','#bab0ac','#1f77b4','#d62728'];
const color = i => i < PAL.length ? PAL[i] : 'hsl(' + ((i * 137) % 360) + ',55%,55%)';
const LANE = 14, LEFT = 190, TOP = 18;
const tl = document.getElementById('tl'), tip = document.getElementById('tip');
const cv = document.createElement('canvas'); tl.appendChild(cv);
const ctx = cv.getContext('2d');
// lane -> [label, group index]; bars by lane, sorted by start, for hit tests
const laneInfo = [], byLane = [];
const groupTop = [];
D.groups.forEach((g, gi) => {
  g.threads.forEach((t, ti) => {
    for (let k = 0; k < t.lanes; k++) {
      const who = (g.role ? g.role + ' ' : '') + 'rank ' + g.rank + ' pid ' + g.pid;
      laneInfo[t.lane + k] = [k === 0 ? (ti === 0 ? who : '') + ' thread ' + t.tid : '', gi, t.tid];
    }
  });
  groupTop.push(g.threads.length ? g.threads[0].lane : 0);
});
for (let i = 0; i < D.lanes; i++) byLane.push([]);
D.bars.forEach(b => byLane[b[0]].push(b));
byLane.forEach(l => l.sort((a, b) => a[1] - b[1]));
const maxDur = byLane.map(l => l.reduce((m, b) => Math.max(m, b[2]), 0));
let v0 = 0, v1 = D.span_us;
const H = TOP + Math.max(D.lanes, 1) * LANE + 24;
function size() {
  const w = tl.clientWidth, r = window.devicePixelRatio || 1;
  cv.width = w * r; cv.height = H * r; cv.style.width = w + 'px'; cv.style.height = H + 'px';
  ctx.setTransform(r, 0, 0, r, 0, 0);
}
const X = t => LEFT + (t - v0) / (v1 - v0) * (cv.clientWidth - LEFT - 10);
function draw() {
  const W = cv.clientWidth;
  ctx.clearRect(0, 0, W, H);
  ctx.font = '11px sans-serif'; ctx.textBaseline = 'middle';
  let drawn = 0;
  for (let i = 0; i < D.lanes; i++) {
    const y = TOP + i * LANE;
    if (laneInfo[i] && laneInfo[i][0]) {
      ctx.fillStyle = '#444'; ctx.fillText(laneInfo[i][0].slice(0, 32), 4, y + LANE / 2);
    }
  }
  ctx.save(); ctx.beginPath(); ctx.rect(LEFT, 0, W - LEFT, H); ctx.clip();
  for (const b of D.bars) {
    const s = b[1], e = b[1] + b[2];
    if (e < v0 || s > v1) continue;
    const x = X(s), w = Math.max(X(e) - x, D.min_bar_px);
    ctx.fillStyle = color(b[3]);
    ctx.fillRect(x, TOP + b[0] * LANE, w, LANE - 2);
    if (b[5]) { ctx.strokeStyle = '#111'; ctx.setLineDash([3, 2]);
      ctx.strokeRect(x, TOP + b[0] * LANE, w, LANE - 2); ctx.setLineDash([]); }
    if (w > 40) { ctx.fillStyle = '#fff';
      ctx.fillText(D.names[b[3]].slice(0, Math.floor(w / 6)), x + 2,
        TOP + b[0] * LANE + LANE / 2 - 1); }
    drawn++;
  }
  ctx.setLineDash([4, 3]); ctx.strokeStyle = '#333';
  for (const st of D.steps) {
    if (st[1] < v0 || st[1] > v1) continue;
    const x = X(st[1]);
    const lanes = D.groups.filter(g => g.rank === st[0] && g.role === st[3])
      .flatMap(g => g.threads);
    if (!lanes.length) continue;
    const y0 = TOP + lanes[0].lane * LANE, last = lanes[lanes.length - 1];
    const y1 = TOP + (last.lane + last.lanes) * LANE;
    ctx.beginPath(); ctx.moveTo(x, y0 - 4); ctx.lineTo(x, y1); ctx.stroke();
    ctx.fillStyle = '#333'; ctx.fillText('step ' + st[2], x + 2, y0 - 8);
  }
  ctx.restore(); ctx.setLineDash([]);
  ctx.fillStyle = '#666';
  ctx.fillText(fmt(v0) + ' … ' + fmt(v1) + '  (wheel: zoom, drag: pan, double-click: reset)',
    LEFT, H - 10);
  document.body.setAttribute('data-drawn', String(drawn));
}
function fmt(us) {
  return us >= 1e6 ? (us / 1e6).toFixed(3) + ' s' : (us / 1e3).toFixed(3) + ' ms';
}
cv.addEventListener('wheel', ev => {
  ev.preventDefault();
  const rect = cv.getBoundingClientRect(), px = ev.clientX - rect.left;
  if (px < LEFT) return;
  const t = v0 + (px - LEFT) / (cv.clientWidth - LEFT - 10) * (v1 - v0);
  const f = Math.exp(ev.deltaY * 0.002);
  const span = Math.max((v1 - v0) * f, 0.001);
  v0 = t - (t - v0) / (v1 - v0) * span; v1 = v0 + span; draw();
}, {passive: false});
let drag = null;
cv.addEventListener('mousedown', ev => {
  drag = [ev.clientX, v0, v1]; cv.style.cursor = 'grabbing';
});
window.addEventListener('mouseup', () => { drag = null; cv.style.cursor = 'grab'; });
cv.addEventListener('dblclick', () => { v0 = 0; v1 = D.span_us; draw(); });
cv.addEventListener('mousemove', ev => {
  const rect = cv.getBoundingClientRect(), px = ev.clientX - rect.left, py = ev.clientY - rect.top;
  if (drag) {
    const dt = (ev.clientX - drag[0]) / (cv.clientWidth - LEFT - 10) * (drag[2] - drag[1]);
    v0 = drag[1] - dt; v1 = drag[2] - dt; draw(); return;
  }
  const lane = Math.floor((py - TOP) / LANE);
  const hit = lane >= 0 && lane < D.lanes ? find(lane, px) : null;
  if (!hit) { tip.style.display = 'none'; return; }
  const g = D.groups[laneInfo[lane][1]];
  let text = (hit[6] || D.names[hit[3]]) + '\n' + (g.role ? g.role + ' ' : '') + 'rank ' + g.rank +
    ', pid ' + g.pid + ', thread ' + laneInfo[lane][2] + '\n' + (hit[2] / 1e3).toFixed(3) + ' ms';
  if (hit[4] >= 0) text += '\nargs ' + D.args[hit[4]];
  if (hit[5]) text += '\nopen: still running when read';
  tip.textContent = text; tip.style.display = 'block';
  tip.style.left = (ev.clientX + 12) + 'px'; tip.style.top = (ev.clientY + 12) + 'px';
});
cv.addEventListener('mouseleave', () => { tip.style.display = 'none'; });
function find(lane, px) {
  const bars = byLane[lane], slack = (v1 - v0) / (cv.clientWidth - LEFT - 10) * 2;
  const t = v0 + (px - LEFT) / (cv.clientWidth - LEFT - 10) * (v1 - v0);
  let lo = 0, hi = bars.length;
  while (lo < hi) {
    const m = (lo + hi) >> 1;
    if (bars[m][1] <= t + slack) lo = m + 1; else hi = m;
  }
  for (let i = lo - 1; i >= 0; i--) {
    const b = bars[i];
    if (b[1] + b[2] + slack >= t) return b;
    if (b[1] + maxDur[lane] + slack < t) break;
  }
  return null;
}
// legend
const legend = document.getElementById('legend');
D.names.forEach((n, i) => {
  const s = document.createElement('span'), c = document.createElement('i');
  c.style.background = color(i); s.appendChild(c); s.appendChild(document.createTextNode(n));
  legend.appendChild(s);
});
// phase table
const cols = [...(D.roles.some(r => r) ? [['role', 'role']] : []), ['name', 'phase'],
  ['count', 'count'], ['total', 'total ms'], ['mean', 'mean ms'],
  ['p50', 'p50 ms'], ['p90', 'p90 ms'], ['max', 'max ms'], ['share', 'step %'],
  ['imbalance', 'imbalance'], ['slowest', 'slowest rank']];
const table = document.getElementById('phases');
const head = table.createTHead().insertRow(), body = table.createTBody();
let order = [null, 1];
cols.forEach(([k, label]) => {
  const th = document.createElement('th'); th.textContent = label; th.dataset.key = k;
  th.addEventListener('click', () => { order = [k, order[0] === k ? -order[1] : -1]; rows(); });
  head.appendChild(th);
});
function rows() {
  const list = D.phases.slice();
  if (order[0]) list.sort((a, b) => {
    const x = a[order[0]], y = b[order[0]];
    if (x === y) return 0; if (x === null) return 1; if (y === null) return -1;
    return (x < y ? -1 : 1) * order[1];
  });
  body.textContent = '';
  for (const p of list) {
    const tr = body.insertRow();
    cols.forEach(([k]) => {
      const td = tr.insertCell(); let v = p[k];
      if (v === null || v === undefined) v = '-';
      else if (k === 'imbalance') v = v.toFixed(2);
      else if (typeof v === 'number' && k !== 'count' && k !== 'slowest') v = v.toFixed(3);
      if ((k === 'p50' || k === 'p90') && p.err) v += ' ~';
      td.textContent = v;
    });
  }
}
rows();
// imbalance
const imb = document.getElementById('imbalance');
for (const p of D.phases) {
  const card = document.createElement('div'); card.className = 'card';
  const h = document.createElement('div');
  const ratio = p.imbalance === null ? '-' : p.imbalance.toFixed(2) + 'x';
  h.textContent = (p.role ? p.role + ' ' : '') + p.name + ': slowest rank ' + p.slowest +
    ' (' + ratio + ' the fastest)';
  card.appendChild(h);
  const box = document.createElement('div'); box.className = 'imb';
  const top = Math.max(...p.ranks.map(r => r[1]), 1e-9);
  for (const [rank, total] of p.ranks) {
    const b = document.createElement('div');
    b.style.height = Math.max(2, 100 * total / top) + '%';
    b.title = 'rank ' + rank + ': ' + total.toFixed(3) + ' ms';
    if (rank === p.slowest) b.className = 'slow';
    box.appendChild(b);
  }
  card.appendChild(box);
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
) -> str:
    """The page for ``traces`` and their ``summary``, as one string."""
    data = report_data(traces, summary, steps)
    payload = json.dumps(data, default=str, separators=(",", ":")).replace("</", "<\\/")
    left = data["left_out"]
    note = (
        f"<p class='note'>{left} of the shortest ranges are not drawn (the table counts them).</p>"
        if left
        else ""
    )
    sketch = any(p["err"] for p in data["phases"])
    err_note = (
        "<p class='note'>~: the p50/p90 across ranks are within 0.5% (merged sketches).</p>"
        if sketch
        else ""
    )
    ranks, roles = data["ranks"], [r for r in data["roles"] if r]
    who = f"{len(ranks)} rank(s)"
    if roles:  # roles first: several roles may share one rank
        who = (
            f"{len(data['members'])} processes in {len(roles)} roles ("
            + ", ".join(html.escape(r) for r in roles)
            + f") on {who}"
        )
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style>"
        f"<script>{_CATCH}</script></head><body>"
        f"<h1>{html.escape(title)}</h1>"
        f"<p>{who}, {len(data['bars'])} ranges drawn.</p>{note}"
        "<div class='legend' id='legend'></div><div id='tl'></div><div id='tip'></div>"
        f"<h2>Phases</h2>{err_note}<table id='phases'></table>"
        "<h2>Rank imbalance (per role, total time per rank; red: the slowest)</h2>"
        "<div id='imbalance'></div>"
        f"<script type='application/json' id='data'>{payload}</script>"
        f"<script>{_SCRIPT}</script></body></html>\n"
    )


def write_html_report(
    path: str | Path,
    traces: Sequence[RankTrace],
    summary: Summary,
    steps: StepOptions | None = None,
) -> Path:
    """Write :func:`render_html` to ``path`` atomically and return the path."""
    return atomic_write_bytes(path, render_html(traces, summary, steps).encode())
