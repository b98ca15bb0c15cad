"""The summary-judge reward wired through the agent-RL loop (experiments/tiny_compaction.py
smoke, `config.rl.summary_judge` on, a local OpenAI-compatible judge): RL sessions that
compacted earn the task reward plus the weighted judge score, the step metrics report it,
and evaluation reports the task reward alone (no judge call for held-out sessions)."""
import json

import pytest

from composer_rl.controller import agent_rl
from tests.rollout.test_summary_judge import JudgeServer
from tests.train import helpers


def _rows(path):
  with open(path) as f:
    return [json.loads(line) for line in f]


@pytest.mark.slow  # ~35 s; an optional reward term, off by default
def test_judged_summaries_in_the_rl_loop(tmp_path):
  c = helpers.load_experiment("tiny_compaction", "smoke")
  c.sft.update(num_demos=2, steps=1)
  c.rl.steps, c.eval.num_heldout = 1, 1
  server = JudgeServer(answer="SCORE: 6")
  try:
    c.rl.summary_judge.update(weight=0.5)
    c.rl.summary_judge.judge_args.base_url = server.base_url
    agent_rl.run(c, str(tmp_path))
  finally:
    server.close()
  rl = [r for r in _rows(tmp_path / "metrics.jsonl") if r.get("phase") == "rl"]
  assert rl and all(r["summary_judge_score"] == 0.6 for r in rl)
  trajs = _rows(tmp_path / "rollouts" / "rl_step_00000.jsonl")
  judged = [t for t in trajs if t["segments"]]
  assert judged, "the smoke sessions compact"
  for t in judged:
    info = t["reward_info"]
    assert t["reward"] == info["task_reward"] + 0.5 * 0.6
    assert [s["summary"] for s in info["summary_judge"]["summaries"]] == [
        s["summary"] for s in t["segments"]]
  # Held-out sessions compacted too, but were not judged: evaluation is the task reward.
  held = _rows(tmp_path / "rollouts" / "eval_rl.jsonl")
  assert any(t["segments"] for t in held)
  assert not any("summary_judge" in (t["reward_info"] or {}) for t in held)
  # Every judged summary was asked about (the factory may also have run sessions past the
  # last step, which were judged but not trained).
  asked = [r["body"]["messages"][0]["content"].split("SUMMARY:\n")[-1] for r in server.requests]
  assert len(asked) >= sum(len(t["segments"]) for t in judged)
