"""A real model's tokenizer (`tokenizer.json`, Hugging Face `tokenizers`), as a drop-in for
`ByteTokenizer`: same `encode` / `decode` / `is_special` / `name` / `vocab_size` interface.

Two encoders, because the chat layout is built from pieces:

* `encode(text)` treats *all* of `text` as text: a control token spelled inside it (a file
  that contains "<|im_end|>", say) is encoded as ordinary characters, so nothing the
  environment returns can forge a turn boundary. Non-special added tokens (Qwen3's
  `<tool_call>`, `<think>`, ...) are still matched, exactly as the reference tokenizer does.
* `encode_markup(text)` also recognizes the special tokens: the encoding of a fully
  rendered conversation, which tests compare with the piecewise one.

`token_bytes(id)` is one token's share of the text as bytes (a byte-level BPE token can
hold part of a UTF-8 character), so a streamed completion is decoded incrementally.

`decode` drops special (control) tokens and keeps the non-special added ones, like
`tokenizer.decode(ids, skip_special_tokens=True)` in transformers: the text of an assistant
turn keeps its `<tool_call>` tags for the parser. Ids past the tokenizer's vocabulary (the
model's embedding is padded: Qwen3 has 151936 rows for 151669 tokens) decode to nothing.
"""
import os
from typing import Iterable, List, Optional

from tokenizers import Tokenizer


class HfTokenizer:
  """Text <-> token ids with a `tokenizer.json`. Special ids: `tok.EOT` (end of a message,
  the token an assistant turn ends on), `tok.PAD`, `tok.EOS`, plus `token_id(text)`."""

  def __init__(self, path_or_tokenizer, eot: str = "<|im_end|>",
               pad: Optional[str] = "<|endoftext|>", eos: Optional[str] = None):
    """path_or_tokenizer: a `tokenizer.json` file, a directory holding one, or a
    `tokenizers.Tokenizer`. eot / pad / eos: spellings of those tokens (eos defaults to eot)."""
    tok = path_or_tokenizer
    if isinstance(tok, (str, os.PathLike)):
      path = os.fspath(tok)
      if os.path.isdir(path):
        path = os.path.join(path, "tokenizer.json")
      if not os.path.exists(path):
        raise FileNotFoundError(f"HfTokenizer: no tokenizer.json at {path}")
      tok = Tokenizer.from_file(path)
    self._markup = tok
    self._plain = Tokenizer.from_str(tok.to_str())
    self._plain.encode_special_tokens = True
    self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
    self._special = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}
    self.EOT = self.token_id(eot)
    self.EOS = self.token_id(eos) if eos else self.EOT
    self.PAD = self.token_id(pad) if pad else self.EOS
    self._bytes: Optional[List[bytes]] = None

  def token_id(self, text: str) -> int:
    """The id of a single token (e.g. '<|im_start|>'); KeyError naming it if absent."""
    i = self._markup.token_to_id(text)
    if i is None:
      raise KeyError(f"HfTokenizer: token {text!r} is not in the vocabulary")
    return i

  def encode(self, text: str) -> List[int]:
    """Ids of `text`; special tokens spelled in it are *not* recognized (see module doc)."""
    return self._plain.encode(text, add_special_tokens=False).ids

  def encode_markup(self, text: str) -> List[int]:
    """Ids of rendered markup: special tokens spelled in `text` become their ids."""
    return self._markup.encode(text, add_special_tokens=False).ids

  def decode(self, ids: Iterable[int]) -> str:
    """Text of `ids`; special tokens and out-of-vocabulary ids are dropped."""
    keep = [int(i) for i in ids if 0 <= int(i) < self.vocab_size]
    return self._markup.decode(keep, skip_special_tokens=True)

  def token_bytes(self, token_id: int) -> bytes:
    """The bytes token `token_id` adds to the decoded text (b"" for a special token or an
    id past the vocabulary). Byte-level BPE tokens map back through the byte alphabet;
    added tokens (`<tool_call>`) are their own text."""
    if self._bytes is None:
      self._bytes = self._byte_table()
    return self._bytes[token_id] if 0 <= token_id < self.vocab_size else b""

  def _byte_table(self) -> List[bytes]:
    # GPT-2's byte -> printable character table (what ByteLevel pre-tokenization writes):
    # printable Latin-1 bytes stand for themselves, the others for chr(256 + n) in order.
    char_of, extra = {}, 0
    for b in range(256):
      if 33 <= b <= 126 or 161 <= b <= 172 or b >= 174:
        char_of[b] = chr(b)
      else:
        char_of[b], extra = chr(256 + extra), extra + 1
    byte_of = {c: b for b, c in char_of.items()}
    added = self._markup.get_added_tokens_decoder()
    table = []
    for i in range(self.vocab_size):
      if i in self._special:
        table.append(b"")
      elif i in added:
        table.append(added[i].content.encode("utf-8"))
      else:
        piece = self._markup.id_to_token(i) or ""
        if all(c in byte_of for c in piece):
          table.append(bytes(byte_of[c] for c in piece))
        else:  # not a byte-level vocabulary: the token's own decoding
          table.append(self._markup.decode([i]).encode("utf-8"))
    return table

  def is_special(self, token_id: int) -> bool:
    return token_id in self._special or not 0 <= token_id < self.vocab_size

  def name(self, token_id: int) -> str:
    t = self._markup.id_to_token(int(token_id)) if 0 <= token_id < self.vocab_size else None
    return t if t is not None else f"<unused {token_id}>"
