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
import json
import os
from typing import Callable, Dict, Optional, Sequence

from composer_rl.data.byte_tokenizer import ByteTokenizer
from composer_rl.rollout.chat import ChatFormat


def _byte(tokenizer: str, tools: Optional[Sequence[str]], enable_thinking: bool):
  del tokenizer, tools, enable_thinking  # the byte layout has none of these
  return ChatFormat(ByteTokenizer())


def _qwen3(tokenizer: str, tools: Optional[Sequence[str]], enable_thinking: bool):
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
  if tools is None:  # a format without tools (question answering)
    return qwen3_chat.Qwen3ChatFormat(tok, tools=None, enable_thinking=enable_thinking)
  allowed = set(tools) | {"submit"} if tools else None
  signatures = [t for t in qwen3_chat.env_tools()
                if allowed is None or t["function"]["name"] in allowed]
  return qwen3_chat.Qwen3ChatFormat(tok, tools=signatures, enable_thinking=enable_thinking)


# config.chat.format -> fn(tokenizer dir, allowed tools, enable_thinking) -> chat format
CHAT_FORMATS: Dict[str, Callable] = {"byte": _byte, "qwen3": _qwen3}


def make_chat(name: str, tokenizer: str = "", tools: Optional[Sequence[str]] = (),
              enable_thinking: bool = False):
  """The chat format `name` (see module docstring). tokenizer: a directory with
  tokenizer.json (formats that read one); tools: the environment's allowed tools (empty =
  all; None = no tools), which a format that declares tools lists."""
  if name not in CHAT_FORMATS:
    raise ValueError(f"unknown chat format {name!r}; known: {sorted(CHAT_FORMATS)}")
  return CHAT_FORMATS[name](tokenizer, None if tools is None else tuple(tools),
                            enable_thinking)


def from_config(chat, init_checkpoint: str = "", tools: Optional[Sequence[str]] = ()):
  """The chat format of a run: its `chat` section (format, tokenizer, enable_thinking; None
  = the byte format) and `init_checkpoint` (a converted checkpoint brings its tokenizer,
  hf_files/, unless chat.tokenizer names one; FileNotFoundError if it is not one)."""
  from composer_rl.model import hf_qwen3  # pylint: disable=g-import-not-at-top
  get = (lambda k, d: getattr(chat, k, d)) if chat is not None else (lambda k, d: d)
  if init_checkpoint:
    hf_qwen3.check_converted(init_checkpoint)
  tok_dir = get("tokenizer", "") or (
      os.path.join(init_checkpoint, hf_qwen3.HF_FILES_DIR) if init_checkpoint else "")
  return make_chat(get("format", "byte"), tok_dir, tools, get("enable_thinking", False))


RUN_CHAT_FILE = "chat.json"  # in a run's workdir: its chat format, for the viewer


def write_run_chat(workdir: str, chat, tokenizer: str) -> None:
  """Records a run's chat format, call syntax and tokenizer directory in its workdir."""
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, RUN_CHAT_FILE), "w") as f:
    json.dump(dict(format=chat.name, call_syntax=chat.call_syntax,
                   tokenizer=os.path.abspath(tokenizer) if tokenizer else ""), f)


def read_run_chat(workdir: str) -> Dict[str, str]:
  """What `write_run_chat` wrote ({} for a run that has none: the byte format)."""
  try:
    with open(os.path.join(workdir, RUN_CHAT_FILE)) as f:
      return json.load(f)
  except (OSError, ValueError):
    return {}
