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
import hashlib
import itertools
import json
import os
import time
from typing import Dict, List

import jax
import jax.numpy as jnp
import numpy as np

from composer_rl.controller import agent_sft
from composer_rl.controller.agent_eval import context_stats, evaluate, write_rollouts
from composer_rl.controller.agent_setup import Setup
from composer_rl.controller.remote_rollouts import RemoteRollouts
from composer_rl.controller.rollout_factory import Group, Ledger, RolloutFactory
from composer_rl.model import hf_qwen3, inference_copy
from composer_rl.rollout.compaction import expand_segments
from composer_rl.train import advantages as adv_lib
from composer_rl.train import loop, losses, stages
from composer_rl.train.checkpoint import Checkpointer
from composer_rl.train.optimizer import OptimizerConfig
from composer_rl.train.train_step import TrainConfig, make_train_step


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
             trained_tokens=0.0, **context_stats(trajs))  # (an update sets trained_tokens)
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
  state, m = stages.rl_update(step, state, records, row_adv, temperature=c.temperature,
                              top_k=c.top_k, top_p=c.top_p,
                              row_multiple=c.groups_per_step * c.group_size)
  out.update(m)
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
  if c.mode == "async":
    factory.start()
  trained = [0.0]  # tokens through forward and backward, this run

  def fetch(k, state):
    t0 = time.time()
    if c.mode == "async":
      groups = [factory.get() for _ in range(c.groups_per_step)]
    else:
      groups = factory.collect(c.groups_per_step)
    return groups, t0, time.time()

  def update(k, state, item):
    groups, t0, t1 = item
    stats: Dict = {}
    write_rollouts(s, f"rl_step_{k:05d}", [t for g in groups for t in g.trajectories])
    version = factory.version  # the policy version these groups are measured against
    t_step = time.time()
    state, m = _train_on(s, step, state, groups, stats, version)
    t_step = time.time() - t_step
    if int(state.step) != k + 1:  # a skipped update still counts: step == RL steps done
      state = state.replace(step=jnp.int32(k + 1))
    factory.set_params(state.params, k + 1)
    t2 = time.time()
    stale = [g.group_id for g in groups if version - g.min_version > c.max_staleness]
    factory.record([g.group_id for g in groups if g.group_id not in stale], stale)
    trained[0] += m.get("trained_tokens", 0.0)
    timing["idle"] += t1 - t0
    timing["busy"] += t2 - t1
    m.update(stats, trainer_idle_fraction=timing["idle"] / max(sum(timing.values()), 1e-9),
             step_seconds=t2 - t0, idle_seconds=t1 - t0,
             train_step_seconds=t_step,
             # tokens the loss trained on per second of the train step alone
             trained_tokens_per_s=m.get("trained_tokens", 0.0) / max(t_step, 1e-9))
    return state, m

  def save(done, state):
    book["rollouts"] = factory.ledger_json()
    ckpt.save(done, state, ledger=book)
  try:
    state, history = loop.run(state, start=start, steps=c.steps, phase="rl", label="RL",
                              fetch=fetch, update=update, metrics=s.metrics, save=save,
                              checkpoint_every=c.checkpoint_every)
  finally:
    factory.stop()
  if c.steps > start:
    factory.close()
  total = max(sum(timing.values()), 1e-9)
  # The sampled training reward (temperature rl.temperature, not the greedy evaluation)
  # over the first and the last fifth of this run's RL steps.
  rewards = [m["reward_mean"] for m in history if "reward_mean" in m]
  fifth = max(1, len(rewards) // 5)
  curve = dict(rl_reward_mean_first=float(np.mean(rewards[:fifth])),
               rl_reward_mean_last=float(np.mean(rewards[-fifth:]))) if rewards else {}
  return state, dict(**curve, trainer_idle_fraction=timing["idle"] / total,
                     rl_steps_per_hour=(c.steps - start) / max(total, 1e-9) * 3600
                     if start < c.steps else 0.0,
                     train_seconds_per_token=timing["busy"] / max(trained[0], 1.0),
                     groups_consumed=len(ledger.consumed),
                     groups_dropped_stale=len(ledger.dropped_stale),
                     sampler_stats=factory.stats())


def run(config, workdir: str, init_params=None, sft_from: str = "") -> Dict:
  """Runs (or resumes, from `workdir/checkpoints`) the experiment; returns the summary,
  which is also the last stdout line (JSON). `init_params` (host arrays of the same
  architecture) start SFT from an earlier stage's weights instead of a fresh init (default:
  config.init_checkpoint's weights, if set);
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
    if init_params is None:
      init_params = s.init_params()  # config.init_checkpoint's weights, if any
    sft_params = (agent_sft.saved_sft_params(s, step, sft_from) if sft_from
                  else agent_sft.sft_stage(s, init_params).params)
    book = dict(sft_eval=evaluate(s, sft_params, config.eval.num_heldout, "sft"))
    state = step.init_state(config.seed, params=sft_params)
    ckpt.save(0, state, ledger=book)
  summary = dict(seed=config.seed, mode=config.rl.mode, **book["sft_eval"])
  state, rl_info = rl_stage(s, step, state, book, ckpt)
  ckpt.close()
  summary.update(evaluate(s, state.params, config.eval.num_heldout, "rl"))
  full = config.eval.full_window_max_seq_len
  if full:  # the reference: the same weights with a window the sessions fit in
    summary.update(evaluate(s, state.params, config.eval.num_heldout, "rl_full_window",
                            context_mode="none", max_seq_len=full))
  if config.init_checkpoint:  # exportable: launch/convert_checkpoint.py --export_from
    hf_qwen3.save_trained(os.path.join(workdir, "final_params"), s.model_config,
                          jax.device_get(state.params), config.init_checkpoint)
  summary.update(rl_info, total_seconds=time.time() - t0)
  summary["gain_points"] = 100 * (summary["heldout_solve_rate_rl"]
                                  - summary["heldout_solve_rate_sft"])
  s.metrics.close()
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump(summary, f)
  print(json.dumps({k: v for k, v in summary.items() if k != "sampler_stats"}), flush=True)
  return summary
