"""The `Task` record shared by every task source, the grader and the scripted policies."""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, Dict, Optional, Tuple


@dataclasses.dataclass(frozen=True)
class Edit:
    """One exact-string replacement (what the `edit` tool does)."""

    path: str
    old: str
    new: str


@dataclasses.dataclass(frozen=True)
class Task:
    """A repository, a bug, and how to check the fix.

    id: stable unique id (content hash based for generated tasks).
    family: bug family (wrong_operator, off_by_one, ...) or "realrepo:<mutation>".
    split: "train" or "heldout".
    files: the buggy repository, {relative path: text}; what the agent's world starts as.
    editable: paths the agent is meant to change; only these are copied out of its tree at
      grading time (grading.md rule 1).
    visible_tests: paths (inside `files`) of tests the agent can see and run.
    hidden_tests: {path: text} test files added only at grading time, never in the world.
    test_cmd: how a developer runs the tests in the world (shown in the prompt).
    test_paths: test files/dirs the grader passes to pytest explicitly (rule 3).
    test_ids: junit ids ("classname::name") that must all be present and pass (rule 7).
    checks: for generated tasks, hidden cases [{"id", "func", "args", "expected"}]; the
      module runs in a child process and returns JSON that the grader compares (rule 4).
    module: the importable module the checks call (generated tasks).
    oracle: edits that turn `files` into the fixed repository.
    prompt: the task description shown to the agent.
    world_only: paths of `files` that exist in the agent's world but never in the grading
      copy: what the agent must read and carry into its answer, not import from it.
    """

    id: str
    family: str
    split: str
    files: Dict[str, str]
    editable: Tuple[str, ...]
    visible_tests: Tuple[str, ...]
    hidden_tests: Dict[str, str]
    test_cmd: str
    prompt: str
    oracle: Tuple[Edit, ...]
    test_paths: Tuple[str, ...] = ()
    test_ids: Tuple[str, ...] = ()
    checks: Optional[Tuple[Dict[str, Any], ...]] = None
    module: Optional[str] = None
    world_only: Tuple[str, ...] = ()
    meta: Dict[str, Any] = dataclasses.field(default_factory=dict)

    def fixed_files(self) -> Dict[str, str]:
        files = dict(self.files)
        for e in self.oracle:
            assert files[e.path].count(e.old) == 1, (self.id, e.path)
            files[e.path] = files[e.path].replace(e.old, e.new, 1)
        return files

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        return json.dumps(d, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> "Task":
        d = json.loads(text)
        d["oracle"] = tuple(Edit(**e) for e in d["oracle"])
        for k in ("editable", "visible_tests", "test_paths", "test_ids", "world_only"):
            d[k] = tuple(d.get(k, ()))
        if d.get("checks") is not None:
            d["checks"] = tuple(d["checks"])
        return Task(**d)


def content_id(prefix: str, *parts: Any) -> str:
    h = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()
    return f"{prefix}-{h[:12]}"
