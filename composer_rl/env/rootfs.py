"""Read-only support trees that the sandbox binds: a synthetic /etc and a pytest site dir.

Why these exist:
  * The sandbox never binds the host's /etc (it holds the host's identity, users and DNS
    config). Programs still expect /etc/passwd, /etc/hostname and /etc/hosts, so we write a
    tiny synthetic one that names the sandbox user and maps only localhost.
  * Grading and the agent's `run` tool need pytest inside the sandbox, but the host's
    environment lives under /root (pyenv), which must not be visible. We copy only the pure
    Python packages pytest needs (pytest, _pytest, pluggy, iniconfig, packaging, pygments)
    into a root-owned, world-readable directory once per machine, and bind that read-only.
The interpreter inside the sandbox is Debian's /usr/bin/python3 (it lives under /usr, which
is bound anyway), so no part of the host's pyenv is exposed.

Both trees are built atomically (write to a temp dir, then rename) so concurrent processes
can race to create them safely, and are keyed by content so a pytest upgrade rebuilds them.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile

# Interpreter used inside every sandbox. It must live under a bound path (/usr).
SANDBOX_PYTHON = "/usr/bin/python3"
# Mount points inside the sandbox.
PYSITE_MOUNT = "/opt/pysite"
ETC_MOUNT = "/etc"
# Packages copied into the pytest site dir: pytest and its runtime dependencies.
PYTEST_PACKAGES = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "pygments", "py")
SANDBOX_UID = 1000  # uid/gid the agent sees inside the sandbox (unprivileged)

_ETC_FILES = {
    "hostname": "sandbox\n",
    "hosts": "127.0.0.1 localhost sandbox\n::1 localhost\n",
    "passwd": "root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1000:agent:/tmp:/bin/sh\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    "group": "root:x:0:\nagent:x:1000:\nnogroup:x:65534:\n",
    "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\n",
}


class SandboxRuntimeError(RuntimeError):
    """The sandbox cannot be set up on this machine (missing bwrap, interpreter, pytest)."""


def _cache_root() -> str:
    return os.path.join(tempfile.gettempdir(), "composer_rl_sandbox_rootfs")


def _publish(build, key: str) -> str:
    """Build a directory once (atomic rename), world-readable, owned by the host user."""
    root = _cache_root()
    os.makedirs(root, mode=0o755, exist_ok=True)
    os.chmod(root, 0o755)
    final = os.path.join(root, key)
    if os.path.isdir(final):
        return final
    tmp = tempfile.mkdtemp(prefix=key + ".tmp.", dir=root)
    try:
        build(tmp)
        for dirpath, dirnames, filenames in os.walk(tmp):
            os.chmod(dirpath, 0o755)
            for f in filenames:
                os.chmod(os.path.join(dirpath, f), 0o644)
        try:
            os.rename(tmp, final)
        except OSError:  # somebody else won the race
            if not os.path.isdir(final):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def etc_dir() -> str:
    """Host path of the synthetic /etc bound read-only into every sandbox."""
    key = "etc-" + hashlib.sha256(repr(sorted(_ETC_FILES.items())).encode()).hexdigest()[:12]

    def build(d):
        for name, text in _ETC_FILES.items():
            with open(os.path.join(d, name), "w") as f:
                f.write(text)

    return _publish(build, key)


def _package_sources() -> list:
    srcs = []
    for name in PYTEST_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            if name == "py":
                continue  # optional shim
            raise SandboxRuntimeError(f"pytest dependency {name!r} is not installed on the host")
        if spec.submodule_search_locations:
            srcs.append(list(spec.submodule_search_locations)[0])
        else:
            srcs.append(spec.origin)
    return srcs


def pysite_dir() -> str:
    """Host path of the read-only site dir holding pytest, bound at PYSITE_MOUNT."""
    srcs = _package_sources()
    import pytest  # noqa: F401  (version is part of the key)

    key = "pysite-" + hashlib.sha256(repr((srcs, pytest.__version__)).encode()).hexdigest()[:12]

    def build(d):
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
        for src in srcs:
            dst = os.path.join(d, os.path.basename(src))
            if os.path.isdir(src):
                shutil.copytree(src, dst, ignore=ignore)
            else:
                shutil.copy2(src, dst)

    return _publish(build, key)


def check_interpreter() -> str:
    if not os.path.isfile(SANDBOX_PYTHON):
        raise SandboxRuntimeError(
            f"{SANDBOX_PYTHON} not found: install Debian's python3 (apt-get install -y python3); "
            "the sandbox never exposes the host's own Python prefix")
    return SANDBOX_PYTHON
