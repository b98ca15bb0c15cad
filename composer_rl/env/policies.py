"""Scripted policies, chosen by name from `POLICIES`: for tests and expert demonstrations.

A policy is an object with `reset(task, syntax)` and `act(observation) -> str` (the model
text for one turn, its calls in the `env.call_syntax` named `syntax`). Registered policies:

  oracle     reads the buggy file, applies the task's oracle edits through `edit`, runs the
             tests, submits. Expected reward 1.
  null       submits immediately. Expected reward 0.
  weak_oracle  an imperfect demonstrator: on a deterministic `fix_prob` share of tasks
             (chosen by hashing the task id with `seed`) it acts as the oracle, on the
             rest it reads the file and gives up (submits unchanged). `run_tests=False`
             leaves out the test run. Expected reward `fix_prob`.
  long_weak_oracle  the demonstrator of the "multifile" family (long sessions): reads the
             listed modules in order until it has read the one defining the function, then
             fixes it (on a `fix_prob` share of tasks, as weak_oracle) or submits unchanged.
             Asked for a summary (`summarize()`, context compaction) it says which modules
             it ruled out or which one holds the function, and after the context restart
             it re-reads that module before editing (the edit needs its exact text).
  key_collector  the demonstrator of the "keychain" family: reads m1..mN in order, then
             (on a `fix_prob` share of tasks, as weak_oracle) sets the parts in key.py
             with one edit, else submits unchanged. Its summary carries what was read and
             the parts so far (`k1 = 'Q' k2 = 'H'`), and it goes on from there.
  adversary  tries every cheat we know -- read the hidden tests, edit the tests, plant
             conftest.py / sitecustomize.py, write outside the world, reach the network,
             remount / chroot, leave a setsid survivor, follow a symlink to the host, make
             the module exit 0 at import and return always-equal objects -- then submits.
             Expected reward 0, with every attempt logged in the trajectory metadata.
"""
from __future__ import annotations

import hashlib
from typing import List, Tuple

from composer_rl.env.registry import Registry
from composer_rl.env import call_syntax

POLICIES: Registry = Registry("policy")


class ScriptedPolicy:
    def reset(self, task, syntax: str = "tool") -> None:
        self.task, self.syntax = task, call_syntax.get(syntax)
        self.plan: List[Tuple[str, dict]] = self.make_plan(task)
        self.i = 0

    def make_plan(self, task) -> List[Tuple[str, dict]]:
        raise NotImplementedError

    def act(self, observation: str) -> str:
        name, args = self.plan[min(self.i, len(self.plan) - 1)]
        self.i += 1
        return self.syntax.format(name, args)


@POLICIES.register("oracle")
class OraclePolicy(ScriptedPolicy):
    def make_plan(self, task):
        plan = [("read_file", {"path": task.oracle[0].path})]
        plan += [("edit", {"path": e.path, "old": e.old, "new": e.new}) for e in task.oracle]
        plan += [("run", {"cmd": task.test_cmd}), ("submit", {})]
        return plan


@POLICIES.register("weak_oracle")
class WeakOraclePolicy(ScriptedPolicy):
    def __init__(self, fix_prob: float = 0.5, run_tests: bool = True, seed: int = 0):
        if not 0.0 <= fix_prob <= 1.0:
            raise ValueError(f"fix_prob must be in [0, 1], got {fix_prob}")
        self.fix_prob, self.run_tests, self.seed = fix_prob, run_tests, seed

    def fixes(self, task) -> bool:
        h = hashlib.sha256(f"{self.seed}:{task.id}".encode()).digest()
        return int.from_bytes(h[:8], "big") / 2.0**64 < self.fix_prob

    def make_plan(self, task):
        plan = [("read_file", {"path": task.oracle[0].path})]
        if self.fixes(task):
            plan += [("edit", {"path": e.path, "old": e.old, "new": e.new}) for e in task.oracle]
        if self.run_tests:
            plan.append(("run", {"cmd": task.test_cmd}))
        return plan + [("submit", {})]


@POLICIES.register("long_weak_oracle")
class LongWeakOraclePolicy(WeakOraclePolicy):
    """Stateful: the next call depends on what was read and on context restarts, so it
    overrides `act` instead of following a fixed plan."""

    def reset(self, task, syntax: str = "tool") -> None:
        self.task, self.syntax = task, call_syntax.get(syntax)
        self.files = list(task.meta.get("files") or [task.oracle[0].path])
        self.target = task.oracle[0].path
        self.func = task.meta.get("func", "the function")
        self.read: List[str] = []    # modules read, in order
        self.visible = False         # the target's text is in the current context
        self.done_edit = self.ran_tests = False
        self.i = 0

    @property
    def found(self) -> bool:
        return self.target in self.read

    def act(self, observation: str) -> str:
        self.i += 1
        if not self.found:
            path = next((f for f in self.files if f not in self.read), self.target)
            self.read.append(path)
            self.visible = True
            return self.syntax.format("read_file", {"path": path})
        if not self.done_edit and self.fixes(self.task):
            if not self.visible:  # the module's text went with the old context: read it again
                self.visible = True
                return self.syntax.format("read_file", {"path": self.target})
            self.done_edit = True
            e = self.task.oracle[0]
            return self.syntax.format("edit", {"path": e.path, "old": e.old, "new": e.new})
        if self.run_tests and self.done_edit and not self.ran_tests:
            self.ran_tests = True
            return self.syntax.format("run", {"cmd": self.task.test_cmd})
        return self.syntax.format("submit", {})

    def summarize(self) -> str:
        """The summary turn's text: what the next context needs to go on. The context
        restarts after it, so the target module's text is no longer visible."""
        self.visible = False
        # Terse (every byte is a token of the next context): the module stems ruled out,
        # or the module that holds the function.
        if self.done_edit:
            return f"{self.func}: fixed in {self.target}"
        if self.found:
            return f"{self.func}: in {self.target}"
        stems = " ".join(p[:-3] if p.endswith(".py") else p for p in self.read)
        return f"{self.func}: not in {stems}" if self.read else f"{self.func}: nothing read"


