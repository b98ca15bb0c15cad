"""Function templates for generated bug-fix tasks.

Each template is a small, correct Python function (with a name and, for some, an integer
constant `{k}` chosen per task) and a list of bug sites: (family, correct line, buggy line).
The buggy module replaces one correct line by its buggy version; the oracle fix is the
reverse single-line `edit`. `args(rng, k)` draws one input tuple for a test case.

Families: wrong_operator, off_by_one, wrong_constant, swapped_args, missing_branch,
wrong_return. Every template is checked at generation time: the buggy line must be unique in
the buggy module and the bug must change the output of at least one visible and one hidden
case (cases are redrawn until it does).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, List, Tuple


@dataclasses.dataclass(frozen=True)
class Template:
    key: str
    names: Tuple[str, ...]
    consts: Tuple[int, ...]  # values for {k}; (0,) when the template has no constant
    source: str  # uses {name} and {k}
    bugs: Tuple[Tuple[str, str, str], ...]  # (family, correct line, buggy line)
    args: Callable  # (rng, k) -> tuple of call arguments


def _ints(rng, n, lo=-9, hi=9) -> List[int]:
    return [rng.randint(lo, hi) for _ in range(n)]


def _find_args(rng, k):
    xs = rng.sample(range(10, 40), 5)
    return xs, rng.choice(xs[:1] * 2 + xs + [99])  # the first slot is where off-by-one bites


TEMPLATES: Tuple[Template, ...] = (
    Template("clamp", ("clamp", "bound", "limit", "clip", "squash"), (0,),
             "def {name}(x, lo, hi):\n    if x < lo:\n        return lo\n"
             "    if x > hi:\n        return hi\n    return x\n",
             (("wrong_operator", "    if x < lo:", "    if x > lo:"),
              ("wrong_return", "        return hi", "        return lo"),
              ("missing_branch", "    if x > hi:\n        return hi\n", "")),
             lambda rng, k: (rng.randint(-20, 20), rng.randint(-10, -1), rng.randint(1, 10))),
    Template("count_above", ("count_above", "num_greater", "count_over", "tally_above"), (0,),
             "def {name}(xs, t):\n    n = 0\n    for x in xs:\n        if x > t:\n"
             "            n += 1\n    return n\n",
             (("wrong_operator", "        if x > t:", "        if x >= t:"),
              ("wrong_constant", "    n = 0", "    n = 1"),
              ("wrong_return", "    return n", "    return len(xs)")),
             lambda rng, k: (_ints(rng, rng.randint(3, 7), -3, 3), rng.randint(-2, 2))),
    Template("tri", ("triangle", "sum_to", "total_upto", "series_sum"), (1, 2, 3),
             "def {name}(n):\n    total = 0\n    for i in range({k}, n + 1):\n"
             "        total += i\n    return total\n",
             (("off_by_one", "    for i in range({k}, n + 1):", "    for i in range({k}, n):"),
              ("wrong_operator", "        total += i", "        total -= i")),
             lambda rng, k: (rng.randint(4, 30),)),
    Template("scale", ("scale", "times_k", "amplify", "gain"), (2, 3, 4, 5, 6, 7, 8, 9, 10, 11),
             "def {name}(x, offset):\n    return x * {k} + offset\n",
             (("wrong_operator", "    return x * {k} + offset", "    return x * {k} - offset"),
              ("wrong_constant", "    return x * {k} + offset", "    return x * {k}1 + offset")),
             lambda rng, k: (rng.randint(-50, 50), rng.randint(1, 50))),
    Template("safe_div", ("safe_div", "ratio", "divide", "quotient"), (0, -1, 1),
             "def {name}(a, b):\n    if b == 0:\n        return {k}\n    return a // b\n",
             (("swapped_args", "    return a // b", "    return b // a"),
              ("missing_branch", "    if b == 0:\n        return {k}\n", ""),
              ("wrong_operator", "    return a // b", "    return a % b")),
             lambda rng, k: (rng.randint(10, 99), rng.choice([0, rng.randint(2, 9)]))),
    Template("find", ("find_index", "index_of", "locate", "position"), (-1,),
             "def {name}(xs, target):\n    for i in range(len(xs)):\n"
             "        if xs[i] == target:\n            return i\n    return {k}\n",
             (("off_by_one", "    for i in range(len(xs)):", "    for i in range(1, len(xs)):"),
              ("wrong_return", "            return i", "            return xs[i]"),
              ("wrong_constant", "    return {k}", "    return 0")),
             _find_args),
    Template("power", ("power", "raise_to", "exp_int"), (0,),
             "def {name}(base, exp):\n    return pow(base, exp)\n",
             (("swapped_args", "    return pow(base, exp)", "    return pow(exp, base)"),),
             lambda rng, k: (rng.randint(2, 6), rng.randint(2, 5))),
    Template("leap", ("is_leap", "leap_year", "has_feb29"), (0,),
             "def {name}(y):\n    if y % 400 == 0:\n        return True\n"
             "    if y % 100 == 0:\n        return False\n    return y % 4 == 0\n",
             (("wrong_constant", "    if y % 400 == 0:", "    if y % 300 == 0:"),
              ("missing_branch", "    if y % 100 == 0:\n        return False\n", ""),
              ("wrong_return", "        return True", "        return False")),
             lambda rng, k: (rng.choice([rng.randint(15, 30) * 100, rng.randint(1, 2500)]),)),
    Template("last_n", ("last_n", "tail", "take_last"), (0,),
             "def {name}(xs, n):\n    if n <= 0:\n        return []\n    return xs[-n:]\n",
             (("off_by_one", "    return xs[-n:]", "    return xs[-n + 1:]"),
              ("missing_branch", "    if n <= 0:\n        return []\n", ""),
              ("wrong_operator", "    if n <= 0:", "    if n < 0:")),
             lambda rng, k: (_ints(rng, 6), rng.randint(0, 4))),
    Template("maxgap", ("max_gap", "widest_step", "biggest_jump"), (0,),
             "def {name}(xs):\n    best = 0\n    for i in range(1, len(xs)):\n"
             "        best = max(best, xs[i] - xs[i - 1])\n    return best\n",
             (("swapped_args", "        best = max(best, xs[i] - xs[i - 1])",
               "        best = max(best, xs[i - 1] - xs[i])"),
              ("off_by_one", "    for i in range(1, len(xs)):", "    for i in range(2, len(xs)):")),
             lambda rng, k: (_ints(rng, rng.randint(3, 7), 0, 30),)),
    Template("repeat", ("repeat_join", "join_copies", "stutter"), (0,),
             "def {name}(s, n, sep):\n    return sep.join([s] * n)\n",
             (("swapped_args", "    return sep.join([s] * n)", "    return s.join([sep] * n)"),
              ("off_by_one", "    return sep.join([s] * n)", "    return sep.join([s] * (n - 1))")),
             lambda rng, k: (rng.choice(["ab", "x", "cat", "zz"]), rng.randint(2, 5),
                             rng.choice(["-", ",", "+"]))),
    Template("sign", ("sign", "signum", "polarity"), (1, 2, 3),
             "def {name}(x):\n    if x > 0:\n        return {k}\n    if x < 0:\n"
             "        return -{k}\n    return 0\n",
             (("wrong_operator", "    if x < 0:", "    if x > 0:"),
              ("wrong_constant", "        return -{k}", "        return -{k}0"),
              ("missing_branch", "    if x < 0:\n        return -{k}\n", "")),
             lambda rng, k: (rng.choice([0, rng.randint(-9, -1), rng.randint(1, 9)]),)),
)
