"""The sharded train step: on-policy ratio exactly 1, and 1 device == 8 devices bitwise."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from composer_rl.model import Transformer, get_preset, sharding as shd
from composer_rl.train import losses
from composer_rl.train.optimizer import OptimizerConfig, make_optimizer
from composer_rl.train.reduction import tree_sum
from composer_rl.train.train_step import TrainConfig, make_train_step

from .helpers import TINY, on_policy_batch

CFG = TrainConfig(optimizer=OptimizerConfig(learning_rate=1e-2, warmup_steps=0, total_steps=10),
                  loss=losses.LossConfig(policy_loss="ppo_clip"), micro_batch_size=1)


def _bits(tree):
  return [np.asarray(x).view(np.uint32) for x in jax.tree.leaves(jax.device_get(tree))]


def _run(mesh_shape, train_config=CFG, model_config=TINY, steps=2, rows=8):
  n = int(np.prod(list(mesh_shape.values())))
  mesh = shd.make_mesh(mesh_shape, jax.devices()[:n])
  ts = make_train_step(model_config, train_config, mesh)
  state = ts.init_state(seed=0)
  batch = on_policy_batch(model_config, jax.device_get(state.params), rows, seq_len=16)
  metrics = []
  for _ in range(steps):
    state, m = ts.step(state, ts.shard_batch(batch))
    metrics.append(jax.device_get(m))
  return jax.device_get(state), metrics


@pytest.fixture(scope="module")
def one_device():
  return _run({"data": 1})


def test_on_policy_ratio_is_exactly_one(one_device):
  m = one_device[1][0]  # first step: the batch was sampled by these exact weights
  assert m["tokens"] > 0
  assert m["ratio_not_one_frac"] == 0.0  # every sampled token: exp(logp - logp_sampler) == 1
  assert m["ratio_max"] == 1.0 and m["ratio_min"] == 1.0
  assert m["kl_behaviour"] == 0.0 and m["clip_frac"] == 0.0
  assert np.isfinite(m["loss"]) and m["grad_norm"] > 0
  m2 = one_device[1][1]  # second step: the same batch is now one version stale
  assert m2["ratio_not_one_frac"] > 0.5 and m2["kl_behaviour"] > 0


@pytest.mark.parametrize("mesh_shape", [
    pytest.param({"data": 8}, id="data8", marks=pytest.mark.slow),  # suite time; the
    pytest.param({"fsdp": 8}, id="fsdp8"),                           # 2-process test runs
    pytest.param({"data": 2, "fsdp": 4}, id="data2_fsdp4"),          # data=8 too
    pytest.param({"fsdp": 2, "tensor": 2, "expert": 2}, id="fsdp2_tensor2_expert2",
                 marks=pytest.mark.slow)])
def test_one_device_equals_eight_devices_bitwise(one_device, mesh_shape):
  """Loss, every metric, parameters and optimizer moments: same bits. With fsdp (and
  tensor) axes the parameters, moments and gradients stay split inside the step: each
  layer gathered in the layer loop, its gradient reduce-scattered in the backward."""
  s1, m1 = one_device
  s8, m8 = _run(mesh_shape)
  for a, b in zip(m1, m8):
    for k in a:
      assert np.asarray(a[k]).view(np.uint32) == np.asarray(b[k]).view(np.uint32), k
  for a, b in zip(_bits(s1.params), _bits(s8.params)):
    np.testing.assert_array_equal(a, b)
  for a, b in zip(_bits(s1.opt_state), _bits(s8.opt_state)):
    np.testing.assert_array_equal(a, b)


def test_tree_sum_is_the_balanced_tree():
  x = np.array([1e8, 1.0, -1e8, 1.0], np.float32)
  got = tree_sum((x,), lambda a, b: (a[0] + b[0],))[0]
  assert got == np.float32((np.float32(1e8) + np.float32(1.0)) + (np.float32(-1e8) + 1.0))


@pytest.mark.slow
def test_moe_one_vs_eight_devices():
  """MoE: loss, metrics and per-token log-probs are bitwise; a few router-gradient elements
  can differ in the last bits on 8 devices (BUILD_NOTES_train.md, "Bitwise across device
  counts"), so parameters are compared to fp32 precision."""
  mc = TINY.replace(num_experts=4, experts_per_token=2, moe_d_ff=32)
  s1, m1 = _run({"data": 1}, model_config=mc)
  for shape in ({"data": 8}, {"fsdp": 4, "expert": 2}):
    s8, m8 = _run(shape, model_config=mc)
    for k in ("loss", "tokens", "ratio_mean", "ratio_not_one_frac", "logp_mean", "entropy"):
      assert np.asarray(m1[0][k]).view(np.uint32) == np.asarray(m8[0][k]).view(np.uint32), k
    assert m1[0]["ratio_not_one_frac"] == 0.0
    for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s8.params)):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_psum_reduce_is_close():
  cfg = TrainConfig(optimizer=CFG.optimizer, loss=CFG.loss, grad_reduce="psum")
  s1, _ = _run({"data": 1})
  for shape in ({"data": 8}, {"data": 2, "fsdp": 4}):
    s8, _ = _run(shape, cfg)
    for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s8.params)):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_kl_to_reference_and_tis_in_the_step():
  cfg = TrainConfig(optimizer=CFG.optimizer, micro_batch_size=4,
                    loss=losses.LossConfig(policy_loss="tis", kl_coef=0.1))
  s, m = _run({"data": 1}, cfg, steps=2)
  assert m[0]["kl_ref"] == 0.0  # the reference is the initial policy
  assert m[1]["kl_ref"] > 0.0
  np.testing.assert_array_equal(s.ref_params["embed"].shape, s.params["embed"].shape)


def test_weight_decay_skips_the_stacked_norm_scales():
  """Stacked over layers, norm scales are 2-D like the weight matrices; AdamW's decay
  still leaves them alone (zero gradients: only the decay moves a parameter)."""
  params = nnx.to_pure_dict(nnx.state(Transformer(get_preset("tiny_moe"), rngs=nnx.Rngs(0)),
                                      nnx.Param))
  opt = make_optimizer(OptimizerConfig(learning_rate=0.1, warmup_steps=0, weight_decay=0.5))
  grads = jax.tree.map(jnp.zeros_like, params)
  updates, _ = opt.update(grads, opt.init(params), params)
  moved = jax.tree_util.tree_map_with_path(
      lambda path, u: (str(path[-1].key), bool(jnp.any(u != 0))), updates)
  flat = jax.tree.leaves(moved, is_leaf=lambda x: isinstance(x, tuple))
  assert any(name.endswith("norm") for name, _ in flat)
  for name, changed in flat:
    assert changed == (not name.endswith("norm")), name
