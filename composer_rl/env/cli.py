"""Library side of the launch/ entry points (the scripts only parse flags)."""
from __future__ import annotations

import json
import sys
from typing import Optional

from composer_rl.env.sandbox import SandboxUnavailable, make_sandbox
from composer_rl.env.world import World


def _task_files(task_spec: Optional[str]) -> dict:
    if not task_spec:
        return {}
    from composer_rl.env.tasks import get_task
    source, split, index = (task_spec.split(":") + ["train", "0"])[:3]
    return dict(get_task(source, split, int(index)).files)


def sandbox_exec_main(command: str, as_json: bool = False, timeout_s: Optional[float] = None,
                      task_spec: Optional[str] = None) -> int:
    try:
        sandbox = make_sandbox("bwrap")
    except SandboxUnavailable as e:
        print(f"sandbox unavailable: {e}", file=sys.stderr)
        return 2
    with World(_task_files(task_spec), sandbox) as world:
        r = world.run(command, timeout_s=timeout_s)
    if as_json:
        print(r.to_json())
        return 0
    sys.stdout.write(r.stdout)
    sys.stderr.write(r.stderr)
    if r.killed_reason:
        print(f"[sandbox: {r.killed_reason}]", file=sys.stderr)
    return r.exit_code


def make_tasks_main(repo, test_cmd, out, max_tasks=10, seed=0, functions=None, spec_out=None,
                    max_candidates=200) -> int:
    from composer_rl.env.tasks.realrepo import specs_from_tasks
    from composer_rl.env.tasks.repo_builder import build_tasks, load_repo, save_tasks
    try:
        sandbox = make_sandbox("bwrap")
        tasks = build_tasks(repo, test_cmd, sandbox, max_tasks=max_tasks, seed=seed,
                            functions=functions or None, max_candidates=max_candidates,
                            log=lambda m: print(m, file=sys.stderr))
    except (SandboxUnavailable, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    paths = save_tasks(tasks, out)
    if spec_out:
        with open(spec_out, "w") as f:
            json.dump(specs_from_tasks(tasks, load_repo(repo), test_cmd), f, indent=1)
    print(json.dumps({"kept": len(tasks), "out": out, "files": [p.split("/")[-1] for p in paths]}))
    return 0 if tasks else 1
