"""`POST /v1/completions` (legacy) requests: string or token-id prompts."""
import dataclasses
from typing import Any, Dict, List, Optional

from composer_rl.serving.protocol.errors import bad_request
from composer_rl.serving.protocol.fields import (Sampling, as_object, get_bool, get_str, is_int,
    parse_model, parse_sampling, parse_stream, refuse_unsupported)


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
  elif isinstance(p, list) and p and all(is_int(x) for x in p):
    prompts = [p]
  elif isinstance(p, list) and p and all(isinstance(x, str) for x in p):
    prompts = list(p)
  elif isinstance(p, list) and p and all(
      isinstance(x, list) and x and all(is_int(y) for y in x) for x in p):
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
  body = as_object(body)
  model = parse_model(body)
  prompts = _prompts(body, vocab_size, max_prompts)
  if get_bool(body, "echo"):
    raise bad_request("'echo' is not supported by this server.", "echo")
  if body.get("suffix") not in (None, ""):
    raise bad_request("'suffix' is not supported by this server.", "suffix")
  refuse_unsupported(body)
  sampling = parse_sampling(body, max_n, max_top_logprobs, chat=False)
  if len(prompts) * sampling.n > max_n * max_prompts:
    raise bad_request("too many choices requested.", "n")
  stream, include_usage = parse_stream(body)
  return CompletionRequest(model=model, prompts=prompts, sampling=sampling, stream=stream,
                           include_usage=include_usage, user=get_str(body, "user"))