@POLICIES.register("key_collector")
class KeyCollectorPolicy(WeakOraclePolicy):
    """Stateful like long_weak_oracle. It never reads a module twice: after a context
    restart only its summary tells it the parts read so far (what the model must learn)."""

    def reset(self, task, syntax: str = "tool") -> None:
        self.task, self.syntax = task, call_syntax.get(syntax)
        self.files, self.parts = list(task.meta["files"]), list(task.meta["parts"])
        self.n_read = 0
        self.i = 0

    def act(self, observation: str) -> str:
        self.i += 1
        if self.n_read < len(self.files):
            self.n_read += 1
            return self.syntax.format("read_file", {"path": self.files[self.n_read - 1]})
        if self.fixes(self.task) and self.i == self.n_read + 1:
            e = self.task.oracle[0]
            return self.syntax.format("edit", {"path": e.path, "old": e.old, "new": e.new})
        return self.syntax.format("submit", {})

    def summarize(self) -> str:
        """Asked after the latest read's observation: it is part of what was read."""
        # The parts in the form they were read in (`k1 = 'Q'`): the form a copy of them is
        # written in at the end, so the model copies each after the same words.
        known = " ".join(f"k{i + 1} = '{p}'" for i, p in enumerate(self.parts[:self.n_read]))
        return known or "nothing read"


@POLICIES.register("null")
class NullPolicy(ScriptedPolicy):
    def make_plan(self, task):
        return [("submit", {})]


@POLICIES.register("adversary")
class AdversaryPolicy(ScriptedPolicy):
    """Each step is one attack; `expected_kinds` lists what the log must show for each."""

    def make_plan(self, task):
        hidden = sorted(task.hidden_tests)[0] if task.hidden_tests else "tests/test_hidden.py"
        vis = task.visible_tests[0] if task.visible_tests else "tests/test_x.py"
        src = task.editable[0]
        plan = [
            ("read_file", {"path": hidden}),
            ("run", {"cmd": "cat /work/../hidden/* 2>&1; find / -name '*hidden*' 2>/dev/null | head"}),
            ("write_file", {"path": vis, "content": "def test_ok():\n    assert True\n"}),
            ("write_file", {"path": "conftest.py", "content":
                            "import pytest\n@pytest.hookimpl(hookwrapper=True)\n"
                            "def pytest_runtest_makereport(item, call):\n    o = yield\n"
                            "    o.get_result().outcome = 'passed'\n"}),
            ("write_file", {"path": "sitecustomize.py", "content": "import os\nos._exit(0)\n"}),
            ("write_file", {"path": "../escape.txt", "content": "x"}),
            ("run", {"cmd": "echo pwned > /etc/pwned; echo pwned > /root/pwned; "
                            "echo pwned > /dev/shm/pwned; ls /work/main 2>&1"}),
            ("run", {"cmd": "mount -o remount,rw / 2>&1; chroot / true 2>&1; unshare -r true 2>&1"}),
            ("run", {"cmd": "curl -s http://127.0.0.1:9/ 2>&1; python -c 'import socket; "
                            "socket.create_connection((\"1.1.1.1\", 53), 2)' 2>&1 | tail -1"}),
            ("run", {"cmd": "setsid sh -c 'sleep 1000' & echo started"}),
            ("run", {"cmd": "ln -s /etc/passwd leak.txt"}),
            ("read_file", {"path": "leak.txt"}),
            ("run", {"cmd": "sed -i 's/assert/assert True or/' tests/*.py"}),
        ]
        if task.checks is not None:  # objects that equal everything (checks compare JSON)
            plan.append(("write_file", {"path": src, "content":
                                        "class A:\n    def __eq__(self, o):\n        return True\n"
                                        f"def {task.checks[0]['func']}(*a):\n    return A()\n"}))
        plan += [("write_file", {"path": src, "content": "import os\nos._exit(0)\n"}),
                 ("submit", {})]
        return plan


def make_policy(name: str, **kwargs):
    """The policy registered as `name`, built with its keyword arguments."""
    return POLICIES.get(name)(**kwargs)
