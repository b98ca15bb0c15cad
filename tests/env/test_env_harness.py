"""Tool-call parser, tools, and the session object (text in, text out)."""
import os
import threading

import pytest

from composer_rl.env import EnvConfig, get_task, make_env
from composer_rl.env.tool_call_format import ToolCallError, format_tool_call, parse_tool_call
from composer_rl.env.tools import TOOLS, ToolError, ToolLimits


@pytest.mark.parametrize("name,args", [
    ("read_file", {"path": "a.py", "start": 2, "end": 9}), ("submit", {}), ("list_dir", {"path": "x"}),
    ("edit", {"path": "a.py", "old": "</tool> <t>", "new": "ünï\n"}), ("run", {"cmd": "ls", "timeout": 1.5}),
    ("search", {"pattern": "def .*", "path": "."}), ("write_file", {"path": "b", "content": ""}),
])
@pytest.mark.parametrize("compact", [False, True])
def test_format_roundtrip(name, args, compact):
    call = parse_tool_call("some reasoning\n" + format_tool_call(name, args, compact))
    full = dict(call.args)
    assert call.name == name and {k: full[k] for k in args} == args


def test_compact_is_short():
    assert format_tool_call("read_file", {"path": "a.py", "start": 1, "end": 40}, True) == '<t>["read","a.py",1,40]</t>'


@pytest.mark.parametrize("text,kind", [
    ("no call here", "no_call"), ('<t>["read"]</t>', "bad_args"), ('<t>["nope"]</t>', "unknown_tool"),
    ('<t>["submit"]</t><t>["submit"]</t>', "multiple_calls"), ('<t>["read","a",true]</t>', "bad_type"),
    ('<tool>{"name":"submit","name":"run"}</tool>', "bad_json"), ('<t>["submit"]</t> extra', "trailing_text"),
    ('<t>["run","ls"', "unterminated"), ("<tool>[]</tool>", "bad_shape"), ("<t>{bad json</t>", "bad_json"),
    ('<tool>{"name":"read_file","args":{"path":"a","bogus":1}}</tool>', "bad_args"),
    ('<t>["submit",1]</t>', "bad_args"), (None, "bad_shape"), ("<t>" + "[" * 100000 + "</t>", "bad_json"),
])
def test_malformed_calls_are_errors_not_exceptions(text, kind):
    with pytest.raises(ToolCallError) as e:
        parse_tool_call(text)
    assert e.value.kind == kind


def test_tools(world):
    L = ToolLimits(max_read_lines=3)
    world.write_text("m.py", "a = 1\nb = 2\nc = 3\nb = 2\nd = 4\n")
    assert TOOLS.get("read_file")(world, {"path": "m.py", "start": 2, "end": 3}, L) == "2|b = 2\n3|c = 3"
    assert "not shown" in TOOLS.get("read_file")(world, {"path": "m.py", "start": 1, "end": None}, L)
    with pytest.raises(ToolError, match="not found"):
        TOOLS.get("edit")(world, {"path": "m.py", "old": "zzz", "new": "y"}, L)
    with pytest.raises(ToolError, match="occurs 2 times"):
        TOOLS.get("edit")(world, {"path": "m.py", "old": "b = 2", "new": "y"}, L)
    assert TOOLS.get("edit")(world, {"path": "m.py", "old": "c = 3", "new": "c = 30"}, L) == "edited m.py"
    assert "m.py:3:c = 30" in TOOLS.get("search")(world, {"pattern": r"c = \d+", "path": "."}, L)
    with pytest.raises(ToolError, match="bad regex"):
        TOOLS.get("search")(world, {"pattern": "(", "path": "."}, L)
    assert "m.py" in TOOLS.get("list_dir")(world, {"path": "."}, L).split("\n")
    with pytest.raises(ToolError, match="no such file"):
        TOOLS.get("read_file")(world, {"path": "nope.py", "start": 1, "end": None}, L)
    out = TOOLS.get("run")(world, {"cmd": "python -c 'import m; print(m.c)'; exit 4", "timeout": None}, L)
    assert out == "30\n[exit code 4]"
    out = TOOLS.get("run")(world, {"cmd": "sleep 5", "timeout": 0.5}, L)
    assert out.startswith("[timed out after 0.5s")


def test_session_flow_and_metrics():
    task = get_task("generated", "train", 21)
    env = make_env(task, EnvConfig(max_turns=4))
    try:
        prompt = env.reset()
        assert task.prompt in prompt and "<tool>" in prompt
        r = env.step("I will look around. <tool>{oops}</tool>")
        assert r.observation.startswith("error: invalid JSON") and not r.done
        r = env.step('<t>["ls"]</t>')
        assert task.editable[0] in r.observation
        r = env.step('<t>["read","missing.py"]</t>')
        assert "no such file" in r.observation
        r = env.step('<t>["ls"]</t>')
        assert r.done and r.info.get("budget_exhausted")
        res = env.grade()
        assert res.reward == 0.0 and res.info["metrics"]["malformed_calls"] == 1
        assert res.info["metrics"]["tool_errors"] == 1 and res.info["submitted"] is False
    finally:
        env.close()
    import os
    assert not os.path.exists(env.world.root)


def test_tool_allow_list():
    """A tool outside `EnvConfig.tools` runs nothing and answers with an error; the system
    prompt lists only the allowed tools (and submit); unknown names are refused up front."""
    task = get_task("generated", "train", 21)
    env = make_env(task, EnvConfig(max_turns=4, call_syntax="tool_compact", tools=("read_file",)))
    try:
        prompt = env.reset()
        assert "read path" in prompt and "grep" not in prompt and "submit" in prompt
        r = env.step('<t>["grep","def "]</t>')
        assert r.observation == ("error: tool 'search' is not available here "
                                 "(tools: read_file, submit)")
        assert r.info["error"] == "tool_not_allowed" and not r.done
        r = env.step(f'<t>["read","{task.editable[0]}"]</t>')
        assert r.observation.startswith("1|")
        assert env.step('<t>["submit"]</t>').done
        assert env.grade().info["metrics"]["tool_errors"] == 1
    finally:
        env.close()
    with pytest.raises(ValueError, match="unknown tool"):
        EnvConfig(tools=("grep_all",))


def test_concurrent_sessions_in_threads():
    from composer_rl.env import run_episode
    results = {}

    def work(i):
        results[i] = run_episode("oracle" if i % 2 == 0 else "null", get_task("generated", "train", 100 + i)).reward

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: 1.0 if i % 2 == 0 else 0.0 for i in range(6)}


def test_env_package_does_not_import_jax():
    import subprocess, sys
    code = ("import sys, composer_rl.env, composer_rl.env.tasks.repo_builder, composer_rl.env.cli; "
            "assert not any(m == 'jax' or m.startswith('jax.') for m in sys.modules), 'jax imported'")
    # A clean environment (what `env -i` gives): no XLA_FLAGS inherited from this process,
    # so the package's flag setup runs as it does for a user.
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
