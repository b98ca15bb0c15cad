"""Train a byte-level BPE tokenizer shaped like Qwen3's on text you have (`tokenizers`).

For small models trained from scratch in Qwen3's chat format, and for tests: Qwen3's
pre-tokenizer split, NFC normalization, byte-level pre-tokenization and decoding, its
control tokens (`<|endoftext|>`, `<|im_start|>`, `<|im_end|>`) and its non-special added
tokens (`<tool_call>`, `<tool_response>`, `<think>` and their closers), so
`HfTokenizer` and `rollout.qwen3_chat.Qwen3ChatFormat` use it exactly as a Qwen3
checkpoint's `tokenizer.json`. Nothing is downloaded.

  python -c "from composer_rl.data import bpe; bpe.train_qwen3_style(open('code.txt'), 2048, 'tok/')"
"""
import os
from typing import Iterable

SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
ADDED = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>",
         "</think>")
# Qwen2/Qwen3's pre-tokenizer regex (tokenizer.json, pre_tokenizer.pretokenizers[0]).
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
              r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def train_qwen3_style(texts: Iterable[str], vocab_size: int, out_dir: str) -> str:
  """Trains on `texts` and writes `out_dir/tokenizer.json`; returns its path. `vocab_size`
  counts the 256 byte symbols and the control tokens (the added tokens come on top)."""
  from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                          pre_tokenizers, trainers)  # pylint: disable=g-import-not-at-top
  if vocab_size < 256 + len(SPECIAL):
    raise ValueError(f"vocab_size={vocab_size}: needs at least {256 + len(SPECIAL)} (the 256 "
                     "byte symbols and the control tokens)")
  tok = Tokenizer(models.BPE())
  tok.normalizer = normalizers.NFC()
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator(texts, trainers.BpeTrainer(
      vocab_size=vocab_size, special_tokens=list(SPECIAL),
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
  tok.add_tokens([AddedToken(a, special=False, normalized=False) for a in ADDED])
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, "tokenizer.json")
  tok.save(path)
  return path
