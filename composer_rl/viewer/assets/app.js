// Router: the URL hash is the state, so every view (and every session) has a permalink.
//   #/  #/step/<src>  #/group/<src>/<gid>  #/session/<src>/<i>  #/search?...  #/compare?...
'use strict';

const ROUTES = {
  '': (app) => Views.overview(app),
  step: (app, p) => Views.step(app, p[0]),
  group: (app, p) => Views.group(app, p[0], p[1]),
  session: (app, p) => Views.session(app, p[0], p[1]),
  search: (app, p, q) => Views.search(app, q),
  compare: (app, p, q) => Views.compare(app, q),
};

let renderSeq = 0;

async function render() {
  const seq = ++renderSeq;
  const raw = location.hash.replace(/^#\/?/, '');
  const [path, query] = raw.split('?');
  const parts = path.split('/').filter((x) => x).map(decodeURIComponent);
  const view = ROUTES[parts[0] || ''] ? parts.shift() || '' : null;
  const app = document.getElementById('app');
  const fresh = document.createElement('div');  // built off-screen, swapped in at once
  document.body.removeAttribute('data-ready');
  try {
    if (view === null) throw new Error('unknown page');
    const name = await ROUTES[view](fresh, parts, new URLSearchParams(query || ''));
    if (seq !== renderSeq) return;
    V.clear(app).appendChild(fresh);
    document.body.dataset.ready = name;
    window.__viewerReadyAt = performance.now();  // when this view was in the document
    if (name === 'overview' && window.__viewerFirstRender === undefined) {
      window.__viewerFirstRender = performance.now();  // read by the load-time benchmark
    }
  } catch (e) {
    if (seq !== renderSeq) return;
    V.clear(app).appendChild(V.el('div', {cls: 'error'}, V.el('h1', null, 'Cannot show this page'),
      V.pre(String(e && e.message || e)), V.link('#/', 'back to the overview')));
    document.body.dataset.ready = 'error';
  }
  window.scrollTo(0, 0);
}

window.addEventListener('hashchange', render);
render();
