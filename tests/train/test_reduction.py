"""The streaming and cross-device sums give the balanced tree's bits (`tree_sum`)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from composer_rl.train.reduction import streaming_tree_sum, tree_sum


def _add(a, b):
  return jax.tree.map(jnp.add, a, b)


@pytest.mark.parametrize("n", list(range(1, 18)) + [32, 45])
def test_streaming_tree_sum_is_the_balanced_tree_bit_for_bit(n):
  rng = np.random.default_rng(n)
  # Magnitudes spread over 16 decades: any change of the tree changes the last bits.
  xs = (rng.standard_normal((n, 64)) * 10.0 ** rng.integers(-8, 8, (n, 64))).astype(np.float32)
  square = lambda x: {"v": x * x, "s": jnp.sum(x)}
  want = tree_sum(jax.lax.map(square, jnp.asarray(xs)), _add)
  got = jax.jit(lambda x: streaming_tree_sum(square, x, _add))(jnp.asarray(xs))
  for k in want:
    np.testing.assert_array_equal(np.asarray(got[k]).view(np.uint32),
                                  np.asarray(want[k]).view(np.uint32))


def test_a_different_tree_is_detected():
  """Negative control: a left-to-right sum of the same values differs in the bits."""
  rng = np.random.default_rng(0)
  xs = (rng.standard_normal((7, 64)) * 10.0 ** rng.integers(-8, 8, (7, 64))).astype(np.float32)
  tree = np.asarray(tree_sum(jnp.asarray(xs), jnp.add))
  serial = xs[0]
  for x in xs[1:]:
    serial = serial + x
  assert (tree.view(np.uint32) != serial.view(np.uint32)).any()


def test_streaming_holds_log_n_partial_sums_not_n():
  """The compiled program's temporaries grow with log n, not n (the old stacked map held
  one gradient per microbatch)."""
  def temp_bytes(n, streaming):
    xs = jax.ShapeDtypeStruct((n, 8), jnp.float32)
    big = lambda x: jnp.broadcast_to(x[:, None], (8, 32_768)) * 1.5  # 1 MiB per item
    if streaming:
      fn = lambda x: streaming_tree_sum(big, x, jnp.add)
    else:
      fn = lambda x: tree_sum(jax.lax.map(big, x), jnp.add)
    return jax.jit(fn).lower(xs).compile().memory_analysis().temp_size_in_bytes
  mib = 1 << 20
  assert temp_bytes(64, streaming=False) >= 64 * mib
  assert temp_bytes(64, streaming=True) <= 10 * mib
