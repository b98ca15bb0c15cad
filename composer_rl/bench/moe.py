"""The exact MoE feed-forward against plain-JAX MoEs, one layer, same run.

  python -m composer_rl.bench.moe                       # Qwen3-30B-A3B's MoE layer
  python -m composer_rl.bench.moe --tokens=1,16 --repeats=5

One MoE feed-forward (`ops.grouped.grouped_swiglu`: d_model 2048, 128 experts of d_ff
768, 8 per token, the Qwen3-30B-A3B preset) on N tokens routed at random, timed as the
sampler runs it (`live_only`: only tiles that hold rows) and as the trainer does (every
tile of the static buffer), against two plain-JAX MoEs, neither batch-invariant:
`jax.lax.ragged_dot` over the assignments sorted by expert (the dropless grouped matmul)
and the classic capacity dispatch (three batched einsums over [experts, capacity] rows,
capacity factor 1.25, drops what overflows). Prints one JSON object: per N, milliseconds
per call (median of --repeats after a warm-up), the rows each exact path computes, and the
exact paths' time over the faster baseline's; whether the two exact paths gave the same
bits (they must) and the largest difference from ragged_dot.
"""
import json
import time

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np

from composer_rl.model.config import get_preset
from composer_rl.ops import grouped

FLAGS = flags.FLAGS
flags.DEFINE_string("preset", "qwen3_30b_a3b", "model preset whose MoE layer is timed")
flags.DEFINE_string("tokens", "1,16,512", "token counts per call")
flags.DEFINE_integer("repeats", 3, "timed calls per measurement (median reported)")
# XLA:CPU converts a whole bf16 weight stack to f32 around its dots (~0.6 s per call at
# this shape, whatever the token count), so the CPU default is float32.
flags.DEFINE_string("dtype", "float32", "matmul dtype ('' = the preset's compute dtype)")


def ragged_swiglu(x, expert_ids, gates, w_gate, w_up, w_down, dtype):
  """The plain-JAX MoE: assignments sorted by expert, three `lax.ragged_dot`s."""
  n, k = expert_ids.shape
  e = w_gate.shape[0]
  flat = expert_ids.reshape(-1)
  order = jnp.argsort(flat, stable=True)
  sizes = jnp.bincount(flat, length=e).astype(jnp.int32)
  xs = jnp.repeat(x, k, axis=0)[order].astype(dtype)
  rd = lambda a, w: jax.lax.ragged_dot(a, w.astype(dtype), sizes,
                                       preferred_element_type=jnp.float32)
  h = jax.nn.silu(rd(xs, w_gate)) * rd(xs, w_up)
  y = jnp.zeros((n * k, x.shape[1]), jnp.float32).at[order].set(rd(h.astype(dtype), w_down))
  return (y.reshape(n, k, -1) * gates[..., None]).sum(1)


def capacity_swiglu(x, expert_ids, gates, w_gate, w_up, w_down, dtype,
                    capacity_factor: float = 1.25):
  """The classic dense-dispatch MoE (GShard / Switch style): every expert takes a fixed
  capacity of C = ceil(capacity_factor * assignments / experts) rows, assignments past an
  expert's capacity are dropped (so it is not the same function when routing is uneven),
  and three batched einsums run [E, C] rows."""
  n, k = expert_ids.shape
  e, d, _ = w_gate.shape
  cap = max(1, -(-int(capacity_factor * n * k) // e))
  flat = expert_ids.reshape(-1)
  onehot = jax.nn.one_hot(flat, e, dtype=jnp.int32)
  rank = ((jnp.cumsum(onehot, 0) - 1) * onehot).sum(-1)  # position within its expert
  keep = rank < cap
  slot = jnp.where(keep, flat * cap + rank, e * cap)  # dropped -> a spare row
  buf = jnp.zeros((e * cap + 1, d), dtype).at[slot].set(
      jnp.repeat(x, k, axis=0).astype(dtype))[:-1].reshape(e, cap, d)
  ein = lambda eq, a, w: jnp.einsum(eq, a, w.astype(dtype), preferred_element_type=jnp.float32)
  h = jax.nn.silu(ein("ecd,edf->ecf", buf, w_gate)) * ein("ecd,edf->ecf", buf, w_up)
  y = ein("ecf,efd->ecd", h.astype(dtype), w_down).reshape(e * cap, d)
  y = jnp.where(keep[:, None], jnp.concatenate([y, jnp.zeros((1, d))])[slot], 0.0)
  return (y.reshape(n, k, d) * gates[..., None]).sum(1)


def _time(fn, args, repeats):
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return 1e3 * float(np.median(times))


def run(preset: str, tokens, repeats: int, dtype: str = ""):
  cfg = get_preset(preset)
  dt = jnp.dtype(dtype) if dtype else cfg.compute_jnp_dtype
  e, d, f, k = cfg.num_experts, cfg.d_model, cfg.moe_d_ff, cfg.experts_per_token
  rng = np.random.default_rng(0)
  w = [jnp.asarray(rng.normal(size=s).astype(np.float32) * 0.02).astype(dt)
       for s in ((e, d, f), (e, d, f), (e, f, d))]
  out = dict(preset=preset, dtype=str(jnp.dtype(dt)), d_model=d, moe_d_ff=f, experts=e,
             experts_per_token=k, max_tile=cfg.row_tile, calls={})
  same_bits = True
  for n in tokens:
    x = jnp.asarray(rng.normal(size=(n, d)).astype(np.float32))
    ids = jnp.asarray(np.stack([rng.choice(e, k, replace=False) for _ in range(n)]), jnp.int32)
    gates = jnp.asarray(rng.random((n, k)).astype(np.float32))
    args = (x, ids, gates, *w)
    exact = {live: jax.jit(lambda *a, live=live: grouped.grouped_swiglu(
        *a, tile=cfg.row_tile, dtype=dt, live_only=live)) for live in (True, False)}
    ragged = jax.jit(lambda *a: ragged_swiglu(*a, dtype=dt))
    capacity = jax.jit(lambda *a: capacity_swiglu(*a, dtype=dt))
    sample, train = exact[True](*args), exact[False](*args)
    same_bits &= bool(np.array_equal(np.asarray(sample).view(np.uint32),
                                     np.asarray(train).view(np.uint32)))
    counts = np.bincount(np.asarray(ids).ravel(), minlength=e)
    tile = grouped.tile_rows(n * k, e, cfg.row_tile, max(d, f))
    ms = {name: _time(fn, args, repeats) for name, fn in
          (("exact_sampling", exact[True]), ("exact_training", exact[False]),
           ("ragged_dot", ragged), ("capacity_dispatch", capacity))}
    fastest = min(ms["ragged_dot"], ms["capacity_dispatch"])
    out["calls"][str(n)] = dict(
        tile=tile, assignments=n * k,
        rows_sampling=int((-(-counts // tile) * tile).sum()),
        rows_training=grouped.buffer_rows(n * k, e, tile),
        ms=ms, exact_sampling_over_fastest=ms["exact_sampling"] / fastest,
        exact_training_over_fastest=ms["exact_training"] / fastest,
        max_abs_diff_vs_ragged=float(jnp.max(jnp.abs(sample - ragged(*args)))))
  out["sampling_and_training_same_bits"] = same_bits
  return out


def main(argv):
  del argv
  print(json.dumps(run(FLAGS.preset, [int(t) for t in FLAGS.tokens.split(",")],
                       FLAGS.repeats, FLAGS.dtype)))


if __name__ == "__main__":
  app.run(main)
