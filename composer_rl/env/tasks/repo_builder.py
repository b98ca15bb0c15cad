"""SWE-smith-style task builder: mutate a function of a real repository so that some of the
repository's own tests fail, and keep the mutation as a task only if it is validated.

`build_tasks(repo_dir, test_cmd, ...)` works on any Python repository, without code changes:
  1. Load the repository's text files (skipping VCS, caches, build metadata).
  2. Run `test_cmd` on the pristine repository in the sandbox: it must exit 0 (the oracle --
     the pristine code -- passes). Run the grader's own pytest runner once to record which
     test ids pass; those become the task's expected ids (grading.md rule 7).
  3. For each candidate mutation (mutations.py) of each function (optionally only those named
     in `functions`), in a seeded order: splice it in, require the file still parses, run the
     grader on the mutated repository, and keep it only if some expected tests now fail.
Each kept task has the mutated repository as its files, the mutated file as the only
editable path, the repository's tests as visible tests, and the reverse single `edit` as the
oracle. The prompt names the function and one failing test (SWE-smith gives the issue text).
"""
from __future__ import annotations

import ast
import os
import random
import shlex
import tempfile
import shutil
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from composer_rl.env import grading
from composer_rl.env.tasks.mutations import branch_removals, expression_mutations
from composer_rl.env.tasks.task import Edit, Task, content_id

TEXT_SUFFIXES = (".py", ".cfg", ".toml", ".ini", ".txt", ".rst", ".md", ".json", ".yaml", ".yml")
SKIP_DIRS = {".git", "__pycache__", ".pytest_cache", ".tox", "build", "dist", ".eggs"}
MAX_FILE_BYTES = 256 << 10


def load_repo(repo_dir: str) -> Dict[str, str]:
    files = {}
    for dirpath, dirnames, filenames in os.walk(repo_dir):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS
                             and not d.endswith((".egg-info", ".dist-info")))
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            if (not name.endswith(TEXT_SUFFIXES) and name not in ("LICENSE", "PKG-INFO")) \
                    or os.path.islink(path) or os.path.getsize(path) > MAX_FILE_BYTES:
                continue
            try:
                with open(path, encoding="utf-8") as f:
                    files[os.path.relpath(path, repo_dir)] = f.read()
            except UnicodeDecodeError:
                continue
    return files


def is_test_path(path: str) -> bool:
    parts = path.split("/")
    return (any(p in ("tests", "test", "testing") for p in parts[:-1])
            or parts[-1].startswith("test_") or parts[-1].endswith("_test.py")
            or parts[-1] == "conftest.py")


def test_paths_from_cmd(test_cmd: str, files: Dict[str, str]) -> Tuple[str, ...]:
    """Explicit test paths for the grader: the command's arguments that name repo paths."""
    out = []
    for tok in shlex.split(test_cmd):
        tok = tok.rstrip("/")
        if tok in files or any(p.startswith(tok + "/") for p in files):
            out.append(tok)
    return tuple(out) or (".",)


def _unique_edit(path: str, mutated: str, original: str, lo: int, hi: int) -> Edit:
    """Smallest line window around lines [lo, hi) of `mutated` unique in the mutated file."""
    m_lines = mutated.splitlines(keepends=True)
    o_lines = original.splitlines(keepends=True)
    delta = len(o_lines) - len(m_lines)
    a, b = lo, max(hi, lo + 1)
    while True:
        old = "".join(m_lines[a:b])
        if old.strip() and mutated.count(old) == 1:
            return Edit(path, old, "".join(o_lines[a:b + delta]))
        if b < len(m_lines):
            b += 1
        if a > 0:
            a -= 1
        if a == 0 and b >= len(m_lines):
            return Edit(path, mutated, original)


def candidates(files: Dict[str, str], functions: Optional[Sequence[str]] = None
               ) -> Iterator[Tuple[str, str, str, str, Edit]]:
    """(family, path, function, mutated file text, oracle edit) for every mutation."""
    for path in sorted(files):
        if not path.endswith(".py") or is_test_path(path):
            continue
        src = files[path]
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        lines = src.splitlines(keepends=True)
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if functions and func.name not in functions:
                continue
            for family, node, repl in expression_mutations(func):
                i = node.lineno - 1
                line = lines[i].encode()
                new_line = (line[:node.col_offset].decode() + repl
                            + line[node.end_col_offset:].decode())
                mutated = "".join(lines[:i] + [new_line] + lines[i + 1:])
                if mutated != src:
                    yield family, path, func.name, mutated, _unique_edit(path, mutated, src, i, i + 1)
            for first, last in branch_removals(func):
                mutated = "".join(lines[:first - 1] + lines[last:])
                yield ("missing_branch", path, func.name, mutated,
                       _unique_edit(path, mutated, src, first - 1, first - 1))


