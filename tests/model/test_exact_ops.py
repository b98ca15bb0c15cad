"""The batch-invariant ops, checked as bits: a row's result must not depend on how many
rows its call had, on eager vs jit, or on how many key blocks attention read."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from composer_rl.model import ModelConfig
from composer_rl.ops import exact
from composer_rl.sampling import head as head_lib


def bits(x):
  return np.asarray(x, np.float32).view(np.uint32)


@pytest.mark.parametrize("width,cols", [(300, 20), (1024, 4), (64, 512), (128, 2048),
                                        (128, 4096), (256, 4096)])
def test_dense_rows_do_not_depend_on_the_row_count(width, cols):
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((700, width)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((width, cols)) * 0.05, jnp.float32)
  f = jax.jit(lambda x: exact.dense(x, w, jnp.float32))
  ref = bits(f(x))
  for rows in (1, 2, 3, 7, 8, 40, 513):  # padded, batched chunks, per-chunk dots
    np.testing.assert_array_equal(bits(f(x[:rows])), ref[:rows])
  np.testing.assert_allclose(np.asarray(ref.view(np.float32)), np.asarray(x) @ np.asarray(w),
                             rtol=1e-4, atol=1e-4)


def test_row_sum_and_cumsum_are_sums_in_one_fixed_order():
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.standard_normal((37, 300)), jnp.float32)
  np.testing.assert_allclose(np.asarray(exact.row_sum(x)), np.asarray(x).sum(-1), rtol=1e-5,
                             atol=1e-5)
  np.testing.assert_allclose(np.asarray(exact.row_cumsum(x)), np.cumsum(np.asarray(x), -1),
                             rtol=1e-4, atol=1e-4)
  for fn in (exact.row_sum, exact.row_cumsum):
    ref = bits(jax.jit(fn)(x))
    np.testing.assert_array_equal(bits(fn(x)), ref)  # eager = jit
    np.testing.assert_array_equal(bits(jax.jit(fn)(x[:5])), ref[:5])  # any row count


def test_attention_bits_do_not_depend_on_the_keys_read():
  rng = np.random.default_rng(2)
  b, g, h, d, length = 3, 2, 4, 16, 64
  k = jnp.asarray(rng.standard_normal((b, g, length, d)), jnp.float32)
  v = jnp.asarray(rng.standard_normal((b, g, length, d)), jnp.float32)
  q = jnp.asarray(rng.standard_normal((b, 1, h, d)), jnp.float32)
  lens = np.array([5, 14, 30])
  kseg = jnp.asarray((np.arange(length)[None] <= lens[:, None]).astype(np.int32))
  slots, qseg = jnp.asarray(lens[:, None], jnp.int32), jnp.ones((b, 1), jnp.int32)
  run = lambda n, rows=slice(None): jax.jit(lambda: exact.attention(
      q[rows], k[rows], v[rows], kseg[rows], slots[rows], qseg[rows], key_block=16,
      key_len=n))()
  ref = bits(run(None))  # the bucket picked on device: 32 keys here
  assert exact.key_buckets(length, 16) == (16, 32, 64)
  for n in (32, 48, 64):  # any multiple of the block that covers the furthest key
    np.testing.assert_array_equal(bits(run(n)), ref)
  np.testing.assert_array_equal(bits(run(None, slice(0, 1))), ref[:1])  # alone: 16 keys


def test_head_without_a_sort_gives_the_sorting_paths_bits():
  """Greedy and untruncated rows take the no-sort path alone and the sort path beside a
  top-p row: the same log-probs, bit for bit."""
  rng = np.random.default_rng(3)
  logits = jnp.asarray(rng.standard_normal((3, 500)) * 3, jnp.float32)
  rows = head_lib.RowSampling(temperature=jnp.asarray([0.7, 1.0, 1.3], jnp.float32),
                              top_k=jnp.asarray([1, 0, 0], jnp.int32),
                              top_p=jnp.asarray([1.0, 1.0, 0.8], jnp.float32))
  f = jax.jit(head_lib.transformed_logprobs)
  mixed = bits(f(logits, rows))
  alone = bits(f(logits[:2], jax.tree.map(lambda a: a[:2], rows)))
  np.testing.assert_array_equal(alone, mixed[:2])
  assert np.isfinite(np.asarray(f(logits, rows))[1]).all()  # top_p=1 keeps every token


def test_exact_config_rejects_wide_contractions():
  with pytest.raises(ValueError, match="attention_key_block=256"):
    ModelConfig(max_seq_len=512, attention_key_block=256)
  with pytest.raises(ValueError, match="head_dim=512"):
    ModelConfig(head_dim=512)
  ModelConfig(max_seq_len=512, attention_key_block=256, exact_numerics=False)  # fast mode
