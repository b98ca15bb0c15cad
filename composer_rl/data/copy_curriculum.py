"""Synthetic copy rows: values said under names, then recalled by name, trained on the
recalled values.

Why: an agent that carries facts through its own summaries must copy strings it read
hundreds of tokens earlier, each under its own name (a key's parts `k1 = 'Q'`..`k4 = 'H'`,
BUILD_NOTES section 11). A pretrained LLM can do that from the start (induction heads form
during pretraining); the tiny byte models trained from scratch here cannot, and learn it far
too slowly from demonstrations alone, where copied tokens are a few percent of the trained
ones (1,500 SFT steps on keychain demonstrations left the copied characters at chance).
In `composer_rl.controller.agent_sft.sft_stage`: `sft.copy_only_steps` trains on these rows
alone first, `sft.copy_rows` mixes them into later batches, `sft.copy_rows_kind` /
`copy_rows_args` pick a `COPY_ROWS` kind and its arguments.

Kinds:
  recall  general names (`copy_record`): a block says 1..`names_per_block` names, filler
          between (half the blocks `k1`-style names that differ in one digit), then recalls
          every name in a shuffled order. The recall must be by name, not by position: with
          one name said and repeated at once (`names_per_block=1`, the first version of
          these rows) the model learns "copy the value after the latest `= '`", and its
          summaries restate one part under every name (`k1 = 'U' k2 = 'U'`).
  parts   the keychain family's form (`part_record`): `1|kI = 'X'` module lines, then the
          parts recalled by name in a shuffled order; `alphabets` types each part.

Values are upper-case letters, the filler lower-case words and digits, so what is to be
copied is recognizable and the filler says nothing about it; the loss mask is 1 on the
recalled values only. Pure functions of the numpy generator.
"""
from typing import Callable, Dict, List, Sequence, Tuple

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


def _block(tokenizer, said: str, recalls: List[Tuple[str, str, str]]):
  """Tokens and loss mask of `said`, then each (prompt, value, close) recall: only the
  recalled values are trained."""
  tokens = tokenizer.encode(said)
  mask = [0] * len(tokens)
  for prompt, value, close in recalls:
    p, v, c = tokenizer.encode(prompt), tokenizer.encode(value), tokenizer.encode(close)
    tokens, mask = tokens + p + v + c, mask + [0] * len(p) + [1] * len(v) + [0] * len(c)
  return tokens, mask


def _row(make_block: Callable[[], tuple], seq_len: int) -> Dict[str, List[int]]:
  """As many blocks as fit in `seq_len` tokens (a first block that does not fit is drawn
  again, up to 100 times)."""
  tokens: List[int] = []
  mask: List[int] = []
  for _ in range(100):
    while True:
      toks, m = make_block()
      if len(tokens) + len(toks) > seq_len:
        break
      tokens, mask = tokens + toks, mask + m
    if tokens:
      return dict(tokens=tokens, loss_mask=mask)
  raise ValueError(f"seq_len={seq_len} is too short for a copy row")


@COPY_ROWS.register("recall")
def copy_record(rng: np.random.Generator, tokenizer, seq_len: int, alphabet: str = UPPER,
                max_gap: int = 60, names_per_block: int = 4) -> Dict[str, List[int]]:
  """One row of at most `seq_len` tokens with as many blocks as fit. A block says 1 to
  `names_per_block` names, each followed by 5..`max_gap` bytes of filler, then recalls them
  all in a random order (1 = say a name and repeat it at once)."""
  if names_per_block < 1:
    raise ValueError(f"names_per_block={names_per_block} must be >= 1")

  def block():
    names = _names(rng, int(rng.integers(1, names_per_block + 1)))
    values = {k: _word(rng, alphabet, 1, 4) for k in names}
    said = "".join(f"{k} = '{values[k]}'\n{_filler(rng, max_gap)}\n" for k in names)
    return _block(tokenizer, said, [(f"{k} = '", values[k], "'\n") for k in rng.permutation(names)])
  return _row(block, seq_len)


@COPY_ROWS.register("parts")
def part_record(rng: np.random.Generator, tokenizer, seq_len: int,
                alphabets: Sequence[str] = (UPPER,) * 4, max_gap: int = 120) -> Dict[str, List[int]]:
  """Rows in the keychain family's own form: parts `k1`..`kN` (N = 1..len(alphabets),
  part I's letter from `alphabets[I]`) said in order as numbered file lines
  (`1|kI = 'X'`), each followed by 5..`max_gap` bytes of filler, then all recalled in a
  shuffled order (`kI = 'X' `); the loss is on the recalled letters."""
  def block():
    n = int(rng.integers(1, len(alphabets) + 1))
    parts = [str(rng.choice(list(a))) for a in alphabets[:n]]
    said = "".join(f"1|k{i + 1} = '{p}'\n{_filler(rng, max_gap)}\n" for i, p in enumerate(parts))
    tokens, mask = _block(tokenizer, said, [(f"k{i + 1} = '", parts[i], "' ")
                                            for i in rng.permutation(n)])
    return tokens + tokenizer.encode("\n"), mask + [0]
  return _row(block, seq_len)


def copy_records(rng: np.random.Generator, tokenizer, n: int, seq_len: int,
                 kind: str = "recall", **args) -> List[Dict]:
  """`n` rows of the `COPY_ROWS` kind `kind`, with that kind's keyword arguments."""
  make = COPY_ROWS.get(kind)
  return [make(rng, tokenizer, seq_len, **args) for _ in range(n)]
