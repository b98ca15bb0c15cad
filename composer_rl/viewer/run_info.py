"""The run-level data of the overview: metrics by step, the summary, the TensorBoard dir.

`W/metrics.jsonl` (train/metrics.py: MetricsWriter) has one row per (phase, step);
phases of an agent-RL run: 'demos', 'sft', 'eval_sft', 'rl', 'eval_rl'. A resumed run
truncates and rewrites its RL rows, and a row may be written twice around a crash, so the
last row of each (phase, step) wins. `W/summary.json` exists once the run has finished.
"""
import json
import os
from typing import Any, Dict, List

# RL metrics the overview draws or tabulates (any of them may be missing).
RL_KEYS = ("reward_mean", "solve_rate", "staleness_mean", "dropped_stale", "skipped_no_signal",
           "malformed_rate", "trained_tokens_per_s", "generated_tokens", "step_seconds",
           "idle_seconds", "trainer_idle_fraction", "loss", "entropy", "kl_behaviour",
           "ratio_not_one_frac", "clip_frac", "tool_seconds")
SFT_KEYS = ("loss", "entropy", "grad_norm", "learning_rate")


def read_metrics(workdir: str) -> List[Dict[str, Any]]:
  path = os.path.join(workdir, "metrics.jsonl")
  rows: Dict[tuple, Dict[str, Any]] = {}
  if not os.path.exists(path):
    return []
  with open(path) as f:
    for line in f:
      try:
        r = json.loads(line)
      except ValueError:  # a line cut by a crash, or being written right now
        continue
      if isinstance(r, dict):
        rows[(r.get("phase"), r.get("step"))] = r
  return list(rows.values())


def _series(rows, phase: str, keys) -> Dict[str, List]:
  rows = sorted((r for r in rows if r.get("phase") == phase), key=lambda r: r.get("step", 0))
  out: Dict[str, List] = {"step": [r.get("step", 0) for r in rows]}
  for k in keys:
    if any(isinstance(r.get(k), (int, float)) for r in rows):
      out[k] = [r.get(k) if isinstance(r.get(k), (int, float)) else None for r in rows]
  if "generated_tokens" in out and "step_seconds" in out:
    # tokens the samplers delivered per second of trainer wall time (what the trainer saw)
    out["sampler_tokens_per_s"] = [g / s if g is not None and s else None for g, s in
                                   zip(out["generated_tokens"], out["step_seconds"])]
  return out


def run_info(workdir: str) -> Dict[str, Any]:
  """{"rl": series, "sft": series, "evals": {phase: row}, "summary", "tensorboard"}."""
  rows = read_metrics(workdir)
  evals = {r["phase"]: r for r in rows if str(r.get("phase", "")).startswith("eval_")}
  demos = [r for r in rows if r.get("phase") == "demos"]
  summary = None
  path = os.path.join(workdir, "summary.json")
  if os.path.exists(path):
    try:
      with open(path) as f:
        summary = json.load(f)
    except ValueError:
      summary = None
  tb = os.path.join(os.path.abspath(workdir), "tensorboard")
  return dict(workdir=os.path.abspath(workdir), rl=_series(rows, "rl", RL_KEYS),
              sft=_series(rows, "sft", SFT_KEYS), evals=evals,
              demos=demos[-1] if demos else None, summary=summary,
              tensorboard=tb if os.path.isdir(tb) else None,
              curves_png=os.path.exists(os.path.join(workdir, "curves.png")))
