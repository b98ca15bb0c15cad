"""Chat formats chosen by name (`config.chat.format`): the tokenizer, the token layout of a
session, and the tool-call syntax the environment parses, as one unit, so the agent loop,
demonstrations, evaluation and the trainer all speak the checkpoint's format.

  byte   `ByteTokenizer` + `rollout.chat.ChatFormat` (role tokens, <EOT>), calls in the
         compact `<t>[...]</t>` spelling: the byte-level models trained from scratch here.
  qwen3  the checkpoint's `tokenizer.json` (`data.hf_tokenizer.HfTokenizer`) +
         `rollout.qwen3_chat.Qwen3ChatFormat` (<|im_start|> turns, tools declared in the
         system message, <tool_response> observations), calls in Qwen3's
         `<tool_call>{"name": ..., "arguments": ...}</tool_call>` (`env.qwen3_calls`).

Each format object has `tok`, `start`, `observation`, `end_of_turn` and `call_syntax`
(an `env.call_syntax` name for `EnvConfig.call_syntax`).
"""
import os
from typing import Callable, Dict, Sequence

from composer_rl.data.byte_tokenizer import ByteTokenizer
from composer_rl.rollout.chat import ChatFormat


def _byte(tokenizer: str, tools: Sequence[str], enable_thinking: bool):
  del tokenizer, tools, enable_thinking  # the byte layout has none of these
  return ChatFormat(ByteTokenizer())


def _qwen3(tokenizer: str, tools: Sequence[str], enable_thinking: bool):
  from composer_rl.data.hf_tokenizer import HfTokenizer  # pylint: disable=g-import-not-at-top
  from composer_rl.rollout import qwen3_chat  # pylint: disable=g-import-not-at-top
  if not tokenizer:
    raise ValueError("chat format 'qwen3' needs a tokenizer: config.chat.tokenizer (a "
                     "directory with tokenizer.json) or config.init_checkpoint (a converted "
                     "checkpoint with its hf_files/)")
  if not os.path.exists(os.path.join(tokenizer, "tokenizer.json")):
    raise FileNotFoundError(f"chat format 'qwen3': no tokenizer.json in {tokenizer}")
  tok = HfTokenizer(tokenizer)
  for name in (qwen3_chat.IM_START, qwen3_chat.IM_END, "<tool_call>", "</tool_call>"):
    try:
      tok.token_id(name)
    except KeyError:
      raise ValueError(f"{tokenizer}/tokenizer.json has no {name!r} token: not a Qwen3 "
                       "tokenizer (chat format 'qwen3')") from None
  allowed = set(tools) | {"submit"} if tools else None
  signatures = [t for t in qwen3_chat.env_tools()
                if allowed is None or t["function"]["name"] in allowed]
  return qwen3_chat.Qwen3ChatFormat(tok, tools=signatures, enable_thinking=enable_thinking)


# config.chat.format -> fn(tokenizer dir, allowed tools, enable_thinking) -> chat format
CHAT_FORMATS: Dict[str, Callable] = {"byte": _byte, "qwen3": _qwen3}


def make_chat(name: str, tokenizer: str = "", tools: Sequence[str] = (),
              enable_thinking: bool = False):
  """The chat format `name` (see module docstring). tokenizer: a directory with
  tokenizer.json (formats that read one); tools: the environment's allowed tools (empty =
  all), which a format that declares tools lists."""
  if name not in CHAT_FORMATS:
    raise ValueError(f"unknown chat format {name!r}; known: {sorted(CHAT_FORMATS)}")
  return CHAT_FORMATS[name](tokenizer, tuple(tools), enable_thinking)
