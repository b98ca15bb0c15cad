"""Real-repository tasks: the vendored toolz sdist (source "toolz") and any directory of
tasks `launch/make_tasks.py` built from your own repository (source "dir", `tasks.dir`).

`data/toolz-1.2.0/` is a trimmed copy of toolz 1.2.0's source distribution from PyPI (BSD-3
licence kept; its own test suite in toolz/tests). `data/toolz_tasks.json` holds the tasks
that `launch/make_tasks.py --repo=composer_rl/env/data/toolz-1.2.0 --test_cmd="python -m
pytest -q toolz/tests" --spec_out=...` validated (oracle passes, mutation fails some tests),
stored compactly as the edit that injects each bug; `load_toolz_tasks()` rebuilds full Tasks
from the vendored tree, so nothing is downloaded at run time.

All toolz tasks are in the "train" split; "heldout" is empty there (index errors). A task
directory holds out the bugs of every fifth function (`load_task_dir`).
"""
from __future__ import annotations

import functools
import json
import os
from typing import Dict, List

from composer_rl.env.tasks.registry import TASK_SOURCES
from composer_rl.env.tasks.repo_builder import load_repo, load_tasks
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


@functools.lru_cache(maxsize=8)
def load_task_dir(path: str) -> Dict[str, tuple]:
    """The tasks `launch/make_tasks.py` wrote into `path`, split by the function they break:
    the functions (sorted by name) at positions 4, 9, 14, ... -- or the last one when there
    are fewer than five -- are held out, so no held-out bug is in a function seen in
    training. A single function means no held-out split."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f"tasks.dir={path!r} is not a directory (make one with "
                                "launch/make_tasks.py --out=DIR)")
    tasks = load_tasks(path)
    if not tasks:
        raise ValueError(f"tasks.dir={path!r} holds no task files (*.json from "
                         "launch/make_tasks.py)")
    functions = sorted({t.meta.get("function", t.id) for t in tasks})
    held = set(functions[4::5]) or ({functions[-1]} if len(functions) > 1 else set())
    by_split = {"train": [], "heldout": []}
    for t in tasks:
        by_split["heldout" if t.meta.get("function", t.id) in held else "train"].append(t)
    return {k: tuple(v) for k, v in by_split.items()}


@TASK_SOURCES.register("dir")
def dir_task(split: str = "train", index: int = 0, seed: int = 0, path: str = "") -> Task:
    """Tasks from your own repository (`launch/make_tasks.py --out=DIR`; `tasks.dir`)."""
    if not path:
        raise ValueError("the 'dir' task source needs tasks.dir (a launch/make_tasks.py --out)")
    tasks = load_task_dir(os.path.abspath(path)).get(split)
    if tasks is None:
        raise IndexError(f"the 'dir' task source has splits 'train' and 'heldout', not {split!r}")
    if not tasks:
        raise IndexError(f"tasks.dir={path!r} has no {split!r} tasks (a held-out split needs "
                         "tasks breaking at least two different functions)")
    return tasks[index % len(tasks)]
