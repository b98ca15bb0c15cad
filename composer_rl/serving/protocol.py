"""The OpenAI API's wire format: request validation and response builders (no HTTP here).

Requests are validated into dataclasses (`parse_chat_request`, `parse_completion_request`,
`parse_feedback`); anything a client got wrong raises `OpenAIError`, whose `body()` is
OpenAI's error object

    {"error": {"message": ..., "type": "invalid_request_error", "param": "temperature",
               "code": null}}

with the HTTP status OpenAI uses (400 bad request, 401 key, 404 unknown model, 413 body,
429 rate limit, 503 overloaded), so the official clients raise their usual exception types
(`BadRequestError`, `AuthenticationError`, `NotFoundError`, ...).

What is accepted, and why some OpenAI parameters are refused: the served policy samples
from exactly the distribution the trainer scores (temperature, top-k, top-p; see
`composer_rl.sampling.head`), and every completion is recorded with the log-probs of that
distribution. Parameters that would change the distribution outside that head
(frequency/presence penalties, logit_bias, JSON modes, best_of) are refused with a 400
naming them rather than silently ignored. `temperature=0` means greedy (top_k=1). Unknown
extra fields are ignored, as most OpenAI-compatible servers do, so newer clients keep
working. `tool_choice` 'required' or a named function is accepted but not enforced (there
is no constrained decoding); a named function must be one of `tools`.

Response builders return plain dicts in the shapes of `openai.types.chat.ChatCompletion`,
`ChatCompletionChunk` and `openai.types.Completion`.
"""
import dataclasses
import math
import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

# ---- errors -----------------------------------------------------------------------------

INVALID_REQUEST = "invalid_request_error"


class OpenAIError(Exception):
  """An error response: HTTP `status` and OpenAI's error object."""

  def __init__(self, status: int, message: str, type: str = INVALID_REQUEST,  # pylint: disable=redefined-builtin
               param: Optional[str] = None, code: Optional[str] = None,
               headers: Optional[Dict[str, str]] = None):
    super().__init__(message)
    self.status, self.message, self.type = int(status), message, type
    self.param, self.code = param, code
    self.headers = dict(headers or {})

  def body(self) -> Dict[str, Any]:
    return {"error": {"message": self.message, "type": self.type, "param": self.param,
                      "code": self.code}}

  def __repr__(self):
    return f"OpenAIError({self.status}, {self.message!r}, param={self.param!r})"


def bad_request(message: str, param: Optional[str] = None,
                code: Optional[str] = None) -> OpenAIError:
  return OpenAIError(400, message, INVALID_REQUEST, param, code)


def model_not_found(model: str) -> OpenAIError:
  return OpenAIError(404, f"The model `{model}` does not exist or you do not have access "
                     "to it.", INVALID_REQUEST, "model", "model_not_found")


def unauthorized(message: str = "Incorrect API key provided.") -> OpenAIError:
  return OpenAIError(401, message, INVALID_REQUEST, None, "invalid_api_key",
                     headers={"WWW-Authenticate": "Bearer"})


def rate_limited(retry_after_s: float) -> OpenAIError:
  wait = max(1, math.ceil(retry_after_s))
  return OpenAIError(429, f"Rate limit reached for requests; try again in {wait}s.",
                     "requests", None, "rate_limit_exceeded",
                     headers={"Retry-After": str(wait)})


def body_too_large(limit: int) -> OpenAIError:
  return OpenAIError(413, f"Request body too large: the limit is {limit} bytes.",
                     INVALID_REQUEST, None, "request_too_large")


def overloaded(message: str = "The server is overloaded; retry later.") -> OpenAIError:
  return OpenAIError(503, message, "server_error", None, "server_overloaded",
                     headers={"Retry-After": "1"})


