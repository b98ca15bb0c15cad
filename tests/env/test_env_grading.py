"""One test per rule of /work/shared/design/grading.md (plus junit parsing details)."""
import dataclasses
import os

import pytest

from composer_rl.env import grading, junit
from composer_rl.env.tasks.generated import generate
from composer_rl.env.world import World


def _world(sandbox, task, files=None):
    return World(files if files is not None else task.files, sandbox)


def _fixed_src(task):
    return task.fixed_files()[task.editable[0]]


# Rule 1: grade a fresh copy; only editable files come from the agent.
@pytest.mark.parametrize("use_checks", [True, False])
def test_rule1_fresh_copy_ignores_tampered_tests_and_configs(sandbox, use_checks):
    task = generate("train", 11)
    files = dict(task.files)
    vis = task.visible_tests[0]
    files[vis] = "def test_ok():\n    assert True\n"
    files["conftest.py"] = ("import pytest\n@pytest.hookimpl(hookwrapper=True)\n"
                            "def pytest_runtest_makereport(item, call):\n    o = yield\n"
                            "    o.get_result().outcome = 'passed'\n")
    files["pytest.ini"] = "[pytest]\naddopts = -k nothing_matches\n"
    files["sitecustomize.py"] = "import os\nos._exit(0)\n"
    files["zz.pth"] = "import os; os._exit(0)\n"
    files["pytest.py"] = "import sys\nsys.exit(0)\n"
    with _world(sandbox, task, files) as w:
        r = grading.grade(task, w.root, sandbox, use_checks=use_checks)
        assert not r.passed and r.n_passed < r.n_total
        kinds = {(t["kind"], t["path"]) for t in r.tamper}
        assert ("protected_file_modified", vis) in kinds and ("file_added", "conftest.py") in kinds
        # The real fix still earns the pass, tampering notwithstanding.
        w.write_text(task.editable[0], _fixed_src(task))
        assert grading.grade(task, w.root, sandbox, use_checks=use_checks).passed


# Rule 2: careful reads of the agent's files.
@pytest.mark.parametrize("attack", ["symlink", "symlink_dir", "fifo", "oversized", "binary", "missing"])
def test_rule2_refuses_unsafe_editable_files(sandbox, attack, tmp_path):
    task = generate("train", 12)
    src = task.editable[0]
    with _world(sandbox, task) as w:
        p = os.path.join(w.root, src)
        os.unlink(p)
        if attack == "symlink":
            outside = tmp_path / "fixed.py"
            outside.write_text(_fixed_src(task))
            os.symlink(outside, p)
        elif attack == "symlink_dir":  # a symlinked directory on the path
            task = dataclasses.replace(task, editable=("pkg/" + src,),
                                       files={**task.files, "pkg/" + src: task.files[src]})
            (tmp_path / src).write_text(_fixed_src(task))
            os.symlink(tmp_path, os.path.join(w.root, "pkg"))
        elif attack == "fifo":
            os.mkfifo(p)
        elif attack == "oversized":
            with open(p, "w") as f:
                f.write(_fixed_src(task) + "#" * (2 << 20))
        elif attack == "binary":
            with open(p, "wb") as f:
                f.write(_fixed_src(task).encode() + b"\n# \xff\xfe\n")
        r = grading.grade(task, w.root, sandbox)  # must return (no hang on the FIFO)
        assert not r.passed
        assert list(r.refused) == [task.editable[0]]


# Rule 3: isolated interpreter and pytest (clean env, -I -B, grader ini, no autoload).
def test_rule3_isolated_interpreter_and_pytest(sandbox, monkeypatch):
    seen = {}

    class Spy:
        def run(self, argv, work, **kw):
            seen.update(argv=argv, **kw)
            return sandbox.run(argv, work, **kw)

    monkeypatch.setenv("PYTEST_ADDOPTS", "--collect-only")
    monkeypatch.setenv("PYTHONPATH", "/nonexistent")
    task = generate("train", 13)
    with _world(sandbox, task, task.fixed_files()) as w:
        with open(os.path.join(w.root, ".env"), "w") as f:
            f.write("PYTEST_ADDOPTS=--collect-only\n")
        r = grading.grade(task, w.root, Spy(), use_checks=False)
    assert r.passed, r.reason  # host env and the tree's .env had no effect
    argv, env = seen["argv"], seen["env"]
    assert argv[:3] == ["/usr/bin/python3", "-I", "-B"]
    assert env["PATH"] == "/usr/bin:/bin" and env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] == "1"
    assert env["PYTHONNOUSERSITE"] == "1" and "PYTHONPATH" not in env and "PYTEST_ADDOPTS" not in env
    for flag in ('"-c", "/grader/pytest.ini"', "--rootdir=/work", "--confcutdir=/work",
                 '"no:cacheprovider"'):
        assert flag in grading.PYTEST_RUNNER
    assert all(a.startswith("/work/") for a in argv[4:]) and argv[4:]  # explicit test paths


