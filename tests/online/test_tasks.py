"""The online experiment's question-answer tasks: pure, split-disjoint, demonstrations at
the configured verbose share, the user's preference rule, and the simulated environment."""
import pytest

from composer_rl.online import tasks


def test_tasks_are_pure_and_splits_disjoint():
  assert tasks.answer_task("train", 5, 0) == tasks.answer_task("train", 5, 0)
  train = {tasks.answer_task("train", i).prompt for i in range(500)}
  heldout = {tasks.answer_task("heldout", i).prompt for i in range(200)}
  assert not train & heldout
  t = tasks.answer_task("heldout", 3)
  assert f"def {t.answer}(" in t.prompt and t.answer in t.verbose_answer
  with pytest.raises(ValueError, match="split"):
    tasks.answer_task("test", 0)


def test_demonstrations_follow_the_verbose_share():
  ts = [tasks.answer_task("train", i) for i in range(1000)]
  verbose = sum(tasks.demo_answer(t, 0.75) == t.verbose_answer for t in ts) / len(ts)
  assert 0.7 < verbose < 0.8
  assert all(tasks.demo_answer(t, 0.0) == t.answer for t in ts[:20])


def test_preference_rule_and_simulated_environment():
  t = tasks.answer_task("train", 1)
  assert tasks.preferred(t.answer, f" `{t.answer}`\n")
  assert not tasks.preferred(t.answer, t.verbose_answer)
  assert not tasks.preferred(t.answer, t.answer + "x")
  env = tasks.AnswerEnv(t)
  assert env.reset() == t.prompt
  assert env.step(t.answer).done and env.grade().reward == 1.0
  env = tasks.AnswerEnv(t)
  env.step(t.verbose_answer)
  assert env.grade().reward == 0.0
