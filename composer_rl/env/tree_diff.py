"""The diff of an agent's work tree against the task's original files (for inspection).

The rollout runner stores it in each trajectory (`Trajectory.final_diff`) so a person can
see what the agent changed without re-running anything. The tree is the agent's, so it is
read like untrusted input: symbolic links and other non-regular files are never followed
(the host process runs as root; following an agent-made link could read the host), files
are read with O_NOFOLLOW and a size cap, and the diff itself is capped.
"""
from __future__ import annotations

import difflib
import os
import stat
from typing import Dict

SKIP_DIRS = ("__pycache__", ".pytest_cache")  # written by running tests, not by the agent
MAX_FILE_BYTES = 256 << 10
MAX_FILES = 200
MAX_DIFF_CHARS = 64 << 10


def _read(path: str) -> str:
    """A regular file's text (never through a symlink), or a one-line stand-in."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        return f"<unreadable: {e.strerror}>\n"
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return "<not a regular file>\n"
        data = f.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        return f"<file larger than {MAX_FILE_BYTES} bytes>\n"
    return data.decode("utf-8", errors="replace")


def tree_diff(root: str, original: Dict[str, str]) -> str:
    """Unified diff (a/ = the task's files, b/ = the tree at `root`); '' if unchanged."""
    current: Dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):  # does not descend into dir symlinks
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in sorted(filenames):
            if len(current) >= MAX_FILES:
                break
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            current[rel] = ("<symbolic link, not followed>\n" if os.path.islink(path)
                            else _read(path))
    out = []
    for rel in sorted(set(original) | set(current)):
        old, new = original.get(rel), current.get(rel)
        if old == new:
            continue
        out.extend(difflib.unified_diff(
            (old or "").splitlines(keepends=True), (new or "").splitlines(keepends=True),
            fromfile="/dev/null" if old is None else f"a/{rel}",
            tofile="/dev/null" if new is None else f"b/{rel}"))
        if out and not out[-1].endswith("\n"):
            out[-1] += "\n\\ No newline at end of file\n"
    text = "".join(out)
    if len(text) > MAX_DIFF_CHARS:
        text = (text[:MAX_DIFF_CHARS]
                + f"\n[... diff truncated: {len(text) - MAX_DIFF_CHARS} chars omitted ...]\n")
    return text
