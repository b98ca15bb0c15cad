"""The copying benchmark: its rollout statistics on hand-made sessions, and a probe run."""
import json

import pytest

from composer_rl.bench import copying


def _session(reads, summaries, edit):
  turns = [f'<t>["read","m{i + 1}.py"]</t>' for i in range(len(reads))]
  obs = [f"1|k{i + 1} = '{p}'\n2|" for i, p in enumerate(reads)]
  if edit is not None:
    turns.append('<t>["edit","key.py","k1 = \'\'","' + edit + '"]</t>')
    obs.append("edited key.py")
  return dict(turn_texts=turns, observations=obs,
              segments=[dict(turn=2, token=0, summary=s) for s in summaries])


def test_rollout_statistics(tmp_path):
  rows = [_session("ABCE", ["k1 = 'A' k2 = 'B'"], "k1 = 'A'\\nk2 = 'B'\\nk3 = 'C'\\nk4 = 'E'"),
          _session("ABCE", ["k1 = 'A' k2 = 'A'"], "k1 = 'A'\\nk2 = 'A'\\nk3 = 'C'\\nk4 = 'E'"),
          _session("GH", [], None)]
  path = tmp_path / "rl_step_00000.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  out = copying.rollouts(str(tmp_path / "rl_step_*.jsonl"))
  assert out == dict(files=1, sessions=3, edit_rate=round(2 / 3, 3), summary_parts=4,
                     summary_part_accuracy=0.75, exact_answers=1)
  with pytest.raises(ValueError, match="no rollout files"):
    copying.rollouts(str(tmp_path / "nothing_*.jsonl"))


def test_probe_runs_and_reports_the_curve():
  out = copying.probe("typed_parts", 2)
  assert out["rows"] == "typed_parts" and set(out["copy_loss"]) == {0, 1}
  assert out["chance"] == 2.944 and out["copy_loss"][0] > 5.0


@pytest.mark.slow  # ~90 s: a whole smoke agent-RL run before the diagnostic
def test_policy_scores_a_saved_sft_policy(tmp_path):
  from composer_rl.bench.long_sessions import experiment_config
  from composer_rl.controller import agent_rl
  wd = str(tmp_path / "wd")
  agent_rl.run(experiment_config(smoke=True), wd)
  out = copying.policy(wd, rows=2, contexts=4, smoke=True)
  for part in ("copy_rows", "demo_contexts"):
    assert out[part]["letters"] > 0
    assert 0.0 < out[part]["p_right_mean"] < 1.0  # an untrained smoke model: neither extreme
  with pytest.raises(ValueError, match="no demonstrations"):
    copying.policy(str(tmp_path), smoke=True)
