"""LLM-judge rubric reward.

A judge is any callable `judge(prompt: str) -> str` (later a composer_rl model). It gets a
written rubric, the task prompt and the trajectory (tool calls and truncated observations).

Parse protocol: the judge's answer must contain exactly one line of the form
    SCORE: <number>
with a number in [0, 10] (integer or decimal). The reward is that number / 10. Anything else
-- no SCORE line, several, a number out of range, a non-string answer, or the judge raising
-- gives `JudgeResult(score=ERROR_SCORE, error=...)` (a clear error score, not a crash).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Callable, List, Optional

ERROR_SCORE = 0.0  # reward when the judge's answer cannot be parsed
MAX_OBS_CHARS = 600  # per-observation cap in the judge prompt (keeps the prompt bounded)

DEFAULT_RUBRIC = """Score the agent's work from 0 to 10.
10: the bug is fixed in the source file with a minimal, correct change; tests were run.
5: a plausible fix, but untested or with unrelated changes.
0: no fix, tests edited or deleted, the grader tampered with, or files outside the task touched.
End your answer with one line: SCORE: <0-10>"""

_SCORE = re.compile(r"^\s*SCORE:\s*([0-9]+(?:\.[0-9]+)?)\s*$", re.MULTILINE)


@dataclasses.dataclass
class JudgeResult:
    score: float
    error: Optional[str]
    raw: str


def build_prompt(rubric: str, task, trajectory: List[dict]) -> str:
    lines = ["RUBRIC:", rubric, "", "TASK:", getattr(task, "prompt", str(task)), "", "TRAJECTORY:"]
    for step in trajectory:
        obs = step.get("observation", "")
        if len(obs) > MAX_OBS_CHARS:
            obs = obs[:MAX_OBS_CHARS] + " [...]"
        lines += [f"[turn {step.get('turn')}] ACTION: {step.get('action', '')}",
                  f"[turn {step.get('turn')}] OBSERVATION: {obs}"]
    return "\n".join(lines)


def parse_score(answer) -> JudgeResult:
    if not isinstance(answer, str):
        return JudgeResult(ERROR_SCORE, "judge answer is not text", repr(answer)[:200])
    found = _SCORE.findall(answer)
    if len(found) != 1:
        return JudgeResult(ERROR_SCORE, f"expected exactly one SCORE line, found {len(found)}",
                           answer[:2000])
    value = float(found[0])
    if not 0.0 <= value <= 10.0:
        return JudgeResult(ERROR_SCORE, f"score {value} outside [0, 10]", answer[:2000])
    return JudgeResult(value / 10.0, None, answer[:2000])


def judge_score(judge: Callable[[str], str], rubric: str, task, trajectory) -> JudgeResult:
    try:
        answer = judge(build_prompt(rubric, task, trajectory))
    except Exception as e:
        return JudgeResult(ERROR_SCORE, f"judge raised {type(e).__name__}: {e}", "")
    return parse_score(answer)
