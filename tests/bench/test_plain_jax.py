"""The plain-JAX baselines compute the same model as ours: a flattering baseline is a defect."""
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from composer_rl.bench import plain_jax
from composer_rl.bench.plain_jax import FastSampler, PlainTrainStep
from composer_rl.model import ModelConfig, Transformer
from composer_rl.model.kv_cache import KVCache

CONFIG = ModelConfig(vocab_size=97, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2,
                     head_dim=16, d_ff=96, max_seq_len=32, compute_dtype="float32",
                     exact_numerics=False)


def _ours(model, tokens):
  b, s = tokens.shape
  pos = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))
  out = model.forward(tokens, pos, KVCache.init(CONFIG, b), jnp.zeros((b,), jnp.int32))
  return model.logits(out.hidden.reshape(b * s, -1)).reshape(b, s, -1)


def test_sampler_and_train_step_match_the_model():
  model = Transformer(CONFIG, rngs=nnx.Rngs(3))
  params = nnx.state(model, nnx.Param)
  rng = np.random.default_rng(0)
  prompts = rng.integers(1, CONFIG.vocab_size, (3, 8))
  tokens = FastSampler(CONFIG, params, 20).generate(prompts, 12)
  # Greedy continuation: each token is the argmax of our model's logits (f32, a few ulps apart).
  seq = jnp.asarray(np.concatenate([prompts, tokens], 1), jnp.int32)
  logits = np.asarray(_ours(model, seq))
  np.testing.assert_array_equal(logits[:, 7:-1].argmax(-1), tokens)

  step = PlainTrainStep(CONFIG, params)
  mask = np.ones((3, 19), np.float32)
  logp = np.asarray(jnp.take_along_axis(jax.nn.log_softmax(logits[:, :-1]),
                                        seq[:, 1:, None], -1)[..., 0])
  adv = np.array([1.0, -0.5, 0.25], np.float32)
  # At the behaviour policy the ratio is 1: the loss is -mean(A) over the scored tokens.
  loss = step.step(np.asarray(seq), mask, logp, adv)
  np.testing.assert_allclose(loss, -adv.mean(), rtol=1e-5)
  moved = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), step.params,
                       plain_jax._f32(params))  # per-layer arrays, as the step holds them
  assert min(jax.tree.leaves(moved)) > 0  # AdamW moved every parameter
