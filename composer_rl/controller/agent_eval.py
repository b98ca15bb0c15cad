"""Evaluation of the agent (greedy held-out solve rate), what its sessions look like
against the window, and the rollout files every step and evaluation writes."""
import json
import os
import time
from typing import Dict, List

import numpy as np

from composer_rl.controller.agent_setup import Setup
from composer_rl.env.harness import make_env
from composer_rl.env import call_syntax
from composer_rl.env.tool_call_format import ToolCallError
from composer_rl.progress import progress
from composer_rl.rollout import compaction as compaction_lib
from composer_rl.rollout.session import Trajectory


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


def changed_code(t: Trajectory, syntax: str) -> bool:
  """Whether the session made a well-formed edit/write call (an attempt to fix), in the
  run's call syntax (an `env.call_syntax` name)."""
  parse = call_syntax.get(syntax).parse
  for text in t.turn_texts:
    try:
      if parse(text).name in ("edit", "write_file"):
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
  mode = context_mode or s.config.eval.context_mode
  engine = s.eval_engine(max_seq_len)
  runner = s.runner(params, version=-1, greedy=True, seed=12345, engine=engine,
                    context_mode=mode)
  jobs = [(f"heldout-{i}", i, make_env(s.task("heldout", i), s.env_config))
          for i in range(count)]
  t0 = time.time()
  with progress(count, f"evaluation ({tag})", "sessions") as bar:
    trajs = runner.run(jobs, max_in_flight=s.config.rl.max_in_flight,
                       on_result=lambda _: bar.update(1))
  write_rollouts(s, f"eval_{tag}", trajs)
  solved = np.asarray([t.reward >= 1.0 for t in trajs])
  edited = np.asarray([changed_code(t, s.env_config.call_syntax) for t in trajs])
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
