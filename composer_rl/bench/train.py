"""Train-step benchmark: tokens/s of the full sharded step (value_and_grad over microbatches,
deterministic gradient reduction, clip, AdamW) for the tiny model and a ~100M-parameter
model, exact vs inexact forward, on 1 and 8 (fake CPU) devices. Prints one JSON object.
Each row also carries its model FLOP/s and, on a device with a known bf16 peak, its MFU
(`composer_rl.bench.mfu`). `--sizes=1b` is the ~1B `dense_1b` preset (accelerator only:
`python -m composer_rl.bench.train --sizes=1b --devices=1 --seq_len=1024`).

  python -m composer_rl.bench.train                         # everything (< 10 min, 2 cores)
  python -m composer_rl.bench.train --sizes=tiny --devices=1  # seconds
  python -m composer_rl.bench.train --skip=   # also 100m exact on 8 devices (~19 GB RAM)

The 8-device rows run in a subprocess started with
XLA_FLAGS=--xla_force_host_platform_device_count=8 (the device count is fixed when JAX
starts). On a CPU host the 8 fake devices share the same cores, so their tokens/s measures
the overhead of the sharded program, not a speed-up.
"""
import json
import os
import subprocess
import sys
import time

from absl import app, flags

import composer_rl  # noqa: F401  (parity XLA flags)
import jax
import numpy as np

from composer_rl.bench import mfu as mfu_lib
from composer_rl.bench.plain_jax import PlainTrainStep
from composer_rl.model import sharding as shd
from composer_rl.model.config import ModelConfig, get_preset
from composer_rl.train import losses
from composer_rl.train.batch import build_batch
from composer_rl.train.optimizer import OptimizerConfig
from composer_rl.train.train_step import TrainConfig, make_train_step

SIZES = {
    # The tiny experiments' model (experiments/sft_tiny.py).
    "tiny": ModelConfig(vocab_size=264, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2,
                        head_dim=16, d_ff=128, max_seq_len=128, row_tile=16),
    # ~102M parameters: 12 layers of width 768, GQA 12/4 heads, SwiGLU 2560, vocab 8192.
    "100m": ModelConfig(vocab_size=8192, d_model=768, num_layers=12, num_heads=12,
                        num_kv_heads=4, head_dim=64, d_ff=2560, max_seq_len=128, row_tile=64),
    # ~0.98B parameters (composer_rl.model.config PRESETS["dense_1b"]).
    "1b": get_preset("dense_1b"),
    # The peer benchmark's shape (`composer_rl.bench.peer`), f32.
    "peer": ModelConfig(vocab_size=4096, d_model=256, num_layers=4, num_heads=4,
                        num_kv_heads=2, head_dim=64, d_ff=1024, max_seq_len=256,
                        compute_dtype="float32"),
}

_SIZES = flags.DEFINE_list("sizes", ["tiny", "100m"], f"model sizes: {sorted(SIZES)}")
_DEVICES = flags.DEFINE_list("devices", ["1", "8"], "device counts (8 runs in a subprocess)")
_MODES = flags.DEFINE_list(
    "modes", ["exact", "inexact", "plain"], "exact / inexact forward of our step, or 'plain': "
    "the plain-JAX PPO step of `bench.plain_jax` (whole batch, optax AdamW; 1 device only)")
_ROWS = flags.DEFINE_integer("rows", 8, "sequences per step")
_SEQ = flags.DEFINE_integer("seq_len", 128, "tokens per sequence")
_STEPS = flags.DEFINE_integer("steps", 2, "timed steps (after one compile+warm-up step)")
_REDUCE_100M = flags.DEFINE_string(
    "reduce_100m_8dev", "psum", "grad_reduce for the 100m model on 8 devices ('tree' keeps "
    "8 gradient copies per device: ~25 GB for 100M params)")
_SKIP = flags.DEFINE_list(
    "skip", ["100m/exact/8"], "size/mode/devices combinations not run. 100m/exact/8 is "
    "skipped by default: 8 fake devices each hold the gathered weights plus the exact "
    "forward's per-tile residuals, ~18.5 GB resident on CPU (OOM on a 24 GB host)")
_CHILD = flags.DEFINE_bool("child", False, "internal: run only in this process")


def _measure(size: str, mode: str, devices: int, rows: int, seq_len: int, steps: int,
             reduce: str):
  return measure(SIZES[size], size, mode, devices, rows, seq_len, steps, reduce)


