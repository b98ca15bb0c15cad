// One session: prompt, turns (tool calls as the harness parsed them, observations),
// compaction boundaries, the final diff, grading, and the token view.
'use strict';

const OPEN_OBSERVATION_CHARS = 600;  // longer observations start collapsed

Views.toolCall = function (call) {
  const args = Object.entries(call.args || {});
  return V.el('div', {cls: 'toolcall'},
    V.el('div', {cls: 'toolname'}, V.badge('tool call', 'tool'), ' ', V.el('code', {cls: 'name'}, call.name),
      call.compact ? V.el('span', {cls: 'muted'}, ' (compact spelling)') : null),
    args.length ? V.el('table', {cls: 'args'}, V.el('tbody', null, args.map(([k, v]) =>
      V.el('tr', {data: {arg: k}}, V.el('th', null, k),
        V.el('td', null, V.pre(typeof v === 'string' ? v : JSON.stringify(v), 'argval'))))))
      : V.el('div', {cls: 'muted'}, 'no arguments'));
};

Views.turn = function (t, k, boundary) {
  const obs = t.observation || {};
  const box = V.el('div', {cls: 'turn', id: `turn-${k + 1}`, data: {turn: k + 1}});
  if (boundary) {
    box.appendChild(V.el('div', {cls: 'compaction'}, V.badge('compaction boundary', 'warn'),
      ' earlier turns were replaced by this summary:', V.pre(boundary.summary)));
  }
  V.append(box, [
    V.el('h3', null, `Turn ${k + 1}`),
    t.reasoning ? V.el('div', {cls: 'reasoning'}, V.pre(t.reasoning)) : null,
    t.call ? Views.toolCall(t.call) : V.el('div', {cls: 'malformed'},
      V.badge('malformed call: ' + t.error.kind, 'bad'), ' ', V.el('span', {cls: 'errmsg'}, t.error.message)),
    V.el('details', {cls: 'raw'}, V.el('summary', null, 'raw model text'), V.pre(t.text, 'text rawtext')),
    (t.hacks || []).length ? V.el('div', {cls: 'hacks'}, t.hacks.map((h) =>
      V.el('div', null, V.badge('hack attempt: ' + h.kind, 'bad'), ' ', h.detail))) : null,
  ]);
  if (obs.text !== null && obs.text !== undefined) {
    const det = V.el('details', {cls: 'observation', open: obs.text.length <= OPEN_OBSERVATION_CHARS ? 'open' : null},
      V.el('summary', null, `observation (${obs.text.length} chars)`,
        obs.truncated ? [' ', V.badge(`truncated: ${obs.truncated} chars omitted`, 'warn')] : null),
      V.pre(obs.text, 'text obs'));
    box.appendChild(det);
  } else {
    box.appendChild(V.el('div', {cls: 'muted'}, 'no observation recorded'));
  }
  return box;
};

Views.diff = function (text) {
  if (text === null || text === undefined) return V.el('p', {cls: 'muted'}, 'not recorded for this session (older record, or no work tree)');
  if (text === '') return V.el('p', {cls: 'muted'}, 'no changes to the work tree');
  const pre = V.el('pre', {cls: 'diff'});
  for (const line of text.split('\n')) {
    const cls = line.startsWith('+++') || line.startsWith('---') ? 'hdr' : line.startsWith('@@') ? 'hunk'
      : line.startsWith('+') ? 'add' : line.startsWith('-') ? 'del' : '';
    pre.appendChild(V.el('span', {cls}, line + '\n'));
  }
  return pre;
};

Views.grading = function (s) {
  const ri = s.reward_info || {}, info = ri.info || {};
  const tests = Object.entries(info.tests || {});
  const hacks = ri.hack_attempts || [];
  if (!Object.keys(ri).length) {  // e.g. scripted demonstrations keep only the reward
    return V.el('div', {id: 'grading'}, V.kv([['reward', V.el('span', {cls: 'reward'}, V.fmt(s.r))]]),
      V.el('p', {cls: 'muted'}, 'grading details were not recorded for this session'));
  }
  const breakdown = Object.entries(ri.breakdown || {});
  return V.el('div', {id: 'grading'},
    V.kv([['reward', V.el('span', {cls: 'reward'}, V.fmt(s.r))], ['passed', String(!!ri.passed)],
          ['reason', ri.reason || info.grade_reason || ri.error || '—'],
          ['tests passed', info.n_total !== undefined ? `${info.n_passed} / ${info.n_total}` : 'not recorded'],
          ['submitted', info.submitted === undefined ? '—' : String(info.submitted)]]),
    V.el('h3', null, 'reward breakdown'),
    breakdown.length ? V.table(['term', 'value'], breakdown.map(([k, v]) => [k, V.fmt(v)]), 'grid breakdown')
      : V.el('p', {cls: 'muted'}, 'not recorded'),
    V.el('h3', null, 'tests'),
    tests.length ? V.table(['test', 'visibility', 'outcome'], tests.map(([id, x]) => [
      V.el('code', null, id), x.hidden ? 'hidden' : 'visible',
      V.badge(x.outcome, x.outcome === 'passed' ? 'good' : 'bad')]), 'grid tests')
      : V.el('p', {cls: 'muted'}, 'per-test results not recorded'),
    V.el('h3', null, 'hack attempts'),
    hacks.length ? V.table(['turn', 'kind', 'tool', 'detail'], hacks.map((h) =>
      [h.turn === null ? 'grader' : h.turn, h.kind, h.tool || '', h.detail]), 'grid hacks')
      : V.el('p', {cls: 'muted'}, 'none logged'));
};

