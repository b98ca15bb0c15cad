"""Sandbox benchmark: `python -m composer_rl.bench.sandbox [--commands=N] [--episodes=N]
[--threads=T] [--full_policy_check]`, prints one JSON object.

  plain_ms / sandbox_ms / overhead_ms: mean wall time of `true` through subprocess (/bin/sh)
    vs through the bwrap sandbox (setpriv + prlimit + bwrap + cgroup), and their difference.
  python_plain_ms / python_sandbox_ms: the same for `python3 -c pass` (a typical tool call).
  oracle_episodes_per_s: full oracle episodes on generated tasks (reset, read, edit, run the
    visible tests, submit, grade in a fresh sandbox, close), sequential and with T threads.
  policy_check (with --full_policy_check): oracle/null/adversary rewards on 100 generated
    and all (>= 10) real-repository toolz tasks; expected 1 / 0 / 0 everywhere.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor


def _time_ms(fn, n: int) -> float:
    fn()  # warm-up (first call builds cached rootfs dirs)
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1000)
    return round(statistics.mean(ts), 2)


def command_overhead(n: int) -> dict:
    from composer_rl.env.sandbox import make_sandbox
    from composer_rl.env.world import World
    sb = make_sandbox("bwrap")
    with World({}, sb) as w:
        plain = _time_ms(lambda: subprocess.run(["/bin/sh", "-c", "true"], cwd=w.root), n)
        boxed = _time_ms(lambda: w.run("true"), n)
        py_plain = _time_ms(lambda: subprocess.run(["/usr/bin/python3", "-c", "pass"], cwd=w.root), n)
        py_boxed = _time_ms(lambda: w.run("python3 -c pass"), n)
    return {"plain_ms": plain, "sandbox_ms": boxed, "overhead_ms": round(boxed - plain, 2),
            "python_plain_ms": py_plain, "python_sandbox_ms": py_boxed,
            "python_overhead_ms": round(py_boxed - py_plain, 2), "commands": n}


def episodes_per_second(n: int, threads: int) -> dict:
    from composer_rl.env import get_task, run_episode
    tasks = [get_task("generated", "train", 1000 + i) for i in range(n)]
    t0 = time.perf_counter()
    rewards = [run_episode("oracle", t).reward for t in tasks]
    seq = n / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as ex:
        rewards += list(ex.map(lambda t: run_episode("oracle", t).reward, tasks))
    par = n / (time.perf_counter() - t0)
    return {"oracle_episodes_per_s": round(seq, 2), f"oracle_episodes_per_s_{threads}_threads":
            round(par, 2), "episodes": n, "oracle_mean_reward": sum(rewards) / len(rewards)}


def policy_check(n_generated: int = 100) -> dict:
    from composer_rl.env import get_task, run_episode
    from composer_rl.env.tasks.realrepo import load_toolz_tasks
    out = {}
    for name, tasks in (("generated", [get_task("generated", "train", i) for i in range(n_generated)]),
                        ("toolz", list(load_toolz_tasks()))):
        res = {}
        for policy in ("oracle", "null", "adversary"):
            eps = [run_episode(policy, t) for t in tasks]
            res[policy] = {"mean_reward": sum(e.reward for e in eps) / len(eps),
                           "min": min(e.reward for e in eps), "max": max(e.reward for e in eps),
                           "episodes_with_logged_attempts": sum(bool(e.hack_attempts) for e in eps)}
        out[name] = {"tasks": len(tasks), **res}
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--commands", type=int, default=30)
    p.add_argument("--episodes", type=int, default=10)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--full_policy_check", action="store_true")
    a = p.parse_args(argv)
    result = {**command_overhead(a.commands), **episodes_per_second(a.episodes, a.threads)}
    if a.full_policy_check:
        t0 = time.perf_counter()
        result["policy_check"] = policy_check()
        result["policy_check_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
