"""Synthetic copy rows: a string said once, said again later, trained on the repeat.

Why: an agent that carries facts through its own summaries must copy strings it read
hundreds of tokens earlier (a key's parts, BUILD_NOTES section 11). A pretrained LLM can do
that from the start (induction heads form during pretraining); the tiny byte models trained
from scratch here cannot, and learn it far too slowly from demonstrations alone, where
copied tokens are a few percent of the trained ones: 1,500 SFT steps on keychain
demonstrations left the copied characters at chance. Rows dense in copying (every repeat
trained, repeats close together) start copying within ~200 steps in a probe (`c.sft.copy_rows` mixes them into SFT batches,
`composer_rl.controller.agent_rl.sft_stage`).

A row: `name = 'STRING'`, filler lines, `name = 'STRING'` again, ... up to `seq_len`
tokens; the loss mask is 1 on the repeated STRING only. Strings are upper-case letters
(`alphabet`), the filler lower-case words and digits, so what is to be copied is
recognizable and the filler says nothing about it. Pure function of the numpy generator.
"""
from typing import Dict, List

import numpy as np

UPPER = "ABCEGHJKLNPQRUVWXYZ"
_LOWER = "abcdefghijklmnopqrstuvwxyz"


def _word(rng: np.random.Generator, chars: str, lo: int, hi: int) -> str:
  return "".join(rng.choice(list(chars), size=int(rng.integers(lo, hi + 1))))


def copy_record(rng: np.random.Generator, tokenizer, seq_len: int, alphabet: str = UPPER,
                max_gap: int = 60) -> Dict[str, List[int]]:
  """One row of at most `seq_len` tokens with as many (say, filler, repeat) triples as fit;
  the gap between a string and its repeat is 5..`max_gap` bytes of filler."""
  tokens: List[int] = []
  mask: List[int] = []
  while True:
    name, value = _word(rng, _LOWER, 1, 6), _word(rng, alphabet, 2, 8)
    gap, filler = int(rng.integers(5, max_gap + 1)), []
    while sum(len(w) + 1 for w in filler) < gap:
      filler.append(_word(rng, _LOWER + "0123456789", 1, 8))
    lines = " ".join(filler)
    say = tokenizer.encode(f"{name} = '{value}'\n{lines}\n{name} = '")
    repeat, close = tokenizer.encode(value), tokenizer.encode("'\n")
    if len(tokens) + len(say) + len(repeat) + len(close) > seq_len:
      break
    tokens += say + repeat + close
    mask += [0] * len(say) + [1] * len(repeat) + [0] * len(close)
  if not tokens:
    raise ValueError(f"seq_len={seq_len} is too short for a copy row")
  return dict(tokens=tokens, loss_mask=mask)


def copy_records(rng: np.random.Generator, tokenizer, n: int, seq_len: int) -> List[Dict]:
  return [copy_record(rng, tokenizer, seq_len) for _ in range(n)]
