"""The agent's SFT stage: demonstrations by a scripted demonstrator in the real sandbox
(cached in the workdir), rendered in the RL token layout, optionally mixed with synthetic
copy rows (`data.copy_curriculum`); and the saved SFT policy of an earlier run."""
import dataclasses
import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from typing import List

import numpy as np

from composer_rl.controller.agent_setup import Setup
from composer_rl.data import copy_curriculum
from composer_rl.env.harness import make_env
from composer_rl.env.policies import make_policy
from composer_rl.progress import progress
from composer_rl.rollout import compaction as compaction_lib
from composer_rl.rollout.scripted import scripted_trajectory
from composer_rl.rollout.session import Trajectory
from composer_rl.train import stages
from composer_rl.train.checkpoint import Checkpointer


def demonstrations(s: Setup) -> List[Trajectory]:
  """Scripted sessions of `config.sft.demo_policy` on the first train tasks, all kept
  (an imperfect demonstrator's failures are part of what SFT imitates). Cached in the
  workdir under a name that hashes everything they depend on."""
  c = s.config.sft
  # Demonstrations summarize where RL would (`compaction.mode='compaction'`), whatever
  # mode RL then trains with: every arm of an ablation starts from the same SFT policy.
  comp = dataclasses.replace(s.compaction(), mode="compaction") if (
      s.compaction().enabled) else None
  family = s.config.tasks.family
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
  with ThreadPoolExecutor(s.config.rl.tool_workers) as pool, progress(
      c.num_demos, "demonstrations", "sessions") as bar:
    demos = []
    for d in pool.map(one, range(c.num_demos)):
      demos.append(d)
      bar.update(1)
  with open(path + ".tmp", "w") as f:
    for d in demos:
      f.write(json.dumps(d.to_json()) + "\n")
  os.replace(path + ".tmp", path)
  return demos


def sft_stage(s: Setup, init_params=None):
  """SFT from `init_params` (e.g. a continued-pretraining checkpoint's, host arrays) or,
  when None, from a fresh initialization with the experiment's seed."""
  c = s.config.sft
  # copy_rows: synthetic copy rows in every batch (data.copy_curriculum), for models
  # trained from scratch that must copy what they read; 0 = demonstrations only.
  # copy_rows_kind / copy_rows_args: which rows (a COPY_ROWS name) and their arguments.
  n_copy = c.copy_rows
  if not 0 <= n_copy < c.batch_size:
    raise ValueError(f"sft.copy_rows={n_copy} must be in [0, batch_size={c.batch_size})")
  copy_kind, copy_args = c.copy_rows_kind, dict(c.copy_rows_args)
  # copy_only_steps: the first SFT steps train on copy rows alone. Mixed into batches, the
  # copied tokens are a few percent of the trained ones (the loss is a mean over tokens),
  # too faint a signal to form the copy (BUILD_NOTES section 11).
  n_copy_only = c.copy_only_steps
  if not 0 <= n_copy_only <= c.steps:
    raise ValueError(f"sft.copy_only_steps={n_copy_only} must be in [0, steps={c.steps}]")
  if n_copy or n_copy_only:
    # A bad kind, argument or row length fails here, before any demonstration is made.
    copy_curriculum.copy_records(np.random.default_rng(0), s.tok, 1,
                                 s.model_config.max_seq_len, copy_kind, **copy_args)
  demos = demonstrations(s)
  s.metrics.write(0, dict(demos=len(demos), demo_reward=float(np.mean([d.reward for d in demos]))),
                  phase="demos")
  # One row per context (a compacted demonstration is several sequences, see
  # rollout.compaction); without compaction the rows are the demonstrations themselves.
  rows = [r for d in demos for r in compaction_lib.segment_records(d)]
  window = s.model_config.max_seq_len
  too_long = [len(r["tokens"]) for r in rows if len(r["tokens"]) > window]
  if too_long:
    raise ValueError(
        f"{len(too_long)} of {len(rows)} demonstration contexts are longer than "
        f"model.max_seq_len={window} (longest {max(too_long)} tokens) and context compaction "
        "is off for them: raise model.max_seq_len, shorten env.system_prompt or env.tools, "
        "or enable rl.compaction")
  rng = np.random.default_rng(s.config.seed)
  copy_rng = np.random.default_rng([s.config.seed, 1])

  def sample(k):
    n_demo = 0 if k < n_copy_only else c.batch_size - n_copy
    pick = rng.choice(len(rows), n_demo, replace=len(rows) < n_demo)
    return [rows[i] for i in pick] + copy_curriculum.copy_records(
        copy_rng, s.tok, c.batch_size - n_demo, s.model_config.max_seq_len, copy_kind,
        **copy_args)
  return stages.sft_stage(s.model_config, s.mesh, learning_rate=c.learning_rate,
                          warmup_steps=c.warmup_steps, steps=c.steps,
                          batch_size=c.batch_size, sample=sample, metrics=s.metrics,
                          log_every=c.log_every, seed=s.config.seed, init_params=init_params)


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
