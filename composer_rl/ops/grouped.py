"""Batch-invariant mixture-of-experts feed-forward: one expert per row tile, work in
proportion to the tokens routed.

The usual MoE kernels (capacity-limited dispatch, or a ragged grouped matmul) make a
token's result depend on the rest of the batch: capacity drops tokens, and a grouped
matmul's row results depend on each group's row count. Here every (token, expert)
assignment is placed, sorted by expert, into a buffer where each expert's rows are padded
to a multiple of the call's tile; each tile holds rows of a single expert and goes through
`exact.dense`, whose per-row bits do not depend on how many rows it is given. So the tile
need not be fixed: a call takes the power of two nearest above its mean rows per expert
(`tile_rows`, at most `max_tile`), and a token's result is the same bits whatever tile,
batch or program computed it. Nothing is dropped.

Work: a call routing A = tokens x k assignments over E experts pads each expert's rows to
its tile, at most A + min(E, A) x (tile - 1) rows; the sampling forward (`live_only`) runs
only the tiles that hold rows (a loop with a dynamic trip count), so a decode step of 16
tokens at Qwen3-30B-A3B's shape (k 8, E 128) runs ~90 two-row tiles, where fixed
128-row tiles ran E x 128 = 16,384 rows. The training forward runs every tile of the
static buffer (a loop that reverse-mode differentiation can go through); its calls are
large, where the bound is close to A.
"""
import jax
import jax.numpy as jnp
from jax import lax

from composer_rl.ops import exact


def tile_rows(num_assign: int, num_experts: int, max_tile: int, cols: int) -> int:
  """Rows per tile for a call placing `num_assign` assignments on `num_experts` experts:
  the power of two at or above the mean rows per expert, at least the fewest rows
  `exact.dense` takes without padding for `cols` output columns, at most `max_tile`."""
  mean = -(-num_assign // num_experts)
  tile = 1 << max(0, mean - 1).bit_length()
  return max(exact.min_rows(cols), min(max_tile, tile))


def buffer_rows(num_assign: int, num_experts: int, tile: int) -> int:
  """Rows of the static buffer: at most min(E, A) experts hold rows, each padded by at
  most tile - 1, rounded up to whole tiles."""
  return -(-(num_assign + min(num_experts, num_assign) * (tile - 1)) // tile) * tile


def grouped_swiglu(x: jax.Array, expert_ids: jax.Array, gates: jax.Array, w_gate: jax.Array,
                   w_up: jax.Array, w_down: jax.Array, tile: int, dtype,
                   exact_numerics: bool = True, live_only: bool = False) -> jax.Array:
  """out[n] = sum_j gates[n, j] * SwiGLU_{expert_ids[n, j]}(x[n]).

  Args:
    x: [N, d] token activations.
    expert_ids: [N, k] int32 chosen experts per token.
    gates: [N, k] fp32 combine weights.
    w_gate, w_up: [E, d, f]; w_down: [E, f, d] stacked expert weights.
    tile: the most rows per expert tile (`tile_rows` picks this call's).
    dtype: matmul input dtype.
    exact_numerics: False evaluates all tiles as one batched (vmapped) dot: the inexact fast mode.
    live_only: run only the tiles that hold rows (not differentiable in reverse mode: the
      sampling forward). The bits are the same either way.
  Returns:
    [N, d] fp32.
  """
  n, k = expert_ids.shape
  num_experts, d, f = w_gate.shape
  num_assign = n * k
  tile = tile_rows(num_assign, num_experts, tile, max(d, f))
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

  buf_rows = buffer_rows(num_assign, num_experts, tile)
  num_tiles = buf_rows // tile
  # Row index into x for each buffer row; n points at an appended zero row (padding).
  buf_token = jnp.full((buf_rows,), n, jnp.int32).at[dest].set(flat_token)
  x_pad = jnp.concatenate([x, jnp.zeros((1, d), x.dtype)])
  tile_start = jnp.arange(num_tiles, dtype=jnp.int32) * tile
  tile_expert = jnp.minimum(jnp.searchsorted(padded_end, tile_start, side="right"),
                            num_experts - 1).astype(jnp.int32)

  def expert_tile(args):
    xt, e = args
    dense = lambda a, w: exact.dense(a, w, dtype, exact_numerics)
    h = jax.nn.silu(dense(xt, w_gate[e])) * dense(xt, w_up[e])
    return dense(h, w_down[e])

  if exact_numerics and live_only:
    def one(i, y):
      rows = lax.dynamic_slice_in_dim(buf_token, i * tile, tile)
      return lax.dynamic_update_slice_in_dim(y, expert_tile((x_pad[rows], tile_expert[i])),
                                             i * tile, 0)
    y_buf = lax.fori_loop(0, padded_end[-1] // tile, one,
                          jnp.zeros((buf_rows, d), jnp.float32))
  else:
    tiles = (x_pad[buf_token].reshape(num_tiles, tile, d), tile_expert)
    y_buf = (lax.map(expert_tile, tiles) if exact_numerics
             else jax.vmap(expert_tile)(tiles)).reshape(buf_rows, d)
  y = y_buf[dest].reshape(n, k, d)
  out = gates[:, 0, None] * y[:, 0]
  for j in range(1, k):  # fixed combine order
    out = out + gates[:, j, None] * y[:, j]
  return out
