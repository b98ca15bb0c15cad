"""FSDP inside the train step: the reduce-scatter is the fixed tree, the gradient norm has
the same bits on every mesh, and the compiled step never holds a whole layer stack."""
import re

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from composer_rl.model import ModelConfig, sharding as shd
from composer_rl.sampling.head import RowSampling
from composer_rl.train.batch import TrainBatch
from composer_rl.train.reduction import halving_scatter, tree_sum
from composer_rl.train.train_step import TrainConfig, make_train_step

from .test_train_step import CFG


def _spread(shape, seed):
  """Values over 16 decades, both signs: any change of summation order shows in the bits."""
  rng = np.random.default_rng(seed)
  return (rng.standard_normal(shape) * 10.0 ** rng.integers(-8, 8, shape)).astype(np.float32)


@pytest.mark.parametrize("devices", [2, 4, 8])
@pytest.mark.parametrize("dim", [0, 1])
def test_halving_scatter_is_the_tree_over_devices_then_a_block(devices, dim):
  items = _spread((devices, 16, 24), seed=devices + dim)
  mesh = shd.make_mesh({"fsdp": devices}, jax.devices()[:devices])
  out = P(*([None] * dim + ["fsdp"]))
  got = jax.jit(jax.shard_map(lambda x: halving_scatter(x[0], dim, "fsdp", devices),
                              mesh=mesh, in_specs=P("fsdp"), out_specs=out))(items)
  want = tree_sum((items,), lambda a, b: (a[0] + b[0],))[0]
  np.testing.assert_array_equal(np.asarray(got).view(np.uint32), np.asarray(want).view(np.uint32))
  left_to_right = items[0].copy()
  for x in items[1:]:
    left_to_right = left_to_right + x
  if devices > 2:  # negative control: another order gives other bits on these values
    assert (left_to_right.view(np.uint32) != np.asarray(want).view(np.uint32)).any()


def _norm_on(mesh_shape, grads_host):
  n = int(np.prod(list(mesh_shape.values())))
  mesh = shd.make_mesh(mesh_shape, jax.devices()[:n])
  ts = make_train_step(MOE, CFG, mesh)
  specs = ts.layout.partition_specs()
  grads = jax.device_put(grads_host, ts.param_shardings)
  fn = jax.shard_map(ts.layout.global_norm, mesh=mesh, in_specs=(specs,), out_specs=P(),
                     check_vma=False)
  return np.asarray(jax.jit(fn)(grads))


MOE = ModelConfig(vocab_size=96, d_model=48, num_layers=2, num_heads=2, num_kv_heads=1,
                  head_dim=16, d_ff=96, max_seq_len=32, num_experts=4, experts_per_token=2,
                  moe_d_ff=24, row_tile=8)


def test_the_gradient_norm_has_the_same_bits_on_every_mesh():
  """Leaves split over fsdp, tensor and expert (and some dims that split into chunks of 3:
  48 = 16 x 3), the same bits as on one device, and the value of the norm."""
  ts = make_train_step(MOE, CFG, shd.make_mesh({"data": 1}, jax.devices()[:1]))
  shapes = jax.eval_shape(lambda: ts.init_state(0).params)
  grads = jax.tree.map(lambda s, i=iter(range(100)): _spread(s.shape, next(i)), shapes)
  one = _norm_on({"data": 1}, grads)
  exact = np.sqrt(sum(np.sum(np.square(g.astype(np.float64))) for g in jax.tree.leaves(grads)))
  np.testing.assert_allclose(one, exact, rtol=1e-6)
  for shape in ({"fsdp": 8}, {"fsdp": 2, "tensor": 2, "expert": 2}, {"data": 2, "fsdp": 4},
                {"fsdp": 4, "expert": 2}):
    assert one.view(np.uint32) == _norm_on(shape, grads).view(np.uint32), shape


def test_the_step_gathers_one_layer_at_a_time_and_keeps_an_eighth():
  """The compiled fsdp=8 step: no all-gather holds more than one layer of a stacked leaf,
  and its arguments (parameters + AdamW moments) are about an eighth of data=8's."""
  mc = ModelConfig(vocab_size=256, d_model=128, num_layers=2, num_heads=4, num_kv_heads=2,
                   head_dim=32, d_ff=256, max_seq_len=64, remat="full")
  rows, length = 8, 32
  f32, i32 = (lambda *shape: jax.ShapeDtypeStruct(shape, np.float32),
              lambda *shape: jax.ShapeDtypeStruct(shape, np.int32))
  batch = TrainBatch(tokens=i32(rows, length), segment_ids=i32(rows, length),
                     positions=i32(rows, length), loss_mask=f32(rows, length - 1),
                     behaviour_logprobs=f32(rows, length - 1), advantages=f32(rows),
                     rows_valid=f32(rows), versions=i32(rows, length - 1),
                     sampling=jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                                           RowSampling.broadcast(rows)))
  sizes = {}
  for shape in ({"data": 8}, {"fsdp": 8}):
    ts = make_train_step(mc, TrainConfig(micro_batch_size=1), shd.make_mesh(shape))
    compiled = ts.step.lower(ts.abstract_state(), batch).compile()
    sizes[str(shape)] = compiled.memory_analysis().argument_size_in_bytes
    if "fsdp" in shape:
      gathered = [tuple(int(d) for d in m.group(1).split(",") if d)
                  for m in re.finditer(r"= f32\[([\d,]*)\][^=]*all-gather\(", compiled.as_text())]
      assert gathered, "no all-gather in the fsdp step"
      for dims in gathered:  # a whole layer stack would lead with num_layers
        assert int(np.prod(dims)) <= 256 * 128, dims
  ratio = sizes["{'fsdp': 8}"] / sizes["{'data': 8}"]
  assert ratio < 0.2, sizes
