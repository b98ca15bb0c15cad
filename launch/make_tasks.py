"""Build SWE-smith-style bug-fix tasks from any Python repository.

    python launch/make_tasks.py --repo=DIR --test_cmd="python -m pytest -q tests" --out=DIR \
        [--max_tasks=10] [--seed=0] [--functions=f,g] [--spec_out=FILE]

Writes one JSON Task per kept mutation into --out (a task is kept only if the pristine
code passes the tests and the mutation makes some of them fail). --spec_out also writes the
compact form that composer_rl/env/data/toolz_tasks.json uses.
"""
import argparse
import sys

from composer_rl.env.cli import make_tasks_main

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repo", required=True)
    p.add_argument("--test_cmd", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--max_tasks", type=int, default=10)
    p.add_argument("--max_candidates", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--functions", default="", help="comma-separated function names (default: all)")
    p.add_argument("--spec_out", default=None)
    a = p.parse_args()
    sys.exit(make_tasks_main(a.repo, a.test_cmd, a.out, a.max_tasks, a.seed,
                             [f for f in a.functions.split(",") if f], a.spec_out, a.max_candidates))