def context_length_exceeded(max_len: int, prompt: int, completion: Optional[int],
                            param: str = "messages") -> OpenAIError:
  if completion is None:
    msg = (f"This model's maximum context length is {max_len} tokens. However, your "
           f"prompt is {prompt} tokens, which leaves no room for a completion. Please "
           "reduce the length of the prompt.")
  else:
    msg = (f"This model's maximum context length is {max_len} tokens. However, you "
           f"requested {prompt + completion} tokens ({prompt} in the prompt, {completion} "
           "in the completion). Please reduce the length of the prompt or the completion.")
  return OpenAIError(400, msg, INVALID_REQUEST, param, "context_length_exceeded")


# ---- field checks -----------------------------------------------------------------------

def _is_int(x) -> bool:
  return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x) -> bool:
  return (isinstance(x, (int, float)) and not isinstance(x, bool)
          and math.isfinite(float(x)))


def _get_int(body: Dict, name: str, lo: Optional[int] = None, hi: Optional[int] = None,
             default=None):
  v = body.get(name)
  if v is None:
    return default
  if not _is_int(v):
    raise bad_request(f"'{name}' must be an integer, got {_show(v)}.", name)
  if lo is not None and v < lo:
    raise bad_request(f"{v} is less than the minimum of {lo} - '{name}'", name)
  if hi is not None and v > hi:
    raise bad_request(f"{v} is greater than the maximum of {hi} - '{name}'", name)
  return v


def _get_num(body: Dict, name: str, lo: float, hi: float, default: float,
             lo_open: bool = False) -> float:
  v = body.get(name)
  if v is None:
    return default
  if not _is_num(v):
    raise bad_request(f"'{name}' must be a number, got {_show(v)}.", name)
  v = float(v)
  if v < lo or (lo_open and v == lo):
    raise bad_request(f"{v:g} is {'not greater than' if lo_open else 'less than'} the "
                      f"minimum of {lo:g} - '{name}'", name)
  if v > hi:
    raise bad_request(f"{v:g} is greater than the maximum of {hi:g} - '{name}'", name)
  return v


def _get_bool(body: Dict, name: str, default: bool = False) -> bool:
  v = body.get(name)
  if v is None:
    return default
  if not isinstance(v, bool):
    raise bad_request(f"'{name}' must be a boolean, got {_show(v)}.", name)
  return v


def _get_str(body: Dict, name: str, default: Optional[str] = None) -> Optional[str]:
  v = body.get(name)
  if v is None:
    return default
  if not isinstance(v, str):
    raise bad_request(f"'{name}' must be a string, got {_show(v)}.", name)
  return v


def _show(v) -> str:
  s = repr(v)
  return s if len(s) <= 60 else s[:57] + "..."


MAX_STOP = 4


def _stop(body: Dict) -> Tuple[str, ...]:
  v = body.get("stop")
  if v is None:
    return ()
  if isinstance(v, str):
    v = [v]
  if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
    raise bad_request("'stop' must be a string or a list of strings.", "stop")
  if len(v) > MAX_STOP:
    raise bad_request(f"'stop' holds at most {MAX_STOP} sequences, got {len(v)}.", "stop")
  if any(not s for s in v):
    raise bad_request("'stop' sequences must not be empty.", "stop")
  return tuple(dict.fromkeys(v))


def _refuse_unsupported(body: Dict) -> None:
  """Parameters that would change the sampled distribution away from the trained head."""
  for name in ("frequency_penalty", "presence_penalty", "repetition_penalty"):
    v = body.get(name)
    if v is not None and not (_is_num(v) and float(v) == (1.0 if name == "repetition_penalty"
                                                         else 0.0)):
      raise bad_request(f"'{name}' is not supported by this server (the policy samples "
                        "from its trained distribution); leave it unset or 0.", name)
  if body.get("logit_bias"):
    raise bad_request("'logit_bias' is not supported by this server.", "logit_bias")
  rf = body.get("response_format")
  if rf is not None:
    if not (isinstance(rf, dict) and rf.get("type") == "text"):
      raise bad_request("'response_format' other than {'type': 'text'} is not supported "
                        "by this server.", "response_format")
  for name in ("audio", "prediction", "web_search_options"):
    if body.get(name) is not None:
      raise bad_request(f"'{name}' is not supported by this server.", name)
  mods = body.get("modalities")
  if mods is not None and mods != ["text"]:
    raise bad_request("only the 'text' modality is supported.", "modalities")


