"""Sampler and train-step benchmark: what exactness costs. Prints one JSON object.

  python -m composer_rl.bench.sampler                  # d_model-512 dense model (default)
  python -m composer_rl.bench.sampler --preset=tiny --batch_sizes=1,8 --new_tokens=16

For each batch size: prefill and decode tokens/s of the exact sampler, of the same engine
with exactness off (`exact_numerics=False`, labelled inexact, with its measured parity
mismatch), and of a no-KV-cache baseline that re-runs the full forward every step. Then the
train step (value_and_grad + AdamW) time, exact / inexact. All numbers come from one run on
the same machine, so the ratios are the result; absolute numbers depend on the host.
"""
import json
import time

from absl import app, flags

import composer_rl  # noqa: F401  (parity XLA flags)
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from composer_rl.model import KVCache, Transformer, get_preset
from composer_rl.parity.suite import run_suite
from composer_rl.sampling import head as head_lib
from composer_rl.sampling.sampler import SamplingConfig
from composer_rl.train.scoring import score_tokens

_PRESET = flags.DEFINE_string("preset", "parity_512", "Model preset (composer_rl.model.config).")
_BATCH = flags.DEFINE_string("batch_sizes", "1,8,64", "Decode batch sizes.")
_PROMPT = flags.DEFINE_integer("prompt_len", 64, "Prompt length for prefill.")
_NEW = flags.DEFINE_integer("new_tokens", 32, "Decode steps timed per measurement.")
_TRAIN_BATCH = flags.DEFINE_integer("train_batch", 8, "Sequences per train step.")
_TRAIN_LEN = flags.DEFINE_integer("train_len", 128, "Tokens per training sequence.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed repetitions (best is reported).")
_TILE = flags.DEFINE_integer("row_tile", None, "Override the preset's MoE row tile.")
_PARITY_PROMPTS = flags.DEFINE_integer(
    "parity_prompts", 8, "Prompts of the parity mismatch check (each generated at batch 1, "
    "so this bounds its time: the CPU dry run of launch/device_check.py uses 2).")


def _best(fn, repeats):
  jax.block_until_ready(fn())  # compile + warm up
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t)
  return min(times)


def _engine_numbers(cfg, batch, prompt_len, new_tokens, repeats):
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(model)
  rows = head_lib.RowSampling.broadcast(batch)
  tokens = jax.random.randint(jax.random.key(0), (batch, prompt_len), 1, cfg.vocab_size)
  positions = jnp.broadcast_to(jnp.arange(prompt_len), (batch, prompt_len))

  @jax.jit
  def prefill(state, tokens):
    m = nnx.merge(graphdef, state)
    out = m.forward(tokens, positions, KVCache.init(cfg, batch), jnp.zeros((batch,), jnp.int32))
    return out.hidden[:, -1], out.cache

  def sample(m, hidden, pos):
    keys = head_lib.token_keys(0, jnp.arange(batch), pos)
    return head_lib.token_head(m.logits, hidden, keys, jnp.full((batch,), -1), rows)

  @jax.jit
  def decode(state, hidden, cache):
    m = nnx.merge(graphdef, state)

    def step(carry, i):
      hidden, cache = carry
      slot = jnp.full((batch,), prompt_len, jnp.int32) + i
      nxt = sample(m, hidden, slot)
      out = m.forward(nxt.tokens[:, None], slot[:, None], cache, slot)
      return (out.hidden[:, 0], out.cache), nxt.tokens
    return jax.lax.scan(step, (hidden, cache), jnp.arange(new_tokens))[1]

  total = prompt_len + new_tokens

  @jax.jit
  def no_cache(state, tokens):
    """Baseline: every step re-runs the full forward over the (padded) sequence so far."""
    m = nnx.merge(graphdef, state)
    seq = jnp.zeros((batch, total), jnp.int32).at[:, :prompt_len].set(tokens)
    pos = jnp.broadcast_to(jnp.arange(total), (batch, total))

    def step(seq, i):
      cur = prompt_len + i
      segs = (jnp.arange(total)[None] < cur).astype(jnp.int32) * jnp.ones((batch, 1), jnp.int32)
      out = m.forward(seq, pos, KVCache.init(cfg, batch), jnp.zeros((batch,), jnp.int32), segs)
      hidden = jax.lax.dynamic_index_in_dim(out.hidden, cur - 1, 1, keepdims=False)
      nxt = sample(m, hidden, jnp.full((batch,), cur))
      return seq.at[:, cur].set(nxt.tokens), None
    return jax.lax.scan(step, seq, jnp.arange(new_tokens))[0]

  t_prefill = _best(lambda: prefill(state, tokens), repeats)
  hidden, cache = prefill(state, tokens)
  t_decode = _best(lambda: decode(state, hidden, cache), repeats)
  t_nocache = _best(lambda: no_cache(state, tokens), max(1, repeats - 2))
  return dict(prefill_tokens_per_s=batch * prompt_len / t_prefill,
              decode_tokens_per_s=batch * new_tokens / t_decode,
              no_kv_cache_tokens_per_s=batch * new_tokens / t_nocache)