# Rule 4: the verdict comes from the grader's own comparison of plain values.
@pytest.mark.parametrize("attack", [
    "import os\nos._exit(0)\n",
    "class A:\n    def __eq__(self, o):\n        return True\ndef {f}(*a):\n    return A()\n",
    "import json, sys\nprint(json.dumps({{'forged': 1}}))\n"
    "open('/results/out.json', 'w').write(json.dumps({{c: {{'value': 0}} for c in []}}))\nsys.exit(0)\n",
    "def {f}(*a):\n    return True\n",
])
def test_rule4_forged_results_fail(sandbox, attack):
    task = generate("train", 14)
    f = task.checks[0]["func"]
    with _world(sandbox, task, {**task.files, task.editable[0]: attack.format(f=f)}) as w:
        r = grading.grade(task, w.root, sandbox)
    assert not r.passed and r.n_passed < r.n_total


def test_rule4_type_and_value_compared():
    assert grading._same([1, 2], [1, 2])
    assert not grading._same(1, True) and not grading._same(1, 1.0) and not grading._same("1", 1)


# Rule 5: agent code is sandboxed at grading time too.
def test_rule5_grading_sandbox(sandbox):
    probe = ('import os, socket\n'
             'def _try(f):\n    try:\n        f(); return 1\n    except Exception:\n        return 0\n'
             'def probe():\n'
             '    ro = 1 - _try(lambda: open("/work/x", "w"))\n'
             '    net = _try(lambda: socket.create_connection(("1.1.1.1", 53), 1))\n'
             '    hidden = int(any("hidden" in n for _, _, fs in os.walk("/work") for n in fs)'
             ' or os.path.exists("/grader/expected.json"))\n'
             '    pid1 = open("/proc/1/cmdline").read().split("\\0")[0]\n'
             '    return [ro, net, hidden, os.getuid(), "bwrap" in pid1]\n')
    task = generate("train", 15)
    task = dataclasses.replace(task, checks=({"id": "p", "func": "probe", "args": [],
                                              "expected": [1, 0, 0, 1000, True]},),
                               files={**task.files, task.editable[0]: probe})
    with _world(sandbox, task) as w:
        r = grading.grade(task, w.root, sandbox)
    assert r.passed, r.reason


# Rule 6: timeouts, crashes and hangs are reward 0 with a reason, never an exception.
@pytest.mark.parametrize("body,reason", [
    ("while True:\n    pass\n", "timed out"),
    ("import os, subprocess\nsubprocess.Popen(['sleep', '100'], start_new_session=True)\n"
     "raise SystemExit(3)\n", "failed"),
    ("import os\nos.kill(os.getpid(), 9)\n", "exit code"),
])
def test_rule6_bounded(sandbox, body, reason):
    import time
    task = generate("train", 16)
    t0 = time.time()
    with _world(sandbox, task, {**task.files, task.editable[0]: body}) as w:
        r = grading.grade(task, w.root, sandbox, timeout_s=2)
    assert not r.passed and reason in r.reason
    assert time.time() - t0 < 5  # a leftover child holds no pipe: grading returns promptly


# Rule 7: trust only a safe parse of the grader's report and require every expected id.
def test_rule7_junit_rules(sandbox):
    ok = b'<testsuite><testcase classname="t" name="a"/><testcase classname="t" name="b"/></testsuite>'
    assert junit.verdict(junit.parse_junit_bytes(ok), ["t::a", "t::b"], 0)[0] == 2
    with pytest.raises(junit.ReportError):
        junit.parse_junit_bytes(b'<!DOCTYPE x [<!ENTITY a "b">]><testsuite/>')
    with pytest.raises(junit.ReportError):
        junit.parse_junit_bytes(b"<testsuite>" + b" " * (junit.MAX_REPORT_BYTES + 1))
    skipped = b'<testsuite><testcase classname="t" name="a"><skipped/></testcase></testsuite>'
    assert junit.verdict(junit.parse_junit_bytes(skipped), ["t::a"], 0)[0] == 0
    assert junit.verdict({}, ["t::a"], 0)[0] == 0  # zero collected
    assert junit.verdict(junit.parse_junit_bytes(ok), ["t::a", "t::b"], 1)[2].startswith("test process exit")
    assert junit.verdict(junit.parse_junit_bytes(ok), [], 0)[1] == 0  # no expectations: no pass
    # End to end: a deselecting/renaming change makes expected ids go missing -> fail.
    task = generate("train", 17)
    task = dataclasses.replace(task, test_ids=task.test_ids + ("tests.test_nowhere::test_x",))
    with _world(sandbox, task, task.fixed_files()) as w:
        r = grading.grade(task, w.root, sandbox, use_checks=False)
    assert not r.passed and "missing" in r.reason


# Rule 8: hidden tests are not in the world, and grading never touches the agent's tree.
def test_rule8_hidden_tests_hidden_and_tree_untouched(sandbox):
    task = generate("train", 18)
    with _world(sandbox, task, task.fixed_files()) as w:
        before = {os.path.join(d, f): os.stat(os.path.join(d, f)).st_mtime_ns
                  for d, _, fs in os.walk(w.root) for f in fs}
        assert not any(p in task.files for p in task.hidden_tests)
        assert not any("hidden" in p for p in before)
        assert grading.grade(task, w.root, sandbox, use_checks=False).passed
        after = {os.path.join(d, f): os.stat(os.path.join(d, f)).st_mtime_ns
                 for d, _, fs in os.walk(w.root) for f in fs}
    assert before == after  # no pycache, junit or hidden file written into the agent's tree