# ---- sampling ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Sampling:
  """The validated sampling settings shared by both endpoints.

  max_tokens: None = the server's default (capped to what the context leaves).
  temperature 0 is greedy: `engine_settings` maps it to temperature 1, top_k 1.
  """
  max_tokens: Optional[int]
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  seed: Optional[int] = None
  stop: Tuple[str, ...] = ()
  n: int = 1
  logprobs: bool = False
  top_logprobs: int = 0

  def engine_settings(self) -> Tuple[float, int, float]:
    """(temperature, top_k, top_p) for the exact head; greedy is top_k=1."""
    if self.temperature == 0.0:
      return 1.0, 1, 1.0
    return self.temperature, self.top_k, self.top_p


SEED_RANGE = (-(2 ** 63), 2 ** 63 - 1)


def _sampling(body: Dict, max_n: int, max_top_logprobs: int, chat: bool) -> Sampling:
  mct = _get_int(body, "max_completion_tokens", lo=1) if chat else None
  mt = _get_int(body, "max_tokens", lo=1)
  if mct is not None and mt is not None and mct != mt:
    raise bad_request("Give one of 'max_tokens' and 'max_completion_tokens' (they differ).",
                      "max_tokens")
  max_tokens = mct if mct is not None else mt
  temperature = _get_num(body, "temperature", 0.0, 2.0, 1.0)
  top_p = _get_num(body, "top_p", 0.0, 1.0, 1.0, lo_open=True)
  top_k = _get_int(body, "top_k", lo=-1, default=0)  # vLLM's extension; -1 = off
  top_k = max(top_k, 0)
  seed = _get_int(body, "seed", lo=SEED_RANGE[0], hi=SEED_RANGE[1])
  n = _get_int(body, "n", lo=1, hi=max_n, default=1)
  if chat:
    logprobs = _get_bool(body, "logprobs")
    top = _get_int(body, "top_logprobs", lo=0, hi=max_top_logprobs, default=0)
    if top and not logprobs:
      raise bad_request("'top_logprobs' requires 'logprobs' to be true.", "top_logprobs")
  else:  # /v1/completions: logprobs is the number of alternatives (0..5)
    lp = _get_int(body, "logprobs", lo=0, hi=min(5, max_top_logprobs))
    logprobs, top = lp is not None, lp or 0
  best_of = body.get("best_of")
  if best_of is not None and best_of != n and best_of != 1:
    raise bad_request("'best_of' is not supported by this server.", "best_of")
  return Sampling(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                  seed=seed, stop=_stop(body), n=n, logprobs=logprobs, top_logprobs=top)


def _stream(body: Dict) -> Tuple[bool, bool]:
  stream = _get_bool(body, "stream")
  so = body.get("stream_options")
  include_usage = False
  if so is not None:
    if not stream:
      raise bad_request("'stream_options' is only allowed when 'stream' is true.",
                        "stream_options")
    if not isinstance(so, dict):
      raise bad_request("'stream_options' must be an object.", "stream_options")
    include_usage = _get_bool(so, "include_usage")
  return stream, include_usage


def _model(body: Dict) -> str:
  m = body.get("model")
  if m is None:
    raise bad_request("you must provide a model parameter", "model")
  if not isinstance(m, str):
    raise bad_request("'model' must be a string.", "model")
  return m


def _object(body: Any) -> Dict:
  if not isinstance(body, dict):
    raise bad_request("The request body must be a JSON object.")
  return body


