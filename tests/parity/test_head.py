"""The sampling transform and RNG scheme, against hand-computed values."""
import jax.numpy as jnp
import numpy as np
import pytest

from composer_rl.sampling import head as H


def _lp(logits, **kw):
  s = H.RowSampling.broadcast(1, **kw)
  return np.asarray(H.transformed_logprobs(jnp.asarray([logits], jnp.float32), s))[0]


def test_temperature_only_is_log_softmax_of_scaled_logits():
  lp = _lp([1.0, 2.0, 3.0], temperature=0.5)
  z = np.array([2.0, 4.0, 6.0])
  np.testing.assert_allclose(lp, z - np.log(np.exp(z).sum()), rtol=1e-6)


def test_top_k_renormalizes_over_the_k_best():
  lp = _lp([0.0, 3.0, 1.0, 2.0], top_k=2)
  assert np.isneginf(lp[0]) and np.isneginf(lp[2])
  np.testing.assert_allclose(np.exp(lp[[1, 3]]), np.exp([3, 2]) / np.exp([3, 2]).sum(), rtol=1e-6)


def test_top_p_keeps_the_token_that_crosses_the_mass():
  # probs 0.5, 0.3, 0.2: top_p=0.6 keeps {0.5, 0.3} (0.5 < 0.6, the 0.3 crosses it).
  logits = np.log([0.5, 0.3, 0.2])
  lp = _lp(logits, top_p=0.6)
  assert np.isneginf(lp[2])
  np.testing.assert_allclose(np.exp(lp[:2]), [0.625, 0.375], rtol=1e-5)
  # top_p=0.5 keeps only the first: the mass before the second token is exactly 0.5.
  lp = _lp(logits, top_p=0.5)
  assert lp[0] == 0.0 and np.isneginf(lp[1:]).all()


def test_top_k_then_top_p_order():
  # top_k=2 leaves [0.5, 0.3] -> renormalized 0.625/0.375; top_p=0.6 then keeps only first.
  lp = _lp(np.log([0.5, 0.3, 0.2]), top_k=2, top_p=0.6)
  assert lp[0] == 0.0 and np.isneginf(lp[1:]).all()


def test_greedy_is_top_k_1_with_logprob_zero():
  out = H.token_head(lambda h: h, jnp.asarray([[0.1, 0.9, 0.3]]), jnp.zeros((1, 2), jnp.uint32),
                     jnp.array([-1]), H.RowSampling.broadcast(1, top_k=1), tile=4)
  assert int(out.tokens[0]) == 1 and float(out.logprobs[0]) == 0.0 and float(out.entropy[0]) == 0


@pytest.mark.parametrize("kw,needle", [(dict(temperature=0.0), "temperature"),
                                       (dict(top_k=-1), "top_k"), (dict(top_p=0.0), "top_p"),
                                       (dict(top_p=1.5), "top_p")])
def test_bad_sampling_settings_are_rejected(kw, needle):
  with pytest.raises(ValueError, match=needle):
    H.RowSampling.broadcast(1, **kw)


def test_token_keys_depend_on_seed_sequence_and_position_only():
  keys = np.asarray(H.token_keys(7, jnp.array([3, 3, 4, 3]), jnp.array([10, 11, 10, 10])))
  assert (keys[0] == keys[3]).all()          # same (seq, pos) -> same key, any slot
  assert not (keys[0] == keys[1]).all()      # position matters
  assert not (keys[0] == keys[2]).all()      # sequence matters
  other = np.asarray(H.token_keys(8, jnp.array([3]), jnp.array([10])))
  assert not (keys[0] == other[0]).all()     # seed matters


def test_sampled_frequencies_follow_the_transformed_distribution():
  logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]] * 4000))
  keys = H.token_keys(0, jnp.arange(4000), jnp.zeros(4000, jnp.int32))
  out = H.token_head(lambda h: h, logits, keys, jnp.full((4000,), -1), 
                     H.RowSampling.broadcast(4000, top_k=3), tile=64)
  freq = np.bincount(np.asarray(out.tokens), minlength=4) / 4000
  np.testing.assert_allclose(freq, [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0], atol=0.03)
  # The recorded log-prob is the transformed distribution's, not the raw one.
  np.testing.assert_allclose(np.exp(np.asarray(out.logprobs))[np.asarray(out.tokens) == 0],
                             0.5 / 0.95, rtol=1e-5)
