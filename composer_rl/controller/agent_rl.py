"""SFT on oracle sessions, then GRPO on agent sessions in the sandbox: one controller.

`run(config, workdir)` is what `launch/train.py` calls for an agent-RL experiment
(`experiments/tiny_bugfix.py`). Stages:
  1. SFT on oracle demonstrations rendered in the RL token layout (real sandbox sessions).
  2. Held-out solve rate (greedy, one session per held-out task).
  3. RL: the rollout factory (continuous batching over the engine's slots, tools in a
     thread pool) and the trainer (consumes complete groups, drops groups older than
     `max_staleness` versions, corrects the rest with the clipped importance ratio against
     the recorded behaviour log-probs, publishes weights after every step). `mode='sync'`
     runs them one after the other instead, for comparison.
  4. Held-out solve rate again, and a JSON summary as the last stdout line.

Long sessions (issue #7): `config.rl.compaction` (a section of
`composer_rl.rollout.compaction.CompactionConfig` fields; absent = disabled) sets what the
RL rollouts do when a context fills up ('compaction', 'truncation' or 'none');
`config.eval.context_mode` ('' = as in RL) lets evaluation use another mode, and
`config.eval.full_window_max_seq_len` adds a reference evaluation with a larger window
(`max_seq_len` is a compute field: the parameters do not change). `config.tasks.family`
picks the task source (`composer_rl.env.tasks.TASK_SOURCES`; default 'generated').
"""
import dataclasses
import hashlib
import itertools
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from composer_rl.controller import placement
from composer_rl.controller.metrics import MetricsWriter
from composer_rl.controller.remote_rollouts import RemoteRollouts
from composer_rl.controller.rollout_factory import Group, Ledger, RolloutFactory
from composer_rl.data import copy_curriculum
from composer_rl.data.byte_tokenizer import ByteTokenizer
from composer_rl.env.harness import EnvConfig, make_env
from composer_rl.env.policies import make_policy
from composer_rl.env.tasks import TASK_SOURCES
from composer_rl.env.tool_call_format import ToolCallError, parse_tool_call
from composer_rl.model import ModelConfig, Transformer, inference_copy, sharding
from composer_rl.rollout.chat import ChatFormat
from composer_rl.rollout import compaction as compaction_lib
from composer_rl.rollout.compaction import expand_segments
from composer_rl.rollout.runner import RolloutConfig, RolloutRunner
from composer_rl.rollout.scripted import scripted_trajectory
from composer_rl.rollout.session import Trajectory
from composer_rl.rollout.summary_judge import SummaryJudgeConfig
from composer_rl.sampling.engine import Engine
from composer_rl.train import advantages as adv_lib
from composer_rl.train import losses
from composer_rl.train.batch import build_batch
from composer_rl.train.checkpoint import Checkpointer
from composer_rl.train.optimizer import OptimizerConfig
from composer_rl.train.sft import make_sft_step
from composer_rl.train.train_step import TrainConfig, make_train_step


