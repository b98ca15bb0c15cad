"""Tasks whose answer is a fact gathered across a session longer than the window ("keychain").

A key is split into `N_PARTS` parts of `PART_CHARS` characters (part I from
`PART_ALPHABETS[I]`); module `mI.py` (I = 1..N)
holds part I as `kI = 'Q'` above one correct filler function (the generated family's
templates, so the world reads like code). `key.py` starts with `k1 = ''` .. `k4 = ''` and
`def key(): return k1 + k2 + k3 + k4`; the agent must set each kI there to its value in mI.py
(the prompt says so). Reading the four modules and setting the parts take more tokens than
the experiment's window (670 to 911, against 640), so by the time the agent writes the
parts, the first ones have left its context: it succeeds only if it carried them forward.
A compaction summary can (`k1 = 'Q' k2 = 'H'`); truncating old turns drops them by
construction -- the separation the compaction ablation needs (issue #7, BUILD_NOTES
section 11), which the "multifile" family did not give (there, the last module read tells
a truncated context where it is, and nothing earlier is needed). The parts are written as
`kI = 'Q'` everywhere (module, summary, answer), the form of the copy rows that teach a
small model to copy (`data/copy_curriculum.py`, "parts").

Fixed module names and a fixed reading order: a tiny byte model copies random names badly
(BUILD_NOTES section 11), and only the parts are what must be remembered.

Grading: one check calls `key()` in the sandbox and compares it with the key (rule 4);
the modules are `world_only`, absent from the grading copy, so `from m1 import k1` in
key.py scores 0 (an answer must carry the parts, not import them). The split hashes the
key, so no held-out key is a train key. Pure function of (split, index, seed).

`task.meta`: "files" (reading order), "parts" (part I of the key is in files[I]), "key".
"""
from __future__ import annotations

import hashlib
import random

from composer_rl.env.tasks.registry import TASK_SOURCES
from composer_rl.env.tasks.task import Edit, Task, content_id
from composer_rl.env.tasks.templates import TEMPLATES

N_PARTS = 4
PART_CHARS = 1
# One character per part, upper-case letters that occur nowhere else in a session (the
# code (but True, False), the prompts and the tool calls are lower-case; the prompts start
# with D, S, T), so what is to be copied is recognizable by what it is.
ALPHABET = "ABCEGHJKLNPQRUVWXYZ"
# Part I's letters: its own quarter of the alphabet (a part has a type, as a path or a port
# number has). What tells k2's value from k1's in a context is then the value itself, not
# the name three tokens before it: in 500 steps from scratch the tiny model recalls typed
# parts (copy loss 0.12) and untyped ones barely better than one of the four at random
# (1.15; ln 4 = 1.39) (python -m composer_rl.bench.copying --mode=probe
# --rows=parts|typed_parts --steps=500; BUILD_NOTES section 11). A guess is right 1 time in
# 5 per part, so an agent that lost two parts solves ~4 % by luck.
PART_ALPHABETS = (ALPHABET[0:5], ALPHABET[5:10], ALPHABET[10:15], ALPHABET[15:])
HELDOUT_PERCENT = 10
KEY_PATH = "key.py"
BLANKS = "".join(f"k{i + 1} = ''\n" for i in range(N_PARTS))   # key.py's parts, unset
KEY_SOURCE = BLANKS + "\n\ndef key():\n    return " + " + ".join(
    f"k{i + 1}" for i in range(N_PARTS)) + "\n"
TEST_PATH = "tests/test_key.py"
HIDDEN_PATH = "tests/test_key_hidden.py"


def _split_of(key: str) -> str:
    h = int(hashlib.sha256(f"keychain:{key}".encode()).hexdigest(), 16)
    return "heldout" if h % 100 < HELDOUT_PERCENT else "train"


def _module(i: int, part: str, filler: str) -> str:
    return f"k{i + 1} = '{part}'\n\n\n{filler}"


@TASK_SOURCES.register("keychain")
def generate(split: str = "train", index: int = 0, seed: int = 0) -> Task:
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    rng = random.Random(f"composer_rl-keychain:{seed}:{split}:{index}")
    while True:  # the key decides the split
        parts = ["".join(rng.choice(letters) for _ in range(PART_CHARS))
                 for letters in PART_ALPHABETS]
        key = "".join(parts)
        if _split_of(key) == split:
            break
    fillers = [t.source.format(name=rng.choice(t.names), k=rng.choice(t.consts))
               for t in rng.sample(TEMPLATES, N_PARTS)]
    paths = [f"m{i + 1}.py" for i in range(N_PARTS)]
    files = {p: _module(i, part, f) for i, (p, part, f) in enumerate(zip(paths, parts, fillers))}
    files[KEY_PATH] = KEY_SOURCE
    # The visible test checks the form only: a failing assertion would print the key.
    files[TEST_PATH] = ("from key import key\n\n\ndef test_key_form():\n"
                        f"    assert isinstance(key(), str) and len(key()) == {len(key)}\n")
    hidden = {HIDDEN_PATH: f"from key import key\n\n\ndef test_key():\n    assert key() == {key!r}\n"}
    # Terse: on a byte-level model every byte of the prompt is a token of every context.
    prompt = (f"Set k1..k{N_PARTS} in {KEY_PATH} to the values they have in "
              f"{' '.join(paths)}.")
    return Task(
        id=content_id("kc", key, fillers, seed), family="keychain", split=split, files=files,
        editable=(KEY_PATH,), visible_tests=(TEST_PATH,), hidden_tests=hidden,
        test_cmd="python -m pytest -q tests", prompt=prompt,
        oracle=(Edit(KEY_PATH, BLANKS.rstrip("\n"), "\n".join(
            f"k{i + 1} = '{p}'" for i, p in enumerate(parts))),),
        test_paths=("tests",),
        test_ids=("tests.test_key::test_key_form", "tests.test_key_hidden::test_key"),
        checks=({"id": "test_key", "func": "key", "args": [], "expected": key},),
        module="key", world_only=tuple(paths),
        meta={"files": paths, "parts": parts, "key": key, "seed": seed, "index": index})
