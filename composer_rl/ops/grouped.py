"""Batch-invariant mixture-of-experts feed-forward: fixed row tiles, one expert per tile.

The usual MoE kernels (capacity-limited dispatch, or a ragged grouped matmul) make a
token's result depend on the rest of the batch: capacity drops tokens, and a grouped
matmul's row results depend on each group's row count. Here every (token, expert)
assignment is placed, sorted by expert, into a buffer where each expert's rows are padded
to a multiple of `tile`; each tile then holds rows of a single expert and goes through the
same `[tile, d] x [d, f]` dots as every other tile. Nothing is dropped; the overhead is at
most E * (tile - 1) padding rows per call.
"""
import jax
import jax.numpy as jnp
from jax import lax

from composer_rl.ops import exact


def grouped_swiglu(x: jax.Array, expert_ids: jax.Array, gates: jax.Array, w_gate: jax.Array,
                   w_up: jax.Array, w_down: jax.Array, tile: int, dtype,
                   exact_numerics: bool = True) -> jax.Array:
  """out[n] = sum_j gates[n, j] * SwiGLU_{expert_ids[n, j]}(x[n]).

  Args:
    x: [N, d] token activations.
    expert_ids: [N, k] int32 chosen experts per token.
    gates: [N, k] fp32 combine weights.
    w_gate, w_up: [E, d, f]; w_down: [E, f, d] stacked expert weights.
    tile: rows per expert matmul.
    dtype: matmul input dtype.
    exact_numerics: False evaluates all tiles as one batched (vmapped) dot: the inexact fast mode.
  Returns:
    [N, d] fp32.
  """
  n, k = expert_ids.shape
  num_experts = w_gate.shape[0]
  num_assign = n * k
  flat_expert = expert_ids.reshape(-1).astype(jnp.int32)
  flat_token = jnp.repeat(jnp.arange(n, dtype=jnp.int32), k)

  order = jnp.argsort(flat_expert, stable=True)
  sorted_expert = flat_expert[order]
  counts = jnp.zeros((num_experts,), jnp.int32).at[flat_expert].add(1)
  padded = (counts + tile - 1) // tile * tile
  padded_end = jnp.cumsum(padded)
  padded_start = padded_end - padded
  start = jnp.cumsum(counts) - counts
  rank = jnp.arange(num_assign, dtype=jnp.int32) - start[sorted_expert]
  dest_sorted = padded_start[sorted_expert] + rank
  dest = jnp.zeros_like(dest_sorted).at[order].set(dest_sorted)  # per original assignment

  num_tiles = -(-(num_assign + num_experts * (tile - 1)) // tile)
  buf_rows = num_tiles * tile
  # Row index into x for each buffer row; n points at an appended zero row (padding).
  buf_token = jnp.full((buf_rows,), n, jnp.int32).at[dest].set(flat_token)
  x_buf = jnp.concatenate([x, jnp.zeros((1, x.shape[1]), x.dtype)])[buf_token]
  tile_start = jnp.arange(num_tiles, dtype=jnp.int32) * tile
  tile_expert = jnp.minimum(jnp.searchsorted(padded_end, tile_start, side="right"),
                            num_experts - 1).astype(jnp.int32)

  def expert_tile(args):
    xt, e = args
    dense = lambda a, w: exact.dense(a, w, dtype, exact_numerics)
    h = jax.nn.silu(dense(xt, w_gate[e])) * dense(xt, w_up[e])
    return dense(h, w_down[e])

  tiles = (x_buf.reshape(num_tiles, tile, -1), tile_expert)
  y_buf = lax.map(expert_tile, tiles) if exact_numerics else jax.vmap(expert_tile)(tiles)
  y = y_buf.reshape(buf_rows, -1)[dest].reshape(n, k, -1)
  out = gates[:, 0, None] * y[:, 0]
  for j in range(1, k):  # fixed combine order
    out = out + gates[:, j, None] * y[:, j]
  return out
