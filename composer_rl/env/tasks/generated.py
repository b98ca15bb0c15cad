"""Deterministic generator of small bug-fix tasks (source name: "generated").

`generate(split, index, seed)` is a pure function of its arguments. A task is a template
(see templates.py) instantiated with a function name, constant and module name (the "code
variant"), one injected bug, 3 visible and 6 hidden input cases. The split is a function of
the code variant's hash (HELDOUT_PERCENT of variants are held out), so no buggy module in
"heldout" ever appears in "train": the splits are disjoint by construction, not by sampling.

The prompt names the function and shows one failing visible case (input, expected, actual),
enough for a small model to localize the bug; the oracle is a single `edit`.
"""
from __future__ import annotations

import hashlib
import random
from typing import Any, List, Tuple

from composer_rl.env.tasks.registry import TASK_SOURCES
from composer_rl.env.tasks.task import Edit, Task, content_id
from composer_rl.env.tasks.templates import TEMPLATES, Template

HELDOUT_PERCENT = 10  # share of code variants reserved for the held-out split
N_VISIBLE, N_HIDDEN = 3, 6  # test cases the agent sees / only the grader has
MODULES = ("mathutil", "helpers", "core", "ops", "utils", "calc", "tools")
MAX_DRAWS = 200  # redraws of cases before giving up on a variant (never hit in practice)
ERROR = "<error>"


def _split_of(variant: Tuple) -> str:
    h = int(hashlib.sha256(repr(variant).encode()).hexdigest(), 16)
    return "heldout" if h % 100 < HELDOUT_PERCENT else "train"


def _call(source: str, name: str, args: Tuple) -> Any:
    """Run our own (trusted) template code on the host to get a case's value."""
    ns: dict = {}
    exec(compile(source, "<template>", "exec"), ns)  # noqa: S102 - template code, not agent code
    try:
        return ns[name](*[list(a) if isinstance(a, list) else a for a in args])
    except Exception:
        return ERROR


def _oracle_edit(path: str, source: str, correct: str, buggy_snip: str) -> Tuple[str, Edit]:
    """Inject the bug; return buggy source and the smallest unique single edit that undoes it."""
    i = source.index(correct)
    prefix, suffix = source[:i], source[i + len(correct):]
    buggy = prefix + buggy_snip + suffix
    left, right = "", ""
    pre_lines = prefix.splitlines(keepends=True)
    suf_lines = suffix.splitlines(keepends=True)
    while True:
        old = left + buggy_snip + right
        if old.strip() and buggy.count(old) == 1:
            return buggy, Edit(path, old, left + correct + right)
        if suf_lines and (not buggy_snip or len(right) <= len(left)):
            right += suf_lines.pop(0)
        elif pre_lines:
            left = pre_lines.pop() + left
        else:
            raise ValueError("cannot make a unique oracle edit")


def test_file(import_lines: List[str], name: str, cases: List[dict]) -> str:
    """A pytest module: `import_lines`, then one test per case asserting `name(*args)`."""
    lines = list(import_lines) + [""]
    for c in cases:
        call = f"{name}({', '.join(repr(a) for a in c['args'])})"
        lines += ["", f"def {c['id']}():", f"    assert {call} == {c['expected']!r}", ""]
    return "\n".join(lines)


def generate(split: str = "train", index: int = 0, seed: int = 0) -> Task:
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    rng = random.Random(f"composer_rl-generated:{seed}:{split}:{index}")
    while True:
        t: Template = rng.choice(TEMPLATES)
        bug_i = rng.randrange(len(t.bugs))
        name, k, module = rng.choice(t.names), rng.choice(t.consts), rng.choice(MODULES)
        variant = (t.key, bug_i, name, k, module)
        if _split_of(variant) == split:
            break
    family, correct, buggy_snip = (s.format(name=name, k=k) if "{" in s else s
                                   for s in t.bugs[bug_i])
    path = f"{module}.py"
    source = t.source.format(name=name, k=k)
    buggy, oracle = _oracle_edit(path, source, correct, buggy_snip)
    for _ in range(MAX_DRAWS):
        draws, seen = [], set()
        for _ in range(50 * (N_VISIBLE + N_HIDDEN)):  # distinct cases only
            a = tuple(t.args(rng, k))
            if repr(a) not in seen:
                seen.add(repr(a))
                draws.append(a)
            if len(draws) == N_VISIBLE + N_HIDDEN:
                break
        good = [_call(source, name, a) for a in draws]
        bad = [_call(buggy, name, a) for a in draws]
        if ERROR in good or len(draws) < N_VISIBLE + N_HIDDEN:
            continue
        differs = [g != b or type(g) is not type(b) for g, b in zip(good, bad)]
        if any(differs[:N_VISIBLE]) and any(differs[N_VISIBLE:]):
            break
    else:
        raise RuntimeError(f"could not draw distinguishing cases for {variant}")
    cases = [{"id": f"test_{name}_{i}" if i < N_VISIBLE else f"test_hidden_{i - N_VISIBLE}",
              "func": name, "args": list(a), "expected": g}
             for i, (a, g) in enumerate(zip(draws, good))]
    visible, hidden = cases[:N_VISIBLE], cases[N_VISIBLE:]
    fail = next(i for i in range(N_VISIBLE) if differs[i])
    vis_path, hid_path = f"tests/test_{module}.py", f"tests/test_{module}_hidden.py"
    call = f"{name}({', '.join(repr(a) for a in draws[fail])})"
    prompt = (f"Fix the bug in `{name}` in {path}. Failing test: {call} should be "
              f"{good[fail]!r} but is {bad[fail]!r}. Run tests: python -m pytest -q tests")
    tid = content_id("gen", variant, draws, seed)
    test_ids = tuple(f"tests.test_{module}::{c['id']}" for c in visible) + tuple(
        f"tests.test_{module}_hidden::{c['id']}" for c in hidden)
    return Task(
        id=tid, family=family, split=split,
        files={path: buggy, vis_path: test_file([f"from {module} import {name}"], name, visible)},
        editable=(path,), visible_tests=(vis_path,),
        hidden_tests={hid_path: test_file([f"from {module} import {name}"], name, hidden)},
        test_cmd="python -m pytest -q tests", prompt=prompt, oracle=(oracle,),
        test_paths=("tests",), test_ids=test_ids, checks=tuple(cases), module=module,
        meta={"template": t.key, "variant": list(variant), "seed": seed, "index": index})


TASK_SOURCES.register("generated")(generate)
