"""Qwen3's tool-call spelling, parsed as strictly as the environment's own
(`composer_rl.env.tool_call_format`): the same tool schemas, argument binding, duplicate-key
and size checks, and `ToolCallError` kinds, so both spellings accept and reject the same
calls and malformed calls are counted the same way.

A Qwen3 assistant turn may reason first (`<think> ... </think>`; calls written while
thinking are not calls), then writes its calls as

  <tool_call>
  {"name": "read_file", "arguments": {"path": "a.py"}}
  </tool_call>

with only whitespace after the last one. `arguments` may also be a JSON string holding the
object (some models write that). The chat layout around the calls (`<|im_start|>`,
`<tool_response>` observations) is `composer_rl.rollout.qwen3_chat`'s.
"""
import json
import re
from typing import Any, Dict, List

from composer_rl.env import tool_call_format as tcf
from composer_rl.env.tool_call_format import ToolCall, ToolCallError

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_TAG_RE = re.compile(re.escape(CALL_OPEN) + "|" + re.escape(CALL_CLOSE))


def format_call(name: str, arguments: Dict[str, Any]) -> str:
  """One call as Qwen3 writes it (its chat template's spelling, `json.dumps` separators).
  Arguments holding a call tag are written with '<' as the JSON escape \\u003c (the same
  value), so the call still parses back: the template itself would end the call there."""
  body = json.dumps(arguments, ensure_ascii=False)
  if _TAG_RE.search(body):
    body = body.replace("<", "\\u003c")
  return f'{CALL_OPEN}\n{{"name": "{name}", "arguments": {body}}}\n{CALL_CLOSE}'


def _call_from_json(body: str) -> ToolCall:
  if len(body) > tcf.MAX_CALL_CHARS:
    raise ToolCallError(f"tool call longer than {tcf.MAX_CALL_CHARS} characters", "too_long")
  try:
    value = json.loads(body, object_pairs_hook=tcf.reject_duplicate_keys)
  except json.JSONDecodeError as e:
    raise ToolCallError(f"invalid JSON in tool call: {e.msg} at char {e.pos}", "bad_json")
  if not isinstance(value, dict) or "name" not in value or set(value) - {"name", "arguments"}:
    raise ToolCallError('tool call must be a JSON object {"name": ..., "arguments": {...}}',
                        "bad_shape")
  args = value.get("arguments", {})
  if isinstance(args, str):  # some models write the arguments as a JSON string
    try:
      args = json.loads(args, object_pairs_hook=tcf.reject_duplicate_keys)
    except json.JSONDecodeError as e:
      raise ToolCallError(f"invalid JSON in tool call arguments: {e.msg} at char {e.pos}",
                          "bad_json")
  if not isinstance(args, dict):
    raise ToolCallError('"arguments" must be a JSON object', "bad_shape")
  name = tcf.resolve_name(value["name"])
  return ToolCall(name, tcf.bind_args(name, args))


def call_blocks(text: str) -> List[str]:
  """The JSON body of each `<tool_call>` block of a model turn, after its reasoning;
  ToolCallError when the blocks are not well formed (the body's
  JSON is not read here: the environment and the server check it against their tools)."""
  if not isinstance(text, str):
    raise ToolCallError("model output must be text", "bad_shape")
  if THINK_CLOSE in text:  # calls written while thinking are not calls
    text = text.rsplit(THINK_CLOSE, 1)[1]
  elif THINK_OPEN in text:
    raise ToolCallError(f"the turn ended inside {THINK_OPEN} (no {THINK_CLOSE})", "no_call")
  tags = list(_TAG_RE.finditer(text))
  if not tags:
    raise ToolCallError("no tool call found; write one like <tool_call>\n"
                        '{"name": "submit", "arguments": {}}\n</tool_call>', "no_call")
  bodies, pos = [], None
  for m in tags:
    if m.group(0) == CALL_OPEN:
      if pos is not None:
        raise ToolCallError(f"{CALL_OPEN} opened again before {CALL_CLOSE}", "unterminated")
      pos = m.end()
    else:
      if pos is None:
        raise ToolCallError(f"{CALL_CLOSE} without {CALL_OPEN}", "unterminated")
      bodies.append(text[pos:m.start()])
      pos = None
  if pos is not None:
    raise ToolCallError(f"tool call must end with {CALL_CLOSE}", "unterminated")
  if text[tags[-1].end():].strip():
    raise ToolCallError(f"nothing may follow the last {CALL_CLOSE}", "trailing_text")
  return bodies


def _parse_calls(text: str) -> List[ToolCall]:
  return [_call_from_json(body) for body in call_blocks(text)]


def parse_tool_calls(text: str) -> List[ToolCall]:
  """All `<tool_call>` blocks of a model turn (after its reasoning), checked against the
  environment's tool schemas; raises only `ToolCallError`."""
  return tcf.guarded_parse(_parse_calls, text)


def parse_tool_call(text: str) -> ToolCall:
  """Exactly one call (the environment runs one per turn)."""
  calls = parse_tool_calls(text)
  if len(calls) != 1:
    raise ToolCallError("exactly one tool call per turn", "multiple_calls")
  return calls[0]
