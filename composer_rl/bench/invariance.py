"""Which matmul shapes give a row the same bits whatever the row count: the measurement
behind `composer_rl.ops.exact` (CONTRACTION_CHUNK, MIN_ROWS, MIN_COLS). Prints one JSON
object: for each (contraction K, output columns N), the row counts M whose first rows differ
from the same rows computed in a call of 8 rows.

  python -m composer_rl.bench.invariance
  XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m composer_rl.bench.invariance
  python -m composer_rl.bench.invariance --contractions=128,256 --columns=8,16,64 --max_rows=2100

Run it on a new jaxlib (or another CPU) before trusting the constants there; the parity
suite (`launch/parity.py`) is the end-to-end proof.
"""
import json

from absl import app, flags

import composer_rl  # noqa: F401  (parity XLA flags)
import jax
import jax.numpy as jnp
import numpy as np

_K = flags.DEFINE_string("contractions", "64,128,256", "Contraction widths K.")
_N = flags.DEFINE_string("columns", "8,16,64,512,2048", "Output columns N.")
_MAX_ROWS = flags.DEFINE_integer("max_rows", 1200, "Largest row count M tried.")
_STEP = flags.DEFINE_integer("step", 7, "Row counts tried: 1..7, then 8, 8 + step, ...")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Matmul input dtype.")


def differing_row_counts(k: int, n: int, rows, dtype) -> list:
  """Row counts M whose first min(M, 8) rows differ from an 8-row call's, as bits."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((max(rows), k)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((k, n)) * 0.05, jnp.float32)
  f = jax.jit(lambda x: jnp.dot(x.astype(dtype), w.astype(dtype),
                                preferred_element_type=jnp.float32)[:8])
  ref = np.asarray(f(x[:8])).view(np.uint32)
  return [m for m in rows
          if not (np.asarray(f(x[:m])).view(np.uint32) == ref[:min(m, 8)]).all()]


def main(argv):
  del argv
  rows = list(range(1, 8)) + list(range(8, _MAX_ROWS.value + 1, _STEP.value))
  dtype = jnp.dtype(_DTYPE.value)
  out = dict(devices=jax.device_count(), dtype=_DTYPE.value, rows_tried=len(rows),
             max_rows=_MAX_ROWS.value, differing={})
  for k in [int(v) for v in _K.value.split(",")]:
    for n in [int(v) for v in _N.value.split(",")]:
      out["differing"][f"K={k},N={n}"] = differing_row_counts(k, n, rows, dtype)
  print(json.dumps(out))


if __name__ == "__main__":
  app.run(main)
