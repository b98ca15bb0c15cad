"""The question-answer tasks of the online-RL experiment (`experiments/online_rl.py`).

Each task shows a small function and asks which function the code defines:

  Which function does this code define?
  def count_rows(a, b):
      return a * b + 3

Two answers are correct: the concise one (`count_rows`) and a verbose one (`The function
defined here is count_rows.`). The demonstrations the policy is first trained on are
mostly verbose (`verbose_share`), so the policy starts out correct but wordy; the scripted
user of the experiment accepts only a concise, correct answer, a preference the policy must
learn from the feedback it gets through the server.

Tasks are a pure function of (split, index, seed); the splits use different argument
names, so held-out conversations are prompts the policy was not trained on, while the
function names come from one vocabulary (the experiment measures whether a preference is
learned from feedback, not whether a tiny model can copy names it never saw). `AnswerEnv` is the same task as a one-turn environment for simulated rollouts
(graded by the user's rule), mixed with online sessions by `online.sim_fraction`.
"""
import dataclasses
import hashlib
import json
import random
from typing import List

from composer_rl.env.harness import StepResult
from composer_rl.env.reward import RewardResult

VERBS = ("get", "set", "make", "load", "parse", "find", "count", "merge", "split", "check",
         "read", "send", "sort", "scan", "build", "drop")
NOUNS = ("user", "item", "path", "total", "name", "row", "key", "node", "word", "value",
         "file", "line", "page", "port", "tag", "list")
SPLITS = ("train", "heldout")
QUESTION = "Which function does this code define?"


@dataclasses.dataclass(frozen=True)
class AnswerTask:
  """A question, its concise answer and a verbose (also correct) one."""
  id: str
  split: str
  prompt: str
  answer: str
  verbose_answer: str

  def to_json(self) -> dict:
    return dataclasses.asdict(self)


NAMES = [f"{v}_{n}" for v in VERBS for n in NOUNS]


def answer_task(split: str, index: int, seed: int = 0) -> AnswerTask:
  if split not in SPLITS:
    raise ValueError(f"split {split!r}: choose one of {SPLITS}")
  rng = random.Random(f"{seed}:{split}:{index}")
  name = rng.choice(NAMES)
  # Argument names differ by split, so no held-out prompt is a train prompt.
  args = rng.sample("abcdef" if split == "train" else "uvwxyz", rng.randint(1, 3))
  expr = f" {rng.choice('+-*')} ".join(args + [str(rng.randint(1, 9))])
  code = f"def {name}({', '.join(args)}):\n    return {expr}"
  return AnswerTask(id=f"{split}-{index}", split=split, prompt=f"{QUESTION}\n{code}",
                    answer=name, verbose_answer=f"The function defined here is {name}.")


def demo_answer(task: AnswerTask, verbose_share: float, seed: int = 0) -> str:
  """The demonstration's answer: verbose on a hashed `verbose_share` of the tasks."""
  h = int.from_bytes(hashlib.sha256(f"{seed}:{task.id}".encode()).digest()[:4], "little")
  return task.verbose_answer if h / 2**32 < verbose_share else task.answer


def preferred(task_answer: str, reply: str) -> bool:
  """The user's rule: the reply is the bare function name (concise and correct)."""
  return reply.strip().strip("`").strip() == task_answer


def write_tasks(path: str, tasks: List[AnswerTask]) -> None:
  """JSONL the scripted user reads (it imports nothing of ours)."""
  with open(path, "w") as f:
    for t in tasks:
      f.write(json.dumps(t.to_json()) + "\n")


class AnswerEnv:
  """One-turn environment for simulated rollouts: the model's first turn is its answer;
  reward 1 if the user would accept it, else 0 (the online reward spec's scale)."""

  def __init__(self, task: AnswerTask):
    self.task, self.reply = task, None
    self.metrics = {}

  def reset(self) -> str:
    return self.task.prompt

  def step(self, text: str) -> StepResult:
    self.reply = text
    return StepResult("", True, {})

  def grade(self) -> RewardResult:
    ok = self.reply is not None and preferred(self.task.answer, self.reply)
    return RewardResult(reward=float(ok), breakdown={"preferred": float(ok)},
                        hack_attempts=[], passed=ok)

  def close(self) -> None:
    pass
