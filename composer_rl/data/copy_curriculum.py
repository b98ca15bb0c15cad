"""Synthetic recall rows: several names said with their values, then recalled in another
order, trained on the recalled values.

Why: an agent that carries facts through its own summaries must copy strings it read
hundreds of tokens earlier, each under its own name (a key's parts `k1 = 'Q'`..`k4 = 'H'`,
BUILD_NOTES section 11). A pretrained LLM can do that from the start (induction heads form
during pretraining); the tiny byte models trained from scratch here cannot, and learn it far
too slowly from demonstrations alone, where copied tokens are a few percent of the trained
ones (1,500 SFT steps on keychain demonstrations left the copied characters at chance).
`c.sft.copy_rows` mixes these rows into SFT batches
(`composer_rl.controller.agent_rl.sft_stage`).

The recall must be by name, not by position: with one name said and repeated at once
(`names_per_block=1`, the first version of these rows) the model learns "copy the value
after the latest `= '`", and its summaries then restate one part under every name
(`k1 = 'U' k2 = 'U'`, 40 % of parts right). So a block says 1..`names_per_block` names
(half the blocks `k1`-style names that differ in one digit, as the key's parts do), filler
between, then recalls every name in a shuffled order.

Row text: `name = 'VALUE'` lines and lower-case filler, then `name = 'VALUE'` again; the
loss mask is 1 on the recalled VALUE bytes only. Values are upper-case letters
(`alphabet`), the filler lower-case words and digits, so what is to be copied is
recognizable and the filler says nothing about it. Pure function of the numpy generator.
"""
from typing import Dict, List, Sequence

import numpy as np

from composer_rl.env.registry import Registry

# Row kinds by name (`config.sft.copy_rows_kind`): "recall" (general names, below) or
# "parts" (the keychain family's form, for its experiment).
COPY_ROWS: Registry = Registry("copy row kind")
UPPER = "ABCEGHJKLNPQRUVWXYZ"
_LOWER = "abcdefghijklmnopqrstuvwxyz"


def _word(rng: np.random.Generator, chars: str, lo: int, hi: int) -> str:
  return "".join(rng.choice(list(chars), size=int(rng.integers(lo, hi + 1))))


def _filler(rng: np.random.Generator, max_gap: int) -> str:
  gap, words = int(rng.integers(5, max_gap + 1)), []
  while sum(len(w) + 1 for w in words) < gap:
    words.append(_word(rng, _LOWER + "0123456789", 1, 8))
  return " ".join(words)


def _names(rng: np.random.Generator, n: int) -> List[str]:
  if rng.random() < 0.5:  # one prefix, digits apart: only the digit says which value
    prefix = _word(rng, _LOWER, 1, 2)
    return [f"{prefix}{d}" for d in rng.choice(9, n, replace=False) + 1]
  names: List[str] = []
  while len(names) < n:
    w = _word(rng, _LOWER, 1, 6)
    names += [w] if w not in names else []
  return names


@COPY_ROWS.register("recall")
def copy_record(rng: np.random.Generator, tokenizer, seq_len: int, alphabet: str = UPPER,
                max_gap: int = 60, names_per_block: int = 4) -> Dict[str, List[int]]:
  """One row of at most `seq_len` tokens with as many blocks as fit. A block says 1 to
  `names_per_block` names, each followed by 5..`max_gap` bytes of filler, then recalls them
  all in a random order (1 = say a name and repeat it at once)."""
  if names_per_block < 1:
    raise ValueError(f"names_per_block={names_per_block} must be >= 1")
  tokens: List[int] = []
  mask: List[int] = []
  most = names_per_block
  while True:
    n = int(rng.integers(1, most + 1))
    names = _names(rng, n)
    values = {k: _word(rng, alphabet, 1, 4) for k in names}
    toks, m = tokenizer.encode("".join(f"{k} = '{values[k]}'\n{_filler(rng, max_gap)}\n"
                                       for k in names)), []
    m = [0] * len(toks)
    for k in rng.permutation(names):
      say, value, close = (tokenizer.encode(f"{k} = '"), tokenizer.encode(values[k]),
                           tokenizer.encode("'\n"))
      toks, m = toks + say + value + close, m + [0] * len(say) + [1] * len(value) + [0] * len(close)
    if len(tokens) + len(toks) > seq_len:
      if tokens or n == 1:
        break
      most = n - 1  # a short row: the first block must fit, with fewer names
      continue
    tokens, mask = tokens + toks, mask + m
  if not tokens:
    raise ValueError(f"seq_len={seq_len} is too short for a copy row")
  return dict(tokens=tokens, loss_mask=mask)


@COPY_ROWS.register("parts")
def part_record(rng: np.random.Generator, tokenizer, seq_len: int,
                alphabets: Sequence[str] = (UPPER,) * 4, max_gap: int = 120) -> Dict[str, List[int]]:
  """Rows in the keychain family's own form: parts `k1`..`kN` (N = 1..len(alphabets),
  part I's letter from `alphabets[I]`) said in order as numbered file lines
  (`1|kI = 'X'`), each followed by 10..`max_gap` bytes of filler, then all recalled in a
  shuffled order (`kI = 'X' `); the loss is on the recalled letters."""
  tokens: List[int] = []
  mask: List[int] = []
  for _ in range(100):
    parts = [str(rng.choice(list(a))) for a in alphabets[:int(rng.integers(1, len(alphabets) + 1))]]
    toks = tokenizer.encode("".join(f"1|k{i + 1} = '{p}'\n{_filler(rng, max_gap)}\n"
                                    for i, p in enumerate(parts)))
    m = [0] * len(toks)
    for i in rng.permutation(len(parts)):
      say, part, close = (tokenizer.encode(f"k{i + 1} = '"), tokenizer.encode(parts[i]),
                          tokenizer.encode("' "))
      toks, m = toks + say + part + close, m + [0] * len(say) + [1] * len(part) + [0] * len(close)
    toks, m = toks + tokenizer.encode("\n"), m + [0]
    if len(tokens) + len(toks) > seq_len:
      if tokens:
        break
      continue  # a first block too long for a short row: draw another
    tokens, mask = tokens + toks, mask + m
  if not tokens:
    raise ValueError(f"seq_len={seq_len} is too short for a part row")
  return dict(tokens=tokens, loss_mask=mask)


def copy_records(rng: np.random.Generator, tokenizer, n: int, seq_len: int,
                 kind: str = "recall", **args) -> List[Dict]:
  """`n` rows of the `COPY_ROWS` kind `kind`, with that kind's keyword arguments."""
  make = COPY_ROWS.get(kind)
  return [make(rng, tokenizer, seq_len, **args) for _ in range(n)]
