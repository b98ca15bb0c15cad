"""Best-effort per-sandbox cgroups (pids + memory), used where the host lets us write them.

rlimits already bound each sandbox (RLIMIT_NPROC works because every sandbox runs under its
own unprivileged host uid), so a cgroup is a second layer, not the only one: where no cgroup
hierarchy is writable (many containers) we simply run without one and say so in the result.

Supports cgroup v1 (separate `pids` and `memory` hierarchies, as on this machine) and v2
(unified hierarchy with the `pids` and `memory` controllers enabled for our subtree).
"""
from __future__ import annotations

import os
import shlex
import signal
import time
import uuid
from typing import List, Optional

_V1 = {"pids": "pids.max", "memory": "memory.limit_in_bytes"}


def _own_path(controller: str) -> str:
    """Our process's cgroup path in a v1 hierarchy ('' for v2 entry '0::')."""
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, ctrls, path = line.rstrip("\n").split(":", 2)
                if controller in ctrls.split(","):
                    return path
    except OSError:
        pass
    return "/"


def _writable_dir(path: str) -> bool:
    return os.path.isdir(path) and os.access(path, os.W_OK)


class Cgroup:
    """One sandbox's cgroup directories; `wrap(argv)` joins them before exec (race-free)."""

    def __init__(self, dirs: List[str]):
        self.dirs = dirs

    @staticmethod
    def create(max_pids: int, memory_bytes: int) -> Optional["Cgroup"]:
        name = "composer_rl_" + uuid.uuid4().hex[:12]
        dirs = []
        try:
            for ctrl, limit_file in _V1.items():
                base = os.path.join("/sys/fs/cgroup", ctrl) + _own_path(ctrl)
                if not _writable_dir(base) or not os.path.exists(os.path.join(base, "cgroup.procs")):
                    continue
                d = os.path.join(base, name)
                os.mkdir(d)
                dirs.append(d)
                value = max_pids if ctrl == "pids" else memory_bytes
                with open(os.path.join(d, limit_file), "w") as f:
                    f.write(str(value))
            if not dirs:  # try the v2 unified hierarchy
                base = "/sys/fs/cgroup" + _own_path("")
                ctrl_file = os.path.join(base, "cgroup.subtree_control")
                if _writable_dir(base) and os.path.exists(ctrl_file):
                    with open(ctrl_file) as f:
                        enabled = f.read().split()
                    if "pids" in enabled:
                        d = os.path.join(base, name)
                        os.mkdir(d)
                        dirs.append(d)
                        with open(os.path.join(d, "pids.max"), "w") as f:
                            f.write(str(max_pids))
                        if "memory" in enabled:
                            with open(os.path.join(d, "memory.max"), "w") as f:
                                f.write(str(memory_bytes))
        except OSError:
            Cgroup(dirs).destroy()
            return None
        return Cgroup(dirs) if dirs else None

    def wrap(self, argv: List[str]) -> List[str]:
        """Prefix argv with a shell that moves itself into our cgroups, then execs argv."""
        joins = " && ".join(f"echo $$ > {shlex.quote(os.path.join(d, 'cgroup.procs'))}"
                            for d in self.dirs)
        return ["/bin/sh", "-c", joins + ' && exec "$@"', "cgroup-join"] + list(argv)

    def oom_killed(self) -> bool:
        for d in self.dirs:
            for fname in ("memory.failcnt", "memory.events"):
                p = os.path.join(d, fname)
                try:
                    with open(p) as f:
                        text = f.read()
                except OSError:
                    continue
                if fname == "memory.failcnt" and text.strip() not in ("", "0"):
                    return True
                if fname == "memory.events":
                    for line in text.splitlines():
                        k, _, v = line.partition(" ")
                        if k == "oom_kill" and v.strip() != "0":
                            return True
        return False

    def destroy(self) -> None:
        """SIGKILL anything left in the cgroups, then remove them."""
        for d in self.dirs:
            for _ in range(500):  # ~1 s at most
                try:
                    with open(os.path.join(d, "cgroup.procs")) as f:
                        pids = [int(x) for x in f.read().split()]
                except OSError:
                    break
                if not pids:
                    break
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                time.sleep(0.002)
            try:
                os.rmdir(d)
            except OSError:
                pass
