"""Real-repository tasks from the vendored toolz sdist (source name: "toolz").

`data/toolz-1.2.0/` is a trimmed copy of toolz 1.2.0's source distribution from PyPI (BSD-3
licence kept; its own test suite in toolz/tests). `data/toolz_tasks.json` holds the tasks
that `launch/make_tasks.py --repo=composer_rl/env/data/toolz-1.2.0 --test_cmd="python -m
pytest -q toolz/tests" --spec_out=...` validated (oracle passes, mutation fails some tests),
stored compactly as the edit that injects each bug; `load_toolz_tasks()` rebuilds full Tasks
from the vendored tree, so nothing is downloaded at run time.

All real-repository tasks are in the "train" split; "heldout" is empty here (index errors).
"""
from __future__ import annotations

import functools
import json
import os
from typing import List

from composer_rl.env.tasks.registry import TASK_SOURCES
from composer_rl.env.tasks.repo_builder import load_repo
from composer_rl.env.tasks.task import Edit, Task

DATA_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data")
TOOLZ_DIR = os.path.join(DATA_DIR, "toolz-1.2.0")
TOOLZ_SPECS = os.path.join(DATA_DIR, "toolz_tasks.json")


def specs_from_tasks(tasks: List[Task], pristine: dict, test_cmd: str) -> dict:
    """Compact form: the bug-injecting edit per task plus shared test ids."""
    specs = []
    for t in tasks:
        (o,) = t.oracle
        if pristine[o.path].count(o.new) != 1:
            continue  # cannot re-inject unambiguously; skip rather than ship a broken task
        specs.append({"id": t.id, "family": t.family, "path": o.path, "inject_old": o.new,
                      "inject_new": o.old, "prompt": t.prompt, "meta": t.meta})
    ids = tasks[0].test_ids if tasks else ()
    return {"test_cmd": test_cmd, "test_paths": list(tasks[0].test_paths) if tasks else [],
            "test_ids": list(ids), "tasks": specs}


def tasks_from_specs(spec: dict, pristine: dict) -> List[Task]:
    from composer_rl.env.tasks.repo_builder import is_test_path
    out = []
    for s in spec["tasks"]:
        files = dict(pristine)
        assert files[s["path"]].count(s["inject_old"]) == 1, s["id"]
        files[s["path"]] = files[s["path"]].replace(s["inject_old"], s["inject_new"], 1)
        out.append(Task(
            id=s["id"], family=s["family"], split="train", files=files, editable=(s["path"],),
            visible_tests=tuple(p for p in files if is_test_path(p)), hidden_tests={},
            test_cmd=spec["test_cmd"], prompt=s["prompt"],
            oracle=(Edit(s["path"], s["inject_new"], s["inject_old"]),),
            test_paths=tuple(spec["test_paths"]), test_ids=tuple(spec["test_ids"]),
            meta=s["meta"]))
    return out


@functools.lru_cache(maxsize=1)
def load_toolz_tasks() -> tuple:
    with open(TOOLZ_SPECS) as f:
        spec = json.load(f)
    return tuple(tasks_from_specs(spec, load_repo(TOOLZ_DIR)))


@TASK_SOURCES.register("toolz")
def toolz_task(split: str = "train", index: int = 0, seed: int = 0) -> Task:
    if split != "train":
        raise IndexError("the toolz source has only a 'train' split")
    tasks = load_toolz_tasks()
    return tasks[index % len(tasks)]
