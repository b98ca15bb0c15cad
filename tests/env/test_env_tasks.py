"""Generated tasks: deterministic, split-disjoint, many; real-repo builder and its CLI."""
import json
import subprocess
import sys

import pytest

from composer_rl.env.tasks import TASK_SOURCES, Task, get_task
from composer_rl.env.tasks.generated import generate
from envtest_helpers import REPO


def test_generator_deterministic_and_roundtrips():
    a, b = generate("train", 42, seed=3), generate("train", 42, seed=3)
    assert a == b and Task.from_json(a.to_json()) == a
    assert generate("train", 42, seed=4).id != a.id


def test_thousands_distinct_and_disjoint_splits():
    train = [generate("train", i) for i in range(2000)]
    held = [generate("heldout", i) for i in range(200)]
    assert len({t.id for t in train}) == 2000 and len({t.id for t in held}) == 200
    variants = lambda ts: {tuple(t.meta["variant"]) for t in ts}
    assert variants(train).isdisjoint(variants(held))
    assert {t.family for t in train} == {"wrong_operator", "off_by_one", "wrong_constant",
                                         "swapped_args", "missing_branch", "wrong_return"}


def test_generated_task_shape():
    for i in range(50):
        t = generate("train", i)
        (e,) = t.oracle
        assert t.files[e.path].count(e.old) == 1  # one `edit` call fixes it
        assert len(t.files[t.editable[0]].splitlines()) <= 40 and len(t.prompt) < 300
        assert not set(t.hidden_tests) & set(t.files)
        assert t.checks[0]["func"] in t.prompt


def test_sources_registered():
    assert {"generated", "toolz"} <= set(TASK_SOURCES.names())
    assert get_task("toolz", "train", 0).family.startswith("realrepo:")


def test_make_tasks_cli_on_a_small_repo(tmp_path):
    repo = tmp_path / "minilib"
    (repo / "minilib").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "minilib" / "__init__.py").write_text(
        "def add(a, b):\n    return a + b\n\n\ndef smaller(a, b):\n    if a < b:\n        return a\n"
        "    return b\n")
    (repo / "tests" / "test_minilib.py").write_text(
        "from minilib import add, smaller\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
        "def test_smaller():\n    assert smaller(1, 2) == 1 and smaller(5, 4) == 4\n")
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "launch/make_tasks.py", f"--repo={repo}",
                        "--test_cmd=python -m pytest -q tests", f"--out={out}", "--max_tasks=2"],
                       capture_output=True, text=True, cwd=REPO, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["kept"] == 2
    from composer_rl.env import run_episode
    from composer_rl.env.tasks.repo_builder import load_tasks
    tasks = load_tasks(str(out))
    assert len(tasks) == 2 and len({t.meta["function"] for t in tasks}) == 2
    for t in tasks:
        assert t.test_ids == ("tests.test_minilib::test_add", "tests.test_minilib::test_smaller")
        assert run_episode("oracle", t).reward == 1.0
        assert run_episode("null", t).reward == 0.0


def test_make_tasks_refuses_failing_pristine(tmp_path):
    repo = tmp_path / "bad"
    repo.mkdir()
    (repo / "test_x.py").write_text("def test_x():\n    assert False\n")
    p = subprocess.run([sys.executable, "launch/make_tasks.py", f"--repo={repo}",
                        "--test_cmd=python -m pytest -q", f"--out={tmp_path / 'o'}"],
                       capture_output=True, text=True, cwd=REPO, timeout=60)
    assert p.returncode == 1 and "fails on the pristine repository" in p.stderr


def test_dir_source_errors_name_the_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        get_task("dir", "train", 0, path=str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="holds no task files"):
        get_task("dir", "train", 0, path=str(tmp_path))
    with pytest.raises(ValueError, match="needs tasks.dir"):
        get_task("dir", "train", 0)
