"""Shared fixtures for the environment tests (sandbox with short limits, CLI driver)."""
import json
import os
import subprocess
import sys

import pytest

from composer_rl.env.sandbox import SandboxLimits, make_sandbox

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAST = SandboxLimits(wall_timeout_s=10, cpu_seconds=3, address_space_bytes=1 << 30,
                     memory_bytes=1 << 30, file_size_bytes=8 << 20, max_processes=32,
                     tmp_size_bytes=16 << 20, output_limit_bytes=4096)


@pytest.fixture(scope="session")
def sandbox():
    return make_sandbox("bwrap", limits=FAST)


@pytest.fixture
def world(sandbox):
    from composer_rl.env.world import World
    w = World({"a.py": "x = 1\n"}, sandbox)
    yield w
    w.close()


def cli(command: str, *flags: str, timeout: float = 60) -> dict:
    """Drive launch/sandbox_exec.py --json exactly as a researcher would."""
    p = subprocess.run([sys.executable, os.path.join(REPO, "launch", "sandbox_exec.py"), "--json",
                        *flags, "--", command], capture_output=True, text=True, timeout=timeout,
                       cwd=REPO)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def host_pids_with(marker: str):
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        out.append(int(pid))
            except OSError:
                pass
    return out
