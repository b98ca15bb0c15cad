"""What a rollout session does when its context fills up, at a turn boundary (the runner's
part of `rollout.compaction`): fire the trigger, ask for a summary ('compaction'), restart
the context from (system, task, summary), or cut old turns ('truncation').

A mixin of `RolloutRunner`: it uses the runner's `cfg`, `chat`, `engine`, `_turn_starts`,
`_context_len` and `_end_turn_text`.
"""
from typing import List

from composer_rl.rollout import compaction as compaction_lib
from composer_rl.rollout.session import LiveSession


class ContextBoundary:
  """The context-boundary steps of a rollout session (see module docstring)."""

  def _triggers(self, s: LiveSession, obs_tokens: List[int]) -> bool:
    """Whether the context trigger fires at this turn boundary (any mode but 'none')."""
    c = self.cfg.compaction
    return c.active and compaction_lib.should_compact(
        c, self._context_len(s) + len(obs_tokens), s.traj.turns - s.context_turn0,
        len(s.traj.segments), self.engine.config.max_seq_len)

  def _ask_summary(self, s: LiveSession, obs: str, obs_tokens: List[int]):
    """'compaction': the model sees the observation, then is asked for a summary (its next
    turn), provided the instruction and a one-token summary still fit."""
    c = self.cfg.compaction
    if not compaction_lib.summary_fits(self.chat, c, self._context_len(s) + len(obs_tokens),
                                       self.engine.config.max_seq_len):
      return None
    s.summarizing = True
    return compaction_lib.instruction_tokens(self.chat, obs, c.instruction)

  def _truncate(self, s: LiveSession, obs: str, obs_tokens: List[int]):
    """'truncation': ends the current context after the last model turn and returns the
    next one, (system, task, the most recent whole turns, the observation), which is
    prefilled once from an empty cache; None when even (system, task, observation) would
    leave no room for a turn."""
    t, c, n = s.traj, self.cfg.compaction, self.engine.config.max_seq_len
    head = self.chat.start(self.cfg.system_prompt, t.prompt or "")
    starts = self._turn_starts[t.session_id]
    k = compaction_lib.truncation_cut(len(head), starts, len(t.tokens), len(obs_tokens),
                                      int(c.truncation_keep_fraction * n))
    kept_from = starts[k] if k < len(starts) else len(t.tokens)
    new = head + t.tokens[kept_from:] + obs_tokens
    if len(new) + 2 >= n:
      return None
    t.metrics["truncations"] = t.metrics.get("truncations", 0.0) + 1.0
    t.metrics["dropped_turns"] = t.metrics.get("dropped_turns", 0.0) + float(k)
    t.segments.append(dict(turn=t.turns, token=len(t.tokens), summary="", dropped_turns=k))
    s.saved = None  # the old context's cache is never extended again
    s.context_start, s.context_turn0 = len(t.tokens), t.turns
    # The kept turns move to their place in the new context.
    offset = len(t.tokens) + len(head) - kept_from
    self._turn_starts[t.session_id] = [p + offset for p in starts[k:]]
    return new

  def _restart_context(self, s: LiveSession, ready: List[LiveSession]) -> bool:
    """Ends the summary turn and starts the next context from (system, task, summary);
    False (nothing restarted) when that context would not leave room for a model turn.

    The old context's cache is dropped (`saved = None`): the new context is prefilled once,
    from an empty cache at position 0, exactly the sequence the trainer scores alone."""
    t = s.traj
    turn = t.tokens[s.turn_start:]
    if turn and turn[-1] == self.chat.end_of_turn:
      turn = turn[:-1]
    sampled = sum(t.loss_mask[s.turn_start:])
    text = self._end_turn_text(s)  # closes a cut summary with an unsampled end-of-turn
    s.saved, s.summarizing = None, False
    # The summary's tokens were sampled (and are trained) even if no context follows.
    t.metrics["summary_tokens"] = t.metrics.get("summary_tokens", 0.0) + float(sampled)
    new = compaction_lib.restart_tokens(self.chat, self.cfg.system_prompt, t.prompt or "",
                                        compaction_lib.summary_ids(self.chat, turn))
    if len(new) + 2 >= self.engine.config.max_seq_len:  # same rule as an observation's
      return False
    t.metrics["compactions"] = t.metrics.get("compactions", 0.0) + 1.0
    t.segments.append(dict(turn=t.turns, token=len(t.tokens), summary=text))
    s.context_start, s.context_turn0 = len(t.tokens), t.turns
    s.extend_context(new)
    s.turn_tokens, s.turn_start = 0, len(t.tokens)
    self._turn_starts[t.session_id] = [s.turn_start]
    ready.append(s)
    return True
