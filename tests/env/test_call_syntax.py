"""Tool-call syntaxes chosen by name (composer_rl.env.call_syntax): what demonstrators write
parses back to the same call in every syntax, the spellings reject the same bad calls with
the same kinds, and the harness runs a whole episode in Qwen3's `<tool_call>` spelling,
strictly (another syntax's call is malformed there)."""
import pytest

from composer_rl.env import EnvConfig, get_task, make_env, run_episode
from composer_rl.env import call_syntax
from composer_rl.env.tool_call_format import ToolCallError

CALLS = [("read_file", {"path": "pkg/a.py", "start": 3, "end": 9}),
         ("edit", {"path": "a.py", "old": "x < 1", "new": "x <= 1  # </tool_call> </t>"}),
         ("run", {"cmd": "python -m pytest -q"}), ("submit", {})]


@pytest.mark.parametrize("name", sorted(call_syntax.CALL_SYNTAXES))
@pytest.mark.parametrize("tool, args", CALLS)
def test_format_parses_back(name, tool, args):
  syn = call_syntax.get(name)
  call = syn.parse("I will look first.\n" + syn.format(tool, args))
  want = call_syntax.get("tool").parse(call_syntax.get("tool").format(tool, args))
  assert (call.name, call.args) == (want.name, want.args)
  assert set(args.items()) <= set(call.args.items())


BAD = [  # (arguments as JSON, the kind every syntax reports)
    ('{"name": "nope", ARGS: {}}', "unknown_tool"),
    ('{"name": "read_file", ARGS: {}}', "bad_args"),
    ('{"name": "read_file", ARGS: {"path": 3}}', "bad_type"),
    ('{"name": "read_file", ARGS: {"path": "a", "path": "b"}}', "bad_json"),
    ('{"name": "read_file", ARGS: {"path": "a", "mode": "r"}}', "bad_args"),
    ('{"name": "read_file", ARGS: {"path": "a"', "bad_json"),
]


@pytest.mark.parametrize("body, kind", BAD)
def test_spellings_reject_the_same_calls(body, kind):
  tool = call_syntax.get("tool").parse
  qwen3 = call_syntax.get("qwen3").parse
  with pytest.raises(ToolCallError) as a:
    tool("<tool>" + body.replace("ARGS", '"args"') + "</tool>")
  with pytest.raises(ToolCallError) as b:
    qwen3("<tool_call>\n" + body.replace("ARGS", '"arguments"') + "\n</tool_call>")
  assert a.value.kind == b.value.kind == kind


def test_qwen3_syntax_is_strict():
  parse = call_syntax.get("qwen3").parse
  ok = call_syntax.get("qwen3").format("submit", {})
  assert parse("<think>\nmaybe <tool_call> here?\n</think>\n\n" + ok).name == "submit"
  for text, kind in [('<tool>{"name": "submit", "args": {}}</tool>', "no_call"),
                     (ok + ok, "multiple_calls"), (ok + " and more", "trailing_text"),
                     ("<think>\n" + ok, "no_call"), ("<tool_call>\n{}", "unterminated")]:
    with pytest.raises(ToolCallError) as e:
      parse(text)
    assert e.value.kind == kind, text


def test_unknown_syntax_is_named():
  with pytest.raises(ValueError, match=r"unknown call syntax 'json'; known: \['qwen3', 'tool'"):
    EnvConfig(call_syntax="json")


def test_an_episode_in_qwen3_syntax():
  """The oracle writes Qwen3 calls and earns 1 in the sandbox; a `<tool>` call in that
  environment is a malformed call, counted by kind, and the system prompt points to the
  tools block of the Qwen3 layout instead of describing another spelling."""
  task = get_task("generated", "train", 7)
  cfg = EnvConfig(call_syntax="qwen3", max_turns=8)
  r = run_episode("oracle", task, cfg)
  assert r.reward == 1.0 and r.metrics["malformed_calls"] == 0
  assert all(step["action"].startswith("<tool_call>\n") for step in r.trajectory)
  env = make_env(task, cfg)
  try:
    prompt = env.reset()
    assert "<tool_call>" in prompt and "<tool>" not in prompt
    res = env.step('<tool>{"name": "submit", "args": {}}</tool>')
    assert res.info["error"] == "no_call" and not res.done
    assert env.metrics["malformed_calls"] == 1 and env.metrics["malformed_no_call"] == 1
    res = env.step(call_syntax.get("qwen3").format("submit", {}))
    assert res.done and res.observation == "submitted"
  finally:
    env.close()
