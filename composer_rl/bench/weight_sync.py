"""Weight-sync benchmark: how sparse are RL updates in bf16, and what does shipping only the
delta save? Prints one JSON object.

  python -m composer_rl.bench.weight_sync                 # tiny + ~125M-parameter config
  python -m composer_rl.bench.weight_sync --sizes=tiny --steps=2
  python -m composer_rl.bench.weight_sync --sizes=1b --steps=2 --lrs=1e-6  # accelerator

For each size and learning rate (1e-6, 3e-6, 1e-5) it runs real RL steps (sample with the
Sampler, a verifiable reward, group-normalized advantages, policy-gradient loss through
`score_tokens`, AdamW), publishes every step's bf16 inference copy, and records the fraction
of values whose bits changed and full bytes / delta bytes (raw, and on disk after zstd). At
1e-6 it times publish + subscriber read/apply/verify against a full Orbax save + restore of
the same inference copy, and checks the subscriber's weights against the trainer's, bit for
bit.
"""
import json
import os
import shutil
import tempfile
import time

from absl import app, flags

import composer_rl  # noqa: F401
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx

from composer_rl.model import ModelConfig, Transformer, get_preset, inference_copy
from composer_rl.sampling.head import RowSampling
from composer_rl.sampling.sampler import Sampler, SamplingConfig
from composer_rl.sync import codec
from composer_rl.sync.publisher import WeightPublisher
from composer_rl.sync.subscriber import WeightSubscriber
from composer_rl.train.scoring import score_tokens

_SIZES = flags.DEFINE_string("sizes", "tiny,125m", "Comma list of: tiny, 125m, 1b.")
_LRS = flags.DEFINE_string("lrs", "1e-6,3e-6,1e-5", "Learning rates.")
_STEPS = flags.DEFINE_integer("steps", 3, "RL steps per learning rate.")
_SYNTH = flags.DEFINE_float(
    "synthetic_params", 0, "If > 0, also time the I/O path on a bf16 tree of this many "
    "parameters whose values change at --synthetic_fraction per step (a synthetic update "
    "pattern: shows how publish+apply vs full save+restore scales with model size).")
_SYNTH_FRACTION = flags.DEFINE_float("synthetic_fraction", 0.0175,
                                     "changed share per step (default: 125m at lr 1e-6)")

# ~125M parameters: 12 layers, d 768, vocab 32000 (untied).
_CONFIGS = {
    "tiny": get_preset("tiny"),
    "125m": ModelConfig(vocab_size=32000, d_model=768, num_layers=12, num_heads=12,
                        num_kv_heads=4, head_dim=64, d_ff=2048, max_seq_len=64,
                        exact_numerics=False),  # inexact: only the update sizes matter here
    # ~0.98B (the dense_1b preset), short cache: the RL batch is 24 tokens.
    "1b": get_preset("dense_1b", max_seq_len=64, attention_key_block=0, exact_numerics=False),
}


def _dir_bytes(path):
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def _rl_step_fn(graphdef, tx):
  @jax.jit
  def step(params, opt_state, tokens, segs, mask, adv, rows):
    def loss(p):
      s = score_tokens(nnx.merge(graphdef, p), tokens, rows, segs)
      return -jnp.sum(s.logprobs * mask * adv[:, None]) / jnp.maximum(jnp.sum(mask), 1.0)
    grads = jax.grad(loss)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state
  return step


def _rl_batch(sampler, cfg, step, group=8, prompt_len=8, new=16):
  """One group of samples of one prompt; reward = fraction of even token ids."""
  rng = np.random.default_rng(step)
  prompt = rng.integers(1, cfg.vocab_size, prompt_len).tolist()
  samples = sampler.generate([prompt] * group, list(range(group)),
                             SamplingConfig(max_new_tokens=new, seed=step))
  rewards = np.array([np.mean(np.asarray(s.tokens) % 2 == 0) for s in samples], np.float32)
  adv = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
  tokens = np.array([prompt + s.tokens for s in samples], np.int32)
  mask = np.zeros((group, tokens.shape[1] - 1), np.float32)
  mask[:, prompt_len - 1:] = 1.0
  return tokens, np.ones_like(tokens), mask, adv


