"""Fixed-order sums of per-microbatch gradients: the same bits on 1 and N devices, with
memory that does not grow with the number of microbatches or devices.

The order is one balanced binary tree over all microbatches of the batch (pairs of
neighbours, an odd last item carried up to the next level; `tree_sum`). Floating-point
addition is commutative but not associative, so the tree's shape -- not the order of the
two operands of each addition -- is what fixes the bits. Three ways to compute that tree:

- `tree_sum`: over a stacked leading axis (the reference; holds every item).
- `streaming_tree_sum`: over items produced one after another in a `lax.scan`, keeping one
  partial sum per tree level that is still open (a binary counter): memory
  O(log n) items instead of n. Item i closes ctz(i + 1) levels; at the end the open
  levels are folded from the lowest up, which is exactly where `tree_sum` carries its odd
  items.
- `butterfly_sum`: over devices, each holding the sum of its own contiguous block of
  items (recursive doubling with `ppermute`): after round r a device holds the sum of its
  block of 2^(r+1) devices, i.e. the tree's level above the devices' subtrees. One extra
  item in flight instead of an all-gather of all N. Needs N a power of two (as the
  subtree argument does).
- `halving_scatter`: the same tree over devices, each keeping only its block of the sum
  along one axis (recursive halving: each round sends half of what is left). This is FSDP's
  reduce-scatter with the tree's bits: a device sends and holds at most one item.
"""
from typing import Any, Callable

import jax
import jax.numpy as jnp

Combine = Callable[[Any, Any], Any]


def tree_sum(stack: Any, combine: Combine) -> Any:
  """Pairwise (balanced binary tree) reduction over the leading axis of every leaf."""
  n = jax.tree.leaves(stack)[0].shape[0]
  items = [jax.tree.map(lambda x, i=i: x[i], stack) for i in range(n)]
  while len(items) > 1:
    paired = [combine(items[i], items[i + 1]) for i in range(0, len(items) - 1, 2)]
    items = paired + ([items[-1]] if len(items) % 2 else [])
  return items[0]


def _trailing_zeros(x: jax.Array) -> jax.Array:
  return jax.lax.population_count((x & -x) - 1)


def streaming_tree_sum(fn: Callable[[Any], Any], xs: Any, combine: Combine) -> Any:
  """`tree_sum(lax.map(fn, xs), combine)`, bit for bit, holding O(log n) results of `fn`:
  bit_length(n - 1) open partial sums and the item being computed (n = 8 rows: 3 + 1).

  xs: a tree whose leaves share a leading axis of n items; fn maps one item to a tree.
  """
  n = jax.tree.leaves(xs)[0].shape[0]
  # Level l holds the sum of 2**l items. Only the last item of a power-of-two n closes
  # level bit_length(n - 1); the result then goes to slot 0 (dead by then), not a new slot.
  levels = max(1, (n - 1).bit_length())
  first = jax.tree.map(lambda x: x[0], xs)
  shapes = jax.eval_shape(fn, first)
  open_sums = jax.tree.map(lambda s: jnp.zeros((levels,) + s.shape, s.dtype), shapes)

  def body(sums, item):
    i, x = item
    closes = _trailing_zeros(i + 1)
    # Close `closes` levels: each holds the left neighbour of the running sum.
    cur = jax.lax.fori_loop(
        0, closes,
        lambda lvl, c: combine(jax.tree.map(lambda s: s[lvl], sums), c), fn(x))
    at = jnp.where(closes < levels, closes, 0)
    sums = jax.tree.map(lambda s, c: s.at[at].set(c), sums, cur)
    return sums, None

  sums, _ = jax.lax.scan(body, open_sums, (jnp.arange(n, dtype=jnp.int32), xs))
  out = None
  for lvl in range(levels + 1):  # the open levels are the set bits of n, lowest first
    if n >> lvl & 1:
      here = jax.tree.map(lambda s, lvl=lvl: s[lvl % levels], sums)
      out = here if out is None else combine(here, out)
  return out


def butterfly_sum(local: Any, combine: Combine, axis_name, num_devices: int) -> Any:
  """Inside `shard_map`: the balanced-tree sum over devices of each device's `local`
  (device d's items come before device d + 1's), returned on every device."""
  if num_devices & (num_devices - 1):
    raise ValueError(f"butterfly_sum needs a power-of-two device count, got {num_devices}")
  step = 1
  while step < num_devices:
    other = jax.lax.ppermute(local, axis_name, [(d, d ^ step) for d in range(num_devices)])
    # Both partners add the same two blocks; IEEE addition (and max/min) is commutative, so
    # they get the same bits whichever operand comes first.
    local = combine(local, other)
    step *= 2
  return local


def halving_scatter(x: jax.Array, dim: int, axis_name, num_devices: int) -> jax.Array:
  """Inside `shard_map`: `tree_sum` over devices of `x` (device d's item before d + 1's),
  of which device d keeps block d of `dim` (x.shape[dim] / num_devices long).

  Round r pairs devices d and d ^ 2**r, as `butterfly_sum` does, so the additions are the
  tree's; the blocks still held are those whose index agrees with d in its r low bits, and
  each device keeps the half whose bit r is its own and sends the other.
  """
  if num_devices & (num_devices - 1):
    raise ValueError(f"halving_scatter needs a power-of-two device count, got {num_devices}")
  n = x.shape[dim]
  if n % num_devices:
    raise ValueError(f"axis {dim} of length {n} does not split into {num_devices} blocks")
  pre, post = x.shape[:dim], x.shape[dim + 1:]
  held = x.reshape(pre + (num_devices, n // num_devices) + post)  # blocks by index
  me = jax.lax.axis_index(axis_name)
  step = 1
  while step < num_devices:
    held = held.reshape(pre + (held.shape[dim] // 2, 2) + held.shape[dim + 1:])
    bit = (me // step) % 2
    keep = jax.lax.dynamic_index_in_dim(held, bit, dim + 1, keepdims=False)
    send = jax.lax.dynamic_index_in_dim(held, 1 - bit, dim + 1, keepdims=False)
    held = keep + jax.lax.ppermute(send, axis_name,
                                   [(d, d ^ step) for d in range(num_devices)])
    step *= 2
  return held.reshape(pre + (n // num_devices,) + post)
