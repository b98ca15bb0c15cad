"""One trajectory record -> the viewer's summary row and full session JSON.

Tool calls are parsed with the harness's own parser (`env.tool_call_format`), so a turn
shows exactly the call the harness executed (or the exact error it answered with). Every
string here is untrusted model or tool output: the page renders it as text only.
"""
import re
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from composer_rl.data.byte_tokenizer import ByteTokenizer
from composer_rl.env import call_syntax, qwen3_calls
from composer_rl.env.tool_call_format import (COMPACT_OPEN, FULL_OPEN, ToolCallError,
                                              parse_tool_call)

_TOK = ByteTokenizer()
# tools.truncate_observation's marker; the page highlights it so a cut is never silent
_TRUNCATED = re.compile(r"\[\.\.\. observation truncated: (\d+) chars omitted \.\.\.\]")


def vocab() -> List[str]:
  """Display names of the byte tokenizer's ids (the page maps ids through this table)."""
  return [_TOK.name(i) for i in range(_TOK.vocab_size)]


def _logprobs(d: Dict[str, Any]) -> List[float]:
  lp = d.get("logprobs") or []
  if d.get("logprobs_are_uint32_bits"):
    lp = np.asarray(lp, np.uint32).view(np.float32)
  return [float(x) for x in np.asarray(lp, np.float64).round(5)]


def _names(tokenizer, tokens: List[int]) -> Dict[str, str]:
  """{id: display text} of the session's distinct ids under a real tokenizer (the page
  shows `#id` without one): a token's own bytes, a special token by its name."""
  if tokenizer is None:
    return {}
  return {str(t): (tokenizer.name(t) if tokenizer.is_special(t) else repr(
      tokenizer.token_bytes(t).decode("utf-8", errors="replace"))[1:-1])
          for t in sorted(set(tokens))}


def _byte_tokens(tokens: List[int]) -> bool:
  return all(0 <= t < _TOK.vocab_size for t in tokens)


def _prompt_from_tokens(d: Dict[str, Any]) -> Tuple[Optional[str], Optional[str]]:
  """(system, task) decoded from the context before the first sampled token, for records
  written before `prompt` was recorded (byte tokenizer only)."""
  tokens, mask = d.get("tokens") or [], d.get("loss_mask") or []
  if not tokens or not _byte_tokens(tokens):
    return None, None
  first = next((i for i, m in enumerate(mask) if m), len(tokens))
  parts: Dict[int, List[int]] = {}
  role = None
  for t in tokens[:first]:
    if t in (_TOK.SYS, _TOK.USER):
      role = t
    elif t >= _TOK.num_bytes:  # EOT or another role ends the message
      role = None
    elif role is not None:
      parts.setdefault(role, []).append(t)
  dec = lambda r: _TOK.decode(parts[r]) if r in parts else None
  return dec(_TOK.SYS), dec(_TOK.USER)


def parse_turn(text: str, syntax: str = "tool") -> Dict[str, Any]:
  """{"text", "reasoning", "call": {"name", "args", "compact"} | None,
  "error": {"kind", "message"} | None} as the harness saw this turn, in the run's call
  syntax (`env.call_syntax`: the byte format's `<tool>`/`<t>` or Qwen3's `<tool_call>`)."""
  out: Dict[str, Any] = {"text": text, "reasoning": "", "call": None, "error": None}
  opens = (qwen3_calls.CALL_OPEN,) if syntax == "qwen3" else (FULL_OPEN, COMPACT_OPEN)
  starts = [i for i in (text.find(o) for o in opens) if i >= 0]
  out["reasoning"] = text[:min(starts)].strip() if starts else ""
  parse = call_syntax.get(syntax).parse if syntax == "qwen3" else parse_tool_call
  try:
    call = parse(text)
    out["call"] = {"name": call.name, "args": call.args, "compact": call.compact}
  except ToolCallError as e:
    out["error"] = {"kind": e.kind, "message": str(e)}
  return out


def _observation(text: Optional[str]) -> Dict[str, Any]:
  if text is None:
    return {"text": None, "truncated": 0}
  m = _TRUNCATED.search(text)
  return {"text": text, "truncated": int(m.group(1)) if m else 0}


def outcome(d: Dict[str, Any]) -> str:
  """'solved' (reward >= 1, the controller's solve criterion), 'error' or 'failed'."""
  if d.get("finish_reason") == "error":
    return "error"
  return "solved" if float(d.get("reward", 0.0)) >= 1.0 else "failed"


def convert(d: Dict[str, Any], advantage: float, shard: int, syntax: str = "tool",
            tokenizer=None) -> Tuple[Dict, Dict]:
  """(summary row, full session) for one record (`Trajectory.to_json()` form). `syntax`:
  the run's call syntax; `tokenizer`: the run's real tokenizer (its token names go with
  the session), None for the byte tokenizer."""
  texts = list(d.get("turn_texts") or [])
  observations = list(d.get("observations") or [])
  turns = [parse_turn(t, syntax) for t in texts]
  info = d.get("reward_info") or {}
  hacks = list(info.get("hack_attempts") or [])
  for k, t in enumerate(turns):
    t["observation"] = _observation(observations[k] if k < len(observations) else None)
    t["hacks"] = [h for h in hacks if h.get("turn") == k + 1]
  tokens = list(d.get("tokens") or [])
  mask = list(d.get("loss_mask") or [])
  versions = [int(v) for v in d.get("versions") or []]
  sampled = [v for v in versions if v >= 0]
  metrics = d.get("metrics") or {}
  task_info = d.get("task_info") or {}
  system, task = d.get("system_prompt"), d.get("prompt")
  if task is None:
    system, task = _prompt_from_tokens(d)
  row = dict(task=str(d.get("task_id", "")), gid=int(d.get("group_id", 0)),
             sid=int(d.get("session_id", 0)), r=float(d.get("reward", 0.0)),
             fam=str(task_info.get("family", "")), turns=int(d.get("turns", len(texts))),
             gen=int(sum(mask)), len=len(tokens), fin=str(d.get("finish_reason", "")),
             out=outcome(d), mal=int(metrics.get("malformed_calls", 0)), hacks=len(hacks),
             vmin=min(sampled) if sampled else -1, vmax=max(sampled) if sampled else -1,
             adv=round(float(advantage), 5),
             tools=" ".join(sorted({t["call"]["name"] for t in turns if t["call"]})),
             shard=shard)
  session = dict(row, system_prompt=system, prompt=task, task_info=task_info, turns_detail=turns,
                 segments=list(d.get("segments") or []), final_diff=d.get("final_diff"),
                 reward_info=info, metrics=metrics, parity=d.get("parity"),
                 tokens=dict(ids=tokens, mask=mask, lp=_logprobs(d), ver=versions,
                             byte_vocab=tokenizer is None and _byte_tokens(tokens),
                             names=_names(tokenizer, tokens)))
  return row, session
