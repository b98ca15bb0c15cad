// A task's group of G rollouts side by side, two steps of one task compared, and search.
'use strict';

// One rollout as a card: the numbers the trainer saw, plus its tool calls once the
// session's shard has arrived (`calls` filled asynchronously).
Views.card = function (r, tag) {
  const calls = V.el('ol', {cls: 'calls muted'}, V.el('li', null, 'loading tool calls…'));
  D.session(r.src, r.i).then((s) => {
    V.clear(calls);
    for (const t of s.turns_detail) {
      calls.appendChild(V.el('li', null, t.call ? V.el('code', null, t.call.name)
        : V.badge('malformed: ' + t.error.kind, 'bad')));
    }
  }).catch(() => { V.clear(calls); calls.appendChild(V.el('li', null, 'unavailable')); });
  return V.el('div', {cls: 'card ' + r.out, data: {session: `${r.src}/${r.i}`}},
    V.el('h3', null, V.link(V.route('session', r.src, r.i), (tag || 'session ') + r.sid)),
    V.kv([['reward', V.el('span', {cls: 'reward'}, V.fmt(r.r))],
          ['advantage', V.fmt(r.adv)],
          ['outcome', V.outcomeBadge(r.out)], ['finish', r.fin], ['turns', r.turns],
          ['tokens (generated / total)', `${r.gen} / ${r.len}`],
          ['malformed calls', r.mal], ['hack attempts', r.hacks],
          ['policy version', r.vmin < 0 ? '—' : r.vmin === r.vmax ? r.vmin : `${r.vmin}–${r.vmax}`]]),
    calls);
};

Views.group = async function (app, src, gid) {
  const [s, t] = await Promise.all([D.source(src), D.sessions()]);
  if (!s) throw new Error('unknown record file');
  const rows = (t.bySrc.get(src) || []).map(t.row).filter((r) => String(r.gid) === String(gid));
  if (!rows.length) throw new Error('no such group');
  const task = rows[0].task;
  const others = [...new Set((t.byTask.get(task) || []).map((j) => t.row(j).src))].filter((x) => x !== src);
  const mean = rows.reduce((a, r) => a + r.r, 0) / rows.length;
  V.append(app, [
    Views.crumbs(['#/', 'overview'], [V.route('step', src), s.label], `group ${gid}`),
    V.el('h1', null, `Group ${gid} — task ${task}`),
    V.kv([['task family', rows[0].fam || '—'], ['rollouts', rows.length], ['mean reward', V.fmt(mean)],
          ['compare with another step', others.length ? V.el('span', null, others.map((o) =>
            [V.link(`#/compare?task=${encodeURIComponent(task)}&a=${encodeURIComponent(src)}&b=${encodeURIComponent(o)}`, o), ' ']))
            : V.el('span', {cls: 'muted'}, 'this task appears in no other record file')]]),
    V.el('div', {cls: 'cards'}, rows.map((r) => Views.card(r))),
  ]);
  return 'group';
};

Views.compare = async function (app, q) {
  const t = await D.sessions();
  const task = q.get('task') || '';
  const rows = (t.byTask.get(task) || []).map(t.row);
  const srcs = [...new Set(rows.map((r) => r.src))];
  const pick = (name) => V.el('select', {name, on: {change: (e) => {
    q.set(name, e.target.value); location.hash = '#/compare?' + q.toString(); }}},
    srcs.map((s) => V.el('option', {value: s, selected: s === q.get(name) ? 'selected' : null}, s)));
  const column = (src) => {
    const rs = rows.filter((r) => r.src === src);
    const mean = rs.length ? rs.reduce((a, r) => a + r.r, 0) / rs.length : null;
    return V.el('div', {cls: 'compare-col', data: {src}},
      V.el('h2', null, src), V.el('p', null, `${rs.length} rollouts, mean reward ${V.fmt(mean)}`),
      V.el('div', {cls: 'cards'}, rs.map((r) => Views.card(r))));
  };
  V.append(app, [
    Views.crumbs(['#/', 'overview'], 'compare'),
    V.el('h1', null, `Task ${task}: two steps compared`),
    V.el('p', null, 'left ', pick('a'), ' right ', pick('b')),
    V.el('div', {cls: 'compare'}, column(q.get('a')), column(q.get('b'))),
  ]);
  return 'compare';
};