def measure(model: ModelConfig, size: str, mode: str, devices: int, rows: int, seq_len: int,
            steps: int, reduce: str = "tree"):
  """One row of the benchmark: the full step of `model` (named `size` in the output) at
  rows x seq_len tokens on `devices` devices; `mode` exact / inexact numerics."""
  kb = model.attention_key_block
  mc = model.replace(exact_numerics=(mode == "exact"), max_seq_len=seq_len,
                           attention_key_block=kb if kb and seq_len % kb == 0 else 0)
  mesh = shd.make_mesh({"data": devices}, jax.devices()[:devices])
  cfg = TrainConfig(optimizer=OptimizerConfig(warmup_steps=0, total_steps=100),
                    loss=losses.LossConfig(), micro_batch_size=rows // devices,
                    grad_reduce=reduce)
  ts = make_train_step(mc, cfg, mesh)
  state = ts.init_state(0)
  rng = np.random.default_rng(0)
  recs = [dict(tokens=rng.integers(0, mc.vocab_size, seq_len).tolist(),
               loss_mask=[0] * (seq_len // 4) + [1] * (seq_len - seq_len // 4),
               logprobs=(-rng.random(seq_len) * 3).tolist()) for _ in range(rows)]
  batch = build_batch(recs, seq_len, advantages=rng.normal(size=rows))
  if mode == "plain":
    plain = PlainTrainStep(mc, state.params)
    args = (batch.tokens, batch.loss_mask, batch.behaviour_logprobs, batch.advantages)
    run = lambda: {"loss": plain.step(*args)}
  else:
    batch = ts.shard_batch(batch)

    def run():
      nonlocal state
      state, m = ts.step(state, batch)
      return jax.block_until_ready(m)
  t = time.perf_counter()
  m = run()
  compile_s = time.perf_counter() - t
  times = []
  for _ in range(steps):
    t = time.perf_counter()
    m = run()
    times.append(time.perf_counter() - t)
  params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state.params))
  best = min(times)
  kind = jax.devices()[0].device_kind
  return dict(size=size, params=params, mode=mode, devices=devices, grad_reduce=reduce,
              rows=rows, seq_len=seq_len, step_s=round(best, 4),
              tokens_per_s=round(rows * seq_len / best, 1),
              first_step_s=round(compile_s, 2), loss=float(m["loss"]), device_kind=kind,
              **mfu_lib.mfu(mc, seq_len, rows * seq_len / best, kind, devices))


def _rows(devices: int):
  """Every (size, mode) measured on the first `devices` devices of this process."""
  out = []
  for size in _SIZES.value:
    for mode in _MODES.value:
      if f"{size}/{mode}/{devices}" in _SKIP.value or (mode == "plain" and devices > 1):
        continue
      reduce = _REDUCE_100M.value if (size == "100m" and devices > 1) else "tree"
      out.append(_measure(size, mode, devices, _ROWS.value, _SEQ.value, _STEPS.value, reduce))
      print(json.dumps(out[-1]), file=sys.stderr, flush=True)
  return out


def main(_):
  if _CHILD.value:
    print(json.dumps(_rows(jax.device_count())))  # the parent reads the last stdout line
    return
  results = []
  for d in [int(x) for x in _DEVICES.value]:
    if d <= jax.device_count():  # this process has enough devices
      results += _rows(d)
      continue
    env = dict(os.environ)
    env["XLA_FLAGS"] = (" ".join(f for f in env.get("XLA_FLAGS", "").split()
                                 if "device_count" not in f)
                        + f" --xla_force_host_platform_device_count={d}").strip()
    args = [a for a in sys.argv[1:] if not a.startswith("--devices")]
    out = subprocess.run([sys.executable, "-m", "composer_rl.bench.train", "--child", *args],
                         env=env, capture_output=True, text=True)
    if out.returncode:
      raise RuntimeError(f"{d}-device child failed:\n{out.stderr[-3000:]}")
    sys.stderr.write(out.stderr)
    results += json.loads(out.stdout.strip().splitlines()[-1])
  by = {(r["size"], r["mode"], r["devices"]): r["tokens_per_s"] for r in results}
  ratios = {f"{s}/{d}dev exact_vs_{base}": round(by[(s, "exact", d)] / by[(s, base, d)], 3)
            for (s, m, d) in by for base in ("inexact", "plain")
            if m == "exact" and (s, base, d) in by}
  print(json.dumps(dict(bench="train_step", host_cpus=os.cpu_count(),
                        jax=jax.__version__, results=results, exact_over_inexact=ratios)))


if __name__ == "__main__":
  app.run(main)
