"""Run a scripted policy through the harness to a reward (tests, demos, benchmarks)."""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional

from composer_rl.env.harness import EnvConfig, make_env
from composer_rl.env.policies import make_policy
from composer_rl.env.reward import RewardResult


@dataclasses.dataclass
class EpisodeResult:
    task_id: str
    policy: str
    reward: float
    result: RewardResult
    trajectory: List[dict]
    metrics: Dict[str, Any]

    @property
    def hack_attempts(self) -> List[dict]:
        return self.result.hack_attempts


def run_episode(policy, task, config: Optional[EnvConfig] = None,
                sandbox=None) -> EpisodeResult:
    """`policy` is a registry name or a policy object, writing its calls in the config's
    call syntax; the world is always cleaned up."""
    name = policy if isinstance(policy, str) else type(policy).__name__
    policy = make_policy(policy) if isinstance(policy, str) else policy
    env = make_env(task, config, sandbox)
    try:
        obs = env.reset()
        policy.reset(task, env.config.call_syntax)
        done = False
        while not done:
            res = env.step(policy.act(obs))
            obs, done = res.observation, res.done
        result = env.grade()
        return EpisodeResult(task.id, name, result.reward, result, list(env.trajectory),
                             dict(env.metrics))
    finally:
        env.close()
