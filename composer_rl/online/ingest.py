"""Online-RL ingestion: the server's record log plus user feedback -> training trajectories.

The server (`composer_rl.serving`) appends a `completion` record for every choice it
returns and a `feedback` record for every feedback call (schema in
`composer_rl.serving.records`). `OnlineSessionSource` scans the log once and turns it into
`Trajectory` objects the trainer consumes like rollouts:

Sessions. Completions are grouped by conversation_id and ordered by `created`. Within a
conversation a completion EXTENDS an existing branch when its prompt_ids start with that
branch's last prompt_ids + completion_ids (a later turn of the same conversation; the
tokens in between are tool results or user messages, trained with loss_mask 0) and that
last completion is not another choice of its own response. When several branches qualify,
the one with the longest token history wins. A completion that
extends no branch starts a new one: the n>1 choices of one request (same prompt, each its
own trajectory), a client that edited or regenerated history (the new branch's prompt
carries the earlier turns as context, loss_mask 0, so no sampled token is trained twice).

Trajectory fields: tokens = the branch's full token history; loss_mask 1 exactly on
sampled tokens; logprobs = the sampler's float32 log-probs there (from their bits), 0.0
elsewhere; versions = each completion's policy_version on its tokens, -1 elsewhere;
task_id = conversation_id; group_id = a stable hash of the first completion's prompt_ids
(the choices of one request, and any other session that started from the identical
prompt, share a group, so group-relative advantages compare samples of one prompt);
session_id = a stable hash of (conversation_id, first record id); turns = completions in
the branch; finish_reason = the last completion's; turn_texts = the assistant message
contents; metrics = {"online": 1.0, "feedback": count, "version_lag": current_version -
oldest policy_version}.

Feedback join. Feedback with a completion_id attaches to the branch holding that record
(a record id "<completion_id>:<choice>" names one choice; a bare response id names every
choice of that response, so it attaches to each of their branches). Feedback with only a
conversation_id attaches to every branch of the conversation (a conversation-level verdict
applies to all its attempts). Feedback that matches nothing is counted in
`stats["feedback_unmatched"]`.

Reward. Each attached feedback whose signal has a weight in `RewardSpec.weights`
contributes weight * value, where value is 1/0 for a bool, the number itself for a
number, and 1 for a null value of a presence signal (accepted, rejected, thumbs_up,
thumbs_down, correction: giving the signal is the statement); a task_outcome without a
value contributes nothing. Contributions are summed (repeated signals add up). A session
with feedback none of which contributes gets `RewardSpec.default`.
"""
import copy
import dataclasses
import hashlib
import json
import time
from typing import Any, Dict, List, Optional, Tuple

import grain
import numpy as np

from composer_rl.rollout.session import Trajectory
from composer_rl.serving.records import bits_float, read_records

PRESENCE_SIGNALS = frozenset({"accepted", "rejected", "thumbs_up", "thumbs_down", "correction"})
SIGNALS = PRESENCE_SIGNALS | {"task_outcome"}

_COMPLETION_KEYS = ("id", "completion_id", "conversation_id", "created", "prompt_ids",
                    "completion_ids", "logprobs_bits", "policy_version", "finish_reason")


def _default_weights() -> Dict[str, float]:
  return {"accepted": 1.0, "rejected": -1.0, "thumbs_up": 0.5, "thumbs_down": -0.5,
          "task_outcome": 1.0}


