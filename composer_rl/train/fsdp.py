"""Parameters sharded inside the train step (FSDP), with a 1-device step's bits.

Storage. Parameters, AdamW moments and gradients live sharded by the experiment's rules
(`composer_rl.model.sharding`; by default `embed` over the `fsdp` mesh axis, heads and MLP
columns over `tensor`, experts over `expert`). The step's `shard_map` receives each
device's shards; nothing gathers the whole model.

Forward. A layer's shards are all-gathered at the top of the layer loop's body
(`Transformer.forward(layer_gather=...)`), so one layer's weights are whole at a time, and
gathered again when the backward rematerializes the body. Parameters outside the layers
(embedding, final norm, output head) are gathered once per microbatch.

Backward, and why the bits are a 1-device step's. The step sums microbatch gradients in one
balanced binary tree over the batch's microbatches in order (`composer_rl.train.reduction`).
Microbatch k of a step runs on data replica k // (F m) and on fsdp device k % F (F fsdp
devices, m microbatches per device), so the F devices of an fsdp group work on F
neighbouring microbatches at once: the tree's lowest log2 F levels. The gather's backward
(`gather`) reduces the layer's full gradient over the group in exactly those levels and
keeps the device's block (`reduction.halving_scatter`, or `butterfly_sum` for a leaf that is
not split over fsdp). A device then sums its m group sums as they come (the next levels) and
data replicas combine theirs (the top levels). Devices along `tensor` and `expert` hold
the same rows, so a leaf split over them only keeps its block. Gradient memory per device is
one layer's full gradient in flight plus O(log m) sharded partial sums.

`global_norm`: the gradient norm in an order fixed by the leaves' shapes and the rules,
never by the mesh, so it has the same bits however the gradients are split.
"""
import dataclasses
import functools
from typing import Any, Dict, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec as P

from composer_rl.ops import exact
from composer_rl.train import reduction

Spec = Tuple[Optional[str], ...]  # a mesh axis (or None) per dimension of a leaf


@dataclasses.dataclass(frozen=True)
class Group:
  """What the gather's backward reduces over (hashable: a static argument).

  sizes: the mesh's axis sizes. mode: 'tree' (the fixed tree) or 'psum' (XLA's collectives).
  """
  sizes: Tuple[Tuple[str, int], ...]
  mode: str

  def size(self, axis: str) -> int:
    return dict(self.sizes)[axis]


def group_sum(x: Any, combine, axis: str, size: int, mode: str, psum=None) -> Any:
  """Inside `shard_map`: the sum over `axis` of every device's `x`, on every device, in the
  balanced tree over devices ('tree'), or with `psum(x, axis)` ('psum'; default lax.psum)."""
  if size == 1:
    return x
  if mode == "psum":
    return (psum or jax.lax.psum)(x, axis)
  if size & (size - 1) == 0:
    return reduction.butterfly_sum(x, combine, axis, size)
  return reduction.tree_sum(jax.tree.map(lambda a: jax.lax.all_gather(a, axis), x), combine)


def _block(x: jax.Array, dim: int, axis: str, size: int) -> jax.Array:
  n = x.shape[dim] // size
  return jax.lax.dynamic_slice_in_dim(x, jax.lax.axis_index(axis) * n, n, dim)


def _reduce_grad(g: jax.Array, spec: Spec, group: Group) -> jax.Array:
  """A device's full-size gradient of one gathered leaf -> its block of the group's sum."""
  f = group.size("fsdp")
  dim = spec.index("fsdp") if "fsdp" in spec else None
  if f > 1 and dim is None:
    g = group_sum(g, jnp.add, "fsdp", f, group.mode)
  elif f > 1 and group.mode == "psum":
    g = jax.lax.psum_scatter(g, "fsdp", scatter_dimension=dim, tiled=True)
  elif f > 1 and f & (f - 1) == 0:
    g = reduction.halving_scatter(g, dim, "fsdp", f)
  elif f > 1:
    g = _block(group_sum(g, jnp.add, "fsdp", f, "tree"), dim, "fsdp", f)
  for d, axis in enumerate(spec):  # replicas of the batch: every device computed this
    if axis not in (None, "fsdp") and group.size(axis) > 1:
      g = _block(g, d, axis, group.size(axis))
  return g


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def gather(x: jax.Array, spec: Spec, group: Group) -> jax.Array:
  """Inside `shard_map`: the whole leaf from this device's shard (`spec` per dimension).
  Its backward returns this device's block of the fsdp group's summed gradient."""
  for d, axis in enumerate(spec):
    if axis is not None and group.size(axis) > 1:
      x = jax.lax.all_gather(x, axis, axis=d, tiled=True)
  return x


