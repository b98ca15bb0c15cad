// Safe DOM construction. Every string from the data (model output, tool output, task
// text, file names) becomes a Text node or an attribute value set through the DOM;
// nothing here parses HTML, and links can only point inside the page ("#...").
'use strict';

const V = {};

// el('div', {cls: 'x', title: t, href: '#/...'}, child, ...): children are nodes,
// strings/numbers (-> text nodes), arrays of those, or null (skipped).
V.el = function (tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === 'cls') node.className = v;
    else if (k === 'text') node.textContent = String(v);
    else if (k === 'href') node.setAttribute('href', V.safeHref(v));
    else if (k === 'on') for (const [ev, fn] of Object.entries(v)) node.addEventListener(ev, fn);
    else if (k === 'data') for (const [dk, dv] of Object.entries(v)) node.dataset[dk] = String(dv);
    else if (k.startsWith('on')) throw new Error('event handlers go through {on: {...}}');
    else node.setAttribute(k, String(v));
  }
  V.append(node, children);
  return node;
};

V.append = function (node, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) V.append(node, c);
    else if (c instanceof Node) node.appendChild(c);
    else node.appendChild(document.createTextNode(String(c)));
  }
  return node;
};

// Only in-page links: anything else (javascript:, data:, http:) becomes a dead '#'.
V.safeHref = function (h) {
  h = String(h);
  return h.startsWith('#') ? h : '#';
};

// '#/session/<src>/<i>' with every data-derived part URI-encoded.
V.route = function (...parts) {
  return '#/' + parts.map((p) => encodeURIComponent(String(p))).join('/');
};

V.link = (href, ...children) => V.el('a', {href}, ...children);

V.clear = function (node) {
  while (node.firstChild) node.removeChild(node.firstChild);
  return node;
};

V.fmt = function (x, digits) {
  if (x === null || x === undefined || (typeof x === 'number' && !isFinite(x))) return 'n/a';
  if (typeof x !== 'number') return String(x);
  if (Number.isInteger(x) && digits === undefined) return String(x);
  const d = digits === undefined ? 3 : digits;
  return Math.abs(x) >= 1000 ? x.toFixed(0) : Number(x.toPrecision(d)).toString();
};

V.pct = (x) => (x === null || x === undefined ? 'n/a' : (100 * x).toFixed(1) + '%');

// A table from a header list and rows of cells (cells: anything V.append accepts).
V.table = function (headers, rows, cls) {
  return V.el('table', {cls: cls || 'grid'},
    V.el('thead', null, V.el('tr', null, headers.map((h) => V.el('th', null, h)))),
    V.el('tbody', null, rows.map((r) => V.el('tr', null, r.map((c) => V.el('td', null, c))))));
};

// Key/value table.
V.kv = function (pairs) {
  return V.el('table', {cls: 'kv'}, V.el('tbody', null, pairs.filter((p) => p).map(
    ([k, v]) => V.el('tr', null, V.el('th', null, k), V.el('td', null, v)))));
};

V.pre = (text, cls) => V.el('pre', {cls: cls || 'text'}, text === null || text === undefined ? '' : String(text));

V.badge = (text, kind) => V.el('span', {cls: 'badge ' + (kind || '')}, text);

V.outcomeBadge = (o) => V.badge(o, o === 'solved' ? 'good' : o === 'error' ? 'bad' : 'warn');

V.section = (title, ...children) => V.el('section', null, V.el('h2', null, title), ...children);
