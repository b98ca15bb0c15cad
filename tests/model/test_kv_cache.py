"""A session's saved cache is as long as its tokens need (bucketed), and resizing keeps
every written slot and marks the added ones empty."""
import jax.numpy as jnp
import numpy as np

from composer_rl.model import get_preset
from composer_rl.model.kv_cache import KVCache, bucket_length, resize


def test_bucket_length_is_the_next_power_of_two_within_the_window():
  assert [bucket_length(n, 4096) for n in (0, 1, 16, 17, 100, 1024, 1025)] == \
      [16, 16, 16, 32, 128, 1024, 2048]
  assert bucket_length(3000, 2500) == 2500
  assert bucket_length(40_000, 40_960) == 40_960


def test_resize_cuts_and_pads_with_empty_slots():
  cfg = get_preset("tiny", max_seq_len=64)
  cache = KVCache.init(cfg, 2)
  assert cache.k.shape == (2, cfg.num_layers, cfg.num_kv_heads, 64, cfg.head_dim)
  written = jnp.arange(np.prod(cache.k.shape), dtype=jnp.float32).reshape(cache.k.shape)
  cache = cache.replace(k=written, segments=cache.segments.at[:, :20].set(1))
  short = resize(cache, 32)
  assert short.length == 32
  assert short.k.shape == (2, cfg.num_layers, cfg.num_kv_heads, 32, cfg.head_dim)
  np.testing.assert_array_equal(np.asarray(short.k), np.asarray(written[..., :32, :]))
  back = resize(short, 64)
  assert back.length == 64
  np.testing.assert_array_equal(np.asarray(back.k[..., :32, :]),
                                np.asarray(written[..., :32, :]))
  assert not np.asarray(back.k[..., 32:, :]).any()
  np.testing.assert_array_equal(np.asarray(back.segments[:, :20]), 1)
  assert not np.asarray(back.segments[:, 20:]).any()
