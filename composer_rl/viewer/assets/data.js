// Lazy data access: the overview needs only data/index.json; the session table
// (data/sessions.json) and session shards (data/shards/<src>.<k>.json) are fetched when a
// view first needs them, and cached for the page's life.
'use strict';

const D = {cache: new Map()};

D.json = function (path) {
  if (!D.cache.has(path)) {
    D.cache.set(path, fetch(path, {cache: 'no-cache'}).then((r) => {
      if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
      return r.json();
    }).catch((e) => { D.cache.delete(path); throw e; }));
  }
  return D.cache.get(path);
};

D.index = () => D.json('data/index.json');

D.source = async function (name) {
  const idx = await D.index();
  return idx.sources.find((s) => s.name === name) || null;
};

// The session table as an object with column arrays plus lookups.
D.sessions = function () {
  if (!D._sessions) {
    D._sessions = D.json('data/sessions.json').then((t) => {
      const c = t.columns, n = c.src.length;
      const table = {sources: t.sources, c, n, bySrc: new Map(), byTask: new Map()};
      for (let j = 0; j < n; j++) {
        const s = t.sources[c.src[j]];
        if (!table.bySrc.has(s)) table.bySrc.set(s, []);
        table.bySrc.get(s).push(j);
        const k = c.task[j];
        if (!table.byTask.has(k)) table.byTask.set(k, []);
        table.byTask.get(k).push(j);
      }
      table.row = (j) => {
        const r = {j};
        for (const [name, col] of Object.entries(c)) r[name] = col[j];
        r.src = t.sources[c.src[j]];
        return r;
      };
      return table;
    }).catch((e) => { D._sessions = null; throw e; });
  }
  return D._sessions;
};

D.shard = async function (src, k) {
  const idx = await D.index();
  if (!idx.sources.some((s) => s.name === src)) throw new Error('unknown source');
  return D.json(`data/shards/${encodeURIComponent(src)}.${Number(k)}.json`);
};

D.session = async function (src, i) {
  const idx = await D.index();
  const shard = await D.shard(src, Math.floor(Number(i) / idx.shard_size));
  const s = shard.find((x) => x.i === Number(i));
  if (!s) throw new Error(`no session ${i} in ${src}`);
  return s;
};
