"""`POST /v1/chat/completions` requests: messages, tools, tool_choice."""
import dataclasses
import re
from typing import Any, Dict, List, Optional, Tuple

from composer_rl.serving.protocol.errors import bad_request
from composer_rl.serving.protocol.fields import (Sampling, as_object, get_str, parse_model,
    parse_sampling, parse_stream, refuse_unsupported, show)


ROLES = ("system", "developer", "user", "assistant", "tool")
_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


@dataclasses.dataclass(frozen=True)
class ChatRequest:
  model: str
  messages: List[Dict[str, Any]]
  tools: Optional[List[Dict[str, Any]]]
  tool_choice: Any   # "none" | "auto" | "required" | {"type": "function", ...}
  sampling: Sampling
  stream: bool = False
  include_usage: bool = False
  user: Optional[str] = None

  @property
  def parse_tools(self) -> bool:
    """Whether completions are parsed for tool calls."""
    return bool(self.tools) and self.tool_choice != "none"


def _content_ok(content, where: str, allow_none: bool) -> None:
  if content is None:
    if not allow_none:
      raise bad_request(f"{where}.content must be a string or a list of text parts.",
                        "messages")
    return
  if isinstance(content, str):
    return
  if isinstance(content, list):
    for i, part in enumerate(content):
      if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(
          part.get("text"), str):
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        raise bad_request(f"{where}.content[{i}]: only text parts are supported (got "
                          f"{kind!r}).", "messages")
    return
  raise bad_request(f"{where}.content must be a string or a list of text parts.",
                    "messages")


def _messages(body: Dict) -> List[Dict]:
  msgs = body.get("messages")
  if msgs is None:
    raise bad_request("Missing required parameter: 'messages'.", "messages")
  if not isinstance(msgs, list) or not msgs:
    raise bad_request("'messages' must be a non-empty array.", "messages")
  for i, m in enumerate(msgs):
    where = f"messages[{i}]"
    if not isinstance(m, dict):
      raise bad_request(f"{where} must be an object.", "messages")
    role = m.get("role")
    if role not in ROLES:
      raise bad_request(f"{where}.role must be one of {list(ROLES)}, got {show(role)}.",
                        "messages")
    if role == "assistant":
      _content_ok(m.get("content"), where, allow_none=True)
      calls = m.get("tool_calls")
      if calls is not None:
        if not isinstance(calls, list):
          raise bad_request(f"{where}.tool_calls must be an array.", "messages")
        for k, c in enumerate(calls):
          fn = c.get("function") if isinstance(c, dict) else None
          if not (isinstance(fn, dict) and isinstance(fn.get("name"), str)
                  and isinstance(fn.get("arguments", ""), str)):
            raise bad_request(f"{where}.tool_calls[{k}] must be {{'id', 'type': 'function', "
                              "'function': {'name': str, 'arguments': str}}.", "messages")
      elif m.get("content") is None:
        raise bad_request(f"{where}: an assistant message needs 'content' or 'tool_calls'.",
                          "messages")
    else:
      _content_ok(m.get("content"), where, allow_none=False)
    if role == "tool" and not isinstance(m.get("tool_call_id"), str):
      raise bad_request(f"{where}: a tool message needs 'tool_call_id' (a string).",
                        "messages")
  return msgs


def _tools(body: Dict) -> Tuple[Optional[List[Dict]], Any]:
  tools = body.get("tools")
  if tools is not None:
    if not isinstance(tools, list):
      raise bad_request("'tools' must be an array.", "tools")
    for i, t in enumerate(tools):
      fn = t.get("function") if isinstance(t, dict) else None
      if not (isinstance(t, dict) and t.get("type") == "function" and isinstance(fn, dict)):
        raise bad_request(f"tools[{i}] must be {{'type': 'function', 'function': {{...}}}} "
                          "(only function tools are supported).", f"tools[{i}]")
      name = fn.get("name")
      if not isinstance(name, str) or not _TOOL_NAME.match(name):
        raise bad_request(f"tools[{i}].function.name must match ^[a-zA-Z0-9_-]{{1,64}}$, "
                          f"got {show(name)}.", f"tools[{i}].function.name")
      params = fn.get("parameters")
      if params is not None and not isinstance(params, dict):
        raise bad_request(f"tools[{i}].function.parameters must be a JSON schema object.",
                          f"tools[{i}].function.parameters")
      if fn.get("description") is not None and not isinstance(fn.get("description"), str):
        raise bad_request(f"tools[{i}].function.description must be a string.",
                          f"tools[{i}].function.description")
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) != len(names):
      raise bad_request("tool names must be unique.", "tools")
    tools = tools or None
  choice = body.get("tool_choice")
  if choice is None:
    choice = "auto" if tools else "none"
  elif isinstance(choice, str):
    if choice not in ("none", "auto", "required"):
      raise bad_request("'tool_choice' must be 'none', 'auto', 'required' or "
                        "{'type': 'function', 'function': {'name': ...}}.", "tool_choice")
    if choice == "required" and not tools:
      raise bad_request("'tool_choice' is 'required' but no 'tools' were given.",
                        "tool_choice")
  elif isinstance(choice, dict):
    fn = choice.get("function")
    if choice.get("type") != "function" or not isinstance(fn, dict) or not isinstance(
        fn.get("name"), str):
      raise bad_request("'tool_choice' object must be {'type': 'function', 'function': "
                        "{'name': ...}}.", "tool_choice")
    if not tools or fn["name"] not in [t["function"]["name"] for t in tools]:
      raise bad_request(f"'tool_choice' names {fn['name']!r}, which is not in 'tools'.",
                        "tool_choice")
  else:
    raise bad_request("'tool_choice' must be a string or an object.", "tool_choice")
  return tools, choice


def parse_chat_request(body: Any, max_n: int = 8, max_top_logprobs: int = 20) -> ChatRequest:
  """Validates a /v1/chat/completions body; OpenAIError (400) names the bad parameter."""
  body = as_object(body)
  model = parse_model(body)
  messages = _messages(body)
  tools, choice = _tools(body)
  if body.get("functions") is not None or body.get("function_call") is not None:
    raise bad_request("'functions'/'function_call' are deprecated; use 'tools'.",
                      "functions")
  refuse_unsupported(body)
  sampling = parse_sampling(body, max_n, max_top_logprobs, chat=True)
  stream, include_usage = parse_stream(body)
  return ChatRequest(model=model, messages=messages, tools=tools, tool_choice=choice,
                     sampling=sampling, stream=stream, include_usage=include_usage,
                     user=get_str(body, "user"))
