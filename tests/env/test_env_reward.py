"""Reward registry, weighted combination, and the LLM-judge protocol."""
import pytest

from composer_rl.env import REWARDS, get_task, make_env, make_reward
from composer_rl.env.harness import EnvConfig
from composer_rl.env.judge import DEFAULT_RUBRIC, judge_score, parse_score
from composer_rl.env.policies import make_policy


def test_registry_names():
    assert {"tests", "tests_fraction", "malformed_penalty", "hack_penalty", "judge"} <= set(REWARDS.names())
    with pytest.raises(KeyError, match="unknown reward function"):
        make_reward({"nope": 1.0})


@pytest.mark.parametrize("answer,score,err", [
    ("Looks good.\nSCORE: 7", 0.7, None), ("SCORE: 10", 1.0, None), ("SCORE: 2.5\n", 0.25, None),
    ("no score", 0.0, "exactly one"), ("SCORE: 3\nSCORE: 4", 0.0, "exactly one"),
    ("SCORE: 11", 0.0, "outside"), ("SCORE: -1", 0.0, "exactly one"), (None, 0.0, "not text"),
])
def test_judge_parse_protocol(answer, score, err):
    r = parse_score(answer)
    assert r.score == score and (r.error is None if err is None else err in r.error)


def test_judge_raising_is_error_score():
    def boom(prompt):
        raise RuntimeError("judge down")
    r = judge_score(boom, DEFAULT_RUBRIC, get_task("generated", "train", 0), [])
    assert r.score == 0.0 and "judge down" in r.error


def _episode(spec, policy="oracle", extra_turn=None):
    task = get_task("generated", "train", 30)
    env = make_env(task, EnvConfig(reward=spec))
    try:
        obs = env.reset()
        if extra_turn:
            env.step(extra_turn)
        p = make_policy(policy)
        p.reset(task)
        done = False
        while not done:
            r = env.step(p.act(obs))
            obs, done = r.observation, r.done
        return env.grade()
    finally:
        env.close()


def test_combined_weights_and_judge_sees_trajectory():
    prompts = []

    def judge(prompt):
        prompts.append(prompt)
        return "Fixed minimally.\nSCORE: 8"
    spec = {"tests": 1.0, "malformed_penalty": {"weight": 1.0, "per_call": 0.25},
            "judge": {"weight": 0.5, "judge": judge}, "hack_penalty": 1.0}
    r = _episode(spec, extra_turn="<t>not json</t>")
    assert r.breakdown == {"tests": 1.0, "malformed_penalty": -0.25, "judge": 0.8, "hack_penalty": 0.0}
    assert r.reward == pytest.approx(1.0 - 0.25 + 0.4)
    assert "RUBRIC:" in prompts[0] and '"edit"' in prompts[0]


def test_malformed_judge_and_hack_penalty():
    spec = {"tests": 1.0, "judge": {"weight": 1.0, "judge": lambda p: "I refuse"}, "hack_penalty": 0.5}
    r = _episode(spec, policy="adversary")
    assert r.breakdown["judge"] == 0.0 and r.breakdown["hack_penalty"] == -1.0 and r.reward == -0.5
    assert r.hack_attempts
