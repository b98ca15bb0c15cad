"""Context compaction inside the RL loop (issue #7): summarize, restart the context, go on.

When a session's context nears the model's window, the runner asks the agent (one user
message, `CompactionConfig.instruction`) to summarize its work. The summary is an ordinary
model turn: sampled under the session's sampling config, every token recorded with its
log-prob and policy version, and trained like any other generated token with the
session's final reward. The context then restarts from an empty KV cache as

  <BOS><SYS>system<EOT><USER>task<EOT><USER>summary<EOT><ASSISTANT>

and the session continues. A `Trajectory` keeps the concatenation of its contexts;
`Trajectory.segments[k]["token"]` is where context k+1 starts in `tokens`. Each context
is its own training sequence (`segment_records`): the trainer scores it alone, from
position 0, exactly as the engine sampled it, so behaviour and trainer log-probs agree
bit for bit.

`CompactionConfig.mode` chooses what happens when the trigger fires (`CONTEXT_MODES`):
'compaction' (the summary turn above), 'truncation' (the baseline: the oldest complete
turns -- model turn + its observation -- are dropped, system prompt and task kept, and the
shortened context is prefilled once from an empty cache; a segment boundary like a
compaction's, with no summary turn) or 'none' (no restart: a full context ends the session
'context_full', as with `enabled=False`).

This module holds the config and the pure pieces (when to compact, the token layouts,
splitting a trajectory into per-context records); `composer_rl.rollout.runner` drives it.
"""
import dataclasses
import hashlib
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

# CompactionConfig.mode -> what a firing trigger does; the runner maps each name to one
# handler (`RolloutRunner._BOUNDARY`), 'none' to no handler at all.
CONTEXT_MODES = ("none", "compaction", "truncation")


@dataclasses.dataclass(frozen=True)
class CompactionConfig:
  """When and how a session compacts its context.

  enabled: off by default; a disabled config changes nothing in the runner.
  trigger_fraction: compact at the next turn boundary (a tool observation came back, the
    next model turn has not started) once the current context, observation included,
    holds >= this fraction of the model's `max_seq_len`. The rest of the window must hold
    the instruction and the summary, so keep it well below 1 (e.g. 0.75).
  max_turns_per_context: also compact once this many model turns ran in the current
    context (0 = no turn trigger).
  max_compactions: cap per session. Once reached, a context that fills up ends the session
    as without compaction (finish_reason 'context_full').
  summary_max_tokens: tokens the summary turn may sample; a longer summary is cut and
    closed with an unsampled end-of-turn, as any turn cut by its budget.
  instruction: the user message that asks for the summary. Keep it short: on the tiny
    byte-level models every byte is a token of the context.
  mode: what a firing trigger does, one of `CONTEXT_MODES`: 'compaction' (summary turn,
    restart from system+task+summary), 'truncation' (drop the oldest whole turns, restart
    from system+task+the turns kept; no summary), 'none' (nothing; like enabled=False).
  truncation_keep_fraction: truncation only: the oldest turns are dropped (at least one)
    until the restarted context, the pending observation included, holds <= this fraction
    of `max_seq_len`. Lower = fewer restarts, less recent history kept.
  """
  enabled: bool = False
  trigger_fraction: float = 0.75
  max_turns_per_context: int = 0
  max_compactions: int = 2
  summary_max_tokens: int = 64
  instruction: str = "Summarize your work so far."
  mode: str = "compaction"
  truncation_keep_fraction: float = 0.5

  @property
  def active(self) -> bool:
    """Whether a firing trigger does anything (enabled and a mode other than 'none')."""
    return self.enabled and self.mode != "none"

  def __post_init__(self):
    if self.mode not in CONTEXT_MODES:
      raise ValueError(f"mode must be one of {CONTEXT_MODES}, got {self.mode!r}")
    if not 0.0 < self.truncation_keep_fraction <= 1.0:
      raise ValueError("truncation_keep_fraction must be in (0, 1], got "
                       f"{self.truncation_keep_fraction}")
    if not 0.0 < self.trigger_fraction <= 1.0:
      raise ValueError(f"trigger_fraction must be in (0, 1], got {self.trigger_fraction}")
    if self.max_turns_per_context < 0 or self.max_compactions < 0:
      raise ValueError("max_turns_per_context and max_compactions must be >= 0")
    if self.summary_max_tokens < 1:
      raise ValueError(f"summary_max_tokens must be >= 1, got {self.summary_max_tokens}")


def should_compact(cfg: CompactionConfig, context_tokens: int, turns_in_context: int,
                   compactions: int, max_seq_len: int) -> bool:
  """Whether a session compacts at this turn boundary.

  Args:
    cfg: the compaction config.
    context_tokens: tokens the current context would hold at the next model turn (the
      tool observation and the next turn's header included).
    turns_in_context: model turns finished since the context (re)started.
    compactions: compactions this session already did.
    max_seq_len: the model's window (the engine's KV cache length).
  """
  if not cfg.active or compactions >= cfg.max_compactions:
    return False
  if context_tokens >= cfg.trigger_fraction * max_seq_len:
    return True
  return 0 < cfg.max_turns_per_context <= turns_in_context