def _measure(name, cfg, lrs, steps, tmp):
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  graphdef, init = nnx.split(model)
  n_params = int(sum(x.size for x in jax.tree.leaves(init)))
  rows = RowSampling.broadcast(8)
  out = dict(params=n_params, lr={})
  for lr in lrs:
    tx = optax.adamw(lr, weight_decay=0.0)
    params, opt_state = init, tx.init(init)
    step_fn = _rl_step_fn(graphdef, tx)
    root = os.path.join(tmp, f"{name}-{lr}")
    pub = WeightPublisher(root, anchor_every=1000)
    anchor = pub.publish(inference_copy(params, cfg))
    sub = WeightSubscriber(root, inference_copy(params, cfg))
    sub.poll()
    fractions, ratios, disk_ratios, pub_s, apply_s = [], [], [], [], []
    copy = None
    for k in range(steps):
      sampler = Sampler(nnx.merge(graphdef, params))
      batch = _rl_batch(sampler, cfg, k)
      params, opt_state = step_fn(params, opt_state, *batch, rows)
      prev, copy = copy if k else None, jax.block_until_ready(inference_copy(params, cfg))
      t0 = time.perf_counter()
      m = pub.publish(copy)
      pub_s.append(time.perf_counter() - t0)
      t0 = time.perf_counter()
      sub.poll()
      jax.block_until_ready(jax.tree.leaves(sub.params))
      apply_s.append(time.perf_counter() - t0)
      fractions.append(m["changed"] / m["total"])
      ratios.append(m["full_bytes"] / max(m["payload_bytes"], 1))
      disk_ratios.append(_dir_bytes(os.path.join(root, f"v{0:08d}"))
                         / _dir_bytes(os.path.join(root, f"v{m['version']:08d}")))
    final = inference_copy(params, cfg)
    exact = all(np.array_equal(codec.bits_of(a), codec.bits_of(b)) for a, b in
                zip(jax.tree.leaves(sub.params), jax.tree.leaves(final)))
    entry = dict(fraction_changed_per_step=float(np.mean(fractions)),
                 full_over_delta_bytes=float(np.mean(ratios)),
                 full_over_delta_on_disk=float(np.mean(disk_ratios)),
                 # the first step's apply includes compiling the scatter: report steady state
                 publish_seconds=float(np.median(pub_s[1:] or pub_s)),
                 read_apply_seconds=float(np.median(apply_s[1:] or apply_s)),
                 exact=bool(exact), full_anchor_bytes=anchor["full_bytes"])
    if lr == lrs[0] and prev is not None:
      # The floor of any delta path: read both copies to find what changed (the jitted
      # bit compare, the packed mask to the host, the changed positions from it).
      t0 = time.perf_counter()
      for a, b in zip(codec.flatten_device(prev).values(), codec.flatten_device(copy).values()):
        codec.mask_positions(np.asarray(codec.changed_mask(a, b)), b.size)
      entry["change_detection_seconds"] = time.perf_counter() - t0
      # baseline: a full Orbax save + restore of the same inference copy
      full_s = _full_save_restore(final, os.path.join(tmp, f"{name}-full"))
      entry["full_save_restore_seconds"] = full_s
      entry["full_over_delta_seconds"] = full_s / (entry["publish_seconds"]
                                                   + entry["read_apply_seconds"])
    out["lr"][f"{lr:g}"] = entry
    shutil.rmtree(root, ignore_errors=True)
  return out


def _full_save_restore(tree, path) -> float:
  t0 = time.perf_counter()
  with ocp.StandardCheckpointer() as c:
    c.save(path, tree)
    c.wait_until_finished()
    jax.block_until_ready(jax.tree.leaves(c.restore(path, tree)))
  return time.perf_counter() - t0


def _synthetic(n_params: float, fraction: float, tmp: str, steps: int = 3):
  """Times publish / read+apply+verify against a full save+restore on a synthetic tree."""
  leaves = 64
  per = int(n_params) // leaves
  key = jax.random.key(0)
  tree = {f"w{i:02d}": jax.random.normal(jax.random.fold_in(key, i), (per,), jnp.bfloat16)
          for i in range(leaves)}
  root = os.path.join(tmp, "synthetic")
  pub = WeightPublisher(root, anchor_every=1000)
  pub.publish(tree)
  sub = WeightSubscriber(root, tree)
  sub.poll()
  pub_s, apply_s = [], []
  for k in range(steps + 1):
    bump = jax.jit(lambda t, kk: {n: jnp.where(
        jax.random.uniform(jax.random.fold_in(kk, i), v.shape) < fraction,
        (v.astype(jnp.float32) * 1.01 + 1e-3).astype(jnp.bfloat16), v)
        for i, (n, v) in enumerate(sorted(t.items()))})
    tree = jax.block_until_ready(bump(tree, jax.random.fold_in(key, 1000 + k)))
    t0 = time.perf_counter()
    m = pub.publish(tree)
    t1 = time.perf_counter()
    sub.poll()
    jax.block_until_ready(jax.tree.leaves(sub.params))
    t2 = time.perf_counter()
    if k:  # step 0 compiles
      pub_s.append(t1 - t0)
      apply_s.append(t2 - t1)
  exact = all(np.array_equal(codec.bits_of(np.asarray(sub.params[n])),
                             codec.bits_of(np.asarray(tree[n]))) for n in tree)
  full_s = _full_save_restore(tree, os.path.join(tmp, "synthetic-full"))
  shutil.rmtree(root, ignore_errors=True)
  p, a = float(np.median(pub_s)), float(np.median(apply_s))
  return dict(params=leaves * per, fraction_changed_per_step=m["changed"] / m["total"],
              full_over_delta_bytes=m["full_bytes"] / max(m["payload_bytes"], 1),
              publish_seconds=p, read_apply_seconds=a, full_save_restore_seconds=full_s,
              full_over_delta_seconds=full_s / (p + a), exact=bool(exact))


def main(argv):
  del argv
  lrs = [float(x) for x in _LRS.value.split(",")]
  tmp = tempfile.mkdtemp(prefix="weight_sync_bench_")
  try:
    result = {name: _measure(name, _CONFIGS[name], lrs, _STEPS.value, tmp)
              for name in _SIZES.value.split(",") if name}
    if _SYNTH.value > 0:
      result["synthetic"] = _synthetic(_SYNTH.value, _SYNTH_FRACTION.value, tmp)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  result["exact"] = all(e["exact"] for r in result.values() if "lr" in r
                        for e in r["lr"].values()) and result.get(
                            "synthetic", {}).get("exact", True)
  print(json.dumps(result))


if __name__ == "__main__":
  app.run(main)
