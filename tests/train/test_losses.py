"""Policy losses, KL estimators and aggregations against hand-computed values."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from composer_rl.train import losses
from composer_rl.train.losses import LossConfig

# Four tokens of one sequence: ratios r = 1.5, 0.5, 0.5, 1.5 with advantages +1, +1, -1, -1.
LOGP = jnp.log(jnp.array([[1.5, 0.5, 0.5, 1.5]], jnp.float32))
BLP = jnp.zeros((1, 4), jnp.float32)
ADV = jnp.array([[1.0, 1.0, -1.0, -1.0]], jnp.float32)


def _per_token(name, cfg, logp=LOGP, blp=BLP, adv=ADV):
  return losses.POLICY_LOSSES[name](logp, blp, adv, cfg)


def test_ppo_clip_symmetric():
  # r=1.5,A=+1: min(1.5, 1.2) = 1.2 (clipped); r=.5,A=+1: min(.5, .8) = .5;
  # r=.5,A=-1: min(-.5, -.8) = -.8 (clipped); r=1.5,A=-1: min(-1.5, -1.2) = -1.5.
  loss, clipped = _per_token("ppo_clip", LossConfig(clip_eps_low=0.2, clip_eps_high=0.2))
  np.testing.assert_allclose(loss, [[-1.2, -0.5, 0.8, 1.5]], rtol=1e-6)
  np.testing.assert_array_equal(clipped, [[1, 0, 1, 0]])


def test_ppo_clip_gradient_is_zero_where_clipped():
  cfg = LossConfig(clip_eps_low=0.2, clip_eps_high=0.2)
  g = jax.grad(lambda lp: jnp.sum(_per_token("ppo_clip", cfg, logp=lp)[0]))(LOGP)
  # d(-r A)/dlogp = -A r where unclipped: token 2: -0.5, token 4: +1.5.
  np.testing.assert_allclose(g, [[0.0, -0.5, 0.0, 1.5]], rtol=1e-6)


def test_dapo_asymmetric_clip_higher():
  loss, _ = _per_token("ppo_clip", LossConfig(clip_eps_low=0.2, clip_eps_high=0.28))
  np.testing.assert_allclose(loss, [[-1.28, -0.5, 0.8, 1.5]], rtol=1e-6)


def test_truncated_importance_sampling():
  logp = jnp.log(jnp.array([[3.0, 0.5]], jnp.float32))
  adv = jnp.array([[1.0, -2.0]], jnp.float32)
  blp = jnp.zeros((1, 2), jnp.float32)
  cfg = LossConfig(policy_loss="tis", tis_cap=2.0)
  loss, truncated = _per_token("tis", cfg, logp=logp, blp=blp, adv=adv)
  # weights min(3, 2) = 2 and min(.5, 2) = .5: loss = -w A logp.
  np.testing.assert_allclose(loss, [[-2.0 * np.log(3.0), -0.5 * -2.0 * np.log(0.5)]],
                             rtol=1e-6)
  np.testing.assert_array_equal(truncated, [[1, 0]])
  g = jax.grad(lambda lp: jnp.sum(_per_token("tis", cfg, lp, blp, adv)[0]))(logp)
  np.testing.assert_allclose(g, [[-2.0, 1.0]], rtol=1e-6)  # -w A (weight not differentiated)


def test_sft_is_negative_log_likelihood():
  loss, _ = _per_token("sft", LossConfig(policy_loss="sft"))
  np.testing.assert_allclose(loss, -LOGP, rtol=1e-6)


def test_kl_estimators():
  logp, ref = jnp.log(jnp.float32(0.5)), jnp.log(jnp.float32(0.25))
  d = np.log(0.25) - np.log(0.5)
  np.testing.assert_allclose(losses.k1(logp, ref), -d, rtol=1e-6)          # 0.6931
  np.testing.assert_allclose(losses.k2(logp, ref), 0.5 * d * d, rtol=1e-6)  # 0.2402
  np.testing.assert_allclose(losses.k3(logp, ref), 0.5 - d - 1.0, rtol=1e-5)  # 0.1931
  assert losses.k3(logp, logp) == 0.0


PT = jnp.array([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]], jnp.float32)
MASK = jnp.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]], jnp.float32)


@pytest.mark.parametrize("agg,norm_length,expected", [
    ("token_mean", 0, 7 / 3),                    # (1 + 2 + 4) / 3 tokens
    ("seq_mean_token_mean", 0, (1.5 + 4.0) / 2),  # mean of per-sequence means
    ("seq_mean_token_sum_norm", 4, 7 / (2 * 4)),   # Dr. GRPO: sum / (seqs * constant)
    ("seq_mean_token_sum_norm", 0, 7 / (2 * 3)),   # constant defaults to padded length
])
def test_aggregations(agg, norm_length, expected):
  cfg = LossConfig(aggregation=agg, norm_length=norm_length)
  norms = losses.normalizers(MASK, jnp.ones(2))
  np.testing.assert_allclose(losses.AGGREGATIONS[agg](PT, MASK, norms, cfg), expected,
                             rtol=1e-6)


def test_objective_masks_non_generated_tokens_even_if_infinite():
  logp = jnp.array([[-jnp.inf, jnp.log(0.5)]], jnp.float32)  # prompt token outside top-k
  blp = jnp.array([[0.0, jnp.log(0.5)]], jnp.float32)
  mask = jnp.array([[0.0, 1.0]], jnp.float32)
  norms = losses.normalizers(mask, jnp.ones(1))
  cfg = LossConfig()
  f = lambda lp: losses.policy_objective(lp, blp, jnp.array([2.0]), mask, norms, cfg)[0]
  loss, g = jax.value_and_grad(f)(logp)
  assert loss == -2.0  # on-policy: ratio 1, loss -A
  np.testing.assert_array_equal(g, [[0.0, -2.0]])


def test_kl_penalty_and_metrics():
  mask = jnp.ones((1, 4), jnp.float32)
  norms = losses.normalizers(mask, jnp.ones(1))
  ref = LOGP + jnp.log(0.5)  # ref = logp + log .5: k3 = .5 - log .5 - 1 per token
  cfg = LossConfig(kl_coef=0.1)
  loss, m = losses.policy_objective(LOGP, BLP, ADV, mask, norms, cfg, ref_logp=ref)
  k3 = 0.5 - np.log(0.5) - 1.0
  np.testing.assert_allclose(m["kl_ref"], k3, rtol=1e-5)
  np.testing.assert_allclose(loss, (-1.2 - 0.5 + 0.8 + 1.5) / 4 + 0.1 * k3, rtol=1e-5)
  assert m["clipped"] == 2.0 and m["ratio_max"] == np.float32(1.5)


def test_microbatches_sum_to_the_whole_batch():
  rng = np.random.default_rng(0)
  logp = jnp.asarray(-rng.random((4, 5)), jnp.float32)
  blp = jnp.asarray(-rng.random((4, 5)), jnp.float32)
  adv = jnp.asarray(rng.normal(size=4), jnp.float32)
  mask = jnp.asarray(rng.integers(0, 2, (4, 5)), jnp.float32)
  for agg in losses.AGGREGATIONS:
    cfg = LossConfig(aggregation=agg)
    norms = losses.normalizers(mask, jnp.ones(4))
    whole = losses.policy_objective(logp, blp, adv, mask, norms, cfg)[0]
    parts = sum(losses.policy_objective(logp[i:i + 2], blp[i:i + 2], adv[i:i + 2],
                                        mask[i:i + 2], norms, cfg)[0] for i in (0, 2))
    np.testing.assert_allclose(whole, parts, rtol=1e-5)


def test_config_rejects_unknown_names():
  with pytest.raises(ValueError, match="policy_loss"):
    LossConfig(policy_loss="ppo")
  with pytest.raises(ValueError, match="aggregation"):
    LossConfig(aggregation="mean")