# ---- /v1/chat/completions ---------------------------------------------------------------

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
      raise bad_request(f"{where}.role must be one of {list(ROLES)}, got {_show(role)}.",
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
                          f"got {_show(name)}.", f"tools[{i}].function.name")
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
  body = _object(body)
  model = _model(body)
  messages = _messages(body)
  tools, choice = _tools(body)
  if body.get("functions") is not None or body.get("function_call") is not None:
    raise bad_request("'functions'/'function_call' are deprecated; use 'tools'.",
                      "functions")
  _refuse_unsupported(body)
  sampling = _sampling(body, max_n, max_top_logprobs, chat=True)
  stream, include_usage = _stream(body)
  return ChatRequest(model=model, messages=messages, tools=tools, tool_choice=choice,
                     sampling=sampling, stream=stream, include_usage=include_usage,
                     user=_get_str(body, "user"))


# ---- /v1/completions --------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class CompletionRequest:
  """prompts: each prompt as text (str) or token ids (list[int])."""
  model: str
  prompts: List[Any]
  sampling: Sampling
  stream: bool = False
  include_usage: bool = False
  user: Optional[str] = None


def _prompts(body: Dict, vocab_size: int, max_prompts: int) -> List[Any]:
  p = body.get("prompt")
  if p is None:
    raise bad_request("Missing required parameter: 'prompt'.", "prompt")
  if isinstance(p, str):
    prompts = [p]
  elif isinstance(p, list) and p and all(_is_int(x) for x in p):
    prompts = [p]
  elif isinstance(p, list) and p and all(isinstance(x, str) for x in p):
    prompts = list(p)
  elif isinstance(p, list) and p and all(
      isinstance(x, list) and x and all(_is_int(y) for y in x) for x in p):
    prompts = list(p)
  else:
    raise bad_request("'prompt' must be a string, a list of strings, a list of token ids "
                      "or a list of token id lists (non-empty).", "prompt")
  if len(prompts) > max_prompts:
    raise bad_request(f"at most {max_prompts} prompts per request, got {len(prompts)}.",
                      "prompt")
  for q in prompts:
    if isinstance(q, list) and any(not 0 <= x < vocab_size for x in q):
      raise bad_request(f"token ids in 'prompt' must be in [0, {vocab_size}).", "prompt")
  return prompts


def parse_completion_request(body: Any, vocab_size: int, max_n: int = 8,
                             max_top_logprobs: int = 5, max_prompts: int = 16
                             ) -> CompletionRequest:
  """Validates a /v1/completions body."""
  body = _object(body)
  model = _model(body)
  prompts = _prompts(body, vocab_size, max_prompts)
  if _get_bool(body, "echo"):
    raise bad_request("'echo' is not supported by this server.", "echo")
  if body.get("suffix") not in (None, ""):
    raise bad_request("'suffix' is not supported by this server.", "suffix")
  _refuse_unsupported(body)
  sampling = _sampling(body, max_n, max_top_logprobs, chat=False)
  if len(prompts) * sampling.n > max_n * max_prompts:
    raise bad_request("too many choices requested.", "n")
  stream, include_usage = _stream(body)
  return CompletionRequest(model=model, prompts=prompts, sampling=sampling, stream=stream,
                           include_usage=include_usage, user=_get_str(body, "user"))


# ---- /v1/feedback -----------------------------------------------------------------------

SIGNALS = ("accepted", "rejected", "thumbs_up", "thumbs_down", "correction", "task_outcome")
MAX_ID_CHARS = 128
_ID_OK = re.compile(r"^[\x21-\x7e]{1,128}$")


def check_id(value: Any, name: str) -> Optional[str]:
  """A client-supplied id (conversation or completion): printable ASCII, <= 128 chars."""
  if value is None:
    return None
  if not isinstance(value, str) or not _ID_OK.match(value):
    raise bad_request(f"'{name}' must be 1-{MAX_ID_CHARS} printable ASCII characters "
                      "without spaces.", name)
  return value


