"""Packed pretraining rows: shapes, segment/position conventions, reconstruction, exact resume."""
import json

import numpy as np
import pytest

from composer_rl.data import packing
from composer_rl.data.byte_tokenizer import ByteTokenizer
from composer_rl.train.data import iterator

TOK = ByteTokenizer()
SEQ = 32


def _docs(n: int = 40, seed: int = 0):
  """Documents of 1..100 bytes (many shorter than SEQ, some several rows long), unique."""
  rng = np.random.default_rng(seed)
  return [f"doc{i}:" + "".join(rng.choice(list("abcdefgh \n"), rng.integers(1, 100)))
          for i in range(n)]


def _stream(doc: str):
  return [TOK.BOS] + TOK.encode(doc) + [TOK.EOS]


def _segments(rows):
  """Every segment's tokens, in stream order (row by row, segment id by segment id)."""
  out = []
  for r in rows:
    for s in range(1, int(r["segment_ids"].max()) + 1):
      out.append(r["tokens"][r["segment_ids"] == s].tolist())
  return out


def _take(it, n):
  return [next(it) for _ in range(n)]


@pytest.mark.parametrize("bins", [1, 8])
def test_row_format(bins):
  rows = list(packing.packed_rows(_docs(), TOK, SEQ, seed=0, num_epochs=1,
                                  num_packing_bins=bins))
  assert rows
  for r in rows:
    assert set(r) == {"tokens", "segment_ids", "positions", "loss_weights"}
    np.testing.assert_array_equal(r["loss_weights"], r["segment_ids"] > 0)  # align=1
    for v in r.values():
      assert v.dtype == np.int32 and v.shape == (SEQ,)
    seg, pos = r["segment_ids"], r["positions"]
    n = int((seg > 0).sum())
    # Segments 1..k fill a prefix in order; the rest is padding (segment 0, PAD, position 0).
    assert (seg[:n] > 0).all() and (seg[n:] == 0).all()
    assert (np.diff(seg[:n]) >= 0).all() and (np.diff(seg[:n]) <= 1).all() and seg[0] == 1
    assert (r["tokens"][n:] == TOK.PAD).all() and (pos[n:] == 0).all()
    for s in range(1, int(seg.max()) + 1):  # positions restart at 0 in every segment
      np.testing.assert_array_equal(pos[seg == s], np.arange(int((seg == s).sum())))


@pytest.mark.parametrize("align", [8, 16])
def test_aligned_pieces_start_on_multiples_of_align(align):
  docs = _docs()
  rows = list(packing.packed_rows(docs, TOK, SEQ, seed=0, num_epochs=1, align=align))
  real = []
  for r in rows:
    seg, w = r["segment_ids"], r["loss_weights"]
    for s in range(1, int(seg.max()) + 1):
      idx = np.flatnonzero(seg == s)
      assert idx[0] % align == 0 and len(idx) % align == 0  # starts and ends on the grid
      n = int(w[idx].sum())
      np.testing.assert_array_equal(w[idx], np.arange(len(idx)) < n)  # padding trails
      assert (r["tokens"][idx[n:]] == TOK.PAD).all()
      real.append(tuple(r["tokens"][idx[:n]]))
  chunks = [tuple(st[i:i + SEQ]) for d in docs for st in [_stream(d)]
            for i in range(0, len(st), SEQ)]
  assert sorted(real) == sorted(chunks)  # the same pieces, nothing lost
  with pytest.raises(ValueError, match="divide seq_len"):
    packing.packed_rows(docs, TOK, SEQ, seed=0, align=SEQ + 1)


def test_one_bin_reconstructs_the_shuffled_documents_exactly():
  docs = _docs()
  rows = list(packing.packed_rows(docs, TOK, SEQ, seed=0, num_epochs=1, num_packing_bins=1))
  flat = [t for seg in _segments(rows) for t in seg]
  # Split the stream at BOS: exactly the documents, each once, in a shuffled order.
  got, cur = [], None
  for t in flat:
    if t == TOK.BOS:
      cur = []
      got.append(cur)
    cur.append(t)
  assert sorted(map(tuple, got)) == sorted(tuple(_stream(d)) for d in docs)
  assert [TOK.decode(g) for g in got] != docs  # shuffled
  # Long documents became chunks of exactly SEQ (each its own segment) plus a tail.
  assert all(len(s) <= SEQ for s in _segments(rows))


