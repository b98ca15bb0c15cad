"""Device meshes, logical-axis sharding rules, and batch-sharded execution.

Parameters carry logical axis names in their `out_sharding` metadata (`layers`, `vocab`,
`embed`, `q_heads`, `kv_heads`, `head_dim`, `mlp`, `expert`, `expert_logits`, `moe_mlp`). An experiment maps them to mesh axes with a
rules table, e.g. `(("embed", "fsdp"), ("mlp", "tensor"), ("expert", "expert"))`; names
without a rule are replicated.

Parity under sharding: `shard_batch` runs a function with `shard_map` so that each device
executes the *single-device* program on its slice of the batch; weights are all-gathered
first (an all-gather moves bits, it does not add). Because every op in the forward is
batch-invariant, 1 device and N devices produce the same bits. Sharding a contraction
dimension (tensor parallelism over `embed`, `mlp` or heads feeding a reduction) would add a
cross-device sum and is therefore not parity-preserving across different mesh shapes.
"""
from typing import Callable, Dict, Optional, Sequence, Tuple

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor", "expert")
DEFAULT_RULES: Tuple[Tuple[str, Optional[str]], ...] = (
    ("layers", None), ("vocab", None), ("embed", "fsdp"), ("q_heads", "tensor"), ("kv_heads", "tensor"),
    ("head_dim", None), ("mlp", "tensor"), ("expert", "expert"), ("expert_logits", None),
    ("moe_mlp", "tensor"),
)


def make_mesh(shape: Dict[str, int], devices: Optional[Sequence[jax.Device]] = None) -> Mesh:
  """A mesh over `devices` (default: all) with axes MESH_AXES sized by `shape` (default 1).

  One axis may be -1, meaning "all remaining devices".
  """
  devices = list(devices if devices is not None else jax.devices())
  unknown = set(shape) - set(MESH_AXES)
  if unknown:
    raise ValueError(f"unknown mesh axes {sorted(unknown)}; known: {MESH_AXES}")
  sizes = [int(shape.get(a, 1)) for a in MESH_AXES]
  if sizes.count(-1) > 1:
    raise ValueError(f"at most one mesh axis may be -1, got {shape}")
  known = int(np.prod([s for s in sizes if s != -1]))
  if -1 in sizes:
    if len(devices) % known:
      raise ValueError(f"{len(devices)} devices do not divide into mesh {shape}")
    sizes[sizes.index(-1)] = len(devices) // known
  if int(np.prod(sizes)) != len(devices):
    raise ValueError(f"mesh {dict(zip(MESH_AXES, sizes))} needs {int(np.prod(sizes))} devices, "
                     f"have {len(devices)}")
  return Mesh(np.asarray(devices).reshape(sizes), MESH_AXES)


def logical_to_spec(names: Sequence[Optional[str]], rules=DEFAULT_RULES) -> P:
  table = dict(rules)
  return P(*[table.get(n) if n is not None else None for n in names])


def logical_names(state: nnx.State):
  """Each parameter's logical axis names (a tuple, None for an unnamed axis)."""
  def one(var):
    names = tuple(var.get_metadata().get("out_sharding") or ())
    return names + (None,) * (len(var.get_value().shape) - len(names))
  return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def param_shardings(state: nnx.State, mesh: Mesh, rules=DEFAULT_RULES):
  """NamedShardings for an nnx state (concrete, or abstract from `nnx.eval_shape`: nothing
  is materialized) from its params' `out_sharding` (logical) metadata."""
  def one(var):
    names = var.get_metadata().get("out_sharding")
    shape = var.get_value().shape
    spec = tuple(logical_to_spec(names, rules)) if names else ()
    spec = spec + (None,) * (len(shape) - len(spec))
    # An axis that does not divide the dimension stays replicated (tiny models).
    return NamedSharding(mesh, P(*[a if a is not None and d % mesh.shape[a] == 0 else None
                                   for d, a in zip(shape, spec)]))
  return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def batch_axes(mesh: Mesh) -> Tuple[str, ...]:
  """Mesh axes over which the batch is split (data and fsdp both carry batch)."""
  return tuple(a for a in ("data", "fsdp") if mesh.shape[a] > 1) or ("data",)


def shard_batch(fn: Callable, mesh: Mesh, num_replicated: int = 1) -> Callable:
  """Wraps fn(*replicated, *batched) to run per batch shard with `shard_map`.

  The first `num_replicated` arguments (weights, sampling constants) are replicated onto
  every device; every other argument and every output is split along its leading (batch)
  axis over `batch_axes(mesh)`. The batch must divide evenly by the number of shards.
  """
  axes = batch_axes(mesh)

  def wrapped(*args):
    rep, batched = args[:num_replicated], args[num_replicated:]
    in_specs = tuple(jax.tree.map(lambda _: P(), a) for a in rep) + tuple(
        jax.tree.map(lambda _: P(axes), a) for a in batched)
    mapped = jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=P(axes),
                           check_vma=False)
    return mapped(*args)

  return wrapped


def num_batch_shards(mesh: Mesh) -> int:
  return int(np.prod([mesh.shape[a] for a in batch_axes(mesh)]))


def to_host(tree):
  """numpy copies of every leaf's global value, on every process.

  One process: `jax.device_get`. Several (multi-controller): an array sharded over other
  hosts' devices is not addressable here, so its shards are all-gathered first (through
  the cluster's collectives). Costs one full copy of the tree in each host's memory.
  """
  if jax.process_count() == 1:
    return jax.device_get(tree)
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return multihost_utils.process_allgather(tree, tiled=True)