@dataclasses.dataclass(frozen=True)
class Feedback:
  signal: str
  conversation_id: Optional[str]
  completion_id: Optional[str]
  value: Any = None        # number, bool or None
  text: Optional[str] = None


def parse_feedback(body: Any, conversation_header: Optional[str] = None,
                   max_text_chars: int = 1 << 20) -> Feedback:
  """Validates a /v1/feedback body:

    {"signal": "accepted" | "rejected" | "thumbs_up" | "thumbs_down" | "correction" |
               "task_outcome",
     "conversation_id": str?, "completion_id": str?,   (at least one; or X-Conversation-Id)
     "value": number | bool | null,   (task_outcome: required, e.g. true / 0.75)
     "text": str | null}              (correction: required, the corrected answer)
  """
  body = _object(body)
  signal = body.get("signal")
  if signal not in SIGNALS:
    raise bad_request(f"'signal' must be one of {list(SIGNALS)}, got {_show(signal)}.",
                      "signal")
  conv = check_id(body.get("conversation_id"), "conversation_id") or conversation_header
  comp = check_id(body.get("completion_id"), "completion_id")
  if conv is None and comp is None:
    raise bad_request("give 'conversation_id' or 'completion_id' (or the X-Conversation-Id "
                      "header).", "conversation_id")
  value = body.get("value")
  if value is not None and not (isinstance(value, bool) or _is_num(value)):
    raise bad_request("'value' must be a number, a boolean or null.", "value")
  text = _get_str(body, "text")
  if text is not None and len(text) > max_text_chars:
    raise bad_request(f"'text' is longer than {max_text_chars} characters.", "text")
  if signal == "correction" and not text:
    raise bad_request("a 'correction' needs 'text' (the corrected answer).", "text")
  if signal == "task_outcome" and value is None:
    raise bad_request("a 'task_outcome' needs 'value' (e.g. true/false or a score).",
                      "value")
  return Feedback(signal=signal, conversation_id=conv, completion_id=comp, value=value,
                  text=text)


def parse_consent(header: Optional[str]) -> Optional[bool]:
  """X-Training-Consent: 'true' | 'false' (absent = None)."""
  if header is None:
    return None
  v = header.strip().lower()
  if v in ("true", "1", "yes"):
    return True
  if v in ("false", "0", "no"):
    return False
  raise bad_request("X-Training-Consent must be 'true' or 'false'.", "X-Training-Consent")


# ---- responses --------------------------------------------------------------------------

TokenText = Callable[[int], str]
TokenBytes = Callable[[int], Optional[List[int]]]


def usage(prompt_tokens: int, completion_tokens: int) -> Dict[str, int]:
  return {"prompt_tokens": int(prompt_tokens), "completion_tokens": int(completion_tokens),
          "total_tokens": int(prompt_tokens + completion_tokens)}


def _lp(x: float) -> float:
  x = float(x)
  return x if math.isfinite(x) else -9999.0  # JSON has no -inf; OpenAI's floor


def chat_logprobs(token_ids: Sequence[int], logprobs: Sequence[float],
                  top: Sequence[Sequence[Tuple[int, float]]], top_n: int,
                  token_text: TokenText, token_bytes: TokenBytes) -> Dict[str, Any]:
  """`choice.logprobs` of a chat completion: {"content": [ChatCompletionTokenLogprob]}."""
  content = []
  for k, (t, lp) in enumerate(zip(token_ids, logprobs)):
    alts = list(top[k])[:top_n] if k < len(top) else []
    content.append({
        "token": token_text(t), "logprob": _lp(lp), "bytes": token_bytes(t),
        "top_logprobs": [{"token": token_text(a), "logprob": _lp(b), "bytes": token_bytes(a)}
                         for a, b in alts]})
  return {"content": content, "refusal": None}


