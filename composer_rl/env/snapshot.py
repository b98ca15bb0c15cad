"""Careful reads of the agent's tree at grading time (grading.md rules 1 and 2).

`snapshot_files` reads only the task's editable paths, once, refusing: any symlink on the
path, FIFOs/devices/sockets/directories (opened O_NOFOLLOW|O_NONBLOCK, then fstat-checked),
files over `max_bytes`, and text that is not UTF-8. A refused file is reported with a reason
and left out of the grading copy (so the tests fail on it), never followed or blocked on.

`tamper_scan` walks the agent's tree (without following links) and reports every file that
differs from the pristine task outside the editable paths: edited tests, a new conftest.py,
sitecustomize.py, *.pth, pytest.py, ... These are logged as hack attempts; they never reach
the grading copy, which is built from the pristine files.
"""
from __future__ import annotations

import errno
import os
import stat
from typing import Dict, List, Tuple

MAX_FILE_BYTES = 1 << 20  # largest editable file accepted into the grading copy
BENIGN_DIRS = ("__pycache__", ".pytest_cache")
MAX_SCAN_FILES = 5000  # tamper scan stops (and says so) after this many entries


def _read_one(root: str, rel: str, max_bytes: int) -> Tuple[str, str]:
    """Return (text, "") or ("", reason)."""
    parts = os.path.normpath(rel).split(os.sep)
    if os.path.isabs(rel) or ".." in parts:
        return "", "path escapes the tree"
    cur = root
    for p in parts[:-1]:  # every directory on the path must be a real directory
        cur = os.path.join(cur, p)
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            return "", "missing"
        if not stat.S_ISDIR(st.st_mode):
            return "", "symlink or non-directory on path"
    path = os.path.join(root, rel)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as e:
        if e.errno == errno.ENOENT:
            return "", "missing"
        if e.errno == errno.ELOOP:
            return "", "symlink"
        return "", f"unreadable ({e.strerror})"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return "", "not a regular file"
        if st.st_size > max_bytes:
            return "", f"larger than {max_bytes} bytes"
        chunks, total = [], 0
        while True:
            b = os.read(fd, 65536)
            if not b:
                break
            total += len(b)
            if total > max_bytes:
                return "", f"larger than {max_bytes} bytes"
            chunks.append(b)
    finally:
        os.close(fd)
    try:
        return b"".join(chunks).decode("utf-8"), ""
    except UnicodeDecodeError:
        return "", "not valid UTF-8"


def snapshot_files(root: str, paths, max_bytes: int = MAX_FILE_BYTES
                   ) -> Tuple[Dict[str, str], Dict[str, str]]:
    """Read `paths` under `root`. Returns ({path: text}, {path: refusal reason})."""
    ok, refused = {}, {}
    for rel in paths:
        text, why = _read_one(root, rel, max_bytes)
        if why:
            refused[rel] = why
        else:
            ok[rel] = text
    return ok, refused


def tamper_scan(root: str, pristine: Dict[str, str], editable) -> List[dict]:
    """List changes outside the editable paths: [{"kind", "path"}]."""
    editable = set(editable)
    found, seen, n = [], set(), 0
    for dirpath, dirnames, filenames in os.walk(root):
        # Caches the test runner writes are benign byproducts (and never graded).
        dirnames[:] = [d for d in dirnames if d not in BENIGN_DIRS]
        for name in dirnames + filenames:
            n += 1
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            if n > MAX_SCAN_FILES:
                found.append({"kind": "tree_too_large", "path": "."})
                return found
            if name == "__pycache__" or name.endswith(".pyc"):
                continue
            if os.path.islink(full):
                found.append({"kind": "symlink_created", "path": rel})
                continue
            if not os.path.isfile(full) or rel in editable:
                continue
            seen.add(rel)
            if rel not in pristine:
                found.append({"kind": "file_added", "path": rel})
            else:
                text, why = _read_one(root, rel, MAX_FILE_BYTES)
                if why or text != pristine[rel]:
                    found.append({"kind": "protected_file_modified", "path": rel})
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
    for rel in pristine:
        if rel not in editable and rel not in seen:
            found.append({"kind": "protected_file_deleted", "path": rel})
    return found
