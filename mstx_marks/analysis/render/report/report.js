// The report's timeline, phase table and rank imbalance, drawn from the page's data block (see
// mstx_marks/analysis/render/report_html.py, report_data, for its fields). Every name is inserted as
// text, never as markup.
(function () {
'use strict';
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
  let steps = 0;
  for (const st of D.steps) {  // the job's steps (the per-step model's), across every group
    if (st[0] < v0 || st[0] > v1) continue;
    const x = X(st[0]);
    ctx.beginPath(); ctx.moveTo(x, 2); ctx.lineTo(x, H); ctx.stroke(); ctx.fillStyle = '#333';
    for (const g of D.groups) ctx.fillText('step ' + st[1], x + 3, g.top * LANE + LANE / 2);
    steps++;
  }
  ctx.restore(); ctx.setLineDash([]);
  document.getElementById('view').textContent = 'showing ' + fmtDur(v0) + ' … ' + fmtDur(v1) +
    ' (' + fmtDur(v1 - v0) + ' wide)';
  document.body.setAttribute('data-drawn', String(drawn));
  document.body.setAttribute('data-marks', String(shown));
  document.body.setAttribute('data-steps', String(steps));
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
  // red only from the flag on: below it, what ranks doing equal work differ by
  const flagged = p.imbalance !== null && p.imbalance >= D.imbalance_flag;
  h.textContent = (p.role ? p.role + ' ' : '') + p.name + ': slowest rank ' + p.slowest +
    ' (' + ratio + ' the fastest, rank ' + fastest[0] + ')' +
    (flagged ? '' : ': within noise (under ' + D.imbalance_flag.toFixed(2) + 'x)');
  card.setAttribute('data-flagged', flagged ? '1' : '0');
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
    if (rank === p.slowest) b.className = flagged ? 'slow' : 'slowest';
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