def assistant_message(content: Optional[str], tool_calls: Sequence[Dict]) -> Dict[str, Any]:
  msg: Dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
  if tool_calls:
    msg["tool_calls"] = list(tool_calls)
  return msg


def chat_choice(index: int, message: Dict, finish_reason: str,
                logprobs: Optional[Dict]) -> Dict[str, Any]:
  return {"index": index, "message": message, "logprobs": logprobs,
          "finish_reason": finish_reason}


def chat_completion(completion_id: str, created: int, model: str, choices: List[Dict],
                    usage_: Dict[str, int], fingerprint: Optional[str] = None
                    ) -> Dict[str, Any]:
  return {"id": completion_id, "object": "chat.completion", "created": int(created),
          "model": model, "choices": choices, "usage": usage_,
          "system_fingerprint": fingerprint}


def chat_chunk(completion_id: str, created: int, model: str, choices: List[Dict],
               usage_: Optional[Dict[str, int]] = None, with_usage_field: bool = False,
               fingerprint: Optional[str] = None) -> Dict[str, Any]:
  """One chat.completion.chunk. With stream_options.include_usage every chunk carries
  `usage: null` and the last one (empty choices) the totals, as OpenAI does."""
  out = {"id": completion_id, "object": "chat.completion.chunk", "created": int(created),
         "model": model, "choices": choices, "system_fingerprint": fingerprint}
  if with_usage_field or usage_ is not None:
    out["usage"] = usage_
  return out


def chunk_choice(index: int, delta: Dict[str, Any], finish_reason: Optional[str] = None,
                 logprobs: Optional[Dict] = None) -> Dict[str, Any]:
  return {"index": index, "delta": delta, "logprobs": logprobs,
          "finish_reason": finish_reason}


def tool_call_deltas(tool_calls: Sequence[Dict]) -> List[Dict[str, Any]]:
  """Streamed tool calls: each call whole, with its index (what OpenAI's SDK accumulates)."""
  return [{"index": i, "id": c["id"], "type": "function",
           "function": {"name": c["function"]["name"],
                        "arguments": c["function"]["arguments"]}}
          for i, c in enumerate(tool_calls)]


def completion_logprobs(token_ids: Sequence[int], logprobs: Sequence[float],
                        top: Sequence[Sequence[Tuple[int, float]]], top_n: int,
                        token_text: TokenText, text_offset0: int = 0) -> Dict[str, Any]:
  """`choice.logprobs` of a text completion (the legacy format)."""
  tokens = [token_text(t) for t in token_ids]
  offsets, pos = [], text_offset0
  for s in tokens:
    offsets.append(pos)
    pos += len(s)
  tops = []
  for k in range(len(tokens)):
    d: Dict[str, float] = {}
    for a, b in (list(top[k])[:top_n] if k < len(top) else []):
      d.setdefault(token_text(a), _lp(b))
    tops.append(d)
  return {"tokens": tokens, "token_logprobs": [_lp(x) for x in logprobs],
          "top_logprobs": tops if top_n else None, "text_offset": offsets}


def text_choice(index: int, text: str, finish_reason: Optional[str],
                logprobs: Optional[Dict]) -> Dict[str, Any]:
  return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}


def text_completion(completion_id: str, created: int, model: str, choices: List[Dict],
                    usage_: Optional[Dict[str, int]], fingerprint: Optional[str] = None
                    ) -> Dict[str, Any]:
  out = {"id": completion_id, "object": "text_completion", "created": int(created),
         "model": model, "choices": choices, "system_fingerprint": fingerprint}
  if usage_ is not None:
    out["usage"] = usage_
  return out


def model_card(name: str, created: int, owned_by: str = "composer_rl") -> Dict[str, Any]:
  return {"id": name, "object": "model", "created": int(created), "owned_by": owned_by}


def model_list(cards: List[Dict]) -> Dict[str, Any]:
  return {"object": "list", "data": cards}
