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
"""
import json
import os
import time
from typing import Dict, List

import jax
import numpy as np
from flax import nnx

from composer_rl.controller.metrics import MetricsWriter
from composer_rl.controller.rollout_factory import Group, Ledger, RolloutFactory
from composer_rl.data.byte_tokenizer import ByteTokenizer
from composer_rl.env.harness import EnvConfig, make_env
from composer_rl.env.policies import make_policy
from composer_rl.env.tasks import generated
from composer_rl.model import ModelConfig, Transformer, inference_copy, sharding
from composer_rl.rollout.chat import ChatFormat
from composer_rl.rollout.runner import RolloutConfig, RolloutRunner
from composer_rl.rollout.scripted import scripted_trajectory
from composer_rl.rollout.session import Trajectory
from composer_rl.sampling.engine import Engine
from composer_rl.train import advantages as adv_lib
from composer_rl.train import losses
from composer_rl.train.batch import build_batch
from composer_rl.train.optimizer import OptimizerConfig
from composer_rl.train.sft import make_sft_step
from composer_rl.train.train_step import TrainConfig, make_train_step


class Setup:
  """Everything both stages share, built once from the config."""

  def __init__(self, config, workdir: str):
    self.config, self.workdir = config, workdir
    self.tok = ByteTokenizer()
    self.chat = ChatFormat(self.tok)
    self.model_config = ModelConfig(**dict(config.model), vocab_size=self.tok.vocab_size)
    self.mesh = sharding.make_mesh({"data": -1})
    self.shards = sharding.num_batch_shards(self.mesh)
    self.env_config = EnvConfig(compact_prompt=True, max_turns=config.env.max_turns,
                                grade_timeout_s=config.env.grade_timeout_s)
    abstract = nnx.eval_shape(lambda: Transformer(self.model_config, rngs=nnx.Rngs(0)))
    self.engine = Engine(abstract, slots=config.rl.slots,
                         prefill_chunk=config.rl.prefill_chunk)
    self.metrics = MetricsWriter(workdir)

  def rows(self, n: int) -> int:
    """Batch rows for n records: padded up to a multiple of the batch shards."""
    return -(-n // self.shards) * self.shards

  def task(self, split: str, index: int):
    return generated.generate(split, index, self.config.tasks.seed)

  def runner(self, params, version: int, greedy: bool, seed: int) -> RolloutRunner:
    c = self.config.rl
    rcfg = RolloutConfig(max_turns=self.config.env.max_turns, max_turn_tokens=c.max_turn_tokens,
                         temperature=1.0 if greedy else c.temperature,
                         top_k=1 if greedy else c.top_k, top_p=1.0 if greedy else c.top_p,
                         seed=seed, tool_workers=c.tool_workers)
    return RolloutRunner(self.engine, self.chat, rcfg,
                         inference_copy(params, self.model_config), version)


def oracle_demos(s: Setup, count: int) -> List[Trajectory]:
  """Oracle sessions on the first `count` train tasks (cached in the workdir)."""
  path = os.path.join(s.workdir, "oracle_demos.jsonl")
  if os.path.exists(path):
    with open(path) as f:
      demos = [Trajectory.from_json(json.loads(line)) for line in f]
    if len(demos) >= count:
      return demos[:count]
  from concurrent.futures import ThreadPoolExecutor  # pylint: disable=g-import-not-at-top

  def one(i):
    task = s.task("train", i)
    return scripted_trajectory(make_policy("oracle"), task, make_env(task, s.env_config),
                               s.chat, session_id=i)
  with ThreadPoolExecutor(s.config.rl.tool_workers) as pool:
    demos = [d for d in pool.map(one, range(count)) if d.reward == 1.0]
  with open(path + ".tmp", "w") as f:
    for d in demos:
      f.write(json.dumps(d.to_json()) + "\n")
  os.replace(path + ".tmp", path)
  return demos


def write_rollouts(s: Setup, name: str, trajs: List[Trajectory]) -> None:
  """Appends trajectories (exact logprob bits, turn texts, rewards) to workdir/rollouts/."""
  d = os.path.join(s.workdir, "rollouts")
  os.makedirs(d, exist_ok=True)
  with open(os.path.join(d, f"{name}.jsonl"), "a") as f:
    for t in trajs:
      f.write(json.dumps(t.to_json()) + "\n")


def evaluate(s: Setup, params, count: int, tag: str) -> Dict[str, float]:
  runner = s.runner(params, version=-1, greedy=True, seed=12345)
  jobs = [(f"heldout-{i}", i, make_env(s.task("heldout", i), s.env_config))
          for i in range(count)]
  t0 = time.time()
  trajs = runner.run(jobs, max_in_flight=s.config.rl.max_in_flight)
  write_rollouts(s, f"eval_{tag}", trajs)
  solved = np.mean([t.reward >= 1.0 for t in trajs])
  out = {f"heldout_solve_rate_{tag}": float(solved),
         f"heldout_reward_{tag}": float(np.mean([t.reward for t in trajs])),
         f"eval_seconds_{tag}": time.time() - t0}
  s.metrics.write(0, out, phase=f"eval_{tag}")
  return out


def sft_stage(s: Setup):
  c = s.config.sft
  step = make_sft_step(s.model_config, OptimizerConfig(
      learning_rate=c.learning_rate, warmup_steps=c.warmup_steps, total_steps=c.steps),
      s.mesh)
  state = step.init_state(s.config.seed)
  demos = oracle_demos(s, c.num_demos)
  rng = np.random.default_rng(s.config.seed)
  for k in range(c.steps):
    pick = rng.choice(len(demos), c.batch_size, replace=len(demos) < c.batch_size)
    batch = build_batch([demos[i] for i in pick], s.model_config.max_seq_len,
                        num_rows=s.rows(c.batch_size))
    state, m = step.step(state, step.shard_batch(batch))
    if k % c.log_every == 0 or k == c.steps - 1:
      s.metrics.write(k, {k2: float(v) for k2, v in jax.device_get(m).items()}, phase="sft")
  return state


def _train_on(s: Setup, step, state, groups: List[Group], stats: Dict) -> tuple:
  c = s.config.rl
  version = int(state.step)
  fresh = [g for g in groups if version - g.min_version <= c.max_staleness]
  stats["dropped_stale"] = len(groups) - len(fresh)
  trajs = [t for g in fresh for t in g.trajectories]
  if not trajs:
    return state, {}
  rewards = np.asarray([t.reward for t in trajs], np.float32)
  gids = np.asarray([t.group_id for t in trajs], np.int32)
  adv = np.asarray(adv_lib.compute_advantages(c.advantage, rewards, gids))
  if not np.any(adv):
    # Every group was all-success or all-failure: no learning signal. Skipping the update
    # also stops AdamW's momentum from moving the weights on zero gradients.
    stats["skipped_no_signal"] = 1
    return state, dict(reward_mean=float(rewards.mean()),
                       solve_rate=float(np.mean(rewards >= 1.0)))
  batch = build_batch(trajs, s.model_config.max_seq_len,
                      num_rows=s.rows(c.groups_per_step * c.group_size), advantages=adv,
                      temperature=c.temperature,
                      top_k=c.top_k, top_p=c.top_p)
  state, m = step.step(state, step.shard_batch(batch))
  out = {k: float(v) for k, v in jax.device_get(m).items()}
  out.update(reward_mean=float(rewards.mean()), solve_rate=float(np.mean(rewards >= 1.0)),
             staleness_mean=float(np.mean([version - t.min_version() for t in trajs])),
             malformed_rate=float(np.mean([t.metrics.get("malformed_calls", 0) / max(t.turns, 1)
                                           for t in trajs])),
             tool_seconds=float(np.mean([t.metrics.get("tool_seconds", 0.0) for t in trajs])),
             generated_tokens=float(sum(t.num_generated for t in trajs)))
  return state, out


def rl_stage(s: Setup, params) -> tuple:
  c = s.config.rl
  step = make_train_step(s.model_config, TrainConfig(
      optimizer=OptimizerConfig(learning_rate=c.learning_rate, warmup_steps=0,
                                total_steps=max(c.steps, 1), end_lr_ratio=1.0),
      loss=losses.LossConfig(policy_loss=c.policy_loss, clip_eps_low=c.clip_eps,
                             clip_eps_high=c.clip_eps_high)), s.mesh)
  state = step.init_state(s.config.seed, params=params)
  runner = s.runner(state.params, version=int(state.step), greedy=False, seed=s.config.seed)
  counter = iter(range(10**9))
  num_train = c.num_train_tasks
  rng = np.random.default_rng(s.config.seed + 1)

  def next_group():
    gid = next(counter)
    return gid, int(rng.integers(0, num_train))
  factory = RolloutFactory(runner, next_group, lambda i: make_env(s.task("train", i),
                                                                  s.env_config),
                           c.group_size, c.max_in_flight, c.queue_groups, Ledger())
  if c.mode == "async":
    factory.start()
  idle = busy = 0.0
  try:
    for k in range(c.steps):
      t0 = time.time()
      if c.mode == "async":
        groups = [factory.get() for _ in range(c.groups_per_step)]
      else:
        groups = factory.collect(c.groups_per_step)
      t1 = time.time()
      stats: Dict = {}
      write_rollouts(s, f"rl_step_{k:05d}", [t for g in groups for t in g.trajectories])
      state, m = _train_on(s, step, state, groups, stats)
      runner.set_params(inference_copy(state.params, s.model_config), int(state.step))
      t2 = time.time()
      idle += t1 - t0
      busy += t2 - t1
      factory.ledger.consumed.extend(g.group_id for g in groups)
      m.update(stats, trainer_idle_fraction=idle / max(idle + busy, 1e-9),
               step_seconds=t2 - t0,
               trainer_tokens_per_s=m.get("generated_tokens", 0.0) / max(t2 - t1, 1e-9))
      s.metrics.write(k, m, phase="rl")
  finally:
    factory.stop()
  return state, dict(trainer_idle_fraction=idle / max(idle + busy, 1e-9),
                     rl_steps_per_hour=c.steps / max(idle + busy, 1e-9) * 3600,
                     sampler_stats=dict(runner.stats))


def run(config, workdir: str) -> Dict:
  os.makedirs(workdir, exist_ok=True)
  t0 = time.time()
  s = Setup(config, workdir)
  state = sft_stage(s)
  summary = dict(seed=config.seed, mode=config.rl.mode)
  summary.update(evaluate(s, state.params, config.eval.num_heldout, "sft"))
  state, rl_info = rl_stage(s, state.params)
  summary.update(evaluate(s, state.params, config.eval.num_heldout, "rl"))
  summary.update(rl_info, total_seconds=time.time() - t0)
  summary["gain_points"] = 100 * (summary["heldout_solve_rate_rl"]
                                  - summary["heldout_solve_rate_sft"])
  s.metrics.close()
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump(summary, f)
  print(json.dumps({k: v for k, v in summary.items() if k != "sampler_stats"}), flush=True)
  return summary
