"""One agent session's token-level record: what the model saw and what it sampled.

A `Trajectory` is the unit the trainer consumes: the whole session's tokens in order
(prompt, every model turn, every tool observation), with, per token, whether the model
sampled it (`loss_mask`), the log-prob it was sampled with (`logprobs`, from the engine,
bit-identical to the trainer's recomputation under the same weights) and the policy
version that sampled it (`versions`, -1 for tokens the model did not sample).
"""
import dataclasses
from typing import Any, Dict, List, Optional

import numpy as np


@dataclasses.dataclass
class Trajectory:
  """A finished session (see module docstring).

  task_id / group_id: the task and the group of G rollouts of it (advantages are computed
    within a group).
  reward: the grader's final reward; reward_info: its breakdown and logged hack attempts.
  turns: number of model turns; finish_reason: 'submitted', 'turn_budget', 'token_budget',
    'context_full' or 'error'.
  metrics: malformed tool calls, seconds spent in tools, etc.

  Optional fields for inspection (composer_rl.viewer), filled by the rollout runner when
  it finishes a session; records written before they existed load with these defaults:
  prompt: the text the environment opened the session with (`env.reset()`, which holds
    the task and instructions); system_prompt: the runner's system message.
  task_info: what the environment knows of its task ({"id", "family", "split"}).
  final_diff: unified diff of the session's work tree against the task's original files
    (None when the environment cannot produce one).
  segments: context compaction boundaries (`composer_rl.rollout.compaction`, when the
    runner's `RolloutConfig.compaction` is enabled): [{"turn": first turn after the
    boundary, "token": index in `tokens` where the restarted context begins, "summary":
    the text that replaced the turns before it}]. `tokens`/`loss_mask`/`logprobs`/
    `versions` are then the concatenation of the contexts; each context is trained as its
    own sequence (`compaction.segment_records`). Empty = one context.
  """
  task_id: str
  group_id: int
  session_id: int
  tokens: List[int]
  loss_mask: List[int]
  logprobs: List[float]
  versions: List[int]
  reward: float = 0.0
  reward_info: Dict[str, Any] = dataclasses.field(default_factory=dict)
  turns: int = 0
  finish_reason: str = ""
  metrics: Dict[str, float] = dataclasses.field(default_factory=dict)
  turn_texts: List[str] = dataclasses.field(default_factory=list)
  observations: List[str] = dataclasses.field(default_factory=list)
  prompt: Optional[str] = None
  system_prompt: Optional[str] = None
  task_info: Dict[str, Any] = dataclasses.field(default_factory=dict)
  final_diff: Optional[str] = None
  segments: List[Dict[str, Any]] = dataclasses.field(default_factory=list)
  # {"temperature", "top_k", "top_p"} every sampled token was drawn under, when it is the
  # session's own (online sessions from the server); None = the experiment's settings.
  sampling: Optional[Dict[str, float]] = None

  @property
  def num_generated(self) -> int:
    return int(sum(self.loss_mask))

  def min_version(self) -> int:
    v = [x for x in self.versions if x >= 0]
    return min(v) if v else -1

  def to_json(self) -> Dict[str, Any]:
    d = dataclasses.asdict(self)
    d["logprobs"] = np.asarray(self.logprobs, np.float32).view(np.uint32).tolist()
    d["logprobs_are_uint32_bits"] = True  # floats travel as their exact bits
    return d

  @classmethod
  def from_json(cls, d: Dict[str, Any]) -> "Trajectory":
    d = dict(d)
    if d.pop("logprobs_are_uint32_bits", False):
      d["logprobs"] = np.asarray(d["logprobs"], np.uint32).view(np.float32).tolist()
    return cls(**d)


@dataclasses.dataclass
class LiveSession:
  """Bookkeeping of a session in flight (owned by the rollout runner)."""
  traj: Trajectory
  env: Any
  saved: Optional[Any] = None      # engine Prefix (its cache and length) while off a slot
  saved_version: int = -1          # policy version that computed `saved`
  turn_tokens: int = 0             # tokens sampled in the current turn
  turn_start: int = 0              # index in traj.tokens where the current turn began
  # Context compaction (composer_rl.rollout.compaction): the engine only ever sees the
  # current context, traj.tokens[context_start:], at cache positions from 0.
  context_start: int = 0           # index in traj.tokens where the current context began
  context_turn0: int = 0           # traj.turns when the current context began
  summarizing: bool = False        # the current model turn is the summary turn

  def append(self, token: int, sampled: bool, logprob: float = 0.0, version: int = -1):
    t = self.traj
    t.tokens.append(int(token))
    t.loss_mask.append(1 if sampled else 0)
    t.logprobs.append(float(logprob))
    t.versions.append(int(version) if sampled else -1)

  def extend_context(self, tokens: List[int]) -> None:
    for tok in tokens:
      self.append(tok, sampled=False)
