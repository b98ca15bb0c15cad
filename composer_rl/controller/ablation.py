"""The context-compaction ablation (issue #7): the same agent experiment, one arm per way of
meeting the window, with the same training budget.

`run(config, workdir)` is what `launch/train.py` runs for `kind='compaction_ablation'`
(`experiments/tiny_compaction.py:ablation`). `config.agent` is an agent-RL experiment
(`composer_rl.controller.agent_rl`); `config.arms` maps an arm name to
[RL context mode, evaluation context mode] (`composer_rl.rollout.compaction.CONTEXT_MODES`):
  compaction            ['compaction', 'compaction']  summaries trained in the loop
  compaction_eval_only  ['none', 'compaction']        RL never compacts; evaluation does
  truncation            ['truncation', 'truncation']  drop the oldest turns instead
Every arm runs `agent_rl.run` in workdir/<arm> with only those two fields changed. The
SFT stage's inputs do not depend on them (demonstrations summarize in every arm, the same
seed), so SFT runs once, in the first arm, and every later arm starts RL from that arm's
saved SFT policy: the arms differ in RL and evaluation alone. With `config.agent.eval.full_window_max_seq_len`
each arm's RL policy is also evaluated with a window its sessions fit in (the reference;
`max_seq_len` is a compute field, the parameters are the arm's).

Every arm resumes from its own workdir and a finished arm is read back from its
summary.json (`pipeline._stage`), so re-running the command after a kill continues where
it stopped. The last stdout line is one JSON summary: per arm, the held-out solve rates
(after SFT, after RL, RL with the full window) and how sessions met the window (tokens per
session mean/max, context restarts per session, summary tokens).
"""
import json
import os
from typing import Any, Dict

import ml_collections

from composer_rl.controller import agent_rl
from composer_rl.controller import config as config_lib
from composer_rl.controller.pipeline import _stage
from composer_rl.rollout.compaction import CONTEXT_MODES

# What each arm reports, from its agent_rl summary (tag suffixes: _sft, _rl, ...).
_EVAL_KEYS = ("heldout_solve_rate", "heldout_session_tokens_mean", "heldout_session_tokens_max",
              "heldout_context_tokens_max", "heldout_context_restarts_mean",
              "heldout_context_restarts_max", "heldout_summary_tokens_mean",
              "heldout_summary_tokens_per_compaction", "heldout_context_full_rate")


def arm_config(config, train_mode: str, eval_mode: str) -> ml_collections.ConfigDict:
  """`config.agent` with RL rollouts in `train_mode` and evaluation in `eval_mode`."""
  for m in (train_mode, eval_mode):
    if m not in CONTEXT_MODES:
      raise ValueError(f"context mode {m!r}: choose one of {CONTEXT_MODES}")
  c = ml_collections.ConfigDict(config.agent.to_dict())  # an unlocked copy
  c.rl.compaction.mode = train_mode
  c.eval.context_mode = eval_mode
  return c


def _arm_summary(s: Dict[str, Any]) -> Dict[str, Any]:
  out = {}
  for tag in ("sft", "rl", "rl_full_window"):
    for k in _EVAL_KEYS:
      if f"{k}_{tag}" in s:
        out[f"{k}_{tag}"] = s[f"{k}_{tag}"]
  out["gain_points"] = s.get("gain_points")
  out["rl_steps_per_hour"] = s.get("rl_steps_per_hour")
  return out


def run(config, workdir: str) -> Dict[str, Any]:
  config_lib.validate(config, "compaction_ablation")
  os.makedirs(workdir, exist_ok=True)
  arms = {name: tuple(modes) for name, modes in config.arms.items()}
  configs = {name: arm_config(config, *modes) for name, modes in arms.items()}  # fail early
  out: Dict[str, Any] = dict(
      seed=config.agent.seed, window=config.agent.model.max_seq_len,
      full_window=config.agent.eval.full_window_max_seq_len,
      rl_steps=config.agent.rl.steps, task_family=config.agent.tasks.family, arms={})
  first = os.path.join(workdir, next(iter(arms)))
  for name, modes in arms.items():
    summary = _stage(os.path.join(workdir, name), lambda d, c=configs[name]: agent_rl.run(
        c, d, sft_from="" if d == first else first))
    out["arms"][name] = dict(train_context_mode=modes[0], eval_context_mode=modes[1],
                             **_arm_summary(summary))
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump(out, f)
  print(json.dumps(out), flush=True)
  return out
