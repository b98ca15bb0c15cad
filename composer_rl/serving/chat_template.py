"""OpenAI chat messages <-> the token layout the policy is trained on (token-in/token-out).

A request's messages become exactly the layout of `composer_rl.rollout.chat.ChatFormat`:

  <BOS><SYS>system [+ the request's tools]<EOT><USER>text<EOT><ASSISTANT>ids...<EOT>
  <TOOL>tool result<EOT><USER>text<EOT>...<ASSISTANT>

so a served conversation is the same token sequence an agent session in training is, and
the model writes tool calls in the training format (`composer_rl.env.tool_call_format`:
`<tool>{"name": ..., "args": {...}}</tool>` or the compact `<t>[...]</t>`), which `parse`
turns into OpenAI `tool_calls`.

Token-in/token-out: an assistant message the server produced is remembered with the exact
ids it was sampled as (`remember`); when a client sends it back in the history, those ids
are rendered, not a re-encoding of its text (a byte model can sample invalid UTF-8 that no
text round trip reproduces, and a tool call's JSON could be re-spaced by the client). Each
prompt of a multi-turn conversation therefore extends the previous prompt + completion
token for token, which is what lets the record reader join the turns into one trajectory.
A message not remembered (edited by the client, or after a restart) is rendered from its
text, and starts a new branch of the conversation.
"""
import collections
import itertools
import json
import re
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

from composer_rl.env import tool_call_format
from composer_rl.rollout.chat import ChatFormat

_CALL = re.compile(r"<tool>(.*?)</tool>|<t>(.*?)</t>", re.S)
_SHORT_TO_FULL = {short: name for name, (short, _) in tool_call_format.TOOL_SCHEMAS.items()}


def _text(content: Any, where: str) -> str:
  """A message's `content`: a string, or a list of {"type": "text", "text": ...} parts."""
  if content is None:
    return ""
  if isinstance(content, str):
    return content
  if isinstance(content, list):
    out = []
    for i, part in enumerate(content):
      if not (isinstance(part, dict) and part.get("type") == "text"
              and isinstance(part.get("text"), str)):
        raise ValueError(f"{where}.content[{i}]: only text parts are supported")
      out.append(part["text"])
    return "".join(out)
  raise ValueError(f"{where}.content must be a string or a list of text parts")


def _call_key(content: Optional[str], tool_calls: Optional[Sequence[Dict]]) -> str:
  """What identifies an assistant message regardless of the ids a client keeps for calls."""
  calls = []
  for c in tool_calls or ():
    fn = c.get("function") or {}
    args = fn.get("arguments", "")
    try:  # a client may re-serialize the arguments' JSON
      args = json.dumps(json.loads(args), sort_keys=True)
    except (TypeError, ValueError):
      pass
    calls.append([fn.get("name"), args])
  return json.dumps([content or "", calls])


