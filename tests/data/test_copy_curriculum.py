"""Synthetic recall rows (data.copy_curriculum): each trained span is, byte for byte, the
value said earlier under the same name; names come back in another order than they were
said (so the row cannot be solved by copying the latest value); nothing else is trained;
rows fit their length and are a pure function of the generator's seed."""
import re

import numpy as np
import pytest

from composer_rl.data import copy_curriculum as cc
from composer_rl.data.byte_tokenizer import ByteTokenizer
from composer_rl.env.tasks import keychain

TOK = ByteTokenizer()
_LINE = re.compile(r"(\w+) = '([A-Z]+)'")


def _lines(row):
  """(name, value, trained) for every `name = 'VALUE'` line; trained = the value's loss mask."""
  out, start = [], 0
  toks, mask = row["tokens"], row["loss_mask"]
  nl = TOK.encode("\n")[0]
  for i, t in enumerate(toks):
    if t == nl:
      m = _LINE.fullmatch(TOK.decode(toks[start:i]))
      if m:
        out.append((m[1], m[2], any(mask[start:i])))
      start = i + 1
  return out


def test_rows_train_only_values_recalled_by_name():
  rows = cc.copy_records(np.random.default_rng(0), TOK, 20, 640)
  reordered = 0
  for r in rows:
    toks, mask = r["tokens"], r["loss_mask"]
    assert len(toks) == len(mask) <= 640
    said, order, recalled = {}, [], []
    for name, value, trained in _lines(r):
      if not trained:
        if recalled:  # a new block starts: its recalls must match its own says
          reordered += recalled != order
          said, order, recalled = {}, [], []
        said[name] = value
        order.append(name)
      else:
        assert said[name] == value, (name, value, said)
        recalled.append(name)
    trained_text = TOK.decode([t for t, m in zip(toks, mask) if m])
    assert set(trained_text) <= set(cc.UPPER)
    values_recalled = "".join(v for _, v, tr in _lines(r) if tr)
    assert trained_text == values_recalled
    assert sum(mask) >= 8  # several values per row: dense in recall
  assert reordered > 10  # recall order is not the said order


def test_one_name_per_block_repeats_at_once():
  r = cc.copy_record(np.random.default_rng(1), TOK, 400, names_per_block=1)
  lines = _lines(r)
  assert [tr for _, _, tr in lines] == [False, True] * (len(lines) // 2)
  assert all(a[:2] == b[:2] for a, b in zip(lines[::2], lines[1::2]))


def test_pure_and_checked():
  a = cc.copy_records(np.random.default_rng(3), TOK, 3, 300)
  assert a == cc.copy_records(np.random.default_rng(3), TOK, 3, 300)
  assert a != cc.copy_records(np.random.default_rng(4), TOK, 3, 300)
  with pytest.raises(ValueError, match="too short"):
    cc.copy_record(np.random.default_rng(0), TOK, 8)
  with pytest.raises(ValueError, match="names_per_block"):
    cc.copy_record(np.random.default_rng(0), TOK, 300, names_per_block=0)


def test_part_rows_recall_each_part_by_name_in_the_keychain_form():
  row = cc.copy_records(np.random.default_rng(0), TOK, 3, 640, "parts",
                        alphabets=keychain.PART_ALPHABETS)[0]
  assert len(row["tokens"]) == len(row["loss_mask"]) <= 640
  text = TOK.decode(row["tokens"])
  blocks = re.findall(r"((?:1\|k\d = '\w'\n[a-z0-9 ]*\n)+)((?:k\d = '\w' )+)\n", text)
  assert len(blocks) >= 2 and "".join(a + b + "\n" for a, b in blocks) == text
  trained, reordered = [], 0
  for said, recalled in blocks:
    said, recalled = _LINE.findall(said), _LINE.findall(recalled)
    assert [k for k, _ in said] == [f"k{i + 1}" for i in range(len(said))]
    assert sorted(recalled) == sorted(said)  # every part, by its name
    reordered += recalled != said
    assert all(v in keychain.PART_ALPHABETS[int(k[1]) - 1] for k, v in said)
    trained += [v for _, v in recalled]
  assert reordered >= 1
  assert TOK.decode([t for t, m in zip(row["tokens"], row["loss_mask"]) if m]) == "".join(trained)
  with pytest.raises(KeyError, match="copy row kind"):
    cc.copy_records(np.random.default_rng(0), TOK, 1, 640, "nope")
  with pytest.raises(ValueError, match="too short"):
    cc.part_record(np.random.default_rng(0), TOK, 8)
