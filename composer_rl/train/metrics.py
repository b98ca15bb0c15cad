"""Training metrics: a JSONL log that survives resumption, console lines, the run summary."""
import json
import os
from typing import Any, Dict, List


class MetricsLog:
  """Appends one JSON object per step to `path`.

  On resume from step k, lines with step > k (written after the checkpoint the run restarts
  from) are dropped first, so the log of a killed-and-resumed run equals an uninterrupted
  one line for line (timings aside).
  """

  def __init__(self, path: str, resume_step: int = 0):
    self.path = path
    kept = []
    if os.path.exists(path):
      with open(path) as f:
        for line in f:
          try:
            rec = json.loads(line)
          except json.JSONDecodeError:  # a line cut by a kill
            continue
          if rec.get("step", 0) <= resume_step:
            kept.append(line if line.endswith("\n") else line + "\n")
    with open(path, "w") as f:
      f.writelines(kept)
    self.f = open(path, "a")

  def write(self, record: Dict[str, Any]) -> None:
    self.f.write(json.dumps(record) + "\n")
    self.f.flush()

  def close(self) -> None:
    self.f.close()


def console_line(m: Dict[str, Any]) -> str:
  keys = ("loss", "reward_mean", "grad_norm", "ratio_mean", "entropy", "learning_rate")
  if "reward_mean" not in m:  # SFT: no behaviour policy, so no importance ratio
    keys = tuple(k for k in keys if k != "ratio_mean")
  parts = [f"step {int(m['step'])}"] + [f"{k} {m[k]:.4g}" for k in keys if k in m]
  return " | ".join(parts)


def summary(mode: str, start: int, steps: int, history: List[Dict[str, Any]],
            seconds: float) -> Dict[str, Any]:
  out: Dict[str, Any] = dict(mode=mode, resumed_from=start, steps=steps,
                             seconds=round(seconds, 2))
  if history:
    k = max(1, len(history) // 5)
    for key in ("loss", "reward_mean"):
      if key in history[0]:
        out[f"{key}_first"] = float(sum(h[key] for h in history[:k]) / k)
        out[f"{key}_last"] = float(sum(h[key] for h in history[-k:]) / k)
    if mode not in ("sft", "pretrain"):  # they have no behaviour policy to compare with
      out["ratio_not_one_frac_max"] = max(h["ratio_not_one_frac"] for h in history)
  return out