def _train_step_seconds(cfg, batch, length, repeats):
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(model)
  params = state
  tx = optax.adamw(1e-5)
  opt_state = tx.init(params)
  tokens = jax.random.randint(jax.random.key(1), (batch, length), 1, cfg.vocab_size)
  adv = jax.random.normal(jax.random.key(2), (batch, 1))
  rows = head_lib.RowSampling.broadcast(batch)

  @jax.jit
  def step(params, opt_state):
    def loss(p):
      s = score_tokens(nnx.merge(graphdef, p), tokens, rows)
      return -jnp.mean(s.logprobs * adv)
    value, grads = jax.value_and_grad(loss)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, value

  return _best(lambda: step(params, opt_state), repeats)


def _mismatch(cfg, seed=0):
  report = run_suite([cfg], SamplingConfig(max_new_tokens=16, seed=seed),
                     num_prompts=_PARITY_PROMPTS.value,
                     prompt_len_range=(4, 40), batch_sizes=[1], prefill_chunks=[None],
                     prompt_buckets=[16], train_batch_sizes=[8], num_devices=[], seed=seed)
  return dict(tokens=report["tokens"], mismatched_tokens=report["mismatched_tokens"],
              max_abs_diff=report["max_abs_diff"])


def main(argv):
  del argv
  exact_cfg = get_preset(_PRESET.value, max_seq_len=max(256, _PROMPT.value + _NEW.value,
                                                        _TRAIN_LEN.value))
  if _TILE.value:
    exact_cfg = exact_cfg.replace(row_tile=_TILE.value)
  fast_cfg = exact_cfg.replace(exact_numerics=False)
  result = dict(preset=_PRESET.value, row_tile=exact_cfg.row_tile,
                attention_key_block=exact_cfg.key_block,
                backend=jax.default_backend(),
                devices=jax.device_count(), prompt_len=_PROMPT.value, new_tokens=_NEW.value,
                sampler={})
  for b in [int(x) for x in _BATCH.value.split(",")]:
    exact = _engine_numbers(exact_cfg, b, _PROMPT.value, _NEW.value, _REPEATS.value)
    fast = _engine_numbers(fast_cfg, b, _PROMPT.value, _NEW.value, _REPEATS.value)
    result["sampler"][f"batch_{b}"] = dict(
        exact=exact, inexact_fast_mode=fast,
        decode_cost_of_exactness=fast["decode_tokens_per_s"] / exact["decode_tokens_per_s"],
        prefill_cost_of_exactness=fast["prefill_tokens_per_s"] / exact["prefill_tokens_per_s"],
        exact_decode_speedup_vs_no_kv_cache=(exact["decode_tokens_per_s"]
                                             / exact["no_kv_cache_tokens_per_s"]))
  t_exact = _train_step_seconds(exact_cfg, _TRAIN_BATCH.value, _TRAIN_LEN.value, _REPEATS.value)
  t_fast = _train_step_seconds(fast_cfg, _TRAIN_BATCH.value, _TRAIN_LEN.value, _REPEATS.value)
  result["train_step"] = dict(batch=_TRAIN_BATCH.value, length=_TRAIN_LEN.value,
                              exact_seconds=t_exact, inexact_seconds=t_fast,
                              exact_over_inexact=t_exact / t_fast)
  result["parity"] = dict(exact=_mismatch(exact_cfg.replace(compute_dtype="float32")),
                          inexact_fast_mode=_mismatch(fast_cfg.replace(compute_dtype="float32")))
  print(json.dumps(result))


if __name__ == "__main__":
  app.run(main)