def _grade_files(files, test_paths, test_ids, sandbox, timeout_s):
    probe = Task(id="probe", family="probe", split="train", files=files, editable=(),
                 visible_tests=(), hidden_tests={}, test_cmd="", prompt="", oracle=(),
                 test_paths=test_paths, test_ids=test_ids)
    tmp = tempfile.mkdtemp(prefix="composer_rl_build_")
    try:
        return grading.grade(probe, tmp, sandbox, timeout_s=timeout_s, use_checks=False)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def pristine_test_ids(files, test_paths, sandbox, timeout_s) -> Tuple[str, ...]:
    """Ids of tests that pass on the pristine repository (grader's runner, junit)."""
    report = _grade_files(files, test_paths, ("<collect>",), sandbox, timeout_s)
    return tuple(sorted(t for t, o in report.outcomes.items() if o == "passed"))


def build_tasks(repo_dir: str, test_cmd: str, sandbox, max_tasks: int = 10, seed: int = 0,
                functions: Optional[Sequence[str]] = None, max_candidates: int = 200,
                timeout_s: float = 120.0, name: Optional[str] = None, log=print) -> List[Task]:
    from composer_rl.env.world import World
    files = load_repo(repo_dir)
    name = name or os.path.basename(os.path.abspath(repo_dir))
    with World(files, sandbox) as w:
        r = w.run(test_cmd, timeout_s=timeout_s)
    if r.exit_code != 0:
        raise RuntimeError(f"test command fails on the pristine repository "
                           f"(exit {r.exit_code}):\n{(r.stdout + r.stderr)[-2000:]}")
    test_paths = test_paths_from_cmd(test_cmd, files)
    ids = pristine_test_ids(files, test_paths, sandbox, timeout_s)
    if not ids:
        raise RuntimeError("no passing tests found on the pristine repository")
    log(f"pristine: {len(ids)} passing tests; test paths {test_paths}")
    cands = list(candidates(files, functions))
    random.Random(seed).shuffle(cands)
    tasks, used_funcs = [], set()
    for family, path, func, mutated, oracle in cands[:max_candidates]:
        if len(tasks) >= max_tasks:
            break
        if (path, func) in used_funcs:  # one task per function keeps the set diverse
            continue
        new_files = dict(files)
        new_files[path] = mutated
        report = _grade_files(new_files, test_paths, ids, sandbox, timeout_s)
        if report.passed or report.timed_out:
            continue
        if report.n_total - report.n_passed == 0:
            continue
        used_funcs.add((path, func))
        failing = report.reason.split("e.g. ")[-1].split(" (")[0]
        task = Task(
            id=content_id(f"repo-{name}", path, mutated), family=f"realrepo:{family}",
            split="train", files=new_files, editable=(path,),
            visible_tests=tuple(p for p in files if is_test_path(p)), hidden_tests={},
            test_cmd=test_cmd, oracle=(oracle,), test_paths=test_paths, test_ids=ids,
            prompt=(f"A bug was introduced in `{func}` in {path}: {report.n_total - report.n_passed} "
                    f"test(s) fail, e.g. {failing}. Fix it. Run tests: {test_cmd}"),
            meta={"repo": name, "function": func, "n_failing": report.n_total - report.n_passed})
        tasks.append(task)
        log(f"kept {task.id}: {family} in {path}:{func} ({task.meta['n_failing']} failing)")
    return tasks


def save_tasks(tasks: List[Task], out_dir: str) -> List[str]:
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for t in tasks:
        p = os.path.join(out_dir, t.id + ".json")
        with open(p, "w") as f:
            f.write(t.to_json())
        paths.append(p)
    return paths


def load_tasks(task_dir: str) -> List[Task]:
    out = []
    for name in sorted(os.listdir(task_dir)):
        if name.endswith(".json"):
            with open(os.path.join(task_dir, name)) as f:
                out.append(Task.from_json(f.read()))
    return out