def summary_fits(chat, cfg: CompactionConfig, context_tokens: int, max_seq_len: int) -> bool:
  """Whether a context of `context_tokens` (the observation included) still has room for
  the instruction and at least a one-token summary (and its end-of-turn)."""
  extra = len(instruction_tokens(chat, "", cfg.instruction)) - len(chat.observation(""))
  return context_tokens + extra + 2 < max_seq_len


def truncation_cut(head: int, turn_starts: Sequence[int], end: int, pending: int,
                   keep_tokens: int) -> int:
  """How many of the oldest turns a truncation drops: the fewest (>= 1) such that
  head + tokens[turn_starts[k]:end] + pending <= keep_tokens; all of them when none does.

  Args:
    head: tokens of the restarted context's start (system prompt and task).
    turn_starts: index (in the trajectory) where each model turn of the current context
      begins, oldest first; a turn runs to the next one's start (its observation included).
    end: index where the current context ends (the pending observation not included).
    pending: tokens of the observation that follows (it stays in the new context).
    keep_tokens: the restarted context's target size.
  """
  k = 1
  while k < len(turn_starts) and head + (end - turn_starts[k]) + pending > keep_tokens:
    k += 1
  return k


def segment_seed(seed: int, segment: int) -> int:
  """The sampling seed of a session's context `segment` (0 = before any compaction).

  A token's RNG key is (seed, session id, position) and positions restart at 0 in a new
  context, so reusing the seed would replay the first context's random draws; each later
  context gets its own seed instead. Segment 0 keeps `seed`, so sessions that never
  compact sample exactly as without compaction. (Log-probs do not depend on the key: the
  trainer never needs it.)
  """
  if segment == 0:
    return int(seed)
  h = hashlib.sha256(f"composer_rl-context:{int(seed)}:{int(segment)}".encode()).digest()
  return int.from_bytes(h[:4], "big")


def _without_header(chat, ids: List[int], what: str) -> Tuple[List[int], List[int]]:
  """(ids without the trailing assistant header, the header) of a `chat.start` or
  `chat.observation`; any chat format (`rollout.formats`) has `generation_ids`."""
  head = chat.generation_ids()
  if ids[len(ids) - len(head):] != head:
    raise ValueError(f"the chat format's {what} must end with the assistant header")
  return ids[:len(ids) - len(head)], head


def instruction_tokens(chat, observation: str, instruction: str) -> List[int]:
  """What follows the assistant's end-of-turn at a compacting boundary: the tool's
  observation, then the instruction as a user message, then the assistant header (byte
  format: `<TOOL>observation<EOT><USER>instruction<EOT><ASSISTANT>`; Qwen3: the
  `<tool_response>` turn, a user turn, `<|im_start|>assistant`)."""
  obs, head = _without_header(chat, chat.observation(observation), "observation")
  return obs + chat.user_ids(chat.tok.encode(instruction)) + head


def summary_ids(chat, turn_tokens: Sequence[int]) -> List[int]:
  """The summary turn's tokens as they are carried into the new context: the turn without
  its end-of-turn and without special tokens (a stray sampled role token must not open a
  message inside the summary). Token ids are carried, not re-encoded text, so a byte the
  model sampled stays that byte (history is appended, never re-rendered)."""
  tok = chat.tok
  is_special = getattr(tok, "is_special", lambda i: False)
  return [int(t) for t in turn_tokens if not is_special(int(t))]


def restart_tokens(chat, system: str, task: str, summary: Sequence[int]) -> List[int]:
  """The token ids a restarted context starts from (and is prefilled with, once): the
  session's start without its assistant header, the summary as a user message, the header
  (byte format: `<BOS><SYS>system<EOT><USER>task<EOT><USER>summary<EOT><ASSISTANT>`).

  `summary` is token ids (`summary_ids`). Built from `chat.start`, so the system prompt
  and task render exactly as at the session's start.
  """
  start, head = _without_header(chat, chat.start(system, task), "start")
  return start + chat.user_ids([int(t) for t in summary]) + head


def segment_bounds(traj) -> List[Tuple[int, int]]:
  """[(start, end)) token ranges of a trajectory's contexts, in order."""
  starts = [0] + [int(seg["token"]) for seg in (getattr(traj, "segments", None) or [])]
  ends = starts[1:] + [len(traj.tokens)]
  return list(zip(starts, ends))


def segment_records(traj) -> List[Dict[str, Any]]:
  """One training record per context of `traj` (see `composer_rl.train.batch.build_batch`):
  tokens, loss_mask, logprobs and versions of that context alone. A trajectory without
  compaction gives one record equal to the whole trajectory (the same row as before)."""
  out = []
  for a, b in segment_bounds(traj):
    out.append(dict(tokens=list(traj.tokens[a:b]), loss_mask=list(traj.loss_mask[a:b]),
                    logprobs=list(traj.logprobs[a:b]), versions=list(traj.versions[a:b])))
  return out


def expand_segments(trajs: Sequence[Any], advantages: Sequence[float]
                    ) -> Tuple[List[Dict[str, Any]], np.ndarray]:
  """Per-context training rows of `trajs` and their advantages: each session's advantage
  (computed per session, within its group) is repeated for every one of its contexts, so
  the summary and everything before and after it share the session's final reward."""
  records, adv = [], []
  for t, a in zip(trajs, advantages):
    rs = segment_records(t)
    records.extend(rs)
    adv.extend([a] * len(rs))
  return records, np.asarray(adv, np.float32)
