"""How a chat format spells an OpenAI conversation, chosen by the format's name
(`rollout.formats.CHAT_FORMATS`): `LAYOUTS[chat.name](chat)`.

A layout renders a request's turns in the exact token layout the policy is trained on
(`rollout.chat.ChatFormat` or `rollout.qwen3_chat.Qwen3ChatFormat`), writes an assistant
message's tool calls in the format's call syntax, and reads calls back out of a completion.
`serving.chat_template.ChatTemplate` does the rest (validation, token-in/token-out).

Turns are normalized by the template: ("user", text), ("tool", text) and
("assistant", ids), the ids closed by the format's end-of-turn token.
"""
import json
import re
from typing import Dict, List, Optional, Sequence, Tuple

from composer_rl.env import qwen3_calls
from composer_rl.env import tool_call_format

Calls = List[Tuple[str, Dict]]  # (function name, arguments)

_CALL = re.compile(r"<tool>(.*?)</tool>|<t>(.*?)</t>", re.S)
_SHORT_TO_FULL = {short: name for name, (short, _) in tool_call_format.TOOL_SCHEMAS.items()}


def _function(tool, i: int) -> Dict:
  fn = tool.get("function") if isinstance(tool, dict) else None
  if not (isinstance(tool, dict) and tool.get("type", "function") == "function"
          and isinstance(fn, dict) and isinstance(fn.get("name"), str) and fn["name"]):
    raise ValueError(f"tools[{i}]: expected {{'type': 'function', 'function': "
                     "{'name': ..., 'parameters': ...}}")
  return fn


class ByteLayout:
  """`<BOS><SYS>system [+ tools]<EOT><USER>..<EOT><ASSISTANT>..<EOT><TOOL>..<EOT>...`; calls
  as `<tool>{"name": ..., "args": {...}}</tool>` (or the compact `<t>[...]</t>`), one per
  turn, as the environment's harness reads them."""

  def __init__(self, chat):
    self.chat, self.tok = chat, chat.tok

  @staticmethod
  def tools_text(tools: Optional[Sequence[Dict]]) -> str:
    if not tools:
      return ""
    lines = ['Tools (call one as <tool>{"name": NAME, "args": {...}}</tool>):']
    for i, t in enumerate(tools):
      fn = _function(t, i)
      params = (fn.get("parameters") or {}).get("properties") or {}
      lines.append(f"{fn['name']}({', '.join(params)}): {fn.get('description', '')}".rstrip())
    return "\n".join(lines)

  def render(self, system: str, tools: Optional[Sequence[Dict]], turns) -> List[int]:
    t = self.tok
    doc = self.tools_text(tools)
    if doc:
      system = f"{system}\n{doc}" if system else doc
    ids = [t.BOS, t.SYS] + t.encode(system) + [t.EOT]
    role_id = {"user": t.USER, "tool": t.TOOL}
    for role, value in turns:
      if role == "assistant":
        ids += [t.ASSISTANT] + list(value)
      else:
        ids += [role_id[role]] + t.encode(value) + [t.EOT]
    return ids + [t.ASSISTANT]

  def render_text(self, prompt: str) -> List[int]:
    return [self.tok.BOS] + self.tok.encode(prompt)

  @staticmethod
  def calls_text(content: str, calls: Calls) -> str:
    return content + "".join(f"<tool>{json.dumps({'name': n, 'args': a})}</tool>"
                             for n, a in calls)

  @staticmethod
  def parse(text: str, names) -> Optional[Tuple[Optional[str], Calls]]:
    """(content, [one call]) when the text ends with exactly one well-formed call of an
    offered tool; None otherwise."""
    found = list(_CALL.finditer(text))
    if len(found) != 1:
      return None
    m = found[0]
    try:
      if m.group(1) is not None:
        obj = json.loads(m.group(1))
        name, args = obj["name"], obj.get("args", obj.get("arguments", {}))
      else:
        arr = json.loads(m.group(2))
        name, args = _SHORT_TO_FULL.get(arr[0], arr[0]), arr[1:]
        params = tool_call_format.TOOL_SCHEMAS[name][1]
        args = {p.name: v for p, v in zip(params, args)}
    except (ValueError, KeyError, TypeError, IndexError):
      return None
    if name not in names or not isinstance(args, dict) or text[m.end():].strip():
      return None
    return text[:m.start()].strip() or None, [(name, args)]


class Qwen3Layout:
  """Qwen3's chat template: `<|im_start|>role\\n...<|im_end|>\\n` turns, the request's tools
  in the system turn's `<tools>` block, consecutive tool messages as one user turn of
  `<tool_response>` blocks, and any number of `<tool_call>` blocks per assistant turn."""

  def __init__(self, chat):
    self.chat, self.tok = chat, chat.tok

  def render(self, system: str, tools: Optional[Sequence[Dict]], turns) -> List[int]:
    c = self.chat
    for i, t in enumerate(tools or ()):
      _function(t, i)
    ids = c.encode_pieces(c.system_pieces(system, list(tools or ())))
    k = 0
    while k < len(turns):
      role, value = turns[k]
      if role == "user":
        ids += c.encode_pieces(c.user_pieces(value))
      elif role == "tool":
        group = [value]
        while k + 1 < len(turns) and turns[k + 1][0] == "tool":
          k += 1
          group.append(turns[k][1])
        ids += c.encode_pieces(c.tool_pieces(group))
      else:
        ids += c.encode_pieces(c.generation_prompt()) + list(value) + c.encode_pieces(["\n"])
      k += 1
    return ids + c.encode_pieces(c.generation_prompt())

  def render_text(self, prompt: str) -> List[int]:
    return self.tok.encode(prompt)

  @staticmethod
  def calls_text(content: str, calls: Calls) -> str:
    from composer_rl.rollout.qwen3_chat import assistant_text  # pylint: disable=g-import-not-at-top
    return assistant_text(content, [{"name": n, "arguments": a} for n, a in calls])

  @staticmethod
  def parse(text: str, names) -> Optional[Tuple[Optional[str], Calls]]:
    """(content before the first call, the calls) when the text's calls (after its
    reasoning) are all well formed and of offered tools; None otherwise."""
    try:
      bodies = qwen3_calls.call_blocks(text)
    except tool_call_format.ToolCallError:
      return None
    calls = []
    for body in bodies:
      try:
        obj = json.loads(body)
        name, args = obj["name"], obj.get("arguments", {})
        if isinstance(args, str):
          args = json.loads(args)
      except (ValueError, KeyError, TypeError):
        return None
      if name not in names or not isinstance(args, dict) or set(obj) - {"name", "arguments"}:
        return None
      calls.append((name, args))
    think = text.rfind(qwen3_calls.THINK_CLOSE)
    first = text.find(qwen3_calls.CALL_OPEN, think + 1 if think >= 0 else 0)
    return text[:first].strip() or None, calls


# chat format name (`chat.name`) -> layout class
LAYOUTS = {"byte": ByteLayout, "qwen3": Qwen3Layout}
