"""Tamper-proof grading (implements every rule of design/grading.md).

`grade(task, agent_root, sandbox)` -> GradeReport. Steps, with the rule each one serves:
  1. (rule 2) agent processes are already gone: each command ran in its own pid namespace
     that died with it. Snapshot only the editable files, once, carefully (snapshot.py).
  2. (rule 1) Build a fresh grading copy in a grader-owned temp dir from the pristine task
     files; copy in only the snapshot of editable paths. Everything else (tests, conftest,
     configs, dotfiles, .pth, pycache...) comes from the pristine copy or not at all.
     Tamper attempts in the agent's tree are only logged (tamper_scan).
  3. (rules 3, 5, 6, 8) Run in a fresh sandbox under its own host uid: the grading copy
     read-only at /work, one writable results dir, grader scripts read-only at /grader,
     `python -I -B`, clean env with PYTEST_DISABLE_PLUGIN_AUTOLOAD=1, grader-owned ini via
     -c, explicit --rootdir/--confcutdir and test paths, -p no:cacheprovider, output to
     files, hard timeout, namespace killed afterwards. Nothing runs in the agent's tree.
  4. (rule 4) Generated tasks (task.checks): the agent's module runs in a child process
     that returns plain JSON values; this process compares type and value against
     expected values that never enter the sandbox. Real-repository tasks use pytest.
  5. (rule 7) pytest verdict = exit code 0 AND every expected test id present and passed,
     from a size-capped, DOCTYPE-refusing junit parse (junit.py).
A crash, timeout or refusal is a GradeReport with passed=False and a reason, never an
exception into the trainer.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from typing import Dict, List, Optional

from composer_rl.env import junit, rootfs, snapshot
from composer_rl.env.sandbox import Mount, allocate_host_uid

RESULTS_MOUNT, GRADER_MOUNT = "/results", "/grader"
MAX_RESULT_BYTES = 1 << 20  # cap on the check driver's JSON answer
GRADE_ENV = {"PATH": "/usr/bin:/bin", "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1",
             "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}

# Runs the checks: imports the agent's module, calls each case, writes plain JSON.
CHECK_DRIVER = r'''
import json, sys
sys.path.insert(0, "/work")
cases = json.load(open("/grader/cases.json"))
out = {}
try:
    import importlib
    mod = importlib.import_module(sys.argv[1])
except BaseException as e:
    mod = None
    err = "import failed: %s" % type(e).__name__
for c in cases:
    if mod is None:
        out[c["id"]] = {"error": err}
        continue
    try:
        v = getattr(mod, c["func"])(*c["args"])
        json.dumps(v)
        out[c["id"]] = {"value": v}
    except BaseException as e:
        out[c["id"]] = {"error": type(e).__name__}
with open("/results/out.json", "w") as f:
    json.dump(out, f)
'''

# Runs pytest with a grader-owned config; pytest lives read-only at /opt/pysite.
PYTEST_RUNNER = r'''
import sys
sys.path[:0] = ["/opt/pysite", "/work"]
import pytest
sys.exit(pytest.main(["-c", "/grader/pytest.ini", "--rootdir=/work", "--confcutdir=/work",
                      "-p", "no:cacheprovider", "-q", "-o", "junit_family=xunit1",
                      "--junitxml=/results/junit.xml"] + sys.argv[1:]))
'''
GRADER_INI = "[pytest]\naddopts =\n"


@dataclasses.dataclass
class GradeReport:
    passed: bool  # every expected check/test passed
    n_passed: int
    n_total: int
    reason: str
    refused: Dict[str, str] = dataclasses.field(default_factory=dict)
    tamper: List[dict] = dataclasses.field(default_factory=list)
    exit_code: Optional[int] = None
    timed_out: bool = False
    output_tail: str = ""
    outcomes: Dict[str, str] = dataclasses.field(default_factory=dict)  # test/check id -> outcome

    @property
    def fraction(self) -> float:
        return self.n_passed / self.n_total if self.n_total else 0.0


def _same(expected, got) -> bool:
    """Type-and-value equality on plain JSON values (True != 1, 1 != 1.0)."""
    return json.dumps(expected, sort_keys=True) == json.dumps(got, sort_keys=True)


def build_grading_copy(task, editable_snapshot: Dict[str, str], dest: str,
                       with_hidden: bool) -> None:
    files = {p: t for p, t in task.files.items()
             if p not in task.editable and p not in task.world_only}
    files.update(editable_snapshot)
    if with_hidden:
        files.update(task.hidden_tests)
    for rel, text in files.items():
        path = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)


def _run_checks(task, sandbox, copy_dir, grader_dir, results_dir, uid, timeout_s):
    cases = [{"id": c["id"], "func": c["func"], "args": c["args"]} for c in task.checks]
    with open(os.path.join(grader_dir, "cases.json"), "w") as f:
        json.dump(cases, f)  # arguments only: expected values never enter the sandbox
    with open(os.path.join(grader_dir, "driver.py"), "w") as f:
        f.write(CHECK_DRIVER)
    r = _sandboxed(sandbox, [rootfs.SANDBOX_PYTHON, "-I", "-B", "/grader/driver.py", task.module],
                   copy_dir, grader_dir, results_dir, uid, timeout_s)
    try:
        with open(os.path.join(results_dir, "out.json"), "rb") as f:
            data = f.read(MAX_RESULT_BYTES + 1)
        out = json.loads(data) if len(data) <= MAX_RESULT_BYTES else None
    except (OSError, ValueError):
        out = None
    n_total = len(task.checks)
    if r.timed_out or r.exit_code != 0 or not isinstance(out, dict):
        why = "timed out" if r.timed_out else (
            f"check process exit code {r.exit_code}" if r.exit_code else "no valid result")
        return GradeReport(False, 0, n_total, why, exit_code=r.exit_code,
                           timed_out=r.timed_out, output_tail=(r.stdout + r.stderr)[-2000:])
    n_ok, first_bad, outcomes = 0, None, {}
    for c in task.checks:
        got = out.get(c["id"])
        if isinstance(got, dict) and set(got) == {"value"} and _same(c["expected"], got["value"]):
            n_ok += 1
            outcomes[c["id"]] = "passed"
        else:
            first_bad = first_bad or c["id"]
            outcomes[c["id"]] = "error" if isinstance(got, dict) and "error" in got else "failed"
    reason = "all checks passed" if n_ok == n_total else f"check {first_bad} failed"
    return GradeReport(n_ok == n_total, n_ok, n_total, reason, exit_code=r.exit_code,
                       outcomes=outcomes)


def _run_pytest(task, sandbox, copy_dir, grader_dir, results_dir, uid, timeout_s):
    with open(os.path.join(grader_dir, "run_pytest.py"), "w") as f:
        f.write(PYTEST_RUNNER)
    with open(os.path.join(grader_dir, "pytest.ini"), "w") as f:
        f.write(GRADER_INI)
    paths = [os.path.join("/work", p) for p in task.test_paths]
    r = _sandboxed(sandbox, [rootfs.SANDBOX_PYTHON, "-I", "-B", "/grader/run_pytest.py"] + paths,
                   copy_dir, grader_dir, results_dir, uid, timeout_s)
    tail = (r.stdout + r.stderr)[-2000:]
    if r.timed_out:
        return GradeReport(False, 0, len(task.test_ids), "timed out", exit_code=r.exit_code,
                           timed_out=True, output_tail=tail)
    try:
        outcomes = junit.read_junit(os.path.join(results_dir, "junit.xml"))
    except junit.ReportError as e:
        return GradeReport(False, 0, len(task.test_ids), str(e), exit_code=r.exit_code,
                           output_tail=tail)
    n_ok, n_total, reason = junit.verdict(outcomes, task.test_ids, r.exit_code)
    return GradeReport(n_ok == n_total and n_total > 0 and r.exit_code == 0, n_ok, n_total,
                       reason, exit_code=r.exit_code, output_tail=tail, outcomes=outcomes)


def _sandboxed(sandbox, argv, copy_dir, grader_dir, results_dir, uid, timeout_s):
    os.chown(results_dir, uid, uid)
    mounts = [Mount(grader_dir, GRADER_MOUNT), Mount(results_dir, RESULTS_MOUNT, writable=True)]
    return sandbox.run(argv, copy_dir, host_uid=uid, read_only_work=True, mounts=mounts,
                       env=GRADE_ENV, timeout_s=timeout_s)


def grade(task, agent_root: str, sandbox, timeout_s: float = 60.0,
          use_checks: Optional[bool] = None) -> GradeReport:
    """Grade the agent's tree at `agent_root` for `task`. Never raises for agent behaviour."""
    snap, refused = snapshot.snapshot_files(agent_root, task.editable)
    tamper = snapshot.tamper_scan(agent_root, task.files, task.editable)
    use_checks = task.checks is not None if use_checks is None else use_checks
    tmp = tempfile.mkdtemp(prefix="composer_rl_grade_")
    os.chmod(tmp, 0o711)
    try:
        copy_dir, grader_dir, results_dir = (os.path.join(tmp, d) for d in ("copy", "grader", "results"))
        for d in (copy_dir, grader_dir, results_dir):
            os.mkdir(d, 0o755)
        build_grading_copy(task, snap, copy_dir, with_hidden=not use_checks)
        uid = allocate_host_uid()
        run = _run_checks if use_checks else _run_pytest
        try:
            report = run(task, sandbox, copy_dir, grader_dir, results_dir, uid, timeout_s)
        except Exception as e:  # a grader bug must still not crash the trainer
            report = GradeReport(False, 0, 0, f"grader error: {type(e).__name__}: {e}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report.refused, report.tamper = refused, tamper
    if refused and report.passed:
        report.passed = False
        report.reason = f"refused editable file(s): {refused}"
    return report
