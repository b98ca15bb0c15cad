"""The session the rollout layer drives: text in, text out, then a reward.

    env = make_env(task, EnvConfig())
    obs = env.reset()                 # system instructions + task description (text)
    res = env.step(model_text)        # StepResult(observation, done, info)
    ...                               # until res.done (submit, or the turn budget ends)
    rr = env.grade()                  # RewardResult(reward, breakdown, hack_attempts, ...)
    env.close()                       # deletes the world (no process outlives a command)

Observations are plain text for the rollout layer to tokenize and append: the harness never
re-renders history (token-in/token-out). A malformed call returns an error observation and
increments `metrics["malformed_calls"]`; no model text can make `step` raise. Sessions share
nothing mutable, so many can run concurrently in threads.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Tuple

from composer_rl.env import call_syntax, grading, hacks
from composer_rl.env.reward import RewardContext, RewardResult, make_reward
from composer_rl.env.sandbox import SandboxLimits, make_sandbox
from composer_rl.env.tool_call_format import TOOL_SCHEMAS, ToolCallError
from composer_rl.env.tools import TOOLS, ToolError, ToolLimits, truncate_observation
from composer_rl.env.tree_diff import tree_diff
from composer_rl.env.world import World

SYSTEM_PROMPT = ("You are a coding agent working in a repository at /work. {tools} "
                 "Fix the task, run the tests, then submit.")


@dataclasses.dataclass
class EnvConfig:
    """Hyperparameters of one episode.

    max_turns: tool calls allowed before the episode ends without submit (budget end).
    call_syntax: how the model writes a tool call (`call_syntax.CALL_SYNTAXES`: 'tool',
      'tool_compact' for byte-level models, 'qwen3'): what `step` parses and what the
      system prompt's `{tools}` describes.
    sandbox: sandbox backend name (sandbox.SANDBOXES); limits: its resource bounds.
    tool_limits: observation/output caps (tools.ToolLimits).
    reward: reward spec for reward.make_reward, e.g. {"tests": 1.0, "malformed_penalty": 0.5}.
    grade_timeout_s: wall-clock limit of the grading run.
    system_prompt: the instructions before the task; `{tools}` is replaced by the tool
      description (a tiny model trained from demonstrations can do with a terse one).
    tools: the tools the agent may call (`TOOL_SCHEMAS` names; empty = all). `submit` is
      always available. A call of another tool runs nothing and is answered with an error
      observation (counted in `tool_errors`): a task family can close a shortcut (e.g.
      `search` finding `def f(` in one call where the task is to read and remember).
    """

    max_turns: int = 30
    call_syntax: str = "tool"
    sandbox: str = "bwrap"
    limits: SandboxLimits = SandboxLimits()
    tool_limits: ToolLimits = ToolLimits()
    reward: Dict[str, Any] = dataclasses.field(default_factory=lambda: {"tests": 1.0})
    grade_timeout_s: float = 60.0
    system_prompt: str = SYSTEM_PROMPT
    tools: Tuple[str, ...] = ()

    def __post_init__(self):
        call_syntax.get(self.call_syntax)  # a ValueError naming the known ones
        unknown = sorted(set(self.tools) - set(TOOL_SCHEMAS))
        if unknown:
            raise ValueError(f"EnvConfig.tools: unknown tool(s) {unknown}; known: "
                             f"{sorted(TOOL_SCHEMAS)}")


@dataclasses.dataclass
class StepResult:
    observation: str
    done: bool
    info: Dict[str, Any]


_SANDBOX_CACHE: Dict[tuple, Any] = {}


def _shared_sandbox(config: EnvConfig):
    key = (config.sandbox, config.limits)
    if key not in _SANDBOX_CACHE:  # stateless backends: safe to share across threads
        _SANDBOX_CACHE[key] = make_sandbox(config.sandbox, limits=config.limits)
    return _SANDBOX_CACHE[key]


class CodingEnv:
    def __init__(self, task, config: Optional[EnvConfig] = None, sandbox=None):
        self.task = task
        self.config = config or EnvConfig()
        self.syntax = call_syntax.get(self.config.call_syntax)
        self.sandbox = sandbox or _shared_sandbox(self.config)
        self.world: Optional[World] = None
        self.trajectory: List[dict] = []
        self.hack_attempts: List[dict] = []
        self.metrics: Dict[str, Any] = {}
        self.done = False
        self.submitted = False
        self._reward_fn = make_reward(self.config.reward)
        self._result: Optional[RewardResult] = None

    def reset(self) -> str:
        if self.world is not None:
            self.world.close()
        self.world = World(self.task.files, self.sandbox)
        self.trajectory, self.hack_attempts = [], []
        self.metrics = {"turns": 0, "malformed_calls": 0, "tool_errors": 0}
        self.done = self.submitted = False
        self._result = None
        system = self.config.system_prompt.replace(
            "{tools}", self.syntax.help(self.config.tools))
        return f"{system}\nTask: {self.task.prompt}\n"

    def step(self, model_text: str) -> StepResult:
        if self.world is None:
            raise RuntimeError("call reset() before step()")  # a caller bug, not model input
        if self.done:
            return StepResult("episode is over", True, {"error": "done"})
        self.metrics["turns"] += 1
        turn = self.metrics["turns"]
        info: Dict[str, Any] = {"turn": turn}
        try:
            call = self.syntax.parse(model_text)
        except ToolCallError as e:
            self.metrics["malformed_calls"] += 1
            key = f"malformed_{e.kind}"
            self.metrics[key] = self.metrics.get(key, 0) + 1
            obs, info["error"], tool = f"error: {e}", e.kind, None
        else:
            tool = call.name
            attempts = hacks.detect(turn, call.name, call.args, self.task)
            self.hack_attempts.extend(attempts)
            allowed = self.config.tools
            if call.name == "submit":
                obs, self.submitted = "submitted", True
            elif allowed and call.name not in allowed:
                self.metrics["tool_errors"] += 1
                obs, info["error"] = (f"error: tool '{call.name}' is not available here "
                                      f"(tools: {', '.join(allowed)}, submit)"), "tool_not_allowed"
            else:
                try:
                    obs = TOOLS.get(call.name)(self.world, call.args, self.config.tool_limits)
                except ToolError as e:
                    self.metrics["tool_errors"] += 1
                    obs, info["error"] = str(e), "tool_error"
                except Exception as e:  # last line of defence: report, never raise
                    self.metrics["tool_errors"] += 1
                    obs, info["error"] = f"error: internal tool failure ({type(e).__name__})", "internal"
        obs = truncate_observation(obs, self.config.tool_limits.max_observation_chars)
        self.done = self.submitted or turn >= self.config.max_turns
        if self.done and not self.submitted:
            info["budget_exhausted"] = True
        info["tool"] = tool
        self.trajectory.append({"turn": turn, "action": model_text, "tool": tool,
                                "observation": obs, "error": info.get("error")})
        return StepResult(obs, self.done, info)

    def grade(self) -> RewardResult:
        if self._result is not None:
            return self._result
        if self.world is None:
            raise RuntimeError("call reset() before grade()")
        self.world.teardown_processes()
        report = grading.grade(self.task, self.world.root, self.sandbox,
                               timeout_s=self.config.grade_timeout_s)
        for t in report.tamper:
            self.hack_attempts.append({"turn": None, "kind": t["kind"], "tool": "grader",
                                       "detail": t["path"]})
        for path, why in report.refused.items():
            self.hack_attempts.append({"turn": None, "kind": "refused_file", "tool": "grader",
                                       "detail": f"{path}: {why}"})
        ctx = RewardContext(self.task, report, self.trajectory, self.metrics, self.hack_attempts)
        self._result = self._reward_fn(ctx)
        self._result.info.update({"grade_reason": report.reason, "n_passed": report.n_passed,
                                  "n_total": report.n_total, "metrics": dict(self.metrics),
                                  "submitted": self.submitted,
                                  "tests": _test_results(self.task, report.outcomes)})
        return self._result

    def work_tree_diff(self) -> Optional[str]:
        """What the agent changed: its work tree against the task's files (see tree_diff)."""
        if self.world is None or self.world.closed:
            return None
        return tree_diff(self.world.root, self.task.files)

    def close(self) -> None:
        if self.world is not None:
            self.world.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _test_results(task, outcomes: Dict[str, str]) -> Dict[str, Dict[str, Any]]:
    """{test id: {"outcome", "hidden"}} for the record: which visible and which hidden
    tests (or checks) passed. A test is hidden when its module is one of the task's hidden
    test files (checks are named by id; their module comes from task.test_ids)."""
    hidden_modules = {p[:-3].replace("/", ".") for p in task.hidden_tests if p.endswith(".py")}
    full = {t.split("::")[-1]: t for t in task.test_ids}

    def hidden(tid: str) -> bool:
        where = full.get(tid, tid).split("::")[0]  # module, or module.Class
        return any(where == m or where.startswith(m + ".") for m in hidden_modules)
    return {tid: {"outcome": outcome, "hidden": hidden(tid)} for tid, outcome in outcomes.items()}


def make_env(task, config: Optional[EnvConfig] = None, sandbox=None) -> CodingEnv:
    return CodingEnv(task, config, sandbox)