// Filters over the session table; `deep` also greps full transcripts (fetches shards).
Views.search = async function (app, q) {
  const [idx, t] = await Promise.all([D.index(), D.sessions()]);
  const f = {src: q.get('src') || '', fam: q.get('fam') || '', out: q.get('out') || '',
             rmin: q.get('rmin') || '', rmax: q.get('rmax') || '', q: q.get('q') || '',
             deep: q.get('deep') === '1'};
  const input = (name, attrs) => V.el('input', Object.assign({name, value: f[name]}, attrs));
  const select = (name, opts) => V.el('select', {name}, V.el('option', {value: ''}, 'any'),
    opts.map(([v, label]) => V.el('option', {value: v, selected: v === f[name] ? 'selected' : null}, label)));
  const form = V.el('form', {cls: 'filters', id: 'filters', on: {submit: (e) => {
    e.preventDefault();
    const p = new URLSearchParams();
    for (const el of form.elements) {
      if (!el.name) continue;
      const v = el.type === 'checkbox' ? (el.checked ? '1' : '') : el.value.trim();
      if (v) p.set(el.name, v);
    }
    location.hash = '#/search?' + p.toString();
  }}},
  V.el('label', null, 'text ', input('q', {type: 'search', placeholder: 'task id, tool, finish reason…'})),
  V.el('label', null, 'step ', select('src', idx.sources.map((s) => [s.name, s.label]))),
  V.el('label', null, 'family ', select('fam', idx.families.map((x) => [x, x]))),
  V.el('label', null, 'outcome ', select('out', [['solved', 'solved'], ['failed', 'failed'], ['error', 'error']])),
  V.el('label', null, 'reward ≥ ', input('rmin', {type: 'number', step: 'any', size: 5})),
  V.el('label', null, 'reward ≤ ', input('rmax', {type: 'number', step: 'any', size: 5})),
  V.el('label', null, input('deep', {type: 'checkbox', value: '1', checked: f.deep ? 'checked' : null}),
    ' search transcripts'),
  V.el('button', {type: 'submit'}, 'Search'));
  const c = t.c, needle = f.q.toLowerCase(), srcIdx = t.sources.indexOf(f.src);
  let hits = [];
  for (let j = 0; j < t.n; j++) {
    if (f.src && c.src[j] !== srcIdx) continue;
    if (f.fam && c.fam[j] !== f.fam) continue;
    if (f.out && c.out[j] !== f.out) continue;
    if (f.rmin !== '' && !(c.r[j] >= Number(f.rmin))) continue;
    if (f.rmax !== '' && !(c.r[j] <= Number(f.rmax))) continue;
    if (needle && !f.deep && ![c.task[j], c.fam[j], c.fin[j], c.tools[j], t.sources[c.src[j]]]
      .some((x) => String(x).toLowerCase().includes(needle))) continue;
    hits.push(j);
  }
  const status = V.el('p', {id: 'search-status'});
  if (needle && f.deep) {  // full text: fetch the candidates' shards, grep the transcripts
    status.textContent = `searching ${hits.length} transcripts…`;
    const shards = new Set(hits.map((j) => `${c.src[j]}/${c.shard[j]}`));
    await Promise.all([...shards].map((k) => {  // fetch the needed shards in parallel
      const [si, sh] = k.split('/');
      return D.shard(t.sources[Number(si)], Number(sh));
    }));
    const keep = [];
    for (const j of hits) {
      const s = await D.session(t.sources[c.src[j]], c.i[j]);
      const text = [s.prompt, s.final_diff, ...s.turns_detail.flatMap((x) => [x.text, x.observation.text])]
        .filter((x) => x).join('\n').toLowerCase();
      if (text.includes(needle)) keep.push(j);
    }
    hits = keep;
  }
  status.textContent = `${hits.length} sessions match` + (hits.length > 500 ? ' (first 500 shown)' : '');
  V.append(app, [
    Views.crumbs(['#/', 'overview'], 'search'), V.el('h1', null, 'Search sessions'), form, status,
    V.table(['step', 'group', 'session', 'task', 'family', 'reward', 'outcome', 'turns', 'tools'],
      hits.slice(0, 500).map((j) => {
        const r = t.row(j);
        return [r.src, V.link(V.route('group', r.src, r.gid), String(r.gid)),
          V.link(V.route('session', r.src, r.i), String(r.sid)), r.task, r.fam || '—', V.fmt(r.r),
          V.outcomeBadge(r.out), r.turns, r.tools];
      }), 'grid results'),
  ]);
  return 'search';
};
