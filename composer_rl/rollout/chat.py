"""The session's token layout (token-in/token-out: history is appended, never re-rendered).

  <BOS><SYS>system text<EOT><USER>task<EOT><ASSISTANT> model tokens ... <EOT>
  <TOOL>observation<EOT><ASSISTANT> model tokens ... <EOT> ...

The assistant's turn ends when it samples <EOT>; only tokens the model sampled carry loss.
"""
from typing import List

from composer_rl.data.byte_tokenizer import ByteTokenizer


class ChatFormat:
  """Renders message tokens for a `ByteTokenizer`-like tokenizer with role specials. Its
  model writes the environment's compact call spelling (`env.call_syntax`)."""

  name = "byte"  # its `rollout.formats.CHAT_FORMATS` name
  call_syntax = "tool_compact"

  def __init__(self, tokenizer: ByteTokenizer):
    self.tok = tokenizer

  def start(self, system: str, task: str) -> List[int]:
    t = self.tok
    return ([t.BOS, t.SYS] + t.encode(system) + [t.EOT, t.USER] + t.encode(task)
            + [t.EOT, t.ASSISTANT])

  def observation(self, text: str) -> List[int]:
    """Tokens after the assistant's <EOT>: the tool's answer, then the next turn's header."""
    t = self.tok
    return [t.TOOL] + t.encode(text) + [t.EOT, t.ASSISTANT]

  def user_ids(self, content: List[int]) -> List[int]:
    """A user message holding token ids `content` (a carried summary: ids, not text)."""
    return [self.tok.USER] + list(content) + [self.tok.EOT]

  def generation_ids(self) -> List[int]:
    """The assistant header that `start` and `observation` end with."""
    return [self.tok.ASSISTANT]

  @property
  def end_of_turn(self) -> int:
    return self.tok.EOT
