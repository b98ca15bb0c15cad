"""Synthetic copy rows (data.copy_curriculum): each trained span repeats, byte for byte, the
value said earlier under the same name; nothing else is trained; rows fit their length and
are a pure function of the generator's seed."""
import re

import numpy as np
import pytest

from composer_rl.data import copy_curriculum as cc
from composer_rl.data.byte_tokenizer import ByteTokenizer

TOK = ByteTokenizer()


def test_rows_train_only_the_repeats():
  rows = cc.copy_records(np.random.default_rng(0), TOK, 20, 640)
  for r in rows:
    toks, mask = r["tokens"], r["loss_mask"]
    assert len(toks) == len(mask) <= 640
    text = TOK.decode(toks)
    pairs = re.findall(r"(\w+) = '([A-Z]+)'\n[a-z0-9 ]+\n\1 = '([A-Z]+)'\n", text)
    assert pairs and all(a == b for _, a, b in pairs)
    trained = TOK.decode([t for t, m in zip(toks, mask) if m])
    assert trained == "".join(b for _, _, b in pairs)
    assert set(trained) <= set(cc.UPPER)
  n_trained = [sum(r["loss_mask"]) for r in rows]
  assert min(n_trained) >= 8  # several strings per row: dense in copying


def test_pure_and_checked():
  a = cc.copy_records(np.random.default_rng(3), TOK, 3, 300)
  assert a == cc.copy_records(np.random.default_rng(3), TOK, 3, 300)
  assert a != cc.copy_records(np.random.default_rng(4), TOK, 3, 300)
  with pytest.raises(ValueError, match="too short"):
    cc.copy_record(np.random.default_rng(0), TOK, 8)
