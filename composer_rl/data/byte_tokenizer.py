"""Byte-level tokenizer for the tiny models: 256 byte tokens + a few special tokens.

Ids 0..255 are the UTF-8 bytes; the specials follow. Decoding invalid UTF-8 (a model can emit
any byte sequence) replaces the bad bytes instead of failing, so text from a model never
raises. `vocab_size` (264) is what a tiny experiment's ModelConfig.vocab_size must be.

  PAD  padding (never attended: padding has segment id 0)
  BOS  start of a session
  EOS  end of a session
  SYS, USER, ASSISTANT, TOOL   start of a message by that role
  EOT  end of the current message; the assistant's turn ends when it samples EOT
"""
from typing import Iterable, List

SPECIALS = ("PAD", "BOS", "EOS", "SYS", "USER", "ASSISTANT", "TOOL", "EOT")


class ByteTokenizer:
  """Text <-> token ids. Special ids are attributes: tok.EOT, tok.BOS, ..."""

  num_bytes = 256

  def __init__(self):
    for i, name in enumerate(SPECIALS):
      setattr(self, name, self.num_bytes + i)
    self.vocab_size = self.num_bytes + len(SPECIALS)

  def encode(self, text: str) -> List[int]:
    return list(text.encode("utf-8"))

  def decode(self, ids: Iterable[int]) -> str:
    """Bytes back to text; special tokens are dropped, invalid UTF-8 is replaced."""
    return bytes(i for i in ids if 0 <= i < self.num_bytes).decode("utf-8", errors="replace")

  def is_special(self, token_id: int) -> bool:
    return token_id >= self.num_bytes

  def token_bytes(self, token_id: int) -> bytes:
    """The bytes a token adds to the text (b"" for a special token)."""
    return bytes([token_id]) if 0 <= token_id < self.num_bytes else b""

  def name(self, token_id: int) -> str:
    if 0 <= token_id < self.num_bytes:
      return repr(bytes([token_id]))[2:-1]
    return f"<{SPECIALS[token_id - self.num_bytes]}>"
