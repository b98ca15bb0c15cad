"""Mesh construction, logical-axis rules and the import-time XLA flags."""
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from composer_rl.model import Transformer, get_preset, sharding


def test_make_mesh_sizes_and_errors():
  mesh = sharding.make_mesh({"data": 2, "fsdp": -1})
  assert dict(mesh.shape) == {"data": 2, "fsdp": 4, "tensor": 1, "expert": 1}
  with pytest.raises(ValueError, match="unknown mesh axes"):
    sharding.make_mesh({"dta": 8})
  with pytest.raises(ValueError, match="needs 16 devices"):
    sharding.make_mesh({"data": 16})


def test_param_shardings_follow_logical_names():
  model = Transformer(get_preset("tiny_moe", d_model=64), rngs=nnx.Rngs(0))
  mesh = sharding.make_mesh({"fsdp": 2, "tensor": 2, "expert": 2})
  specs = sharding.param_shardings(nnx.state(model), mesh)
  layers = specs["layers"]  # stacked over layers: the layer axis is not sharded
  assert layers["attn"]["wq"].spec == P(None, "fsdp", "tensor")
  assert layers["mlp"]["w_down"].spec == P(None, "tensor", "fsdp")
  assert layers["moe"]["w_gate"].spec == P(None, "expert", "fsdp", "tensor")  # MoE layer
  assert specs["embed"].spec == P(None, "fsdp")
  # Placing the state with these shardings works and keeps the values.
  state = nnx.state(model)
  placed = jax.device_put(state, specs)
  np.testing.assert_array_equal(np.asarray(placed["embed"][...]), np.asarray(state["embed"][...]))


def test_import_sets_parity_flags_and_warns_when_too_late():
  from composer_rl.ops import xla_flags
  for flag in xla_flags.PARITY_FLAGS:
    assert flag in os.environ["XLA_FLAGS"]
  code = ("import os; os.environ.pop('XLA_FLAGS', None); import jax; jax.numpy.zeros(1);"
          "import warnings; warnings.simplefilter('error');\n"
          "try:\n import composer_rl\nexcept RuntimeWarning as e:\n print('WARNED', e)")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert "WARNED" in out.stdout and "could not take effect" in out.stdout, out.stderr
