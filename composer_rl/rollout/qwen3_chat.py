"""Qwen3's chat layout and tool-call convention, token-in/token-out.

A drop-in for `composer_rl.rollout.chat.ChatFormat` (`start`, `observation`,
`end_of_turn`, `tok`) for a Qwen3 checkpoint with its real tokenizer (`HfTokenizer`). The
text is what Qwen3's published chat template renders for the same conversation:

  <|im_start|>system\n{system}\n\n# Tools ... <tools>\n{signature JSON per tool}\n</tools>
  ...<|im_end|>\n<|im_start|>user\n{task}<|im_end|>\n<|im_start|>assistant\n
  [model: <think>\n...\n</think>\n\n{text}\n<tool_call>\n{"name": ..., "arguments": {...}}
  \n</tool_call><|im_end|>]
  \n<|im_start|>user\n<tool_response>\n{observation}\n</tool_response><|im_end|>\n
  <|im_start|>assistant\n [model ...]

Token-in/token-out: `start` and `observation` return only the new tokens, built piece by
piece (control tokens as ids, text through `HfTokenizer.encode`, which never turns text
into a control token), so earlier turns' ids never change and the model's sampled ids are
kept as sampled. Each piece boundary sits at a special token, so for a conversation whose
assistant turns are canonical (`assistant_text`) the concatenated ids equal the encoding of
the template's full rendering. One deliberate divergence: with `enable_thinking=False`
every turn opens with an empty `<think>\n\n</think>\n\n` (what Qwen3's generation prompt
adds), which the reference template drops from *earlier* turns when it re-renders; we keep
what the model actually saw.

The calls themselves are the environment's `qwen3` call syntax
(`composer_rl.env.qwen3_calls`, re-exported here: `parse_tool_calls`, `format_call`), so
the harness parses what this layout's model writes; `to_env_text` rewrites one call into
the environment's `<tool>` spelling.
"""
import json
from typing import Any, Dict, List, Optional, Sequence, Union

from composer_rl.data.hf_tokenizer import HfTokenizer
from composer_rl.env import tool_call_format as tcf
from composer_rl.env.qwen3_calls import (  # noqa: F401  (part of this module's API)
    CALL_CLOSE, CALL_OPEN, THINK_CLOSE, THINK_OPEN, format_call, parse_tool_call,
    parse_tool_calls)

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
TOOLS_HEADER = ("# Tools\n\nYou may call one or more functions to assist with the user query."
                "\n\nYou are provided with function signatures within <tools></tools> XML tags:"
                "\n<tools>")
