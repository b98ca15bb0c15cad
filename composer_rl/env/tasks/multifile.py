"""Long bug-fix tasks whose sessions do not fit a small context window (source: "multifile").

A task is a small package of `N_FILES` modules, each holding `FUNCS_PER_FILE` correct
functions drawn from the generated family's templates (templates.py). One function has one
injected bug. The prompt names the failing function and one failing case, and lists the
module files, but not which of them defines the function; the visible test imports every
module with `from m import *`, so reading it does not tell either. The agent has to read
modules until it finds the definition, and -- when its window fills up on the way -- carry
"which file, which function" forward (a compaction summary) to make the one-line fix.

Grading is the generated family's: the hidden cases run in the sandbox against the buggy
module (`task.checks`, `task.module`), so the same tamper-proof grader applies. Pure
function of (split, index, seed); the split hashes the buggy function's variant exactly as
the generated family does, so no buggy function of "heldout" appears in "train".

`task.meta["files"]` is the module order of the prompt (the demonstrator reads in that
order); `task.meta["target_position"]` is the buggy module's place in it.

Source "multifile_numbered": the same tasks with the modules named m1..m5. A tiny byte
model copies random per-task names badly (29% of its reads named a missing module in the
first compaction ablation, BUILD_NOTES section 11); with fixed names only *which* module
holds the function has to be found and remembered.
"""
from __future__ import annotations

import random
from typing import List

from composer_rl.env.tasks import generated
from composer_rl.env.tasks.registry import TASK_SOURCES
from composer_rl.env.tasks.task import Task, content_id
from composer_rl.env.tasks.templates import TEMPLATES

N_FILES = 5          # modules per task; the buggy one is at a uniformly random position
FUNCS_PER_FILE = 2   # functions per module (distinct templates within a task)
MODULES = ("alpha", "beta", "gamma", "delta", "kappa", "sigma", "omega", "theta")
TEST_PATH = "tests/test_all.py"


def _draw_cases(rng, t, k, name, source, buggy):
    """Visible/hidden argument tuples and expected values on which the bug shows, as in
    `generated.generate` (the bug must change >= 1 visible and >= 1 hidden case)."""
    n = generated.N_VISIBLE + generated.N_HIDDEN
    for _ in range(generated.MAX_DRAWS):
        draws, seen = [], set()
        for _ in range(50 * n):
            a = tuple(t.args(rng, k))
            if repr(a) not in seen:
                seen.add(repr(a))
                draws.append(a)
            if len(draws) == n:
                break
        good = [generated._call(source, name, a) for a in draws]
        bad = [generated._call(buggy, name, a) for a in draws]
        if generated.ERROR in good or len(draws) < n:
            continue
        differs = [g != b or type(g) is not type(b) for g, b in zip(good, bad)]
        if any(differs[:generated.N_VISIBLE]) and any(differs[generated.N_VISIBLE:]):
            return draws, good, bad, differs
    raise RuntimeError(f"could not draw distinguishing cases for {name}")


def _test_file(modules: List[str], name: str, cases: List[dict]) -> str:
    # `import *` from every module: the visible test must not say which one defines `name`.
    return generated.test_file([f"from {m} import *  # noqa" for m in modules], name, cases)


def generate(split: str = "train", index: int = 0, seed: int = 0,
             numbered: bool = False) -> Task:
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    rng = random.Random(f"composer_rl-multifile:{seed}:{split}:{index}")
    while True:  # the buggy function decides the split (as in the generated family)
        t = rng.choice(TEMPLATES)
        bug_i = rng.randrange(len(t.bugs))
        name, k = rng.choice(t.names), rng.choice(t.consts)
        if generated._split_of((t.key, bug_i, name, k)) == split:
            break
    family, correct, buggy_snip = (s.format(name=name, k=k) if "{" in s else s
                                   for s in t.bugs[bug_i])
    target_src = t.source.format(name=name, k=k)
    modules = rng.sample(MODULES, N_FILES)  # drawn either way: the rest of the task is the same
    if numbered:
        modules = [f"m{i + 1}" for i in range(N_FILES)]
    target_pos = rng.randrange(N_FILES)
    target_slot = rng.randrange(FUNCS_PER_FILE)
    while True:  # filler functions: other templates, until the bug site is unique in its file
        others = rng.sample([o for o in TEMPLATES if o.key != t.key],
                            N_FILES * FUNCS_PER_FILE - 1)
        fillers = [o.source.format(name=rng.choice(o.names), k=rng.choice(o.consts))
                   for o in others]
        funcs = fillers[:target_pos * FUNCS_PER_FILE + target_slot] + [target_src] + fillers[
            target_pos * FUNCS_PER_FILE + target_slot:]
        files_src = ["\n\n".join(funcs[i * FUNCS_PER_FILE:(i + 1) * FUNCS_PER_FILE])
                     for i in range(N_FILES)]
        if files_src[target_pos].count(correct) == 1:
            break
    target = f"{modules[target_pos]}.py"
    buggy_file, oracle = generated._oracle_edit(target, files_src[target_pos], correct,
                                                buggy_snip)
    buggy_func = generated._oracle_edit(target, target_src, correct, buggy_snip)[0]
    draws, good, bad, differs = _draw_cases(rng, t, k, name, target_src, buggy_func)
    nv = generated.N_VISIBLE
    cases = [{"id": f"test_{name}_{i}" if i < nv else f"test_hidden_{i - nv}",
              "func": name, "args": list(a), "expected": g}
             for i, (a, g) in enumerate(zip(draws, good))]
    visible, hidden = cases[:nv], cases[nv:]
    fail = next(i for i in range(nv) if differs[i])
    call = f"{name}({', '.join(repr(a) for a in draws[fail])})"
    paths = [f"{m}.py" for m in modules]
    # Terse: on a byte-level model every byte of the prompt is a token of every context.
    prompt = (f"{call} should be {good[fail]!r} but is {bad[fail]!r}. Fix `{name}`, "
              f"defined in one of: {' '.join(paths)}")
    files = {p: (buggy_file if p == target else src) for p, src in zip(paths, files_src)}
    files[TEST_PATH] = _test_file(modules, name, visible)
    hid_path = "tests/test_all_hidden.py"
    tid = content_id("mf", (t.key, bug_i, name, k), modules, target_pos, fillers, draws, seed)
    test_ids = tuple(f"tests.test_all::{c['id']}" for c in visible) + tuple(
        f"tests.test_all_hidden::{c['id']}" for c in hidden)
    return Task(
        id=tid, family=family, split=split, files=files, editable=tuple(paths),
        visible_tests=(TEST_PATH,), hidden_tests={hid_path: _test_file(modules, name, hidden)},
        test_cmd="python -m pytest -q tests", prompt=prompt, oracle=(oracle,),
        test_paths=("tests",), test_ids=test_ids, checks=tuple(cases),
        module=modules[target_pos],
        meta={"template": t.key, "variant": [t.key, bug_i, name, k], "seed": seed,
              "index": index, "files": paths, "target_position": target_pos, "func": name})


TASK_SOURCES.register("multifile")(generate)


@TASK_SOURCES.register("multifile_numbered")
def generate_numbered(split: str = "train", index: int = 0, seed: int = 0) -> Task:
    return generate(split, index, seed, numbered=True)
