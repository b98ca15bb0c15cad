"""Continued pretraining: packed batches (masks by hand), packing equivalence compared as
bits (each document's log-probs in a packed row equal its log-probs alone, in the forward
and inside value_and_grad), no attention across documents, and the pretrain experiment
end to end: perplexity falls, the held-out split is by repository, SIGKILL resume."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from composer_rl.data import packing
from composer_rl.data.byte_tokenizer import ByteTokenizer
from composer_rl.model.config import ModelConfig
from composer_rl.model.transformer import Transformer
from composer_rl.train import pretrain
from composer_rl.train.batch import build_packed_batch
from composer_rl.train.scoring import score_tokens
from tests.train import helpers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_packed_batch_masks_by_hand():
  row = dict(tokens=np.array([5, 6, 7, 8, 9, 10, 0, 0], np.int32),
             segment_ids=np.array([1, 1, 1, 2, 2, 2, 0, 0], np.int32),
             positions=np.array([0, 1, 2, 0, 1, 2, 0, 0], np.int32))
  b = build_packed_batch([row], num_rows=2)
  # Column t predicts token t+1: 6, 7 (doc 1), not 8 (first of doc 2), 9, 10, not padding.
  np.testing.assert_array_equal(b.loss_mask[0], [1, 1, 0, 1, 1, 0, 0])
  np.testing.assert_array_equal(b.loss_mask[1], np.zeros(7))
  np.testing.assert_array_equal(b.rows_valid, [1, 0])
  np.testing.assert_array_equal(b.positions[0], row["positions"])
  # Alignment padding inside a segment (weight 0) is never predicted.
  padded = dict(row, loss_weights=np.array([1, 1, 0, 1, 1, 1, 0, 0], np.int32))
  np.testing.assert_array_equal(build_packed_batch([padded]).loss_mask[0],
                                [1, 0, 0, 1, 1, 0, 0])
  with pytest.raises(ValueError, match="shape"):
    build_packed_batch([row, dict(row, tokens=row["tokens"][:4])])


DOCS = ["def add(a, b):\n    return a + b\n", "import os\nprint(os.sep)\n",
        "class A:\n    x = 1\n" * 3, "# comment only\n", "while True:\n    break\n" * 2]


def _model(compute_dtype, key_block):
  cfg = ModelConfig(vocab_size=ByteTokenizer().vocab_size, d_model=64, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=16, d_ff=128, max_seq_len=128,
                    row_tile=16, attention_key_block=key_block,
                    compute_dtype=compute_dtype)
  return Transformer(cfg, rngs=nnx.Rngs(3))


def _logprobs_fn(model, grad: bool):
  """Per-token log-probs of a batch, from the forward or from inside value_and_grad."""
  graphdef, params = nnx.split(model)

  def forward(p, batch):
    sc = score_tokens(nnx.merge(graphdef, p), batch.tokens, batch.sampling,
                      batch.segment_ids, batch.positions)
    return sc.logprobs

  if not grad:
    return jax.jit(lambda b: forward(params, b))

  def loss(p, b):
    lp = forward(p, b)
    return -jnp.sum(lp * b.loss_mask), lp
  return jax.jit(lambda b: jax.value_and_grad(loss, has_aux=True)(params, b)[0][1])


def _alone(tokens, seq_len):
  n = len(tokens)
  return dict(tokens=np.pad(tokens, (0, seq_len - n)).astype(np.int32),
              segment_ids=(np.arange(seq_len) < n).astype(np.int32),
              positions=np.where(np.arange(seq_len) < n, np.arange(seq_len), 0).astype(np.int32))


@pytest.mark.parametrize("compute_dtype,key_block", [("float32", 8), ("bfloat16", 16),
                                                     ("float32", 16), ("bfloat16", 32)])
@pytest.mark.parametrize("grad", [False, True])
def test_packed_documents_get_their_alone_logprobs_bit_for_bit(compute_dtype, key_block, grad):
  model = _model(compute_dtype, key_block)
  seq_len = 128
  tok = ByteTokenizer()
  rows = list(packing.packed_rows(DOCS, tok, seq_len, seed=0, num_epochs=1,
                                  align=pretrain.alignment(model.config)))
  assert any(r["segment_ids"].max() >= 3 for r in rows)  # documents really are packed
  fn = _logprobs_fn(model, grad)
  packed = np.asarray(fn(build_packed_batch(rows)))
  compared = 0
  for i, row in enumerate(rows):
    for seg in range(1, int(row["segment_ids"].max()) + 1):
      idx = np.flatnonzero(row["segment_ids"] == seg)
      real = idx[row["loss_weights"][idx] > 0]  # alignment padding left out
      alone = np.asarray(fn(build_packed_batch([_alone(row["tokens"][real], seq_len)])))
      got = packed[i, real[:-1]]  # column t predicts token t+1
      want = alone[0, :len(real) - 1]
      assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (i, seg)
      compared += len(real) - 1
  assert compared == sum(len(d) + 1 for d in DOCS)  # every prediction ([BOS] text [EOS])


def test_no_position_attends_across_documents():
  """Changing one document's tokens leaves every other document's log-probs (bits) as
  they were, while its own change."""
  model = _model("float32", 16)
  rows = list(packing.packed_rows(DOCS, ByteTokenizer(), 128, seed=0, num_epochs=1,
                                  align=pretrain.alignment(model.config)))
  row = max(rows, key=lambda r: r["segment_ids"].max())
  fn = _logprobs_fn(model, grad=False)
  base = np.asarray(fn(build_packed_batch([row])))[0]
  seg = row["segment_ids"]
  changed = dict(row, tokens=np.where(seg == 1, (row["tokens"] + 7) % 256, row["tokens"]))
  after = np.asarray(fn(build_packed_batch([changed])))[0]
  # Column t predicts token t+1 from tokens <= t: compare the columns inside one document.
  inside = (seg[1:] == seg[:-1]) & (seg[1:] > 0)
  others, own = inside & (seg[1:] > 1), inside & (seg[1:] == 1)
  assert others.any()
  assert np.array_equal(base[others].view(np.uint32), after[others].view(np.uint32))
  assert not np.array_equal(base[own], after[own])


def test_pretrain_experiment_lowers_heldout_perplexity(tmp_path):
  c = helpers.load_experiment("cpt_code", "tiny")
  c.train.steps = 12
  c.optimizer.total_steps = 12
  from composer_rl.train import trainer  # pylint: disable=g-import-not-at-top
  s = trainer.train(c, str(tmp_path))
  assert s["heldout_perplexity_after"] < s["heldout_perplexity_before"]
  assert s["heldout_repos"] >= 1 and s["heldout_tokens"] > 0
  # The held-out split is by repository: no held-out repository has a train file.
  corpus = pretrain.load_corpus(c.corpus, c.seed, str(tmp_path))
  assert not {d.repo for d in corpus.train} & {d.repo for d in corpus.heldout}
  with open(os.path.join(tmp_path, "metrics.jsonl")) as f:
    assert [json.loads(l)["step"] for l in f] == list(range(1, 13))
