"""OpenAI chat messages <-> the token layout the policy is trained on (token-in/token-out).

A request's messages become exactly the layout of the served chat format
(`rollout.formats`: `byte`'s role tokens or `qwen3`'s `<|im_start|>` turns; the spelling is
`serving.layouts`'), so a served conversation is the same token sequence an agent session
in training is, and the model writes tool calls in the format's call syntax, which `parse`
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
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

from composer_rl.serving.layouts import LAYOUTS


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
  """Renders OpenAI requests for a chat format (`rollout.formats`) and parses completions.

  default_system: the system message when a request has none (the training system prompt
    of the served experiment, so that served sessions look like training sessions).
  remember_limit: assistant messages whose sampled ids are kept (least recently used go).
  """

  def __init__(self, chat, default_system: str = "", remember_limit: int = 100_000):
    if getattr(chat, "name", None) not in LAYOUTS:
      raise ValueError(f"no serving layout for chat format {getattr(chat, 'name', chat)!r}; "
                       f"known: {sorted(LAYOUTS)}")
    self.chat, self.tok = chat, chat.tok
    self.layout = LAYOUTS[chat.name](chat)
    self.default_system = default_system
    self._remembered: "collections.OrderedDict[str, List[int]]" = collections.OrderedDict()
    self._limit = remember_limit
    self._lock = threading.Lock()
    self._call_ids = itertools.count()

  # ---- prompts -------------------------------------------------------------------------
  def render(self, messages: Sequence[Dict], tools: Optional[Sequence[Dict]] = None) -> List[int]:
    """Prompt ids for a chat request, ending with the assistant header; ValueError names
    the message that cannot be rendered."""
    if not isinstance(messages, (list, tuple)) or not messages:
      raise ValueError("messages must be a non-empty list")
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
    if not msgs:
      raise ValueError("messages need at least one user message after the system message")
    turns = []
    for j, m in enumerate(msgs):
      where, role = f"messages[{j + offset}]", m["role"]
      if role in ("user", "tool"):
        turns.append((role, _text(m.get("content"), where)))
      elif role == "assistant":
        turns.append((role, self._assistant_ids(m, where)))
      elif role in ("system", "developer"):
        raise ValueError(f"{where}: a {role} message is only allowed first")
      else:
        raise ValueError(f"{where}: unknown role {role!r}")
    if msgs[-1]["role"] == "assistant":
      raise ValueError("the last message must be a user or tool message (the model answers it)")
    return self.layout.render(system, tools, turns)

  def render_text(self, prompt: str) -> List[int]:
    """Prompt ids for /v1/completions: the text alone, no roles (after <BOS> in the byte
    format)."""
    if not isinstance(prompt, str):
      raise ValueError("prompt must be a string")
    return self.layout.render_text(prompt)

  def _assistant_ids(self, m: Dict, where: str) -> List[int]:
    content = _text(m.get("content"), where)
    calls = m.get("tool_calls") or []
    if not isinstance(calls, list):
      raise ValueError(f"{where}.tool_calls must be a list")
    with self._lock:
      ids = self._remembered.get(_call_key(content, calls))
      if ids is not None:
        self._remembered.move_to_end(_call_key(content, calls))
    if ids is None:  # not produced here (or forgotten): its text in the format's syntax
      parsed = []
      for k, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
          raise ValueError(f"{where}.tool_calls[{k}] needs function.name")
        try:
          args = json.loads(fn.get("arguments") or "{}")
        except ValueError as e:
          raise ValueError(f"{where}.tool_calls[{k}].function.arguments is not JSON: {e}")
        parsed.append((fn["name"], args))
      ids = self.tok.encode(self.layout.calls_text(content, parsed))
    ids = list(ids)
    if not ids or ids[-1] != self.tok.EOT:  # a cut completion is closed, as in training
      ids.append(self.tok.EOT)
    return ids

  # ---- completions ---------------------------------------------------------------------
  def parse(self, text: str, tools: Optional[Sequence[Dict]] = None
            ) -> Tuple[Optional[str], List[Dict]]:
    """(content, tool_calls) of a completion's text. Calls are recognized when the request
    offered tools and every call the text holds is well formed and of an offered tool (the
    format's rule: one call per turn in `byte`, any number in `qwen3`); anything else is
    plain content, so a malformed call reaches the client as the text the model wrote."""
    names = {(t.get("function") or {}).get("name") for t in tools or ()}
    parsed = self.layout.parse(text, names) if names else None
    if parsed is None:
      return text, []
    content, calls = parsed
    return content, [{"id": f"call_{next(self._call_ids)}", "type": "function",
                      "function": {"name": name, "arguments": json.dumps(args)}}
                     for name, args in calls]

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
    return self.tok.token_bytes(token_id).decode("utf-8", errors="replace")

  def token_bytes(self, token_id: int) -> Optional[List[int]]:
    return None if self.tok.is_special(token_id) else list(self.tok.token_bytes(token_id))