class Setup:
  """Everything the stages share, built once from the config. `worker=True` is a remote
  rollout worker's view: no train mesh, one engine over all of its devices."""

  def __init__(self, config, workdir: str, worker: bool = False):
    self.config, self.workdir = config, workdir
    self.tok = ByteTokenizer()
    self.chat = ChatFormat(self.tok)
    self.model_config = ModelConfig(**dict(config.model), vocab_size=self.tok.vocab_size)
    if worker:
      inference_meshes = [sharding.make_mesh({"data": -1})]
      self.mesh, self.shards = None, 1
    else:
      if jax.process_count() > 1:
        raise ValueError(
            f"agent RL is one controller but this job has {jax.process_count()} processes: "
            "run it under Pathways (--distributed=pathways) or on one host, with rollouts in "
            "separate jobs (rl.rollouts='remote', launch/rollout_worker.py)")
      plan = placement.carve(jax.devices(), config.mesh.train_fraction,
                             config.mesh.inference_meshes)
      self.mesh, inference_meshes = plan.train_mesh, plan.inference_meshes
      self.shards = sharding.num_batch_shards(self.mesh)
    self.inference_meshes = inference_meshes
    self._eval_engines: Dict[int, Engine] = {}  # max_seq_len -> a wider-window engine
    self.env_config = EnvConfig(compact_prompt=True, max_turns=config.env.max_turns,
                                grade_timeout_s=config.env.grade_timeout_s,
                                system_prompt=config.env.system_prompt,
                                tools=tuple(config.env.get("tools", ())))
    abstract = nnx.eval_shape(lambda: Transformer(self.model_config, rngs=nnx.Rngs(0)))
    self.engines = [Engine(abstract, slots=config.rl.slots, prefill_chunk=config.rl.prefill_chunk,
                           mesh=m) for m in inference_meshes]
    self.metrics = MetricsWriter(workdir)

  def rows(self, n: int) -> int:
    """Batch rows for n records: padded up to a multiple of the batch shards."""
    return -(-n // self.shards) * self.shards

  def task(self, split: str, index: int):
    # tasks.family: the task source by name; configs written before it existed mean
    # the generated family.
    family = self.config.tasks.get("family", "generated")
    return TASK_SOURCES.get(family)(split, index, self.config.tasks.seed)

  def sampler_params(self, train_params, engine):
    """The trainer's params as engine `engine` (an index or an `Engine`) computes with
    them: compute-dtype copies, moved (resharded) onto its inference mesh."""
    eng = self.engines[engine] if isinstance(engine, int) else engine
    return eng.place(inference_copy(train_params, self.model_config))

  def eval_engine(self, max_seq_len: int = 0) -> Engine:
    """The engine evaluation samples with: engine 0, or (for a `max_seq_len` other than
    the model's) an engine over the same parameters with a longer KV cache, built once."""
    if not max_seq_len or max_seq_len == self.model_config.max_seq_len:
      return self.engines[0]
    if max_seq_len not in self._eval_engines:
      mc = self.model_config.replace(max_seq_len=int(max_seq_len))
      abstract = nnx.eval_shape(lambda: Transformer(mc, rngs=nnx.Rngs(0)))
      self._eval_engines[max_seq_len] = Engine(
          abstract, slots=self.config.rl.slots, prefill_chunk=self.config.rl.prefill_chunk,
          mesh=self.inference_meshes[0])
    return self._eval_engines[max_seq_len]

  @property
  def summary_judge(self) -> SummaryJudgeConfig:
    """`config.rl.summary_judge` (absent = off)."""
    section = self.config.rl.get("summary_judge")
    if not section:
      return SummaryJudgeConfig()
    d = section.to_dict() if hasattr(section, "to_dict") else dict(section)
    return SummaryJudgeConfig(**d)

  def compaction(self, mode: str = "") -> compaction_lib.CompactionConfig:
    """`config.rl.compaction` as a `CompactionConfig` (absent = disabled); `mode` other
    than '' replaces its mode (and enables it unless 'none')."""
    section = self.config.rl.get("compaction")
    cfg = compaction_lib.CompactionConfig(**dict(section)) if section else (
        compaction_lib.CompactionConfig())
    if mode:
      cfg = dataclasses.replace(cfg, mode=mode, enabled=cfg.enabled or mode != "none")
    return cfg

  def rollout_config(self, greedy: bool, seed: int, context_mode: str = "") -> RolloutConfig:
    c = self.config.rl
    return RolloutConfig(max_turns=self.config.env.max_turns, max_turn_tokens=c.max_turn_tokens,
                         temperature=1.0 if greedy else c.temperature,
                         top_k=1 if greedy else c.top_k, top_p=1.0 if greedy else c.top_p,
                         seed=seed, tool_workers=c.tool_workers,
                         decode_steps=c.decode_steps,
                         compaction=self.compaction(context_mode),
                         # RL only: evaluation reports the task reward.
                         summary_judge=SummaryJudgeConfig() if greedy else self.summary_judge)

  def runner(self, params, version: int, greedy: bool, seed: int, engine=0,
             context_mode: str = "") -> RolloutRunner:
    eng = self.engines[engine] if isinstance(engine, int) else engine
    return RolloutRunner(eng, self.chat, self.rollout_config(greedy, seed, context_mode),
                         self.sampler_params(params, eng), version)

  def train_env(self, task_index: int):
    return make_env(self.task("train", task_index), self.env_config)


def demonstrations(s: Setup) -> List[Trajectory]:
  """Scripted sessions of `config.sft.demo_policy` on the first train tasks, all kept
  (an imperfect demonstrator's failures are part of what SFT imitates). Cached in the
  workdir under a name that hashes everything they depend on."""
  c = s.config.sft
  # Demonstrations summarize where RL would (`compaction.mode='compaction'`), whatever
  # mode RL then trains with: every arm of an ablation starts from the same SFT policy.
  comp = dataclasses.replace(s.compaction(), mode="compaction") if (
      s.compaction().enabled) else None
  family = s.config.tasks.get("family", "generated")
  long_sessions = comp is not None or family != "generated"
  parts = [c.demo_policy, dict(c.demo_policy_args), c.num_demos, s.config.tasks.seed,
           dataclasses.asdict(s.env_config)]
  if long_sessions:  # (appended only then, so the cache names of earlier runs stay valid)
    parts += [family, comp and dataclasses.asdict(comp), s.model_config.max_seq_len]
  key = json.dumps(parts, sort_keys=True, default=str)
  # A long-task demonstration must fit the window context by context (SFT trains each
  # context as its own row); the default family's always fit, and keep no limit.
  limit = s.model_config.max_seq_len if long_sessions else 0
  path = os.path.join(s.workdir, f"demos_{hashlib.sha256(key.encode()).hexdigest()[:12]}.jsonl")
  if os.path.exists(path):
    with open(path) as f:
      return [Trajectory.from_json(json.loads(line)) for line in f]

  def one(i):
    task = s.task("train", i)
    policy = make_policy(c.demo_policy, **dict(c.demo_policy_args))
    return scripted_trajectory(policy, task, make_env(task, s.env_config), s.chat,
                               session_id=i, compaction=comp,
                               max_seq_len=limit)
  with ThreadPoolExecutor(s.config.rl.tool_workers) as pool:
    demos = list(pool.map(one, range(c.num_demos)))
  with open(path + ".tmp", "w") as f:
    for d in demos:
      f.write(json.dumps(d.to_json()) + "\n")
  os.replace(path + ".tmp", path)
  return demos


def write_rollouts(s: Setup, name: str, trajs: List[Trajectory]) -> None:
  """Writes trajectories (exact logprob bits, turn texts, rewards) to
  workdir/rollouts/<name>.jsonl, atomically: a step re-run after a resume replaces it."""
  d = os.path.join(s.workdir, "rollouts")
  os.makedirs(d, exist_ok=True)
  path = os.path.join(d, f"{name}.jsonl")
  with open(path + ".tmp", "w") as f:
    for t in trajs:
      f.write(json.dumps(t.to_json()) + "\n")
  os.replace(path + ".tmp", path)


def changed_code(t: Trajectory) -> bool:
  """Whether the session made a well-formed edit/write call (an attempt to fix)."""
  for text in t.turn_texts:
    try:
      if parse_tool_call(text).name in ("edit", "write_file"):
        return True
    except ToolCallError:
      continue
  return False


def context_stats(trajs: List[Trajectory], prefix: str = "") -> Dict[str, float]:
  """How long sessions are against the window: tokens per session (all contexts), per
  context, context restarts (compactions or truncations) and summary tokens per session,
  and the share of sessions that ended because a context filled up."""
  n = max(len(trajs), 1)
  restarts = [len(t.segments) for t in trajs]
  ctx = [b - a for t in trajs for a, b in compaction_lib.segment_bounds(t)]
  summaries = [t.metrics.get("summary_tokens", 0.0) for t in trajs]
  out = dict(session_tokens_mean=float(np.mean([len(t.tokens) for t in trajs])) if trajs else 0.0,
             session_tokens_max=float(max((len(t.tokens) for t in trajs), default=0)),
             context_tokens_max=float(max(ctx, default=0)),
             context_restarts_mean=float(sum(restarts)) / n,
             context_restarts_max=float(max(restarts, default=0)),
             summary_tokens_mean=float(sum(summaries)) / n,
             summary_tokens_per_compaction=float(sum(summaries)) / max(
                 sum(t.metrics.get("compactions", 0.0) for t in trajs), 1.0),
             context_full_rate=float(sum(t.finish_reason == "context_full" for t in trajs)) / n)
  return {f"{prefix}{k}": v for k, v in out.items()}


def evaluate(s: Setup, params, count: int, tag: str, context_mode: str = "",
             max_seq_len: int = 0) -> Dict[str, float]:
  """Greedy held-out solve rate. `context_mode` ('' = `config.eval.context_mode`, itself
  '' = as in RL) and `max_seq_len` (0 = the model's) set how sessions meet the window."""
  mode = context_mode or s.config.eval.get("context_mode", "")
  engine = s.eval_engine(max_seq_len)
  runner = s.runner(params, version=-1, greedy=True, seed=12345, engine=engine,
                    context_mode=mode)
  jobs = [(f"heldout-{i}", i, make_env(s.task("heldout", i), s.env_config))
          for i in range(count)]
  t0 = time.time()
  trajs = runner.run(jobs, max_in_flight=s.config.rl.max_in_flight)
  write_rollouts(s, f"eval_{tag}", trajs)
  solved = np.asarray([t.reward >= 1.0 for t in trajs])
  edited = np.asarray([changed_code(t) for t in trajs])
  out = {f"heldout_solve_rate_{tag}": float(solved.mean()),
         f"heldout_reward_{tag}": float(np.mean([t.reward for t in trajs])),
         # where a gain comes from: attempting a fix more often, or fixing more accurately
         f"heldout_edit_rate_{tag}": float(edited.mean()),
         f"heldout_solve_rate_given_edit_{tag}": float(solved[edited].mean()) if edited.any()
                                                 else 0.0,
         f"eval_seconds_{tag}": time.time() - t0,
         f"eval_window_{tag}": float(engine.config.max_seq_len),
         **{f"{k}_{tag}": v for k, v in context_stats(trajs, "heldout_").items()}}
  s.metrics.write(0, out, phase=f"eval_{tag}")
  return out


def sft_stage(s: Setup, init_params=None):
  """SFT from `init_params` (e.g. a continued-pretraining checkpoint's, host arrays) or,
  when None, from a fresh initialization with the experiment's seed."""
  c = s.config.sft
  # copy_rows: synthetic copy rows in every batch (data.copy_curriculum), for models
  # trained from scratch that must copy what they read; 0 = demonstrations only.
  # copy_rows_kind / copy_rows_args: which rows (a COPY_ROWS name) and their arguments.
  n_copy = int(c.get("copy_rows", 0))
  if not 0 <= n_copy < c.batch_size:
    raise ValueError(f"sft.copy_rows={n_copy} must be in [0, batch_size={c.batch_size})")
  copy_kind = c.get("copy_rows_kind", "recall")
  copy_args = dict(c.get("copy_rows_args") or {})
  # copy_only_steps: the first SFT steps train on copy rows alone. Mixed into batches, the
  # copied tokens are a few percent of the trained ones (the loss is a mean over tokens),
  # too faint a signal to form the copy (BUILD_NOTES section 11).
  n_copy_only = int(c.get("copy_only_steps", 0))
  if not 0 <= n_copy_only <= c.steps:
    raise ValueError(f"sft.copy_only_steps={n_copy_only} must be in [0, steps={c.steps}]")
  if n_copy or n_copy_only:
    # A bad kind, argument or row length fails here, before any demonstration is made.
    copy_curriculum.copy_records(np.random.default_rng(0), s.tok, 1,
                                 s.model_config.max_seq_len, copy_kind, **copy_args)
  step = make_sft_step(s.model_config, OptimizerConfig(
      learning_rate=c.learning_rate, warmup_steps=c.warmup_steps, total_steps=c.steps),
      s.mesh)
  state = step.init_state(s.config.seed, params=init_params)
  demos = demonstrations(s)
  s.metrics.write(0, dict(demos=len(demos), demo_reward=float(np.mean([d.reward for d in demos]))),
                  phase="demos")
  # One row per context (a compacted demonstration is several sequences, see
  # rollout.compaction); without compaction the rows are the demonstrations themselves.
  rows = [r for d in demos for r in compaction_lib.segment_records(d)]
  rng = np.random.default_rng(s.config.seed)
  copy_rng = np.random.default_rng([s.config.seed, 1])
  for k in range(c.steps):
    n_demo = 0 if k < n_copy_only else c.batch_size - n_copy
    pick = rng.choice(len(rows), n_demo, replace=len(rows) < n_demo)
    recs = [rows[i] for i in pick] + copy_curriculum.copy_records(
        copy_rng, s.tok, c.batch_size - n_demo, s.model_config.max_seq_len, copy_kind,
        **copy_args)
    batch = build_batch(recs, s.model_config.max_seq_len, num_rows=s.rows(c.batch_size))
    state, m = step.step(state, step.shard_batch(batch))
    if k % c.log_every == 0 or k == c.steps - 1:
      s.metrics.write(k, {k2: float(v) for k2, v in jax.device_get(m).items()}, phase="sft")
  return state


def _train_on(s: Setup, step, state, groups: List[Group], stats: Dict, version: int) -> tuple:
  c = s.config.rl
  fresh = [g for g in groups if version - g.min_version <= c.max_staleness]
  stats["dropped_stale"] = len(groups) - len(fresh)
  trajs = [t for g in fresh for t in g.trajectories]
  if not trajs:
    return state, {}
  rewards = np.asarray([t.reward for t in trajs], np.float32)
  gids = np.asarray([t.group_id for t in trajs], np.int32)
  adv = np.asarray(adv_lib.compute_advantages(c.advantage, rewards, gids))
  task_rewards = np.asarray([(t.reward_info or {}).get("task_reward", t.reward) for t in trajs])
  out = dict(reward_mean=float(rewards.mean()), solve_rate=float(np.mean(task_rewards >= 1.0)),
             staleness_mean=float(np.mean([version - t.min_version() for t in trajs])),
             malformed_rate=float(np.mean([t.metrics.get("malformed_calls", 0)
                                           / max(t.turns, 1) for t in trajs])),
             tool_seconds=float(np.mean([t.metrics.get("tool_seconds", 0.0) for t in trajs])),
             generated_tokens=float(sum(t.num_generated for t in trajs)),
             trained_tokens=0.0, **context_stats(trajs))
  judged = [t.metrics["summary_judge_score"] for t in trajs if "summary_judge_score" in t.metrics]
  if judged:  # the auxiliary summary reward (rollout.summary_judge), when on
    out["summary_judge_score"] = float(np.mean(judged))
  if not np.any(adv):
    # Every group was all-success or all-failure: no learning signal. Skipping the update
    # also stops AdamW's momentum from moving the weights on zero gradients.
    stats["skipped_no_signal"] = 1
    return state, out
  # One row per context: a compacted session (rollout.compaction) trains each of its
  # contexts as its own sequence, all with the session's advantage. Without compaction
  # this is one row per session, as before. Rows are padded to a multiple of the usual
  # count, so the step's shape (and its compiled program) changes only when needed.
  records, row_adv = expand_segments(trajs, adv)
  base = c.groups_per_step * c.group_size
  batch = build_batch(records, s.model_config.max_seq_len,
                      num_rows=s.rows(-(-len(records) // base) * base), advantages=row_adv,
                      temperature=c.temperature, top_k=c.top_k, top_p=c.top_p)
  state, m = step.step(state, step.shard_batch(batch))
  out.update({k: float(v) for k, v in jax.device_get(m).items()})
  out["trained_tokens"] = float(sum(len(t.tokens) for t in trajs))  # forward+backward
  return state, out


def make_rl_step(s: Setup):
  c = s.config.rl
  return make_train_step(s.model_config, TrainConfig(
      optimizer=OptimizerConfig(learning_rate=c.learning_rate, warmup_steps=0,
                                total_steps=max(c.steps, 1), end_lr_ratio=1.0),
      loss=losses.LossConfig(policy_loss=c.policy_loss, clip_eps_low=c.clip_eps,
                             clip_eps_high=c.clip_eps_high)), s.mesh)


def task_of_group(seed: int, group_id: int, num_tasks: int) -> int:
  """The train task a group visits: a pure function of (seed, group id), so a group that is
  re-run after a resume visits the same task."""
  h = hashlib.sha256(f"composer_rl-group:{seed}:{group_id}".encode()).digest()
  return int.from_bytes(h[:8], "big") % num_tasks


def _local_rollouts(s: Setup, state, next_group, ledger: Ledger, max_outstanding: int):
  """Rollouts in this process: one runner per inference mesh (`controller.placement`)."""
  c = s.config.rl
  runners = [s.runner(state.params, version=int(state.step), greedy=False,
                      seed=s.config.seed, engine=i) for i in range(len(s.engines))]
  factory = RolloutFactory(runners, next_group, s.train_env, c.group_size, c.max_in_flight,
                           c.queue_groups, ledger, max_outstanding=max_outstanding,
                           place_params=s.sampler_params)
  factory.version = int(state.step)
  return factory


def _remote_rollouts(s: Setup, state, next_group, ledger: Ledger, max_outstanding: int):
  """Rollouts by worker processes (`launch/rollout_worker.py`) through `rl.shared_dir`."""
  c = s.config.rl
  if not c.shared_dir:
    raise ValueError("rl.rollouts='remote' needs rl.shared_dir (a directory the workers see)")
  remote = RemoteRollouts(c.shared_dir, next_group, ledger, c.group_size, max_outstanding,
                          lambda p: inference_copy(p, s.model_config),
                          lease_s=c.worker_lease_s)
  remote.set_params(state.params)
  return remote


# rl.rollouts -> how the trainer gets its groups
ROLLOUT_SOURCES = {"local": _local_rollouts, "remote": _remote_rollouts}


def rl_stage(s: Setup, step, state, book: Dict, ckpt: Checkpointer) -> tuple:
  """GRPO from `state` (RL step `state.step`) to `rl.steps`. `book` is the controller's
  checkpointed record (rollout ledger, SFT eval, timings); it is saved with the weights
  every `checkpoint_every` steps, so a resumed run re-runs exactly the groups that were
  issued but not consumed, and never consumes one twice."""
  c = s.config.rl
  start = int(state.step)
  ledger = Ledger.from_json(book.get("rollouts"))
  gids = itertools.count(max(ledger.issued, default=-1) + 1)

  def next_group():
    gid = next(gids)
    return gid, task_of_group(s.config.seed, gid, c.num_train_tasks)
  max_outstanding = (c.max_staleness + 1) * c.groups_per_step
  factory = ROLLOUT_SOURCES[c.rollouts](s, state, next_group, ledger, max_outstanding)
  timing = book.setdefault("timing", dict(idle=0.0, busy=0.0))
  trained_tokens = 0.0
  if c.mode == "async":
    factory.start()
  try:
    for k in range(start, c.steps):
      t0 = time.time()
      if c.mode == "async":
        groups = [factory.get() for _ in range(c.groups_per_step)]
      else:
        groups = factory.collect(c.groups_per_step)
      t1 = time.time()
      stats: Dict = {}
      write_rollouts(s, f"rl_step_{k:05d}", [t for g in groups for t in g.trajectories])
      version = factory.version  # the policy version these groups are measured against
      state, m = _train_on(s, step, state, groups, stats, version)
      if int(state.step) != k + 1:  # a skipped update still counts: step == RL steps done
        state = state.replace(step=jnp.int32(k + 1))
      factory.set_params(state.params, k + 1)
      t2 = time.time()
      stale = [g.group_id for g in groups if version - g.min_version > c.max_staleness]
      factory.record([g.group_id for g in groups if g.group_id not in stale], stale)
      trained_tokens += m.get("trained_tokens", 0.0)
      timing["idle"] += t1 - t0
      timing["busy"] += t2 - t1
      m.update(stats, trainer_idle_fraction=timing["idle"] / max(sum(timing.values()), 1e-9),
               step_seconds=t2 - t0, idle_seconds=t1 - t0,
               trainer_tokens_per_s=m.get("generated_tokens", 0.0) / max(t2 - t1, 1e-9))
      s.metrics.write(k, m, phase="rl")
      if (k + 1) % c.checkpoint_every == 0 or k + 1 == c.steps:
        book["rollouts"] = factory.ledger_json()
        ckpt.save(k + 1, state, ledger=book)
  finally:
    factory.stop()
  if c.steps > start:
    factory.close()
  total = max(sum(timing.values()), 1e-9)
  return state, dict(trainer_idle_fraction=timing["idle"] / total,
                     rl_steps_per_hour=(c.steps - start) / max(total, 1e-9) * 3600
                     if start < c.steps else 0.0,
                     train_seconds_per_token=timing["busy"] / max(trained_tokens, 1.0),
                     groups_consumed=len(ledger.consumed),
                     groups_dropped_stale=len(ledger.dropped_stale),
                     sampler_stats=factory.stats())


def saved_sft_params(s: Setup, step, workdir: str):
  """The SFT policy another run of the same architecture saved as its RL step 0."""
  ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), max_to_keep=2, keep_period=10**9)
  try:
    restored = ckpt.restore(step.abstract_state(), step=0)
  finally:
    ckpt.close()
  if restored is None:
    raise FileNotFoundError(f"no SFT policy (RL step 0 checkpoint) in {workdir}/checkpoints")
  return restored.state.params


def run(config, workdir: str, init_params=None, sft_from: str = "") -> Dict:
  """Runs (or resumes, from `workdir/checkpoints`) the experiment; returns the summary,
  which is also the last stdout line (JSON). `init_params` (host arrays of the same
  architecture) start SFT from an earlier stage's weights instead of a fresh init;
  `sft_from` (a workdir of a run with the same SFT inputs) skips SFT and starts RL from
  that run's SFT policy (an ablation's arms share one SFT stage)."""
  os.makedirs(workdir, exist_ok=True)
  t0 = time.time()
  s = Setup(config, workdir)
  step = make_rl_step(s)
  # Step 0 (the SFT policy) is kept for good: the pipeline benchmark and ablations start there.
  ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), max_to_keep=2, keep_period=10**9)
  restored = ckpt.restore(step.abstract_state())
  if restored is not None:
    state, book = restored.state, dict(restored.ledger or {})
    s.metrics.truncate_phase("rl", restored.step)
    print(f"composer_rl: resumed at RL step {restored.step} from {workdir}", flush=True)
  else:  # step 0 of RL is the SFT policy: checkpointed, so SFT never runs twice
    sft_params = (saved_sft_params(s, step, sft_from) if sft_from
                  else sft_stage(s, init_params).params)
    book = dict(sft_eval=evaluate(s, sft_params, config.eval.num_heldout, "sft"))
    state = step.init_state(config.seed, params=sft_params)
    ckpt.save(0, state, ledger=book)
  summary = dict(seed=config.seed, mode=config.rl.mode, **book["sft_eval"])
  state, rl_info = rl_stage(s, step, state, book, ckpt)
  ckpt.close()
  summary.update(evaluate(s, state.params, config.eval.num_heldout, "rl"))
  full = config.eval.get("full_window_max_seq_len", 0)
  if full:  # the reference: the same weights with a window the sessions fit in
    summary.update(evaluate(s, state.params, config.eval.num_heldout, "rl_full_window",
                            context_mode="none", max_seq_len=full))
  summary.update(rl_info, total_seconds=time.time() - t0)
  summary["gain_points"] = 100 * (summary["heldout_solve_rate_rl"]
                                  - summary["heldout_solve_rate_sft"])
  s.metrics.close()
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump(summary, f)
  print(json.dumps({k: v for k, v in summary.items() if k != "sampler_stats"}), flush=True)
  return summary
