// The verify timeline: reads #data, draws an SVG with one lane per worker.
// Everything drawn carries a data-kind that names its item in #legend (the
// CLI tests check that every kind drawn is explained there).
(function () {
  const d = JSON.parse(document.getElementById('data').textContent);
  const box = document.getElementById('timeline');
  const NS = 'http://www.w3.org/2000/svg';
  const laneH = 44, left = 70, top = 24;
  const CAUSE = {Released: ['#6c6', 'grant-released'], Lost: ['#f93', 'grant-lost'], Deadline: ['#e55', 'grant-deadline'],
    Died: ['#aaa', 'grant-died'], RunEnd: ['#9cf', 'grant-run-end']};
  const BAND = {pause: '#f88', slow: '#fc8', partition: '#8cf'};
  let scale = 1; // 1 is fit
  function el(name, attrs, parent, text) {
    const e = document.createElementNS(NS, name);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    parent.appendChild(e);
    return e;
  }
  // A time for people: '250 ms', '1.5 s', '10 s' (never '10000ms').
  function human(us) {
    if (us === 0) return '0 s';
    if (Math.abs(us) < 1000) return Math.round(us) + ' \u00b5s';
    if (Math.abs(us) < 1e6) return +(us / 1000).toFixed(us % 1000 ? 1 : 0) + ' ms';
    return +(us / 1e6).toFixed(2) + ' s';
  }
  // A tick step of 1, 2 or 5 times a power of ten (µs), about `want` of them.
  function niceStep(span, want) {
    const raw = span / want, p = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 2, 5, 10]) if (m * p >= raw) return m * p;
    return 10 * p;
  }
  // A fence short enough for its bar: more than 5 digits show the last 4 after an ellipsis.
  function shortFence(f) { return f.length > 5 ? '\u2026' + f.slice(-4) : f; }
  function draw() {
    box.innerHTML = '';
    const width = Math.max(600, (box.clientWidth || 1000) - 4);
    const end = Math.max(d.end, 1);
    const px = (width - left - 10) * scale / end; // pixels per µs
    const W = left + end * px + 10, H = top + d.lanes * laneH + 10;
    const svg = el('svg', {width: W, height: H, id: 'svg'}, box);
    const x = t => left + t * px;
    const step = niceStep(end / scale, 10);
    for (let t = 0; t <= end; t += step) {
      el('line', {x1: x(t), x2: x(t), y1: top - 4, y2: H, stroke: '#eee'}, svg);
      el('text', {class: 'tick', 'data-kind': 'axis', x: x(t) + 2, y: 12, 'font-size': 10}, svg, human(t));
    }
    for (let l = 0; l < d.lanes; l++) {
      const g = el('g', {class: 'lane', 'data-lane': l, 'data-kind': 'lane'}, svg);
      el('text', {x: 4, y: top + l * laneH + 24, 'font-size': 12}, g, 'worker ' + l);
      el('line', {x1: left, x2: W, y1: top + (l + 1) * laneH, y2: top + (l + 1) * laneH, stroke: '#ddd'}, g);
    }
    const y = l => top + l * laneH;
    for (const f of d.faults) {
      if (f.pid === 0) {
        // A server fault (restart, leader kill): a band across every lane.
        const r = el('rect', {class: 'fault server ' + f.kind, 'data-kind': 'server', x: x(f.start), y: top,
          width: Math.max(3, x(f.end) - x(f.start)), height: d.lanes * laneH, fill: '#96f', opacity: 0.25}, svg);
        el('title', {}, r, f.kind + ' of the server' + (f.kind === 'leader' ? ' (member ' + f.lane + ')' : '') + ', ' + human(f.end - f.start));
        el('text', {x: x(f.start) + 2, y: top + d.lanes * laneH - 2, 'font-size': 10, fill: '#639'}, svg, f.kind);
      } else if (f.kind === 'kill') {
        const t = el('text', {class: 'fault kill', 'data-kind': 'kill', x: x(f.start) - 4, y: y(f.lane) + 40, fill: 'black', 'font-size': 14}, svg, '\u2715');
        el('title', {}, t, 'kill pid ' + f.pid + ' at ' + human(f.start));
      } else {
        const r = el('rect', {class: 'fault ' + f.kind, 'data-kind': f.kind, x: x(f.start), y: y(f.lane) + 2, width: Math.max(2, x(f.end) - x(f.start)),
          height: laneH - 4, fill: BAND[f.kind] || '#ccc', opacity: 0.35}, svg);
        el('title', {}, r, f.kind + ' pid ' + f.pid + ' for ' + human(f.end - f.start));
      }
    }
    for (const b of d.grants) {
      const [color, kind] = CAUSE[b.cause] || ['#ccc', 'grant-run-end'];
      const shared = b.hold !== 'exclusive';
      const attrs = {class: 'grant', 'data-kind': kind + (shared ? ' shared' : ''), x: x(b.start), y: y(b.lane) + 8,
        width: Math.max(1, x(b.end) - x(b.start)), height: 18, fill: color, stroke: '#333', 'stroke-width': 0.5};
      if (shared) { attrs['fill-opacity'] = 0.55; attrs['stroke-dasharray'] = '3,2'; }
      const r = el('rect', attrs, svg);
      const what = b.hold === 'read' ? ' reader' : shared ? ' ' + b.hold + ' permit(s)' : '';
      el('title', {}, r, 'fence ' + b.fence + what + ', pid ' + b.pid + ', ' + human(b.start) + ' to ' + human(b.end) + ' (' + b.cause + ')');
      const label = (b.hold === 'read' ? 'R ' : shared ? '\u00d7' + b.hold + ' ' : '') + shortFence(b.fence);
      // Only where it fits: about 6 px a character at 10 px.
      if (x(b.end) - x(b.start) > label.length * 6 + 4) {
        el('text', {class: 'fence', 'data-kind': 'fence-label', x: x(b.start) + 2, y: y(b.lane) + 21, 'font-size': 10}, svg, label);
      }
    }
    for (const w of d.writes) {
      const l = el('line', {class: w.accepted ? 'write accepted' : 'write refused', 'data-kind': w.accepted ? 'write-accepted' : 'write-refused',
        x1: x(w.t), x2: x(w.t), y1: y(w.lane) + 28, y2: y(w.lane) + 40, stroke: w.accepted ? '#36c' : '#d00', 'stroke-width': w.accepted ? 1 : 3}, svg);
      el('title', {}, l, (w.accepted ? 'write accepted' : 'STALE write refused') + ', fence ' + w.fence + ' (highest ' + w.highest + ')');
    }
    for (const c of d.holdings) {
      const l = el('line', {class: 'holding', 'data-kind': 'holding', x1: x(c.t), x2: x(c.t), y1: y(c.lane) + 31, y2: y(c.lane) + 40, stroke: '#777'}, svg);
      el('title', {}, l, 'still holding, fence ' + c.fence + ', at ' + human(c.t));
    }
    for (const m of d.marks) {
      const c = el('circle', {class: 'mark', 'data-kind': 'mark-' + m.kind, cx: x(m.t), cy: y(m.lane) + 6, r: 4, fill: m.kind === 'error' ? '#900' : '#f60'}, svg);
      el('title', {}, c, m.what + ' at ' + human(m.t));
    }
    for (const v of d.weaknesses) {
      const l = el('line', {class: 'weakness', 'data-kind': 'weakness', x1: x(v.at), x2: x(v.at), y1: top, y2: H, stroke: '#e90',
        'stroke-width': 3, 'stroke-dasharray': '3,2'}, svg);
      el('title', {}, l, 'within a documented weakness (' + d.weakness + '): ' + v.guarantee + ': ' + v.what);
    }
    for (const v of d.violations) {
      const l = el('line', {class: 'violation', 'data-kind': 'violation', x1: x(v.at), x2: x(v.at), y1: top, y2: H, stroke: '#d00', 'stroke-width': 3}, svg);
      el('title', {}, l, 'UNEXPECTED ' + v.guarantee + ': ' + v.what);
    }
    document.getElementById('zoom').textContent = 'zoom ' + scale.toFixed(1) + 'x';
    box.setAttribute('data-rendered', String(d.grants.length));
  }
  function zoom(k) { scale = Math.min(1000, Math.max(1, scale * k)); draw(); }
  document.getElementById('zin').onclick = () => zoom(2);
  document.getElementById('zout').onclick = () => zoom(0.5);
  document.getElementById('zfit').onclick = () => { scale = 1; draw(); };
  box.addEventListener('wheel', e => {
    if (!e.ctrlKey && Math.abs(e.deltaY) < Math.abs(e.deltaX)) return;
    e.preventDefault();
    const before = (box.scrollLeft + e.offsetX) / scale;
    zoom(e.deltaY < 0 ? 1.25 : 0.8);
    box.scrollLeft = before * scale - e.offsetX;
  }, {passive: false});
  // A link can open the page zoomed: report.html#zoom=4.
  const m = /zoom=([0-9.]+)/.exec(location.hash);
  if (m) scale = Math.min(1000, Math.max(1, parseFloat(m[1])));
  draw();
})();
