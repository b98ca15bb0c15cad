"""Scripted policies (the environment's oracle, null, adversary) rendered as trajectories.

Expert demonstrations for SFT must have exactly the token layout the model sees at RL time,
so a scripted session goes through the same `ChatFormat` and the same environment as a
model session; its turns are marked as sampled (loss_mask 1) with log-prob 0 and
version -1 (no policy produced them).

Context compaction (`compaction` with mode 'compaction', and `max_seq_len`): a policy with
a `summarize()` method is asked for a summary exactly where the rollout runner would ask
the model (same trigger, same instruction, same summary budget), and the session restarts
from (system, task, summary) as a new segment, so a demonstration teaches the summary turn
in the layout RL samples it in (`composer_rl.rollout.compaction`). Without compaction, or
for a policy that cannot summarize, a context that would overflow `max_seq_len` ends the
session 'context_full' as the runner does, and so does a turn that would not fit (the
runner would cut it at the window); no limit when `max_seq_len` is 0.
"""
from typing import List, Optional

from composer_rl.rollout import compaction as compaction_lib
from composer_rl.rollout.chat import ChatFormat
from composer_rl.rollout.session import LiveSession, Trajectory


def _summarize(policy, s: LiveSession, chat: ChatFormat, cfg, obs: str,
               max_seq_len: int) -> List[int]:
  """Appends the instruction and the policy's summary turn, cut where the runner cuts a
  sampled one (its summary budget, or the window's last position), then closed by an
  unsampled end-of-turn. Returns the summary's token ids."""
  s.extend_context(compaction_lib.instruction_tokens(chat, obs, cfg.instruction))
  budget = min(cfg.summary_max_tokens, max_seq_len - 1 - (len(s.traj.tokens) - s.context_start))
  ids = chat.tok.encode(policy.summarize())
  cut = len(ids) >= budget
  ids = ids[:budget]
  for tok in ids:
    s.append(tok, sampled=True)
  s.append(chat.end_of_turn, sampled=not cut)
  t = s.traj
  t.metrics["summary_tokens"] = t.metrics.get("summary_tokens", 0.0) + float(
      len(ids) + (not cut))
  return ids


def scripted_trajectory(policy, task, env, chat: ChatFormat, system_prompt: str = "",
                        group_id: int = 0, session_id: int = 0,
                        compaction: Optional[compaction_lib.CompactionConfig] = None,
                        max_seq_len: int = 0) -> Trajectory:
  """Runs `policy` (reset(task, syntax), act(obs) -> text) through `env` to a reward."""
  traj = Trajectory(task_id=task.id, group_id=group_id, session_id=session_id, tokens=[],
                    loss_mask=[], logprobs=[], versions=[])
  s = LiveSession(traj=traj, env=env)
  comp = compaction if (compaction is not None and max_seq_len and compaction.active
                        and compaction.mode == "compaction"
                        and hasattr(policy, "summarize")) else None
  metrics = {}
  finish = "submitted"
  try:
    obs = env.reset()
    traj.prompt, traj.system_prompt = obs, system_prompt
    s.extend_context(chat.start(system_prompt, obs))
    policy.reset(task, env.config.call_syntax)
    while True:
      text = policy.act(obs)
      turn = chat.tok.encode(text) + [chat.end_of_turn]
      if max_seq_len and len(traj.tokens) - s.context_start + len(turn) >= max_seq_len:
        # The runner would cut this turn at the window; a demonstration ends instead.
        finish = "context_full"
        break
      for tok in turn:
        s.append(tok, sampled=True)
      traj.turns += 1
      traj.turn_texts.append(text)
      res = env.step(text)
      obs = res.observation
      traj.observations.append(obs)
      if res.done:
        break
      obs_tokens = chat.observation(obs)
      ctx = len(traj.tokens) - s.context_start
      if comp is not None and compaction_lib.should_compact(
          comp, ctx + len(obs_tokens), traj.turns - s.context_turn0, len(traj.segments),
          max_seq_len) and compaction_lib.summary_fits(chat, comp, ctx + len(obs_tokens),
                                                       max_seq_len):
        ids = _summarize(policy, s, chat, comp, obs, max_seq_len)
        new = compaction_lib.restart_tokens(chat, system_prompt, traj.prompt,
                                            compaction_lib.summary_ids(chat, ids))
        if len(new) + 2 >= max_seq_len:
          finish = "context_full"
          break
        traj.metrics["compactions"] = traj.metrics.get("compactions", 0.0) + 1.0
        traj.segments.append(dict(turn=traj.turns, token=len(traj.tokens),
                                  summary=chat.tok.decode(ids)))
        s.context_start, s.context_turn0 = len(traj.tokens), traj.turns
        s.extend_context(new)
        continue
      if max_seq_len and ctx + len(obs_tokens) + 2 >= max_seq_len:
        finish = "context_full"
        break
      s.extend_context(obs_tokens)
    result = env.grade()
    traj.reward = float(result.reward)
    traj.finish_reason = finish
    metrics = {k: float(v) for k, v in env.metrics.items() if isinstance(v, (int, float))}
  finally:
    env.close()
  traj.metrics = {**metrics, **traj.metrics}
  return traj
