// Line charts drawn as SVG (no libraries): V.lineChart({title, series: [{name, xs, ys}]}).
'use strict';

const SVGNS = 'http://www.w3.org/2000/svg';

V.svg = function (tag, attrs, ...children) {
  const node = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  for (const c of children) {
    if (c === null || c === undefined) continue;
    node.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
};

V.lineChart = function (opts) {
  const W = opts.width || 360, H = opts.height || 200, L = 46, R = 10, T = 24, B = 28;
  const series = opts.series.filter((s) => s.ys.some((y) => y !== null && isFinite(y)));
  const root = V.el('figure', {cls: 'chart', data: {chart: opts.title}});
  const svg = V.svg('svg', {width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: 'img'});
  svg.appendChild(V.svg('text', {x: L, y: 15, class: 'title'}, opts.title));
  root.appendChild(svg);
  if (!series.length) {
    svg.appendChild(V.svg('text', {x: L, y: H / 2, class: 'axis'}, 'no data yet'));
    return root;
  }
  const pts = series.flatMap((s) => s.xs.map((x, i) => [x, s.ys[i]]))
    .filter(([, y]) => y !== null && isFinite(y));
  let [x0, x1] = [Math.min(...pts.map((p) => p[0])), Math.max(...pts.map((p) => p[0]))];
  let [y0, y1] = [Math.min(...pts.map((p) => p[1])), Math.max(...pts.map((p) => p[1]))];
  if (opts.yMin !== undefined) y0 = Math.min(y0, opts.yMin);
  if (opts.yMax !== undefined) y1 = Math.max(y1, opts.yMax);
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) { y1 += 0.5; y0 -= 0.5; }
  const sx = (x) => L + (x - x0) / (x1 - x0) * (W - L - R);
  const sy = (y) => H - B - (y - y0) / (y1 - y0) * (H - T - B);
  svg.appendChild(V.svg('line', {x1: L, y1: H - B, x2: W - R, y2: H - B, class: 'axisline'}));
  svg.appendChild(V.svg('line', {x1: L, y1: T, x2: L, y2: H - B, class: 'axisline'}));
  for (const y of [y0, (y0 + y1) / 2, y1]) {
    svg.appendChild(V.svg('text', {x: L - 4, y: sy(y) + 4, class: 'axis', 'text-anchor': 'end'}, V.fmt(y)));
  }
  for (const x of [x0, x1]) {
    svg.appendChild(V.svg('text', {x: sx(x), y: H - B + 16, class: 'axis', 'text-anchor': 'middle'}, V.fmt(x)));
  }
  svg.appendChild(V.svg('text', {x: W - R, y: H - 2, class: 'axis', 'text-anchor': 'end'}, opts.xLabel || 'step'));
  series.forEach((s, k) => {
    const cls = 'series s' + (k % 4);
    let d = '';
    s.xs.forEach((x, i) => {
      const y = s.ys[i];
      if (y === null || !isFinite(y)) return;
      d += (d ? ' L' : 'M') + sx(x).toFixed(1) + ' ' + sy(y).toFixed(1);
      svg.appendChild(V.svg('circle', {cx: sx(x), cy: sy(y), r: 2.2, class: cls},
        V.svg('title', null, `${s.name} @ ${x}: ${V.fmt(y)}`)));
    });
    svg.appendChild(V.svg('path', {d, class: cls, fill: 'none'}));
    svg.appendChild(V.svg('text', {x: L + 8 + 120 * k, y: T + 8, class: 'legend ' + cls}, s.name));
  });
  return root;
};