@dataclasses.dataclass(frozen=True)
class RewardSpec:
  """How feedback becomes a session's reward (module docstring has the rule).

  weights: signal -> weight; signals without a weight do not contribute.
  default: reward of a session whose feedback has no weighted signal (and, when
    `require_feedback` is False, of a session without any).
  require_feedback: drop sessions no feedback attaches to.
  judge / judge_weight: an LLM-judge rubric scored over the session text. Not available
    online: `composer_rl.env.judge` needs a judge model (a prompt -> text callable) and an
    environment's tool-step trajectory, and ingestion has neither, so setting it raises
    NotImplementedError.
  """
  weights: Dict[str, float] = dataclasses.field(default_factory=_default_weights)
  default: float = 0.0
  require_feedback: bool = True
  judge: str = ""
  judge_weight: float = 1.0

  def __post_init__(self):
    unknown = set(self.weights) - SIGNALS
    if unknown:
      raise ValueError(f"RewardSpec.weights has unknown signals {sorted(unknown)}; "
                       f"known: {sorted(SIGNALS)}")
    if self.judge:
      raise NotImplementedError(
          f"RewardSpec.judge={self.judge!r}: judge rewards are not wired into online "
          "ingestion (composer_rl.env.judge needs a judge model callable and an "
          "environment trajectory)")

  def signal_value(self, feedback: Dict[str, Any]) -> Optional[float]:
    """The numeric value of one feedback record, or None if it states none."""
    v = feedback.get("value")
    if isinstance(v, (bool, int, float)):
      return float(v)
    if v is None and feedback.get("signal") in PRESENCE_SIGNALS:
      return 1.0
    return None

  def reward(self, feedback: List[Dict[str, Any]]) -> Tuple[float, Dict[str, Any]]:
    """(reward, reward_info) of a session with this feedback."""
    used, total, contributed = [], 0.0, False
    for f in feedback:
      value = self.signal_value(f)
      weight = self.weights.get(f.get("signal"))
      term = None if value is None or weight is None else weight * value
      if term is not None:
        total += term
        contributed = True
      used.append({"id": f.get("id"), "signal": f.get("signal"), "value": f.get("value"),
                   "text": f.get("text"), "contribution": term})
    return (total if contributed else self.default), {
        "feedback": used, "default_reward": not contributed}


@dataclasses.dataclass(frozen=True, kw_only=True)
class IngestLimits:
  """Which sessions are trained on.

  require_consent: keep a session only if some record of it (its completions and the
    feedback attached to it) has consent True. A record with consent False drops the
    session whatever this says: an explicit refusal is always honoured.
  max_tokens: drop sessions with more tokens than this.
  max_age_versions: drop a session whose oldest completion was sampled more than this many
    policy versions before `current_version` (online data's own staleness limit).
  max_age_seconds: drop a session whose oldest completion is older than this relative to
    `now`; 0 disables.
  """
  require_consent: bool = True
  max_tokens: int
  max_age_versions: int
  max_age_seconds: float = 0.0


def _stable_int(data: bytes) -> int:
  """A hash of `data` in [0, 2**31), the same in every process (unlike `hash`)."""
  return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") % (1 << 31)


@dataclasses.dataclass
class _Branch:
  completions: List[Dict[str, Any]]
  head: List[int]  # the last completion's prompt_ids + completion_ids
  feedback: List[Dict[str, Any]] = dataclasses.field(default_factory=list)


def _branches(completions: List[Dict[str, Any]]) -> List[_Branch]:
  """One conversation's completions split into chains (module docstring)."""
  branches: List[_Branch] = []
  for c in sorted(completions, key=lambda c: (c["created"], c["id"])):
    prompt = c["prompt_ids"]
    best = None
    for b in branches:
      n = len(b.head)
      # Another choice of the same response never extends (an empty choice's history
      # would otherwise be a prefix of its siblings' prompt).
      if (prompt[:n] == b.head and b.completions[-1]["completion_id"] != c["completion_id"]
          and (best is None or n > len(best.head))):
        best = b
    if best is None:
      best = _Branch([], [])
      branches.append(best)
    best.completions.append(c)
    best.head = list(prompt) + list(c["completion_ids"])
  return branches


def _oldest_version(b: _Branch) -> int:
  return min(int(c["policy_version"]) for c in b.completions)


