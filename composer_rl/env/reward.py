"""Reward functions, chosen by name from `REWARDS` and combined with weights.

A reward spec is {name: weight} or {name: {"weight": w, **params}}; `make_reward(spec)`
returns a callable `(ctx: RewardContext) -> RewardResult` whose reward is
sum(weight * fn(ctx)) and whose breakdown lists each term. Built-in terms:

  tests             1.0 if every expected hidden/visible check passed in the grader, else 0.
  tests_fraction    fraction of expected checks passed (denser signal, easier to game by
                    partial fixes; use with care).
  malformed_penalty -per_call * (number of malformed tool calls), floored at -cap.
  hack_penalty      -1.0 if any hack attempt was logged (tamper or suspicious calls), else 0.
  judge             LLM-judge rubric score in [0, 1] (judge.py); needs params `judge`
                    (callable prompt -> text) and optionally `rubric`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List

from composer_rl.env.registry import Registry

REWARDS: Registry = Registry("reward function")


@dataclasses.dataclass
class RewardContext:
    task: Any
    grade: Any  # grading.GradeReport
    trajectory: List[dict]  # [{"turn", "action", "observation", "tool", "error"}]
    metrics: Dict[str, float]
    hack_attempts: List[dict]


@dataclasses.dataclass
class RewardResult:
    reward: float
    breakdown: Dict[str, float]
    hack_attempts: List[dict]
    passed: bool = False
    reason: str = ""
    info: Dict[str, Any] = dataclasses.field(default_factory=dict)


@REWARDS.register("tests")
def tests_reward() -> Callable:
    return lambda ctx: 1.0 if ctx.grade.passed else 0.0


@REWARDS.register("tests_fraction")
def tests_fraction_reward() -> Callable:
    return lambda ctx: float(ctx.grade.fraction) if ctx.grade.n_total else 0.0


@REWARDS.register("malformed_penalty")
def malformed_penalty(per_call: float = 0.1, cap: float = 1.0) -> Callable:
    """per_call: penalty per malformed tool call; cap: largest total penalty."""
    return lambda ctx: -min(cap, per_call * ctx.metrics.get("malformed_calls", 0))


@REWARDS.register("hack_penalty")
def hack_penalty() -> Callable:
    return lambda ctx: -1.0 if ctx.hack_attempts else 0.0


@REWARDS.register("judge")
def judge_reward(judge: Callable[[str], str] = None, rubric: str = None) -> Callable:
    from composer_rl.env.judge import DEFAULT_RUBRIC, judge_score
    if judge is None:
        raise ValueError("the judge reward needs a `judge` callable (prompt -> text)")
    rubric = rubric or DEFAULT_RUBRIC
    return lambda ctx: judge_score(judge, rubric, ctx.task, ctx.trajectory).score


def make_reward(spec: Dict[str, Any]) -> Callable[[RewardContext], RewardResult]:
    terms = []
    for name, v in spec.items():
        params = dict(v) if isinstance(v, dict) else {"weight": v}
        weight = float(params.pop("weight", 1.0))
        terms.append((name, weight, REWARDS.get(name)(**params)))

    def reward(ctx: RewardContext) -> RewardResult:
        breakdown, total = {}, 0.0
        for name, weight, fn in terms:
            try:
                value = float(fn(ctx))
            except Exception as e:  # a broken term is reported, never raised into the trainer
                value = 0.0
                breakdown[name + "_error"] = 1.0
                ctx.metrics[f"reward_error_{name}"] = repr(e)[:200]
            breakdown[name] = value
            total += weight * value
        return RewardResult(total, breakdown, ctx.hack_attempts, ctx.grade.passed,
                            ctx.grade.reason)

    return reward