def test_many_bins_keep_every_chunk():
  docs = _docs()
  rows = list(packing.packed_rows(docs, TOK, SEQ, seed=0, num_epochs=1, num_packing_bins=8))
  chunks = [tuple(s[i:i + SEQ]) for d in docs for s in [_stream(d)]
            for i in range(0, len(s), SEQ)]
  assert sorted(map(tuple, _segments(rows))) == sorted(chunks)
  assert packing.padding_fraction(rows) < 0.2


def test_epochs_reshuffle():
  docs = _docs(20)
  rows = list(packing.packed_rows(docs, TOK, SEQ, seed=1, num_epochs=2, num_packing_bins=1))
  starts = [TOK.decode(s).split(":")[0] for s in _segments(rows) if s[0] == TOK.BOS]
  assert len(starts) == 40
  first, second = starts[:20], starts[20:]
  assert sorted(first) == sorted(second) == sorted(f"doc{i}" for i in range(20))
  assert first != second


@pytest.mark.parametrize("bins", [1, 8])
def test_resume_continues_at_exactly_the_next_row(bins):
  ds = packing.packed_rows(_docs(), TOK, SEQ, seed=0, num_epochs=None, num_packing_bins=bins)
  it = iter(ds)
  _take(it, 13)
  state = json.loads(json.dumps(it.get_state()))  # checkpointable as JSON
  expected = _take(it, 57)  # crosses an epoch boundary (40 short docs ~ 60-70 rows/epoch)
  resumed = iterator(ds, state)
  got = _take(resumed, 57)
  for a, b in zip(expected, got):
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])


def test_same_seed_same_rows_and_seed_matters():
  a = _take(iter(packing.packed_rows(_docs(), TOK, SEQ, seed=5)), 10)
  b = _take(iter(packing.packed_rows(_docs(), TOK, SEQ, seed=5)), 10)
  c = _take(iter(packing.packed_rows(_docs(), TOK, SEQ, seed=6)), 10)
  assert all((x["tokens"] == y["tokens"]).all() for x, y in zip(a, b))
  assert any((x["tokens"] != y["tokens"]).any() for x, y in zip(a, c))


def test_worker_processes_resume_exactly():
  from absl import flags
  if not flags.FLAGS.is_parsed():  # Grain's worker processes read its absl flags
    flags.FLAGS.mark_as_parsed()
  ds = packing.packed_rows(_docs(), TOK, SEQ, seed=0, worker_count=2)
  it = iter(ds)
  _take(it, 5)
  state = it.get_state()
  expected = _take(it, 10)
  resumed = iter(packing.packed_rows(_docs(), TOK, SEQ, seed=0, worker_count=2))
  resumed.set_state(state)
  got = _take(resumed, 10)
  for a, b in zip(expected, got):
    np.testing.assert_array_equal(a["tokens"], b["tokens"])
    np.testing.assert_array_equal(a["segment_ids"], b["segment_ids"])


def test_bad_arguments():
  class NoEos:
    def encode(self, text):
      return list(text.encode())
  with pytest.raises(ValueError, match="no EOS"):
    packing.packed_rows(["x"], NoEos(), SEQ, seed=0)
  with pytest.raises(ValueError, match="at least one document"):
    packing.packed_rows([], TOK, SEQ, seed=0)
  with pytest.raises(ValueError, match="positive"):
    packing.packed_rows(["x"], TOK, 0, seed=0)


def test_batches():
  it = iter(packing.packed_rows(_docs(), TOK, SEQ, seed=0, batch_size=4))
  b = next(it)
  assert {k: v.shape for k, v in b.items()} == {k: (4, SEQ) for k in b}
  rows = _take(iter(packing.packed_rows(_docs(), TOK, SEQ, seed=0)), 4)
  np.testing.assert_array_equal(b["tokens"], np.stack([r["tokens"] for r in rows]))
