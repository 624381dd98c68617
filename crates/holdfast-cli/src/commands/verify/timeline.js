// The verify timeline: reads #data, draws an SVG with one lane per worker.
(function () {
  const d = JSON.parse(document.getElementById('data').textContent);
  const box = document.getElementById('timeline');
  const NS = 'http://www.w3.org/2000/svg';
  const laneH = 44, left = 70, top = 24;
  let scale = 1; // pixels per ms at zoom 1 is fit
  function el(name, attrs, parent, text) {
    const e = document.createElementNS(NS, name);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    parent.appendChild(e);
    return e;
  }
  function draw() {
    box.innerHTML = '';
    const width = Math.max(600, (box.clientWidth || 1000) - 4);
    const end = Math.max(d.end, 1);
    const px = (width - left - 10) * scale / end; // pixels per µs
    const W = left + end * px + 10, H = top + d.lanes * laneH + 10;
    const svg = el('svg', {width: W, height: H, id: 'svg'}, box);
    const x = t => left + t * px;
    const step = Math.pow(10, Math.ceil(Math.log10(end / 10 / scale)));
    for (let t = 0; t <= end; t += step) {
      el('line', {x1: x(t), x2: x(t), y1: top - 4, y2: H, stroke: '#eee'}, svg);
      el('text', {x: x(t) + 2, y: 12, 'font-size': 10}, svg, (t / 1000).toFixed(step < 1000 ? 1 : 0) + 'ms');
    }
    for (let l = 0; l < d.lanes; l++) {
      const g = el('g', {class: 'lane', 'data-lane': l}, svg);
      el('text', {x: 4, y: top + l * laneH + 24, 'font-size': 12}, g, 'worker ' + l);
      el('line', {x1: left, x2: W, y1: top + (l + 1) * laneH, y2: top + (l + 1) * laneH, stroke: '#ddd'}, g);
    }
    const y = l => top + l * laneH;
    for (const f of d.faults) {
      if (f.pid === 0) {
        // A server fault (restart, leader kill): a band across every lane.
        const r = el('rect', {class: 'fault server ' + f.kind, x: x(f.start), y: top, width: Math.max(3, x(f.end) - x(f.start)),
          height: d.lanes * laneH, fill: '#96f', opacity: 0.25}, svg);
        el('title', {}, r, f.kind + ' of the server' + (f.kind === 'leader' ? ' (member ' + f.lane + ')' : ''));
        el('text', {x: x(f.start) + 2, y: top + d.lanes * laneH - 2, 'font-size': 10, fill: '#639'}, svg, f.kind);
      } else if (f.kind === 'kill') {
        const t = el('text', {class: 'fault kill', x: x(f.start) - 4, y: y(f.lane) + 40, fill: 'black', 'font-size': 14}, svg, '\u2715');
        el('title', {}, t, 'kill pid ' + f.pid);
      } else {
        const r = el('rect', {class: 'fault ' + f.kind, x: x(f.start), y: y(f.lane) + 2, width: Math.max(2, x(f.end) - x(f.start)),
          height: laneH - 4, fill: f.kind === 'pause' ? '#f88' : '#fc8', opacity: 0.35}, svg);
        el('title', {}, r, f.kind + ' pid ' + f.pid + ' ' + ((f.end - f.start) / 1000).toFixed(0) + 'ms');
      }
    }
    for (const b of d.grants) {
      const color = b.cause === 'Released' ? '#6c6' : b.cause === 'Died' ? '#aaa' : '#f93';
      const r = el('rect', {class: 'grant', x: x(b.start), y: y(b.lane) + 8, width: Math.max(1, x(b.end) - x(b.start)), height: 18,
        fill: color, stroke: '#333', 'stroke-width': 0.5}, svg);
      el('title', {}, r, 'fence ' + b.fence + ' pid ' + b.pid + ' ' + (b.start / 1000).toFixed(1) + '..' + (b.end / 1000).toFixed(1) + 'ms ' + b.cause);
      if (x(b.end) - x(b.start) > 24) el('text', {class: 'fence', x: x(b.start) + 2, y: y(b.lane) + 21, 'font-size': 10}, svg, b.fence);
    }
    for (const w of d.writes) {
      const l = el('line', {class: w.accepted ? 'write accepted' : 'write refused', x1: x(w.t), x2: x(w.t), y1: y(w.lane) + 28,
        y2: y(w.lane) + 40, stroke: w.accepted ? '#36c' : '#d00', 'stroke-width': w.accepted ? 1 : 3}, svg);
      el('title', {}, l, (w.accepted ? 'write accepted' : 'STALE write refused') + ', fence ' + w.fence + ' (highest ' + w.highest + ')');
    }
    for (const m of d.marks) {
      const c = el('circle', {class: 'mark', cx: x(m.t), cy: y(m.lane) + 6, r: 4, fill: '#f60'}, svg);
      el('title', {}, c, m.what);
    }
    for (const v of d.violations) {
      const l = el('line', {class: 'violation', x1: x(v.at), x2: x(v.at), y1: top, y2: H, stroke: '#90c', 'stroke-width': 2}, svg);
      el('title', {}, l, v.guarantee + ': ' + v.what);
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
