// The pipeline view: the per-step model (mstx_marks/analysis/model/rl_steps.py, in the JSON form
// `summary --json` writes, rl_steps_text.steps_json) drawn as an SVG: one lane per process
// (role x rank), each step a column band, each lane at true times from its bins
// (analysis/model/step_bins.py: per process and step, a fixed number, each with its busy time and
// its phase of most time). Every figure drawn is the model's: nothing here finds a step,
// attributes a range or walks a path; it only places what the model says.
(function () {
'use strict';
const D = JSON.parse(document.getElementById('data').textContent);
const P = D.pipeline;
const svg = document.getElementById('pipesvg');
const NS = svg.namespaceURI;  // (the HTML parser's: the page names no URL)
const head = document.getElementById('pipehead');
const note = document.getElementById('pipenote');
const view = document.getElementById('pview');
// Steps per view; the buttons page through the others.
const SHOWN = 8;
const LEFT = 230, RIGHT = 12, HEAD = 32, PATH = 18, LANE = 18, GAP = 10;

function el(name, attrs, parent, title) {
  const e = document.createElementNS(NS, name);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (title) {
    const t = document.createElementNS(NS, 'title'); t.textContent = title; e.appendChild(t);
  }
  if (parent) parent.appendChild(e);
  return e;
}
function text(x, y, words, parent, cls) {
  const t = el('text', {x: x, y: y, class: cls || ''}, parent); t.textContent = words;
  return t;
}
const ms = ns => (ns / 1e6).toFixed(3) + ' ms';
const label = m => m.role ? m.role + ' rank ' + m.rank : 'rank ' + m.rank;

if (!P) {
  head.textContent = 'Steps across the job';
  note.textContent = 'No per-step analysis: no process has steps (or summary ran with' +
    ' --no-per-step).';
  svg.style.display = 'none';
  document.getElementById('pipebar').style.display = 'none';
  document.body.setAttribute('data-pipeline', 'ok');
  return;
}
const M = P.model, steps = M.steps, procs = M.processes, B = P.bins;
const lanes = P.lanes;  // process indices, top to bottom
const laneOf = new Map(lanes.map((pi, k) => [procs[pi].key, k]));
const colorOf = name => P.colors[name] || D.other_color;
const ref = label(M.reference);
note.textContent = 'Steps of ' + ref + ' (' + M.total_steps + ' in all' +
  (M.every > 1 ? ', every ' + M.every + 'th analysed' : '') + '). Each lane is one process at' +
  ' true times: its step (hatched: idle) in ' + B.n + ' bins, each where it lay, coloured by' +
  ' its phase of most time there and as opaque as its phases cover it; the bins\' busy times' +
  ' add up to the step\'s (hover a lane for its figures, a bin for its own). A process' +
  ' attributed to its own steps is drawn in its own step, placed by its clock. The critical' +
  ' path row (from ' + ref + '\'s view) and the red ticks (the process it waited for, at the' +
  ' end of its work) are at their times. \u2691 long tail: the rank whose time at its role\'s' +
  ' median would have saved the step the most. Clocks: ' + M.clock.accuracy + '.' +
  M.notes.map(n => ' Note: ' + n + '.').join('');
let first = 0;

function draw() {
  svg.textContent = '';
  const shown = steps.slice(first, first + SHOWN);
  const W = Math.max(svg.parentNode.clientWidth, LEFT + RIGHT + 200);
  const H = HEAD + PATH + lanes.length * LANE + 4;
  svg.setAttribute('width', W); svg.setAttribute('height', H);
  svg.setAttribute('viewBox', '0 0 ' + W + ' ' + H);
  const total = shown.reduce((a, s) => a + s.length_ns, 0);
  const scale = (W - LEFT - RIGHT - GAP * (shown.length - 1)) / Math.max(total, 1);  // px/ns
  svg.setAttribute('data-scale', String(scale));
  const defs = el('defs', {}, svg);
  const hatch = el('pattern', {id: 'bubble', width: 6, height: 6,
    patternUnits: 'userSpaceOnUse', patternTransform: 'rotate(45)'}, defs);
  el('rect', {width: 6, height: 6, fill: '#fbeaea'}, hatch);
  el('line', {x1: 0, y1: 0, x2: 0, y2: 6, stroke: '#d9a0a0', 'stroke-width': 3}, hatch);
  lanes.forEach((pi, k) => {  // every other lane tinted, the reference's marked
    const y = HEAD + PATH + k * LANE;
    const cls = procs[pi].key === M.reference.key ? 'reference' : k % 2 ? 'tint' : '';
    if (cls) el('rect', {x: 0, y: y, width: W, height: LANE, class: cls}, svg);
  });
  // the lanes' labels (cut at the plot); a long-tail lane's flagged below
  const cut = el('clipPath', {id: 'plabels'}, defs);
  el('rect', {x: 0, y: 0, width: LEFT - 6, height: H}, cut);
  const names = el('g', {'clip-path': 'url(#plabels)'}, svg);
  const labels = lanes.map((pi, k) => {
    const y = HEAD + PATH + k * LANE;
    const p = procs[pi];
    const own = p.key === M.reference.key ? ' (reference)' : p.own_steps ? ' (own steps)' : '';
    const t = text(6, y + LANE / 2, label(p) + own, names, 'lane');
    t.setAttribute('data-lane', k);
    return t;
  });
  text(6, HEAD + PATH / 2, 'critical path', svg, 'lane path');
  const flagged = new Set();
  let x = LEFT;
  shown.forEach((st, n) => {
    const j = first + n, bw = st.length_ns * scale, y0 = HEAD + PATH;
    const band = el('g', {class: 'step', 'data-step': j, 'data-x': x, 'data-width': bw}, svg);
    const clip = el('clipPath', {id: 'pc' + j}, defs);
    el('rect', {x: x, y: 0, width: bw, height: H}, clip);
    band.setAttribute('clip-path', 'url(#pc' + j + ')');
    const w = st.what_if;
    el('rect', {x: x, y: 0, width: bw, height: HEAD, class: 'stephead'}, band,
      'step ' + st.key + ': ' + ms(st.length_ns) + (w ? '\nif ' + label({role: w.role,
        rank: w.slowest_rank}) + ' took the median time in ' + w.phase + ': ' +
        ms(w.step_ns) + ' (' + ms(w.saving_ns) + ' less)' : ''));
    text(x + 4, HEAD / 2, 'step ' + st.key + ' \u00b7 ' + ms(st.length_ns), band, 'steplabel');
    // the critical path, at its times
    for (const link of st.critical_path) {
      const waited = link.waited;
      el('rect', {x: x + (link.start_ns - st.start_ns) * scale, y: HEAD + 3,
        width: (link.end_ns - link.start_ns) * scale, height: PATH - 6, class: 'crit',
        fill: colorOf(link.phase), 'data-step': j, 'data-ns': link.time_ns}, band,
        link.phase + ': ' + ms(link.time_ns) + ' of the step' +
        (waited ? '\nwaited for ' + label(waited) + ' ' + waited.phase + ', ended ' +
          ms(waited.end_ns - st.start_ns) + ' into the step' : ''));
    }
    // each lane at true times: its window in the step (hatched: idle), its bins over it
    lanes.forEach((pi, k) => {
      const p = procs[pi], y = y0 + k * LANE + 2, h = LANE - 4;
      const at = {'data-lane': k, 'data-step': j};
      if (p.length_ns[j] < 0) {
        el('rect', {x: x, y: y, width: bw, height: h, class: 'absent', ...at}, band,
          label(p) + ': no figures in step ' + st.key + ' (its own steps lack it)');
        return;
      }
      // its phases in the step, most time first
      const here = Object.keys(p.phases).filter(n => p.phases[n][j] > 0)
        .sort((a, b) => p.phases[b][j] - p.phases[a][j] || (a < b ? -1 : 1));
      const phases = here.map(n => '\n  ' + n + ' ' + ms(p.phases[n][j]));
      const about = label(p) + ', step ' + st.key + (p.own_steps ? ' (its own: ' +
        ms(p.length_ns[j]) + ')' : '') + '\nbusy ' + ms(p.busy_ns[j]) +
        (p.uncertain_ns[j] ? ' \u00b1' + ms(p.uncertain_ns[j]) : '') + ', idle ' +
        ms(p.idle_ns[j]) + phases.join('');
      const lane = B.lanes[pi], b = lane ? lane[j] : null;
      const wx = b ? x + (b[0] - st.start_ns) * scale : x;
      const ww = b ? (b[1] - b[0]) * scale : bw;
      el('rect', {x: wx, y: y, width: ww, height: h, class: 'window', fill: 'url(#bubble)',
        'data-ns': p.busy_ns[j], 'data-idle-ns': p.idle_ns[j], ...at}, band,
        about + (b ? '' : '\n(where in the step it was busy is not known)'));
      if (!b) return;
      const n = B.n, a = b[0], len = b[1] - b[0];
      const edge = q => a + Math.floor(len * q / n);  // as step_bins.py cuts them
      for (let q = 0; q < n; q++) {
        const cover = b[2][q];
        if (!cover) continue;
        const e0 = edge(q), e1 = edge(q + 1), name = b[3][q] >= 0 ? B.names[b[3][q]] : '';
        el('rect', {x: x + (e0 - st.start_ns) * scale, y: y, width: (e1 - e0) * scale,
          height: h, class: 'bin', fill: name ? colorOf(name) : D.other_color,
          'fill-opacity': Math.max(0.15, cover / Math.max(e1 - e0, 1)).toFixed(3),
          'data-ns': cover, 'data-phase': name, 'data-bin': q, 'data-start-ns': e0,
          'data-end-ns': e1, ...at}, band,
          label(p) + ', step ' + st.key + ': ' + ms(e0 - st.start_ns) + ' to ' +
          ms(e1 - st.start_ns) + ' into it, busy ' + ms(cover) + ' (' +
          Math.round(100 * cover / Math.max(e1 - e0, 1)) + ' %)' +
          (name ? ', mostly ' + name : '') + '\n' + about);
      }
    });
    // over the lanes: where the critical path waited for another process (its work's end)
    for (const link of st.critical_path) {
      const waited = link.waited, k = waited ? laneOf.get(waited.key) : undefined;
      if (k === undefined) continue;
      el('rect', {x: x + (waited.end_ns - st.start_ns) * scale - 1.5, y: y0 + k * LANE,
        width: 3, height: LANE, class: 'waited', 'data-lane': k, 'data-step': j,
        'data-at-ns': waited.end_ns}, band,
        'the critical path\'s ' + link.phase + ' waited for this ' + waited.phase + ', ended ' +
        ms(waited.end_ns - st.start_ns) + ' into the step');
    }
    // the long tail: the rank the what-if names
    const k = w ? laneOf.get(w.role ? w.role + ':' + w.slowest_rank : String(w.slowest_rank))
      : undefined;
    if (k !== undefined) {
      flagged.add(k);
      el('rect', {x: x + 1, y: y0 + k * LANE + 1, width: Math.max(bw - 2, 1),
        height: LANE - 2, class: 'longtail', 'data-lane': k, 'data-step': j}, band,
        'long tail of step ' + st.key + ': ' + w.phase + ' ' + ms(w.slowest_ns) +
        ' against the median ' + ms(w.median_ns));
    }
    x += bw + GAP;
  });
  for (const k of flagged) {
    labels[k].textContent = '\u2691 ' + labels[k].textContent;
    labels[k].setAttribute('class', 'lane flag');
  }
  const last = Math.min(first + SHOWN, steps.length);
  view.textContent = 'steps ' + (steps.length ? first + 1 : 0) + '\u2013' + last + ' of ' +
    steps.length + ' analysed';
  document.getElementById('pprev').disabled = first === 0;
  document.getElementById('pnext').disabled = last >= steps.length;
  document.body.setAttribute('data-pipeline-lanes', String(lanes.length));
}
document.getElementById('pprev').onclick = () => { first = Math.max(0, first - SHOWN); draw(); };
document.getElementById('pnext').onclick = () => {
  if (first + SHOWN < steps.length) { first += SHOWN; draw(); }
};
draw();
window.addEventListener('resize', draw);
document.body.setAttribute('data-pipeline', 'ok');
})();
