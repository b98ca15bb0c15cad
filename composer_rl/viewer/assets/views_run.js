// Run-level views: the overview (curves, throughput, staleness, steps) and one step's
// groups. Both render from data/index.json (+ the session table for the step view).
'use strict';

const Views = {};

Views.crumbs = (...items) => V.el('div', {cls: 'crumbs'},
  items.map((it, k) => [k ? ' › ' : '', Array.isArray(it) ? V.link(it[0], it[1]) : it]));

Views.sourceLink = (s) => V.link(V.route('step', s.name), s.label);

Views.overview = async function (app) {
  const idx = await D.index();
  const run = idx.run, rl = run.rl || {step: []}, sum = run.summary || {};
  const rlSources = idx.sources.filter((s) => s.kind === 'rl');
  const series = (key, name) => ({name: name || key, xs: rl.step, ys: rl[key] || []});
  // Reward and solve rate come from metrics.jsonl; a run without it (or a step the
  // trainer has not logged yet) still has them from its rollout files.
  const fromFiles = (key, name) => ({name, xs: rlSources.map((s) => s.step),
                                     ys: rlSources.map((s) => s[key])});
  const stats = sum.sampler_stats || {};
  const evals = run.evals || {};
  const ev = (tag) => (evals['eval_' + tag] || {})['heldout_solve_rate_' + tag];
  V.append(app, [
    V.el('h1', null, 'Run overview'),
    V.kv([
      ['workdir', V.el('code', null, run.workdir)],
      ['sessions', `${idx.sessions} in ${idx.sources.length} record files (${rlSources.length} RL steps)`],
      ['TensorBoard logdir', run.tensorboard
        ? [V.el('code', {cls: 'tb'}, run.tensorboard), ' ', V.el('span', {cls: 'muted'}, `(tensorboard --logdir=${run.tensorboard})`)]
        : V.el('span', {cls: 'muted'}, 'none')],
      ['held-out solve rate', `SFT ${V.pct(ev('sft'))} → RL ${V.pct(ev('rl'))}` +
        (sum.gain_points !== undefined ? ` (gain ${V.fmt(sum.gain_points)} points)` : '')],
      ['status', run.summary ? 'finished' : 'in progress (or stopped) — re-run launch/view.py to update'],
      sum.rl_steps_per_hour !== undefined ? ['RL steps/hour', V.fmt(sum.rl_steps_per_hour)] : null,
      sum.trainer_idle_fraction !== undefined ? ['trainer idle fraction', V.pct(sum.trainer_idle_fraction)] : null,
      stats.decode_seconds ? ['sampler decode tokens/s', V.fmt(stats.generated_tokens / stats.decode_seconds)] : null,
      sum.groups_consumed !== undefined ? ['groups consumed / dropped stale', `${sum.groups_consumed} / ${sum.groups_dropped_stale}`] : null,
      ['advantage estimator (token view)', idx.advantage],
    ]),
    V.el('div', {cls: 'charts', id: 'charts'},
      V.lineChart({title: 'reward by RL step', series: [series('reward_mean', 'reward (metrics)'),
        fromFiles('reward_mean', 'reward (rollout files)')]}),
      V.lineChart({title: 'solve rate by RL step', yMin: 0, yMax: 1,
        series: [series('solve_rate', 'solve rate'), fromFiles('solve_rate', 'from files')]}),
      V.lineChart({title: 'throughput (tokens/s)', yMin: 0,
        series: [series('trainer_tokens_per_s', 'trainer'), series('sampler_tokens_per_s', 'sampler')]}),
      V.lineChart({title: 'staleness (policy versions)', yMin: 0,
        series: [series('staleness_mean', 'mean staleness'), series('dropped_stale', 'groups dropped')]}),
      V.lineChart({title: 'SFT loss', series: [{name: 'loss', xs: (run.sft || {}).step || [],
        ys: (run.sft || {}).loss || []}]})),
    V.section('Steps', V.table(
      ['record file', 'sessions', 'groups', 'tasks', 'mean reward', 'solve rate', 'malformed calls',
       'hack attempts', 'policy versions', ''],
      idx.sources.map((s) => [Views.sourceLink(s), s.n, s.groups, s.tasks, V.fmt(s.reward_mean),
        V.pct(s.solve_rate), s.malformed, s.hacks, s.vmin < 0 ? '—' : `${s.vmin}–${s.vmax}`,
        V.el('span', {cls: 'muted'}, s.file + (s.bad_lines ? ` (${s.bad_lines} unreadable lines)` : ''))]),
      'grid steps')),
  ]);
  return 'overview';
};

// Groups of one record file (one RL step): the G rollouts of each task.
Views.step = async function (app, src) {
  const [s, t] = await Promise.all([D.source(src), D.sessions()]);
  if (!s) throw new Error('unknown record file');
  const rows = (t.bySrc.get(src) || []).map(t.row);
  const groups = new Map();
  for (const r of rows) {
    if (!groups.has(r.gid)) groups.set(r.gid, []);
    groups.get(r.gid).push(r);
  }
  V.append(app, [
    Views.crumbs(['#/', 'overview'], s.label),
    V.el('h1', null, s.label),
    V.kv([['file', V.el('code', null, s.file)], ['sessions', s.n], ['groups', s.groups],
          ['mean reward', V.fmt(s.reward_mean)], ['solve rate', V.pct(s.solve_rate)],
          ['policy versions', s.vmin < 0 ? 'none (not sampled by a policy)' : `${s.vmin}–${s.vmax}`],
          ['search this step', V.link('#/search?src=' + encodeURIComponent(src), 'filter sessions')]]),
    V.table(['group', 'task', 'family', 'rollouts', 'rewards', 'mean', 'solved', ''],
      [...groups.entries()].map(([gid, rs]) => [
        V.link(V.route('group', src, gid), String(gid)), rs[0].task, rs[0].fam || '—', rs.length,
        V.el('span', {cls: 'chips'}, rs.map((r) => V.el('a', {href: V.route('session', src, r.i),
          cls: 'chip ' + r.out, title: `session ${r.sid}: ${r.out}`}, V.fmt(r.r, 2)))),
        V.fmt(rs.reduce((a, r) => a + r.r, 0) / rs.length),
        rs.filter((r) => r.out === 'solved').length,
        V.link(V.route('group', src, gid), 'open group')]), 'grid groups'),
  ]);
  return 'step';
};
