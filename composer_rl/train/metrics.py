"""Training metrics: the one writer every training path uses (JSONL, TensorBoard, console,
a PNG of the curves), and the trainer's run summary."""
import json
import math
import os
import time
from typing import Any, Dict, List, Optional

from absl import logging

_CONSOLE_KEYS = ("loss", "reward_mean", "solve_rate", "staleness_mean", "grad_norm",
                 "ratio_mean", "entropy", "learning_rate", "sampler_tokens_per_s",
                 "trained_tokens_per_s", "malformed_rate")
# Curves drawn per phase: RL's signal, then the loss (SFT, pretraining).
_PLOT_KEYS = ("reward_mean", "solve_rate", "entropy", "kl_behaviour", "staleness_mean",
              "trainer_idle_fraction", "loss")


class MetricsWriter:
  """Writes `workdir/metrics.jsonl` (one row per (phase, step)), `workdir/tensorboard/`
  (scalars as `phase/name`) and a console line per row; `close()` draws curves.png. Every
  training path (the trainer, agent RL, online RL, the pipeline's stages) writes through it.

  A resumed run calls `truncate_phase(phase, step)` first: rows it will write again are
  dropped, so the log of a killed-and-resumed run equals an uninterrupted one row for row
  (timings aside). A line cut by a kill is dropped too."""

  def __init__(self, workdir: str, tensorboard: bool = True):
    os.makedirs(workdir, exist_ok=True)
    self.workdir = workdir
    self._jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a", buffering=1)
    self._tb = None
    if tensorboard:
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
      self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))
    self.history: List[Dict] = []
    self._t0 = time.time()

  def truncate_phase(self, phase: str, step: int) -> None:
    """Drops `phase` rows at or after `step` (a resumed run logs those steps again)."""
    path = os.path.join(self.workdir, "metrics.jsonl")
    self._jsonl.close()
    rows = []
    with open(path) as f:
      for line in f:
        try:
          rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by a kill
          continue
    keep = [r for r in rows if not (r.get("phase") == phase and r.get("step", 0) >= step)]
    with open(path + ".tmp", "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in keep)
    os.replace(path + ".tmp", path)
    self._jsonl = open(path, "a", buffering=1)
    self.history = keep

  def write(self, step: int, metrics: Dict[str, Any], phase: str = "rl",
            echo: bool = True) -> None:
    """One row; `echo`: also print its main values (a console line)."""
    row = {"step": int(step), "phase": phase, "time": round(time.time() - self._t0, 2)}
    for k, v in metrics.items():
      if isinstance(v, (int, float)) and math.isfinite(float(v)):
        row[k] = float(v)
      elif isinstance(v, (list, dict, str)):
        row[k] = v
    self._jsonl.write(json.dumps(row) + "\n")
    self.history.append(row)
    if self._tb is not None:
      for k, v in row.items():
        if isinstance(v, float) and k != "time":
          self._tb.add_scalar(f"{phase}/{k}", v, step)
    if not echo:
      return
    keys = [k for k in _CONSOLE_KEYS if k in row] or [
        k for k in row if k not in ("step", "phase", "time")]
    shown = " ".join(f"{k}={row[k]:.4g}" for k in keys if isinstance(row.get(k), float))
    logging.info("[%s %d] %s", phase, step, shown)
    print(f"[{phase} {step}] {shown}", flush=True)

  def plot(self, path: Optional[str] = None) -> Optional[str]:
    """curves.png: one row of panels per training phase (RL phases' reward, solve rate,
    entropy, ...; SFT's and pretraining's loss)."""
    panels = []
    for phase in dict.fromkeys(r.get("phase") for r in self.history):
      rows = [r for r in self.history if r.get("phase") == phase]
      keys = [k for k in _PLOT_KEYS if sum(k in r for r in rows) > 1]
      if keys:
        panels.append((phase, rows, keys))
    if not panels:
      return None
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
    width = max(len(keys) for _, _, keys in panels)
    fig, axes = plt.subplots(len(panels), width, figsize=(3.2 * width, 2.8 * len(panels)),
                             squeeze=False)
    for (phase, rows, keys), line in zip(panels, axes):
      for ax in line[len(keys):]:
        ax.axis("off")
      for ax, k in zip(line, keys):
        xs = [r["step"] for r in rows if k in r]
        ax.plot(xs, [r[k] for r in rows if k in r], marker=".")
        ax.set_title(f"{phase}: {k}")
        ax.set_xlabel("step")
    fig.tight_layout()
    path = path or os.path.join(self.workdir, "curves.png")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path

  def close(self) -> None:
    self.plot()
    self._jsonl.close()
    if self._tb is not None:
      self._tb.close()


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
