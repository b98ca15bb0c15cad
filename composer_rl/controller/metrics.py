"""Run metrics: JSONL (one object per step), TensorBoard event files, a console line, and a
PNG of the main curves at the end of a run."""
import json
import math
import os
import time
from typing import Dict, List, Optional

from absl import logging

_CONSOLE_KEYS = ("loss", "reward_mean", "solve_rate", "staleness_mean", "entropy", "sampler_tokens_per_s",
                 "trainer_tokens_per_s", "malformed_rate")
_PLOT_KEYS = ("reward_mean", "solve_rate", "entropy", "kl_behaviour", "staleness_mean",
              "trainer_idle_fraction")


class MetricsWriter:
  """Writes `workdir/metrics.jsonl` and `workdir/tensorboard/`; `close()` draws curves.png."""

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
    with open(path) as f:
      rows = [json.loads(line) for line in f if line.strip()]
    keep = [r for r in rows if not (r.get("phase") == phase and r.get("step", 0) >= step)]
    with open(path + ".tmp", "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in keep)
    os.replace(path + ".tmp", path)
    self._jsonl = open(path, "a", buffering=1)
    self.history = keep

  def write(self, step: int, metrics: Dict[str, float], phase: str = "rl") -> None:
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
    keys = _CONSOLE_KEYS if phase in ("sft", "rl") else [k for k in row if k not in
                                                          ("step", "phase", "time")]
    shown = " ".join(f"{k}={row[k]:.3g}" for k in keys if isinstance(row.get(k), float))
    logging.info("[%s %d] %s", phase, step, shown)
    print(f"[{phase} {step}] {shown}", flush=True)

  def plot(self, path: Optional[str] = None) -> Optional[str]:
    rows = [r for r in self.history if r.get("phase") == "rl"]
    keys = [k for k in _PLOT_KEYS if any(k in r for r in rows)]
    if not rows or not keys:
      return None
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
    fig, axes = plt.subplots(1, len(keys), figsize=(3.2 * len(keys), 2.8), squeeze=False)
    for ax, k in zip(axes[0], keys):
      xs = [r["step"] for r in rows if k in r]
      ax.plot(xs, [r[k] for r in rows if k in r], marker=".")
      ax.set_title(k)
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