class ChatTemplate:
  """Renders OpenAI requests for a byte-level `ChatFormat` and parses completions.

  default_system: the system message when a request has none (the training system prompt
    of the served experiment, so that served sessions look like training sessions).
  remember_limit: assistant messages whose sampled ids are kept (least recently used go).
  """

  def __init__(self, chat: ChatFormat, default_system: str = "", remember_limit: int = 100_000):
    self.chat, self.tok = chat, chat.tok
    self.default_system = default_system
    self._remembered: "collections.OrderedDict[str, List[int]]" = collections.OrderedDict()
    self._limit = remember_limit
    self._lock = threading.Lock()
    self._call_ids = itertools.count()

  # ---- prompts -------------------------------------------------------------------------
  def tools_text(self, tools: Optional[Sequence[Dict]]) -> str:
    """The request's function tools, documented in the system message."""
    if not tools:
      return ""
    lines = ['Tools (call one as <tool>{"name": NAME, "args": {...}}</tool>):']
    for i, t in enumerate(tools):
      fn = t.get("function") if isinstance(t, dict) else None
      if not (isinstance(t, dict) and t.get("type", "function") == "function"
              and isinstance(fn, dict) and isinstance(fn.get("name"), str) and fn["name"]):
        raise ValueError(f"tools[{i}]: expected {{'type': 'function', 'function': "
                         "{'name': ..., 'parameters': ...}}")
      params = (fn.get("parameters") or {}).get("properties") or {}
      lines.append(f"{fn['name']}({', '.join(params)}): {fn.get('description', '')}".rstrip())
    return "\n".join(lines)

  def render(self, messages: Sequence[Dict], tools: Optional[Sequence[Dict]] = None) -> List[int]:
    """Prompt ids for a chat request, ending with the assistant header; ValueError names
    the message that cannot be rendered."""
    if not isinstance(messages, (list, tuple)) or not messages:
      raise ValueError("messages must be a non-empty list")
    t = self.tok
    msgs = list(messages)
    for i, m in enumerate(msgs):
      if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise ValueError(f"messages[{i}] must be an object with a 'role'")
    system = self.default_system
    if msgs[0]["role"] in ("system", "developer"):
      system = _text(msgs[0].get("content"), "messages[0]")
      msgs, offset = msgs[1:], 1
    else:
      offset = 0
    tools_doc = self.tools_text(tools)
    if tools_doc:
      system = f"{system}\n{tools_doc}" if system else tools_doc
    ids = [t.BOS, t.SYS] + t.encode(system) + [t.EOT]
    if not msgs:
      raise ValueError("messages need at least one user message after the system message")
    for j, m in enumerate(msgs):
      where, role = f"messages[{j + offset}]", m["role"]
      if role == "user":
        ids += [t.USER] + t.encode(_text(m.get("content"), where)) + [t.EOT]
      elif role == "tool":
        ids += [t.TOOL] + t.encode(_text(m.get("content"), where)) + [t.EOT]
      elif role == "assistant":
        ids += [t.ASSISTANT] + self._assistant_ids(m, where)
      elif role in ("system", "developer"):
        raise ValueError(f"{where}: a {role} message is only allowed first")
      else:
        raise ValueError(f"{where}: unknown role {role!r}")
    if msgs[-1]["role"] == "assistant":
      raise ValueError("the last message must be a user or tool message (the model answers it)")
    return ids + [t.ASSISTANT]

  def render_text(self, prompt: str) -> List[int]:
    """Prompt ids for /v1/completions: the text's bytes after <BOS>, no roles."""
    if not isinstance(prompt, str):
      raise ValueError("prompt must be a string")
    return [self.tok.BOS] + self.tok.encode(prompt)

  def _assistant_ids(self, m: Dict, where: str) -> List[int]:
    content = _text(m.get("content"), where)
    calls = m.get("tool_calls") or []
    if not isinstance(calls, list):
      raise ValueError(f"{where}.tool_calls must be a list")
    with self._lock:
      ids = self._remembered.get(_call_key(content, calls))
      if ids is not None:
        self._remembered.move_to_end(_call_key(content, calls))
    if ids is None:  # not produced here (or forgotten): its text in the training format
      text = content
      for k, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
          raise ValueError(f"{where}.tool_calls[{k}] needs function.name")
        try:
          args = json.loads(fn.get("arguments") or "{}")
        except ValueError as e:
          raise ValueError(f"{where}.tool_calls[{k}].function.arguments is not JSON: {e}")
        text += f"<tool>{json.dumps({'name': fn['name'], 'args': args})}</tool>"
      ids = self.tok.encode(text)
    ids = list(ids)
    if not ids or ids[-1] != self.tok.EOT:  # a cut completion is closed, as in training
      ids.append(self.tok.EOT)
    return ids

  # ---- completions ---------------------------------------------------------------------
  def parse(self, text: str, tools: Optional[Sequence[Dict]] = None
            ) -> Tuple[Optional[str], List[Dict]]:
    """(content, tool_calls) of a completion's text. A call is recognized when the request
    offered tools and the text holds exactly one well-formed call of an offered tool (the
    training format's rule); anything else is plain content, so a malformed call reaches
    the client as the text the model wrote."""
    names = {(t.get("function") or {}).get("name") for t in tools or ()}
    found = list(_CALL.finditer(text))
    if not names or len(found) != 1:
      return text, []
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
      return text, []
    if name not in names or not isinstance(args, dict) or text[m.end():].strip():
      return text, []
    content = text[:m.start()].strip() or None
    call = {"id": f"call_{next(self._call_ids)}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)}}
    return content, [call]

  def remember(self, completion_ids: Sequence[int], message: Dict) -> None:
    """Keeps the ids an assistant `message` (as returned to the client) was sampled as."""
    key = _call_key(message.get("content"), message.get("tool_calls"))
    with self._lock:
      self._remembered[key] = list(completion_ids)
      self._remembered.move_to_end(key)
      while len(self._remembered) > self._limit:
        self._remembered.popitem(last=False)

  def decode(self, ids: Sequence[int]) -> str:
    return self.tok.decode(ids)

  def token_text(self, token_id: int) -> str:
    """A token as text for `logprobs` entries (a special token by its name)."""
    if self.tok.is_special(token_id):
      return self.tok.name(token_id)
    return bytes([token_id]).decode("utf-8", errors="replace")

  def token_bytes(self, token_id: int) -> Optional[List[int]]:
    return None if self.tok.is_special(token_id) else [int(token_id)]