TOOLS_FOOTER = ("\n</tools>\n\nFor each function call, return a json object with function name"
                " and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')
EMPTY_THINK = "<think>\n\n</think>\n\n"

_DESCRIPTIONS = {
    "list_dir": ("List the entries of a directory in the repository.",
                 {"path": "Directory, relative to the repository root."}),
    "read_file": ("Read lines of a file (1-based, inclusive range).",
                  {"path": "File, relative to the repository root.",
                   "start": "First line to read.", "end": "Last line to read (default: end)."}),
    "search": ("Search files for a Python regular expression; shows matching lines.",
               {"pattern": "Python regular expression.", "path": "File or directory to search."}),
    "edit": ("Replace the exact string `old` (which must occur exactly once) by `new`.",
             {"path": "File to edit.", "old": "Exact text to replace.", "new": "Replacement."}),
    "write_file": ("Create or overwrite a file.",
                   {"path": "File to write.", "content": "Full new content."}),
    "run": ("Run a shell command in the sandbox; shows its output and exit status.",
            {"cmd": "Shell command.", "timeout": "Seconds before it is killed (capped)."}),
    "submit": ("Submit the work: ends the episode and triggers grading.", {}),
}
_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean"}


def env_tools() -> List[Dict[str, Any]]:
  """The environment's tools as OpenAI-style function signatures (what `<tools>` lists)."""
  out = []
  for name, (_, params) in tcf.TOOL_SCHEMAS.items():
    desc, arg_desc = _DESCRIPTIONS.get(name, (name, {}))
    props = {}
    for p in params:
      types = [_JSON_TYPES[t] for t in p.types]
      props[p.name] = {"type": "number" if set(types) == {"integer", "number"} else types[0],
                       "description": arg_desc.get(p.name, p.name)}
    out.append({"type": "function", "function": {
        "name": name, "description": desc,
        "parameters": {"type": "object", "properties": props,
                       "required": [p.name for p in params if p.required]}}})
  return out


def tools_block(tools: Sequence[Dict[str, Any]]) -> str:
  """The system message's declaration of `tools` (JSON signatures), as Qwen3's template
  writes it."""
  sig = "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools)
  return f"{TOOLS_HEADER}{sig}{TOOLS_FOOTER}"


def assistant_text(content: str = "", tool_calls: Sequence[Dict[str, Any]] = (),
                   reasoning: Optional[str] = None) -> str:
  """The canonical text of an assistant turn (without the closing <|im_end|>), as the
  template renders it after the last user query: scripted policies and SFT data use this.
  tool_calls: [{'name': ..., 'arguments': {...}}, ...]."""
  text = content
  if reasoning is not None:
    text = f"{THINK_OPEN}\n{reasoning.strip(chr(10))}\n{THINK_CLOSE}\n\n{content.lstrip(chr(10))}"
  for k, call in enumerate(tool_calls):
    if k or content:
      text += "\n"
    text += format_call(call["name"], call.get("arguments", {}))
  return text


class Qwen3ChatFormat:
  """Qwen3 chat turns as token ids for an `HfTokenizer` (see module docstring).

  tools: function signatures for the system prompt (default: the environment's tools;
    None or [] = no tools block). enable_thinking: False opens every assistant turn with
    an empty think block, as Qwen3's `enable_thinking=False` generation prompt does.
  """

  name = "qwen3"  # its `rollout.formats.CHAT_FORMATS` name
  call_syntax = "qwen3"  # what the environment parses (`env.call_syntax`)

  def __init__(self, tokenizer: HfTokenizer, tools: Optional[Sequence[Dict]] = (),
               enable_thinking: bool = True):
    self.tok = tokenizer
    self.tools = env_tools() if tools == () else list(tools or [])
    self.enable_thinking = enable_thinking
    self._ids = {s: tokenizer.token_id(s) for s in (IM_START, IM_END)}

  # Pieces are special-token strings (kept as one id) or text (encoded as text).
  def encode_pieces(self, pieces: List[str]) -> List[int]:
    out: List[int] = []
    for p in pieces:
      out += [self._ids[p]] if p in self._ids else self.tok.encode(p)
    return out

  def generation_prompt(self) -> List[str]:
    """The pieces that open an assistant turn."""
    return [IM_START, "assistant\n" + ("" if self.enable_thinking else EMPTY_THINK)]

  def system_pieces(self, system: str, tools: Optional[Sequence[Dict]] = None) -> List[str]:
    """The system turn (with a tools block listing `tools`, default this format's tools);
    nothing when there is neither a system message nor a tool."""
    tools = self.tools if tools is None else tools
    if tools:
      head = system + "\n\n" if system else ""
      return [IM_START, f"system\n{head}{tools_block(tools)}", IM_END, "\n"]
    return [IM_START, f"system\n{system}", IM_END, "\n"] if system else []

  @staticmethod
  def user_pieces(text: str) -> List[str]:
    return [IM_START, f"user\n{text}", IM_END, "\n"]

  @staticmethod
  def tool_pieces(observations: Sequence[str]) -> List[str]:
    """Tool results as one user turn of <tool_response> blocks (one per call)."""
    body = "".join(f"\n<tool_response>\n{o}\n</tool_response>" for o in observations)
    return [IM_START, "user" + body, IM_END, "\n"]

  def _start_pieces(self, system: str, task: str) -> List[str]:
    return self.system_pieces(system) + self.user_pieces(task) + self.generation_prompt()

  def _observation_pieces(self, observations: Union[str, Sequence[str]]) -> List[str]:
    obs = [observations] if isinstance(observations, str) else list(observations)
    return ["\n"] + self.tool_pieces(obs) + self.generation_prompt()

  def start(self, system: str, task: str) -> List[int]:
    """System (with the tools block) + user task + the first assistant header."""
    return self.encode_pieces(self._start_pieces(system, task))

  def start_text(self, system: str, task: str) -> str:
    return "".join(self._start_pieces(system, task))

  def observation(self, observations: Union[str, Sequence[str]]) -> List[int]:
    """Tokens after the assistant's <|im_end|>: the tool results as one user turn of
    <tool_response> blocks (one per call), then the next assistant header."""
    return self.encode_pieces(self._observation_pieces(observations))

  def observation_text(self, observations: Union[str, Sequence[str]]) -> str:
    return "".join(self._observation_pieces(observations))

  def assistant(self, text: str) -> List[int]:
    """A whole assistant turn given as text (scripted / SFT data), ending on <|im_end|>."""
    return self.tok.encode(text) + [self.end_of_turn]

  def user_ids(self, content: List[int]) -> List[int]:
    """A user turn holding token ids `content` (a carried summary: ids, not text)."""
    return (self.encode_pieces([IM_START, "user\n"]) + list(content)
            + self.encode_pieces([IM_END, "\n"]))

  def generation_ids(self) -> List[int]:
    """The assistant header that `start` and `observation` end with."""
    return self.encode_pieces(self.generation_prompt())

  @property
  def end_of_turn(self) -> int:
    return self._ids[IM_END]


def to_env_text(text: str) -> str:
  """A Qwen3 turn rewritten as the one call `env.harness` parses (`<tool>{...}</tool>`)."""
  call = parse_tool_call(text)
  return tcf.format_tool_call(call.name, call.args)
