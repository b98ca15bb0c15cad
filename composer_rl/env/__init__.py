"""composer_rl.env: sandboxed coding environments (pure Python + stdlib; never imports JAX).

Entry points: `make_env(task, EnvConfig())` (harness.py), `get_task(source, split, index)`
(tasks/), `run_episode(policy, task)` (episode.py), and the registries SANDBOXES, TOOLS,
REWARDS, POLICIES and TASK_SOURCES.
"""
from composer_rl.env.harness import CodingEnv, EnvConfig, StepResult, make_env  # noqa: F401
from composer_rl.env.reward import REWARDS, RewardResult, make_reward  # noqa: F401
from composer_rl.env.sandbox import SANDBOXES, SandboxLimits, SandboxUnavailable  # noqa: F401
from composer_rl.env.tasks import TASK_SOURCES, Task, get_task  # noqa: F401
from composer_rl.env.policies import POLICIES  # noqa: F401
from composer_rl.env.episode import run_episode  # noqa: F401