// Colours: log-prob from red (improbable) to green (certain); advantage red < 0 < green.
Views.tokenColour = function (mode, lp, adv, ver, vmax) {
  if (mode === 'advantage') {
    const a = Math.max(-1, Math.min(1, adv / 2));
    return a >= 0 ? `rgba(0,150,60,${0.15 + 0.6 * a})` : `rgba(200,30,30,${0.15 - 0.6 * a})`;
  }
  if (mode === 'version') return `hsl(${(ver * 67) % 360},70%,80%)`;
  const x = Math.max(0, Math.min(1, 1 + lp / 8));
  return `hsl(${Math.round(120 * x)},75%,78%)`;
};

Views.tokens = function (s, idx, mode) {
  const tk = s.tokens, box = V.el('div', {cls: 'tokens', data: {mode}});
  const vocab = tk.byte_vocab ? idx.vocab : null;
  const vmax = Math.max(0, ...tk.ver);
  for (let p = 0; p < tk.ids.length; p++) {
    const id = tk.ids[p];
    let text = vocab ? vocab[id] : (tk.names && tk.names[id] !== undefined ? tk.names[id] : `#${id} `);
    const span = V.el('span', {cls: tk.mask[p] ? 'tok gen' : 'tok ctx'});
    if (text === '\\n') { text = '↵'; span.classList.add('nl'); }
    span.textContent = text;
    if (tk.mask[p]) {
      span.style.backgroundColor = Views.tokenColour(mode, tk.lp[p], s.adv, tk.ver[p], vmax);
      span.title = `token ${p}: id ${id}, logprob ${tk.lp[p]}, version ${tk.ver[p]}, advantage ${s.adv}`;
    }
    box.appendChild(span);
    if (text === '↵') box.appendChild(document.createElement('br'));
  }
  return box;
};

Views.session = async function (app, src, i) {
  const [idx, s] = await Promise.all([D.index(), D.session(src, i)]);
  const source = idx.sources.find((x) => x.name === src);
  const rl = idx.run.rl || {step: []};
  const at = rl.step.indexOf(source.step);
  const ratio = source.kind === 'rl' && at >= 0 && rl.ratio_not_one_frac ? rl.ratio_not_one_frac[at] : null;
  const boundaries = new Map((s.segments || []).map((b) => [b.turn, b]));
  let mode = 'logprob';
  const tokenBox = V.el('div', {id: 'token-view'});
  const drawTokens = () => { V.clear(tokenBox); tokenBox.appendChild(Views.tokens(s, idx, mode)); };
  const modeSelect = V.el('select', {id: 'token-mode', on: {change: (e) => { mode = e.target.value; drawTokens(); }}},
    ['logprob', 'advantage', 'version'].map((m) => V.el('option', {value: m}, m)));
  V.append(app, [
    Views.crumbs(['#/', 'overview'], [V.route('step', src), source.label], [V.route('group', src, s.gid), `group ${s.gid}`],
      `session ${s.sid}`),
    V.el('h1', null, `Session ${s.sid} — task ${s.task}`),
    V.el('p', {cls: 'permalink'}, 'permalink: ', V.link(V.route('session', src, i), location.href.split('#')[0] + V.route('session', src, i))),
    V.kv([['task', s.task], ['family', s.fam || '—'], ['record file', source.file], ['group', s.gid],
          ['reward', V.el('span', {cls: 'reward', id: 'session-reward'}, V.fmt(s.r))],
          ['advantage', source.advantages ? `${V.fmt(s.adv)} (${idx.advantage}, within group ${s.gid})` : 'n/a (not an RL step)'],
          ['outcome', V.outcomeBadge(s.out)], ['finish reason', s.fin], ['turns', s.turns],
          ['tokens generated / total', `${s.gen} / ${s.len}`], ['malformed calls', s.mal],
          ['policy version', s.vmin < 0 ? '— (not sampled by a policy)' : `${s.vmin}–${s.vmax}`],
          ['parity', s.parity ? JSON.stringify(s.parity) : ratio !== null
            ? `step ${source.step}: trainer/recorded log-prob ratio ≠ 1 on ${V.pct(ratio)} of tokens (stale tokens differ by design)`
            : 'not recorded']]),
    V.section('Prompt',
      s.system_prompt ? [V.el('h3', null, 'system'), V.pre(s.system_prompt, 'text prompt')] : null,
      V.el('h3', null, 'task (as the environment opened the session)'),
      V.pre(s.prompt === null ? '(not recorded)' : s.prompt, 'text prompt')),
    V.section(`Transcript (${s.turns_detail.length} turns)`, V.el('div', {id: 'turns'},
      s.turns_detail.map((t, k) => Views.turn(t, k, boundaries.get(k + 1))))),
    V.section('Final diff (work tree vs. the task\'s files)', V.el('div', {id: 'diff'}, Views.diff(s.final_diff))),
    V.section('Grading', Views.grading(s)),
    V.section('Tokens', V.el('p', null, 'colour by ', modeSelect,
      V.el('span', {cls: 'muted'}, ' — grey: context the model did not sample; hover a token for its values')), tokenBox),
  ]);
  drawTokens();
  return 'session';
};
