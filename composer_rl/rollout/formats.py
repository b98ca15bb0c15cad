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
import shutil
from typing import Callable, Dict, Iterable, List, Optional, Sequence

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
  return qwen3_chat.Qwen3ChatFormat(tok, tools=_qwen3_signatures(tools),
                                    enable_thinking=enable_thinking)


def _qwen3_signatures(tools: Optional[Sequence[str]]):
  """The JSON signatures of the environment's allowed tools (empty = all; None = a format
  without tools, e.g. question answering) and submit."""
  from composer_rl.rollout import qwen3_chat  # pylint: disable=g-import-not-at-top
  if tools is None:
    return None
  allowed = set(tools) | {"submit"} if tools else None
  return [t for t in qwen3_chat.env_tools() if allowed is None or t["function"]["name"] in allowed]


# config.chat.format -> fn(tokenizer dir, allowed tools, enable_thinking) -> chat format
CHAT_FORMATS: Dict[str, Callable] = {"byte": _byte, "qwen3": _qwen3}
OWN_TOKENIZER = {"byte"}  # formats that read no tokenizer.json


def make_chat(name: str, tokenizer: str = "", tools: Optional[Sequence[str]] = (),
              enable_thinking: bool = False):
  """The chat format `name` (see module docstring). tokenizer: a directory with
  tokenizer.json (formats that read one); tools: the environment's allowed tools (empty =
  all; None = no tools), which a format that declares tools lists."""
  if name not in CHAT_FORMATS:
    raise ValueError(f"unknown chat format {name!r}; known: {sorted(CHAT_FORMATS)}")
  fmt = CHAT_FORMATS[name](tokenizer, None if tools is None else tuple(tools), enable_thinking)
  fmt.tokenizer_dir = tokenizer  # where its tokenizer came from ('' = built in)
  return fmt


def from_config(chat, init_checkpoint: str = "", tools: Optional[Sequence[str]] = (),
                workdir: str = "", corpus: Optional[Callable[[str], Iterable[str]]] = None):
  """The chat format of a run: its `chat` section (format, tokenizer, enable_thinking; None
  = the byte format) and `init_checkpoint` (a converted checkpoint brings its tokenizer,
  hf_files/, unless chat.tokenizer names one; FileNotFoundError if it is not one).
  `chat.bpe_vocab_size` > 0 (agent RL) trains the tokenizer instead, on `corpus`, into
  `workdir/tokenizer` (`trained_tokenizer`)."""
  from composer_rl.model import hf_qwen3  # pylint: disable=g-import-not-at-top
  get = (lambda k, d: getattr(chat, k, d)) if chat is not None else (lambda k, d: d)
  if init_checkpoint:
    hf_qwen3.check_converted(init_checkpoint)
  tok_dir = get("tokenizer", "") or (
      os.path.join(init_checkpoint, hf_qwen3.HF_FILES_DIR) if init_checkpoint else "")
  name, vocab = get("format", "byte"), get("bpe_vocab_size", 0)
  if init_checkpoint and name in OWN_TOKENIZER:
    raise ValueError(f"chat.format={name!r} has its own tokenizer, but init_checkpoint "
                     f"{init_checkpoint} brings the checkpoint's: set chat.format to the "
                     f"checkpoint's format (one of {sorted(set(CHAT_FORMATS) - OWN_TOKENIZER)})")
  if vocab:
    if name not in TRAINABLE or tok_dir:
      raise ValueError(
          f"chat.bpe_vocab_size={vocab} trains a tokenizer for a from-scratch model in "
          f"format {sorted(TRAINABLE)} (chat.format is {name!r}); it cannot be combined "
          "with chat.tokenizer or init_checkpoint, which bring their own")
    if corpus is None or not workdir:
      raise ValueError("chat.bpe_vocab_size: this kind of run does not train a tokenizer "
                       "(agent RL does); set chat.tokenizer")
    tok_dir = trained_tokenizer(name, os.path.join(workdir, TRAINED_TOKENIZER_DIR), vocab,
                                corpus, tools)
  return make_chat(name, tok_dir, tools, get("enable_thinking", False))


TRAINED_TOKENIZER_DIR = "tokenizer"  # in a run's workdir, when chat.bpe_vocab_size is set


def _qwen3_structure(tools: Optional[Sequence[str]]) -> List[str]:
  """The text every Qwen3 session holds besides its content: the tools block of the
  system message and the turn scaffolding."""
  from composer_rl.rollout import qwen3_chat  # pylint: disable=g-import-not-at-top
  return [qwen3_chat.tools_block(_qwen3_signatures(tools) or []), qwen3_chat.EMPTY_THINK,
          "<tool_response>\n\n</tool_response>"]


# formats whose tokenizer can be trained at run time -> (their call syntax, the text of
# their scaffolding)
TRAINABLE: Dict[str, tuple] = {"qwen3": ("qwen3", _qwen3_structure)}


def trained_tokenizer(name: str, out_dir: str, vocab_size: int,
                      corpus: Callable[[str], Iterable[str]],
                      tools: Optional[Sequence[str]] = ()) -> str:
  """A byte-level BPE tokenizer for format `name` (`data.bpe.train_qwen3_style`) with
  `vocab_size` tokens, trained on `corpus(call_syntax)` (sessions in the format's call
  syntax) and the format's scaffolding (each piece as often as the corpus has texts / 8,
  so it is learned as sessions repeat it), saved in `out_dir`; an existing `out_dir/tokenizer.json` is reused (a resumed run, a rollout
  worker). Returns `out_dir`."""
  from composer_rl.data import bpe  # pylint: disable=g-import-not-at-top
  if os.path.exists(os.path.join(out_dir, "tokenizer.json")):
    return out_dir
  syntax, structure = TRAINABLE[name]
  texts = list(corpus(syntax))
  if not texts:
    raise ValueError(f"no text to train the {name} tokenizer on")
  texts += structure(None if tools is None else tuple(tools)) * max(1, len(texts) // 8)
  tmp = f"{out_dir}.tmp{os.getpid()}"
  bpe.train_qwen3_style(texts, vocab_size, tmp)
  try:
    os.replace(tmp, out_dir)
  except OSError:  # another process (a rollout worker) wrote it first: the same file
    shutil.rmtree(tmp, ignore_errors=True)
  return out_dir


RUN_CHAT_FILE = "chat.json"  # in a run's workdir: its chat format, for the viewer


def write_run_chat(workdir: str, chat) -> None:
  """Records a run's chat format, call syntax and tokenizer directory in its workdir."""
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, RUN_CHAT_FILE), "w") as f:
    json.dump(dict(format=chat.name, call_syntax=chat.call_syntax,
                   tokenizer=os.path.abspath(chat.tokenizer_dir) if chat.tokenizer_dir
                   else ""), f)


def read_run_chat(workdir: str) -> Dict[str, str]:
  """What `write_run_chat` wrote ({} for a run that has none: the byte format)."""
  try:
    with open(os.path.join(workdir, RUN_CHAT_FILE)) as f:
      return json.load(f)
  except (OSError, ValueError):
    return {}
