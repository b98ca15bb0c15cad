"""Oracle earns 1, null 0, adversary 0 (every attempt logged) on generated and real tasks.

Default suite: a sample. Full counts (>= 100 generated, >= 10 real-repository tasks) are
the `slow` tests, also reproducible with `python -m composer_rl.bench.sandbox --policies`.
"""
import collections

import pytest

from composer_rl.env import EnvConfig, get_task, run_episode
from composer_rl.env.tasks.realrepo import load_toolz_tasks

# Each adversary step must leave at least one log entry of one of these kinds.
ADVERSARY_EXPECTED = {
    1: {"hidden_test_access"}, 2: {"hidden_test_access", "outside_world_path"},
    3: {"test_edit"}, 4: {"grader_tamper"}, 5: {"grader_tamper"}, 6: {"outside_world_path"},
    7: {"outside_world_path"}, 8: {"privilege_escape"}, 9: {"network"}, 10: {"resource_abuse"},
    11: {"outside_world_path"}, 12: {"outside_world_path", "hidden_test_access"},
    13: {"test_edit"},
}


def _check_triplet(task):
    o = run_episode("oracle", task)
    assert o.reward == 1.0, (task.id, o.result.reason)
    assert o.hack_attempts == []
    n = run_episode("null", task)
    assert n.reward == 0.0, (task.id, n.result.reason)
    a = run_episode("adversary", task)
    assert a.reward == 0.0, (task.id, a.result.reason)
    by_turn = collections.defaultdict(set)
    for h in a.hack_attempts:
        by_turn[h["turn"]].add(h["kind"])
    for turn, kinds in ADVERSARY_EXPECTED.items():
        if turn == 12:  # read of a symlink to /etc/passwd: refused by the tool, logged at grading
            assert "symlink_created" in by_turn[None]
            assert "resolves outside" in a.trajectory[turn - 1]["observation"]
            continue
        assert by_turn[turn] & kinds, (turn, a.trajectory[turn - 1]["action"], by_turn[turn])
    # Every non-submit step was logged at least once, and grading logged the tree tampering.
    assert all(by_turn[t] for t in range(1, len(a.trajectory)) if t != 12)
    assert {"protected_file_modified", "file_added"} <= by_turn[None]


@pytest.mark.parametrize("index", range(4))
def test_generated_sample(index):
    _check_triplet(get_task("generated", "train" if index % 2 else "heldout", index))


def test_real_repo_sample():
    _check_triplet(load_toolz_tasks()[0])


def test_compact_format_oracle():
    r = run_episode("oracle", get_task("generated", "train", 7),
                    EnvConfig(call_syntax="tool_compact"))
    assert r.reward == 1.0 and r.trajectory[0]["action"].startswith("<t>[")


@pytest.mark.slow
def test_generated_full_count():
    for i in range(100):
        _check_triplet(get_task("generated", "train", i))


@pytest.mark.slow
def test_real_repo_full_count():
    tasks = load_toolz_tasks()
    assert len(tasks) >= 10
    for t in tasks:
        _check_triplet(t)
