"""Field checks shared by every endpoint, and the sampling settings of a request."""
import dataclasses
import math
from typing import Any, Dict, Optional, Tuple

from composer_rl.serving.protocol.errors import bad_request


# ---- field checks -----------------------------------------------------------------------

def is_int(x) -> bool:
  return isinstance(x, int) and not isinstance(x, bool)


def is_num(x) -> bool:
  return (isinstance(x, (int, float)) and not isinstance(x, bool)
          and math.isfinite(float(x)))


def get_int(body: Dict, name: str, lo: Optional[int] = None, hi: Optional[int] = None,
             default=None):
  v = body.get(name)
  if v is None:
    return default
  if not is_int(v):
    raise bad_request(f"'{name}' must be an integer, got {show(v)}.", name)
  if lo is not None and v < lo:
    raise bad_request(f"{v} is less than the minimum of {lo} - '{name}'", name)
  if hi is not None and v > hi:
    raise bad_request(f"{v} is greater than the maximum of {hi} - '{name}'", name)
  return v


def get_num(body: Dict, name: str, lo: float, hi: float, default: float,
             lo_open: bool = False) -> float:
  v = body.get(name)
  if v is None:
    return default
  if not is_num(v):
    raise bad_request(f"'{name}' must be a number, got {show(v)}.", name)
  v = float(v)
  if v < lo or (lo_open and v == lo):
    raise bad_request(f"{v:g} is {'not greater than' if lo_open else 'less than'} the "
                      f"minimum of {lo:g} - '{name}'", name)
  if v > hi:
    raise bad_request(f"{v:g} is greater than the maximum of {hi:g} - '{name}'", name)
  return v


def get_bool(body: Dict, name: str, default: bool = False) -> bool:
  v = body.get(name)
  if v is None:
    return default
  if not isinstance(v, bool):
    raise bad_request(f"'{name}' must be a boolean, got {show(v)}.", name)
  return v


def get_str(body: Dict, name: str, default: Optional[str] = None) -> Optional[str]:
  v = body.get(name)
  if v is None:
    return default
  if not isinstance(v, str):
    raise bad_request(f"'{name}' must be a string, got {show(v)}.", name)
  return v


def show(v) -> str:
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


def refuse_unsupported(body: Dict) -> None:
  """Parameters that would change the sampled distribution away from the trained head."""
  for name in ("frequency_penalty", "presence_penalty", "repetition_penalty"):
    v = body.get(name)
    if v is not None and not (is_num(v) and float(v) == (1.0 if name == "repetition_penalty"
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


def parse_sampling(body: Dict, max_n: int, max_top_logprobs: int, chat: bool) -> Sampling:
  mct = get_int(body, "max_completion_tokens", lo=1) if chat else None
  mt = get_int(body, "max_tokens", lo=1)
  if mct is not None and mt is not None and mct != mt:
    raise bad_request("Give one of 'max_tokens' and 'max_completion_tokens' (they differ).",
                      "max_tokens")
  max_tokens = mct if mct is not None else mt
  temperature = get_num(body, "temperature", 0.0, 2.0, 1.0)
  top_p = get_num(body, "top_p", 0.0, 1.0, 1.0, lo_open=True)
  top_k = get_int(body, "top_k", lo=-1, default=0)  # vLLM's extension; -1 = off
  top_k = max(top_k, 0)
  seed = get_int(body, "seed", lo=SEED_RANGE[0], hi=SEED_RANGE[1])
  n = get_int(body, "n", lo=1, hi=max_n, default=1)
  if chat:
    logprobs = get_bool(body, "logprobs")
    top = get_int(body, "top_logprobs", lo=0, hi=max_top_logprobs, default=0)
    if top and not logprobs:
      raise bad_request("'top_logprobs' requires 'logprobs' to be true.", "top_logprobs")
  else:  # /v1/completions: logprobs is the number of alternatives (0..5)
    lp = get_int(body, "logprobs", lo=0, hi=min(5, max_top_logprobs))
    logprobs, top = lp is not None, lp or 0
  best_of = body.get("best_of")
  if best_of is not None and best_of != n and best_of != 1:
    raise bad_request("'best_of' is not supported by this server.", "best_of")
  return Sampling(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                  seed=seed, stop=_stop(body), n=n, logprobs=logprobs, top_logprobs=top)


def parse_stream(body: Dict) -> Tuple[bool, bool]:
  stream = get_bool(body, "stream")
  so = body.get("stream_options")
  include_usage = False
  if so is not None:
    if not stream:
      raise bad_request("'stream_options' is only allowed when 'stream' is true.",
                        "stream_options")
    if not isinstance(so, dict):
      raise bad_request("'stream_options' must be an object.", "stream_options")
    include_usage = get_bool(so, "include_usage")
  return stream, include_usage


def parse_model(body: Dict) -> str:
  m = body.get("model")
  if m is None:
    raise bad_request("you must provide a model parameter", "model")
  if not isinstance(m, str):
    raise bad_request("'model' must be a string.", "model")
  return m


def as_object(body: Any) -> Dict:
  if not isinstance(body, dict):
    raise bad_request("The request body must be a JSON object.")
  return body
