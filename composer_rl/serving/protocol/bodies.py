"""Response builders: plain dicts in the shapes of `openai.types.chat.ChatCompletion`,
`ChatCompletionChunk` and `openai.types.Completion`, and the model list."""
import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple


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
