"""LLM-judge rubric reward.

A judge is any callable `judge(prompt: str) -> str` (later a composer_rl model). It gets a
written rubric, the task prompt and the trajectory (tool calls and truncated observations).

Parse protocol: the judge's answer must contain exactly one line of the form
    SCORE: <number>
with a number in [0, 10] (integer or decimal). The reward is that number / 10. Anything else
-- no SCORE line, several, a number out of range, a non-string answer, or the judge raising
-- gives `JudgeResult(score=ERROR_SCORE, error=...)` (a clear error score, not a crash).

Judge models are chosen by name from `JUDGES` (`make_judge(name, **args)` -> callable):
  http   any OpenAI-compatible chat-completions server (this project's launch/serve.py,
         vLLM, a hosted API): one user message, greedy, the answer's text. Standard library
         only (env/ needs no JAX and no client package).

Summaries (context compaction, issue #7): `build_summary_prompt` shows the judge the work
a summary replaces (that context's tool calls and observations) and the summary, scored
against `SUMMARY_RUBRIC` (`composer_rl.rollout.summary_judge` adds it to the reward).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import urllib.error
import urllib.request
from typing import Callable, List, Optional

from composer_rl.env.registry import Registry

ERROR_SCORE = 0.0  # reward when the judge's answer cannot be parsed
MAX_OBS_CHARS = 600  # per-observation cap in the judge prompt (keeps the prompt bounded)

DEFAULT_RUBRIC = """Score the agent's work from 0 to 10.
10: the bug is fixed in the source file with a minimal, correct change; tests were run.
5: a plausible fix, but untested or with unrelated changes.
0: no fix, tests edited or deleted, the grader tampered with, or files outside the task touched.
End your answer with one line: SCORE: <0-10>"""

SUMMARY_RUBRIC = """Score the summary from 0 to 10. The agent's context was about to be
cleared; the summary is all it keeps of the work shown.
10: every fact the task still needs (values read, files done, what is left) is stated
exactly and briefly.
5: some needed facts are missing or vague.
0: wrong facts, or nothing the task needs.
End your answer with one line: SCORE: <0-10>"""

JUDGES: Registry = Registry("judge")

_SCORE = re.compile(r"^\s*SCORE:\s*([0-9]+(?:\.[0-9]+)?)\s*$", re.MULTILINE)


@dataclasses.dataclass
class JudgeResult:
    score: float
    error: Optional[str]
    raw: str


def build_prompt(rubric: str, task, trajectory: List[dict], heading: str = "TRAJECTORY:") -> str:
    lines = ["RUBRIC:", rubric, "", "TASK:", getattr(task, "prompt", str(task)), "", heading]
    for step in trajectory:
        obs = step.get("observation", "")
        if len(obs) > MAX_OBS_CHARS:
            obs = obs[:MAX_OBS_CHARS] + " [...]"
        lines += [f"[turn {step.get('turn')}] ACTION: {step.get('action', '')}",
                  f"[turn {step.get('turn')}] OBSERVATION: {obs}"]
    return "\n".join(lines)


def build_summary_prompt(rubric: str, task, steps: List[dict], summary: str) -> str:
    """The rubric, the task, the tool calls and observations the summary replaces, and the
    summary itself."""
    work = build_prompt(rubric, task, steps, heading="WORK BEFORE THE SUMMARY:")
    return f"{work}\n\nSUMMARY:\n{summary}"


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


def score_prompt(judge: Callable[[str], str], prompt: str) -> JudgeResult:
    """Asks `judge` and parses its score; a judge that raises gives the error score."""
    try:
        answer = judge(prompt)
    except Exception as e:
        return JudgeResult(ERROR_SCORE, f"judge raised {type(e).__name__}: {e}", "")
    return parse_score(answer)


def judge_score(judge: Callable[[str], str], rubric: str, task, trajectory) -> JudgeResult:
    return score_prompt(judge, build_prompt(rubric, task, trajectory))


@JUDGES.register("http")
def http_judge(base_url: str, model: str = "", api_key_env: str = "", timeout_s: float = 60.0,
               max_tokens: int = 256) -> Callable[[str], str]:
    """A judge served over the OpenAI chat-completions protocol at `base_url` (e.g.
    "http://127.0.0.1:8000/v1"). The key, if any, is read from the environment variable
    `api_key_env` (never from a config file). Errors raise; `score_prompt` turns them into
    the error score with the reason."""
    if not base_url.startswith(("http://", "https://")):
        raise ValueError(f"judge base_url must be an http(s) URL, got {base_url!r}")
    key = os.environ.get(api_key_env, "") if api_key_env else ""
    if api_key_env and not key:
        raise ValueError(f"judge api_key_env={api_key_env!r} is not set in the environment")
    url = base_url.rstrip("/") + "/chat/completions"

    def judge(prompt: str) -> str:
        body = json.dumps({"model": model, "messages": [{"role": "user", "content": prompt}],
                           "temperature": 0, "max_tokens": max_tokens}).encode()
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        req = urllib.request.Request(url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                reply = json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"judge server answered HTTP {e.code}: "
                               f"{e.read()[:300].decode(errors='replace')}") from None
        try:
            return reply["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise RuntimeError(f"judge reply is not a chat completion: {str(reply)[:300]}") from None

    return judge


def make_judge(name: str, **kwargs) -> Callable[[str], str]:
    """The judge model registered as `name`, built with its keyword arguments."""
    return JUDGES.get(name)(**kwargs)
