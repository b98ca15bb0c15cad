"""Scripted policies (the environment's oracle, null, adversary) rendered as trajectories.

Expert demonstrations for SFT must have exactly the token layout the model sees at RL time,
so a scripted session goes through the same `ChatFormat` and the same environment as a
model session; its turns are marked as sampled (loss_mask 1) with log-prob 0 and
version -1 (no policy produced them).
"""
from composer_rl.rollout.chat import ChatFormat
from composer_rl.rollout.session import LiveSession, Trajectory


def scripted_trajectory(policy, task, env, chat: ChatFormat, system_prompt: str = "",
                        group_id: int = 0, session_id: int = 0) -> Trajectory:
  """Runs `policy` (reset(task, compact), act(obs) -> text) through `env` to a reward."""
  traj = Trajectory(task_id=task.id, group_id=group_id, session_id=session_id, tokens=[],
                    loss_mask=[], logprobs=[], versions=[])
  s = LiveSession(traj=traj, env=env)
  try:
    obs = env.reset()
    s.extend_context(chat.start(system_prompt, obs))
    policy.reset(task, getattr(env.config, "compact_prompt", False))
    while True:
      text = policy.act(obs)
      for tok in chat.tok.encode(text) + [chat.end_of_turn]:
        s.append(tok, sampled=True)
      traj.turns += 1
      traj.turn_texts.append(text)
      res = env.step(text)
      obs = res.observation
      traj.observations.append(obs)
      if res.done:
        break
      s.extend_context(chat.observation(obs))
    result = env.grade()
    traj.reward = float(result.reward)
    traj.finish_reason = "submitted"
    traj.metrics = {k: float(v) for k, v in env.metrics.items() if isinstance(v, (int, float))}
  finally:
    env.close()
  return traj