gather.defvjp(lambda x, spec, group: (gather(x, spec, group), None),
              lambda spec, group, _, g: (_reduce_grad(g, spec, group),))


def _is_spec(x) -> bool:  # a per-dimension tuple is a leaf, not a pytree node
  return isinstance(x, tuple)


class ParamLayout:
  """How one model's parameters are split over one mesh, and what the step does about it.

  specs: pure dict of `PartitionSpec`s, as the parameters are stored; shapes: pure dict of
  their global shapes; rules: the logical-axis rules (ordering `global_norm`'s sums);
  names: pure dict of each leaf's logical axis names.
  """

  def __init__(self, specs: Any, shapes: Any, names: Any, mesh: Mesh, mode: str,
               rules: Sequence[Tuple[str, Optional[str]]]):
    self.group = Group(tuple((a, int(s)) for a, s in mesh.shape.items()), mode)
    self.specs = jax.tree.map(lambda s, x: tuple(s) + (None,) * (len(x.shape) - len(s)),
                              specs, shapes, is_leaf=lambda s: isinstance(s, P))
    for path, spec in jax.tree_util.tree_flatten_with_path(self.specs, is_leaf=_is_spec)[0]:
      if "data" in spec:
        raise ValueError(f"parameter {jax.tree_util.keystr(path)} is split over the 'data' "
                         "mesh axis; data replicas hold whole parameters (use 'fsdp')")
    split = [any(a is not None and self.group.size(a) > 1 for a in s)
             for s in jax.tree.leaves(self.specs, is_leaf=_is_spec)]
    # Gathers (and per-microbatch reduction over fsdp) only when something is split.
    self.active = self.group.size("fsdp") > 1 or any(split)
    ruled = {n for n, a in rules if a is not None}
    self.norm_order = jax.tree.map(
        lambda n: tuple(i for i, x in enumerate(n) if x not in ruled)[::-1]
        + tuple(i for i, x in enumerate(n) if x in ruled)[::-1],
        names, is_leaf=_is_spec)

  def partition_specs(self) -> Any:
    """The parameters' `PartitionSpec`s (the step's `shard_map` in and out specs)."""
    return jax.tree.map(lambda s: P(*s), self.specs, is_leaf=_is_spec)

  def _gather_tree(self, tree: Any, specs: Any) -> Any:
    return jax.tree.map(lambda x, s: gather(x, s, self.group), tree, specs, is_leaf=_is_spec)

  def outside_layers(self, params: Dict[str, Any]) -> Dict[str, Any]:
    """Every leaf but the stacked layers gathered whole (once per microbatch)."""
    if not self.active:
      return params
    return {k: v if k == "layers" else self._gather_tree(v, self.specs[k])
            for k, v in params.items()}

  def layer_gather(self):
    """`Transformer.forward`'s `layer_gather`: one layer's leaves gathered whole."""
    if not self.active:
      return None
    layers = jax.tree.map(lambda s: s[1:], self.specs["layers"], is_leaf=_is_spec)
    return lambda kind, arrays: {n: gather(a, layers[kind][n], self.group)
                                 for n, a in arrays.items()}

  def global_norm(self, grads: Any) -> jax.Array:
    """L2 norm of (possibly split) gradients, the same bits on every mesh: each leaf's
    squares are summed one axis at a time (axes no rule splits first, then the others, last
    first), each axis as K contiguous chunks (K the largest power of two dividing its
    length) summed pairwise, then the K chunk sums pairwise -- gathered first where the
    axis is split, which a power-of-two split of K chunks leaves whole. Leaves add up in
    tree order."""
    total = jnp.zeros((), jnp.float32)
    for g, spec, order in zip(jax.tree.leaves(grads),
                              jax.tree.leaves(self.specs, is_leaf=_is_spec),
                              jax.tree.leaves(self.norm_order, is_leaf=_is_spec)):
      x = jnp.square(g.astype(jnp.float32))
      dims = list(range(x.ndim))
      for d in order:
        axis = spec[d]
        ways = self.group.size(axis) if axis is not None else 1
        at = dims.index(d)
        n = x.shape[at] * ways
        chunks = n & -n
        if chunks % ways:  # a split that cuts chunks: gather the axis first
          x, ways = jax.lax.all_gather(x, axis, axis=at, tiled=True), 1
        x = x.reshape(x.shape[:at] + (chunks // ways, n // chunks) + x.shape[at + 1:])
        x = exact.pairwise_sum(x, at + 1)
        if ways > 1:
          x = jax.lax.all_gather(x, axis, axis=at, tiled=True)
        x = exact.pairwise_sum(x, at)
        dims.pop(at)
      total = total + x
    return jnp.sqrt(total)

