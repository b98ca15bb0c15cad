"""SFT: the agent's tokens are learned, prompt/observation tokens only condition."""
import jax
import numpy as np

from composer_rl.data.byte_tokenizer import ByteTokenizer
from composer_rl.model import sharding as shd
from composer_rl.train import data, pretrain, sft
from composer_rl.train.optimizer import OptimizerConfig

from .helpers import TINY

MC = TINY.replace(vocab_size=ByteTokenizer().vocab_size, d_model=48, max_seq_len=48,
                  row_tile=16)


def test_synthetic_records_mask_only_the_answer():
  rec = sft.synthetic_records(1, seed=0)[0]
  tok = ByteTokenizer()
  first = rec["loss_mask"].index(1)
  assert rec["tokens"][first - 1] == tok.ASSISTANT and rec["tokens"][-1] == tok.EOT
  assert all(rec["loss_mask"][first:]) and not any(rec["loss_mask"][:first])


def test_sft_reduces_heldout_loss_on_oracle_trajectories():
  mesh = shd.make_mesh({"data": 1}, jax.devices()[:1])
  step = sft.make_sft_step(MC, OptimizerConfig(learning_rate=1e-2, warmup_steps=2,
                                               total_steps=40), mesh, micro_batch_size=8)
  state = step.init_state(0)
  heldout = sft.sft_batch(sft.synthetic_records(32, seed=99, max_word=4), 48)
  nll_rows = pretrain.make_nll_fn(step)

  def nll(params, batch):  # mean NLL over the batch's loss tokens
    total, count = nll_rows(params, batch)
    return float(jax.numpy.sum(total) / jax.numpy.maximum(jax.numpy.sum(count), 1.0))
  before = float(nll(jax.device_get(state.params), heldout))
  it = data.iterator(data.sft_batches(sft.synthetic_records(512, seed=1, max_word=4), 16, 48, seed=0))
  for _ in range(40):
    state, m = step.step(state, step.shard_batch(sft.sft_batch(next(it), 48)))
  after = float(nll(jax.device_get(state.params), heldout))
  assert np.log(MC.vocab_size) - 0.5 < before < np.log(MC.vocab_size) + 1.0
  assert after < 0.6 * before, (before, after)
  # The step's loss is exactly the token-mean NLL of the masked tokens.
  b = sft.sft_batch(sft.synthetic_records(8, seed=5, max_word=4), 48)
  _, m = step.step(jax.tree.map(lambda x: x.copy(), state), step.shard_batch(b))
  np.testing.assert_allclose(m["loss"], nll(jax.device_get(state.params), b), rtol=1e-5)


def test_masked_tokens_get_no_gradient():
  """Changing a masked (prompt) target token changes nothing but conditioning; a batch whose
  mask is all zero produces a zero gradient."""
  mesh = shd.make_mesh({"data": 1}, jax.devices()[:1])
  step = sft.make_sft_step(MC, OptimizerConfig(warmup_steps=0), mesh, micro_batch_size=2)
  state = step.init_state(0)
  rec = sft.synthetic_records(2, seed=3, max_word=4)
  rec = [dict(tokens=r["tokens"], loss_mask=[0] * len(r["tokens"])) for r in rec]
  _, m = step.step(state, step.shard_batch(sft.sft_batch(rec, 48)))
  assert m["loss"] == 0.0 and m["grad_norm"] == 0.0
