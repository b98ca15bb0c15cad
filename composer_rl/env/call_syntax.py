"""How the model writes a tool call, chosen by name (`EnvConfig.call_syntax`).

The harness parses a model turn with its syntax's `parse` (one call per turn, only
`ToolCallError` on bad input, so malformed calls are counted the same way whatever the
spelling), demonstrators write their calls with its `format`, and the system prompt's
`{tools}` placeholder is filled with its `help`.

  tool          <tool>{"name": ..., "args": {...}}</tool> (either spelling of
                `tool_call_format` is accepted; the help and demonstrations use this one)
  tool_compact  <t>["read","a.py",1,40]</t> (the same parser; for byte-level models, which
                pay for every byte)
  qwen3         <tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>, after any
                <think> block (`env.qwen3_calls`): what Qwen3 checkpoints write. Its chat
                layout (`rollout.qwen3_chat`) declares the tools in the system message, so
                the help only points there.
"""
import dataclasses
from typing import Any, Callable, Dict, Tuple

from composer_rl.env import qwen3_calls
from composer_rl.env import tool_call_format as tcf


@dataclasses.dataclass(frozen=True)
class CallSyntax:
  """parse(text) -> ToolCall; format(name, args) -> text; help(tools) -> text."""
  name: str
  parse: Callable[[str], tcf.ToolCall]
  format: Callable[[str, Dict[str, Any]], str]
  help: Callable[[Tuple[str, ...]], str]


CALL_SYNTAXES: Dict[str, CallSyntax] = {
    "tool": CallSyntax("tool", tcf.parse_tool_call,
                       lambda name, args: tcf.format_tool_call(name, args),
                       lambda tools: tcf.format_help(False, tools)),
    "tool_compact": CallSyntax("tool_compact", tcf.parse_tool_call,
                               lambda name, args: tcf.format_tool_call(name, args, True),
                               lambda tools: tcf.format_help(True, tools)),
    "qwen3": CallSyntax("qwen3", qwen3_calls.parse_tool_call,
                        lambda name, args: qwen3_calls.format_call(
                            tcf.resolve_name(name), dict(args or {})),
                        lambda tools: ("One tool call per turn, inside <tool_call></tool_call> "
                                       "tags as the tools block above describes.")),
}


def get(name: str) -> CallSyntax:
  """The registered syntax `name`; a ValueError listing the known ones otherwise."""
  if name not in CALL_SYNTAXES:
    raise ValueError(f"unknown call syntax {name!r}; known: {sorted(CALL_SYNTAXES)}")
  return CALL_SYNTAXES[name]