def _trajectory(b: _Branch, reward: float, reward_info: Dict[str, Any],
                current_version: int) -> Trajectory:
  tokens: List[int] = []
  loss_mask: List[int] = []
  logprobs: List[float] = []
  versions: List[int] = []
  for c in b.completions:
    context = c["prompt_ids"][len(tokens):]
    sampled = c["completion_ids"]
    tokens += context + sampled
    loss_mask += [0] * len(context) + [1] * len(sampled)
    logprobs += [0.0] * len(context) + bits_float(c["logprobs_bits"])
    versions += [-1] * len(context) + [int(c["policy_version"])] * len(sampled)
  first = b.completions[0]
  conversation = first["conversation_id"]
  texts = [(c.get("response") or {}).get("content") for c in b.completions]
  return Trajectory(
      task_id=conversation,
      group_id=_stable_int(np.asarray(first["prompt_ids"], np.int64).tobytes()),
      session_id=_stable_int(f"{conversation}\0{first['id']}".encode()),
      tokens=tokens, loss_mask=loss_mask, logprobs=logprobs, versions=versions,
      reward=float(reward), reward_info=reward_info, turns=len(b.completions),
      finish_reason=b.completions[-1]["finish_reason"],
      metrics={"online": 1.0, "feedback": float(len(b.feedback)),
               "version_lag": float(current_version - _oldest_version(b))},
      turn_texts=[t if isinstance(t, str) else "" for t in texts],
      sampling=_sampling(first))


def _sampling(c: Dict[str, Any]) -> Dict[str, float]:
  """The transform a completion was sampled under (what the trainer must score)."""
  s = c["sampling"]
  return dict(temperature=float(s["temperature"]), top_k=int(s.get("top_k") or 0),
              top_p=float(s.get("top_p", 1.0)))


def _scan(records_dir: str, stats: Dict[str, int]) -> Tuple[Dict[str, List], List]:
  """({conversation_id: [completion records]}, [feedback records]) from the log, counting
  what it skips in `stats`."""
  def skipped(path, offset, reason):
    stats["torn_records_skipped"] += 1

  completions: Dict[str, List[Dict[str, Any]]] = {}
  feedback: List[Dict[str, Any]] = []
  seen = set()
  for r in read_records(records_dir, on_skip=skipped):
    stats["records"] += 1
    kind = r.get("kind")
    if kind == "completion":
      ok = (all(k in r for k in _COMPLETION_KEYS)
            and len(r["completion_ids"]) == len(r["logprobs_bits"]))
    elif kind == "feedback":
      ok = ("id" in r and "signal" in r
            and bool(r.get("conversation_id") or r.get("completion_id")))
    else:
      continue  # a kind this reader does not know
    if not ok:
      stats["malformed_records"] += 1
      continue
    if (kind, r["id"]) in seen:  # e.g. a retried append
      stats["duplicate_records"] += 1
      continue
    seen.add((kind, r["id"]))
    if kind == "completion":
      completions.setdefault(r["conversation_id"], []).append(r)
    else:
      feedback.append(r)
  return completions, feedback


def _join_feedback(by_conversation: Dict[str, List[_Branch]],
                   feedback: List[Dict[str, Any]]) -> int:
  """Attaches each feedback record to its branches (module docstring); returns how many
  matched none."""
  by_record, by_response = {}, {}
  for branches in by_conversation.values():
    for b in branches:
      for c in b.completions:
        by_record[c["id"]] = b
        by_response.setdefault(c["completion_id"], []).append(b)
  unmatched = 0
  for f in sorted(feedback, key=lambda f: f.get("created", 0.0)):
    cid = f.get("completion_id")
    if cid:
      targets = [by_record[cid]] if cid in by_record else by_response.get(cid, [])
    else:
      targets = by_conversation.get(f["conversation_id"], [])
    for b in targets:
      b.feedback.append(f)
    unmatched += not targets
  return unmatched


