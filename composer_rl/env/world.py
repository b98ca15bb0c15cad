"""A per-rollout world: a private working copy of a task's repository plus its sandbox.

The world's directory lives on the host (root-owned parent, mode 0711) and is chowned to a
host uid allocated for this world alone; every `run` executes inside the sandbox with that
directory bound at /work and nothing else of the host writable.

Host-side file tools (read/edit/write/list) go through `resolve()`, which refuses paths that
leave the world, including via symlinks the agent created: the host process runs as root,
so following an agent-made link to /etc/shadow would be a real read of the host. Between
tool calls no sandboxed process is alive (each command's pid namespace is destroyed when it
returns), so a resolved path cannot be swapped under us (no TOCTOU window).
"""
from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
import weakref
from typing import Dict, Optional

from composer_rl.env.sandbox import WORK_MOUNT, SandboxResult, allocate_host_uid

WORLDS_ROOT = os.path.join(tempfile.gettempdir(), "composer_rl_worlds")
MAX_WRITE_BYTES = 1 << 20  # largest file the write/edit tools will produce


class PathError(ValueError):
    """A tool path that is outside the world, missing, or not a regular file/dir."""


def _make_root(parent: Optional[str]) -> str:
    parent = parent or WORLDS_ROOT
    os.makedirs(parent, exist_ok=True)
    os.chmod(parent, 0o711)  # traversable by the sandbox uid, not listable
    return tempfile.mkdtemp(prefix="world_", dir=parent)


def write_tree(root: str, files: Dict[str, str], uid: Optional[int] = None) -> None:
    """Materialize {relative path: text} under root (chowned to uid when given)."""
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    if uid is not None:
        for dirpath, dirnames, filenames in os.walk(root):
            os.chown(dirpath, uid, uid)
            for name in filenames:
                os.chown(os.path.join(dirpath, name), uid, uid, follow_symlinks=False)


class World:
    """A working copy of `files` that the agent may change, with sandboxed command execution."""

    def __init__(self, files: Dict[str, str], sandbox, parent_dir: Optional[str] = None,
                 env: Optional[Dict[str, str]] = None):
        self.sandbox = sandbox
        self.uid = allocate_host_uid()
        self.root = os.path.realpath(_make_root(parent_dir))
        # PYTHONPATH gives the agent `python -m pytest` (read-only pytest at /opt/pysite).
        self.env = {"PYTHONPATH": "/opt/pysite"}
        self.env.update(env or {})
        write_tree(self.root, files, self.uid)
        os.chown(self.root, self.uid, self.uid)
        os.chmod(self.root, 0o755)
        self.closed = False
        # A caller that forgets close() still gets its world deleted when the World is
        # garbage-collected or at interpreter exit.
        self._finalizer = weakref.finalize(self, shutil.rmtree, self.root, True)

    # ---- paths -------------------------------------------------------------------------------
    def resolve(self, path: str, must_exist: bool = True) -> str:
        """Map a tool path (relative, or absolute under /work) to a host path inside the world."""
        if not isinstance(path, str) or not path or "\x00" in path:
            raise PathError("path must be a non-empty string")
        if path.startswith("/"):
            if path != WORK_MOUNT and not path.startswith(WORK_MOUNT + "/"):
                raise PathError(f"{path}: outside the workspace ({WORK_MOUNT})")
            path = path[len(WORK_MOUNT):].lstrip("/") or "."
        norm = os.path.normpath(path)
        if norm == ".." or norm.startswith("../"):
            raise PathError(f"{path}: outside the workspace")
        host = os.path.join(self.root, norm) if norm != "." else self.root
        # Every existing component must be inside the world after symlink resolution.
        real = os.path.realpath(host)
        if real != self.root and not real.startswith(self.root + os.sep):
            raise PathError(f"{path}: resolves outside the workspace")
        if must_exist and not os.path.lexists(host):
            raise PathError(f"{path}: no such file or directory")
        return host

    def rel(self, host_path: str) -> str:
        return os.path.relpath(host_path, self.root)

    def read_text(self, path: str, limit: int = MAX_WRITE_BYTES) -> str:
        host = self.resolve(path)
        try:
            fd = os.open(host, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as e:
            raise PathError(f"{path}: {'is a symbolic link' if e.errno == errno.ELOOP else e.strerror}")
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise PathError(f"{path}: not a regular file")
            data = f.read(limit + 1)
        if len(data) > limit:
            raise PathError(f"{path}: file larger than {limit} bytes")
        return data.decode("utf-8", errors="replace")

    def write_text(self, path: str, text: str) -> None:
        data = text.encode("utf-8")
        if len(data) > MAX_WRITE_BYTES:
            raise PathError(f"{path}: content larger than {MAX_WRITE_BYTES} bytes")
        host = self.resolve(path, must_exist=False)
        parent = os.path.dirname(host)
        if not os.path.isdir(parent):
            os.makedirs(parent, exist_ok=True)
            d = parent
            while d != self.root:
                os.chown(d, self.uid, self.uid)
                d = os.path.dirname(d)
        real_parent = os.path.realpath(parent)
        if real_parent != self.root and not real_parent.startswith(self.root + os.sep):
            raise PathError(f"{path}: resolves outside the workspace")
        if os.path.isdir(host) and not os.path.islink(host):
            raise PathError(f"{path}: is a directory")
        try:
            fd = os.open(host, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK,
                         0o644)
        except OSError as e:
            raise PathError(f"{path}: {'is a symbolic link' if e.errno == errno.ELOOP else e.strerror}")
        with os.fdopen(fd, "wb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise PathError(f"{path}: not a regular file")
            f.write(data)
        os.chown(host, self.uid, self.uid, follow_symlinks=False)

    # ---- commands ----------------------------------------------------------------------------
    def run(self, command: str, timeout_s: Optional[float] = None) -> SandboxResult:
        if self.closed:
            raise RuntimeError("world is closed")
        return self.sandbox.run(command, self.root, host_uid=self.uid, env=self.env,
                                timeout_s=timeout_s)

    def teardown_processes(self) -> None:
        """No agent process outlives a command (pid namespace per command); kept for clarity."""

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._finalizer()  # rmtree(root, ignore_errors=True), at most once

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
