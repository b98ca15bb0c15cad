"""Which record files a run has, and what each one is.

The controller (`composer_rl/controller/agent_rl.py`) writes every batch of trajectories
(`Trajectory.to_json`, one per line) to:

  W/rollouts/rl_step_NNNNN.jsonl  the groups RL step N trained on (`write_rollouts` in
                                  `rl_stage`); with remote workers the controller still
                                  writes this file from the groups it consumed
  W/rollouts/eval_<tag>.jsonl     greedy held-out evaluation (`evaluate`): tag 'sft' before
                                  RL, 'rl' after; one session per task (its own group)
  W/demos_<hash>.jsonl            the scripted demonstrations SFT imitated (`demonstrations`)

Any other `W/rollouts/*.jsonl` is shown under its file name, after these.
"""
import dataclasses
import glob
import os
import re
from typing import List

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


@dataclasses.dataclass(frozen=True)
class Source:
  """One record file: `name` (file stem, used in URLs and data file names), `kind`
  ('demos', 'eval', 'rl' or 'other'), `step` (RL step for 'rl', else -1), `label`."""
  name: str
  path: str
  kind: str
  step: int
  label: str

  @property
  def order(self):
    rank = {"demos": 0, "eval_sft": 1, "rl": 2, "eval_rl": 3}
    key = self.name if self.name in rank else self.kind
    return (rank.get(key, 4), self.step, self.name)


def _describe(path: str) -> Source:
  stem = os.path.basename(path)[:-len(".jsonl")]
  name = _SAFE.sub("_", stem)
  m = re.fullmatch(r"rl_step_(\d+)", stem)
  if m:
    return Source(name, path, "rl", int(m.group(1)), f"RL step {int(m.group(1))}")
  if stem.startswith("eval_"):
    return Source(name, path, "eval", -1, f"held-out eval ({stem[5:]})")
  if stem.startswith("demos_"):
    return Source(name, path, "demos", -1, "SFT demonstrations")
  return Source(name, path, "other", -1, stem)


def find_sources(workdir: str) -> List[Source]:
  """The run's record files in viewing order (demos, eval before RL, RL steps, eval after)."""
  paths = glob.glob(os.path.join(workdir, "rollouts", "*.jsonl"))
  paths += glob.glob(os.path.join(workdir, "demos_*.jsonl"))
  return sorted((_describe(p) for p in paths), key=lambda s: s.order)