class OnlineSessionSource:
  """The kept online sessions as a grain RandomAccessDataSource of `Trajectory` objects.

  Built by one scan of `records_dir` (`composer_rl.serving.records`); `len()` and
  `[i]` serve the sessions that passed `limits`, in order of their first completion. Each
  access returns a fresh copy, so a consumer may modify what it gets.

  current_version: the trainer's policy version now (for `limits.max_age_versions`).
  now: unix seconds the age limit is measured from (default: the time of the scan).
  stats: counts from the scan -- records (good records read), torn_records_skipped (torn
    or corrupt lines), malformed_records (missing fields), duplicate_records (an id seen
    before), conversations, sessions (branches), kept, dropped_no_consent,
    dropped_no_feedback, dropped_too_long, dropped_mixed_sampling (turns sampled under
    different transforms), dropped_stale, dropped_too_old,
    feedback_unmatched. Each dropped session is counted once, under the first of those
    checks (in that order) it fails.
  """

  def __init__(self, records_dir: str, reward: RewardSpec, limits: IngestLimits,
               current_version: int, now: Optional[float] = None):
    now = time.time() if now is None else now
    stats = dict.fromkeys(
        ["records", "torn_records_skipped", "malformed_records", "duplicate_records",
         "conversations", "sessions", "kept", "dropped_no_consent", "dropped_no_feedback",
         "dropped_too_long", "dropped_mixed_sampling", "dropped_stale", "dropped_too_old",
         "feedback_unmatched"], 0)
    completions, feedback = _scan(records_dir, stats)
    by_conversation = {conv: _branches(cs) for conv, cs in completions.items()}
    stats["feedback_unmatched"] = _join_feedback(by_conversation, feedback)
    stats["conversations"] = len(by_conversation)
    kept = []
    for branches in by_conversation.values():
      for b in branches:
        stats["sessions"] += 1
        drop = self._drop_reason(b, reward, limits, current_version, now)
        if drop:
          stats[drop] += 1
          continue
        r, info = reward.reward(b.feedback)
        kept.append((b.completions[0]["created"], _trajectory(b, r, info, current_version)))
    kept.sort(key=lambda x: (x[0], x[1].session_id))
    self._sessions = [t for _, t in kept]
    stats["kept"] = len(self._sessions)
    self.stats = stats

  @staticmethod
  def _drop_reason(b: _Branch, reward: RewardSpec, limits: IngestLimits,
                   current_version: int, now: float) -> Optional[str]:
    consents = [r.get("consent") for r in b.completions + b.feedback]
    if False in consents or (limits.require_consent and True not in consents):
      return "dropped_no_consent"
    if reward.require_feedback and not b.feedback:
      return "dropped_no_feedback"
    if len(b.head) > limits.max_tokens:
      return "dropped_too_long"
    if len({json.dumps(_sampling(c), sort_keys=True) for c in b.completions}) > 1:
      # One transform per trained sequence: the trainer scores a row under one setting.
      return "dropped_mixed_sampling"
    if current_version - _oldest_version(b) > limits.max_age_versions:
      return "dropped_stale"
    oldest = min(c["created"] for c in b.completions)
    if limits.max_age_seconds > 0 and now - oldest > limits.max_age_seconds:
      return "dropped_too_old"
    return None

  def __len__(self) -> int:
    return len(self._sessions)

  def __getitem__(self, index: int) -> Trajectory:
    return copy.deepcopy(self._sessions[index])

  def __repr__(self) -> str:
    return f"OnlineSessionSource(kept={len(self._sessions)}, stats={self.stats})"


def online_dataset(source: OnlineSessionSource, seed: int, batch_size: int,
                   drop_remainder: bool = False) -> grain.MapDataset:
  """Seeded-shuffled batches (plain lists) of `batch_size` trajectories from `source`;
  one pass is one epoch over every kept session (`.repeat()` it for more)."""
  if batch_size <= 0:
    raise ValueError(f"batch_size must be positive, got {batch_size}")
  return (grain.MapDataset.source(source).shuffle(seed=seed)
          .batch(batch_size, drop_remainder=drop_remainder, batch_fn=list))
