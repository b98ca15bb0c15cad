"""Peer benchmark: generated tokens/s of the exact Engine, the fastest plain-JAX sampler we
can write, and (when importable) google-tunix's vanilla Sampler. Prints one JSON object.

  python -m composer_rl.bench.peer                       # batch 1, 8, 64 at the default shape
  python -m composer_rl.bench.peer --batch_sizes=8 --repeats=5 --d_model=512

The shape (flags): a Qwen3-style decoder, f32, random weights; B prompts of `prompt_len`
random tokens, `new_tokens` generated greedily for each (prefill + decode counted). Per batch
size the three samplers run in alternation, `repeats` times each after a warm-up call, in
one process on the same cores; the best time of each is reported, and the ratios.

* exact: `composer_rl.sampling.engine.Engine` as the rollout runner drives it: the prompts
  prefilled in one batch (`prefill_many`), inserted into slots, decoded on device by
  `generate_many` with per-slot budgets and a stop token. Every token's log-prob is the
  trainer's, bit for bit.
* fast: `composer_rl.bench.plain_jax.FastSampler`: whole-batch matmuls,
  `jax.nn.dot_product_attention` over the cache, the whole decode loop in one
  `lax.fori_loop` on device, argmax sampling, no log-probs kept; same weights.
* tunix: `composer_rl.bench.peer_tunix` (optional extra `.[peer]`; see its docstring).
"""
import json
import time

from absl import app, flags

import composer_rl  # noqa: F401  (parity XLA flags, as for every composer_rl program)
import jax
import numpy as np
from flax import nnx

from composer_rl.bench import peer_tunix
from composer_rl.bench.plain_jax import FastSampler
from composer_rl.model import ModelConfig, Transformer
from composer_rl.sampling.engine import Engine, Request

_BATCH = flags.DEFINE_string("batch_sizes", "1,8,64", "Comma-separated batch sizes.")
_VOCAB = flags.DEFINE_integer("vocab_size", 4096, "Vocabulary size.")
_D = flags.DEFINE_integer("d_model", 256, "Model width.")
_LAYERS = flags.DEFINE_integer("num_layers", 4, "Layers.")
_HEADS = flags.DEFINE_integer("num_heads", 4, "Query heads.")
_KV = flags.DEFINE_integer("num_kv_heads", 2, "Key/value heads.")
_HEAD_DIM = flags.DEFINE_integer("head_dim", 64, "Head width.")
_FF = flags.DEFINE_integer("d_ff", 1024, "SwiGLU hidden width.")
_PROMPT = flags.DEFINE_integer("prompt_len", 128, "Prompt tokens per sequence.")
_NEW = flags.DEFINE_integer("new_tokens", 128, "Generated tokens per sequence.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed calls per sampler and batch size.")
_TUNIX = flags.DEFINE_bool("tunix", True, "Include tunix when it is importable.")
_UNROLL = flags.DEFINE_integer("layer_unroll", 1, "The exact model's layers per loop "
                               "iteration (ModelConfig.layer_unroll).")


def _exact_fn(engine: Engine, prompts: np.ndarray, new_tokens: int):
  def run():
    params, b = engine.params, len(prompts)
    state = engine.init_decode_state()
    prefixes = engine.prefill_many(params=params, items=[
        (p, Request(seq_id=i, top_k=1), None) for i, p in enumerate(prompts)])
    for i, p in enumerate(prefixes):
      state = engine.insert(p, state, i)
    state, out = engine.generate_many(params, state, [new_tokens - 1] * b, -1, new_tokens - 1)
    tokens = np.concatenate([np.asarray([[int(p.token)] for p in prefixes]),
                             np.asarray(out.tokens).T], 1)
    return tokens.size
  return run


def _timed(fn, times):
  t = time.perf_counter()
  n = fn()
  times.append((time.perf_counter() - t, n))


def measure(config: ModelConfig, batch: int, prompt_len: int, new_tokens: int, repeats: int,
            with_tunix: bool) -> dict:
  model = Transformer(config, rngs=nnx.Rngs(0))
  prompts = np.random.default_rng(batch).integers(1, config.vocab_size, (batch, prompt_len))
  engine = Engine(model, slots=batch, prefill_chunk=prompt_len)
  fast = FastSampler(config, engine.params, prompt_len + new_tokens)
  runs = {"exact": _exact_fn(engine, prompts, new_tokens),
          "fast": lambda: fast.generate(prompts, new_tokens).size}
  if with_tunix:
    runs["tunix"] = peer_tunix.make_tunix_generate(
        vocab_size=config.vocab_size, d_model=config.d_model, num_layers=config.num_layers,
        num_heads=config.num_heads, num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim, d_ff=config.d_ff, batch=batch, prompt_len=prompt_len,
        new_tokens=new_tokens)
  for fn in runs.values():  # compile and warm up
    fn()
  times = {k: [] for k in runs}
  for _ in range(repeats):  # alternate, so a busy moment hits every sampler alike
    for k, fn in runs.items():
      _timed(fn, times[k])
  out = {}
  for k, ts in times.items():
    sec, n = min(ts)
    out[f"{k}_tokens_per_s"] = round(n / sec, 1)
  out["exact_over_fast"] = round(out["exact_tokens_per_s"] / out["fast_tokens_per_s"], 3)
  if "tunix_tokens_per_s" in out:
    out["exact_over_tunix"] = round(out["exact_tokens_per_s"] / out["tunix_tokens_per_s"], 3)
  return out


def main(argv):
  del argv
  new = _NEW.value
  config = ModelConfig(vocab_size=_VOCAB.value, d_model=_D.value, num_layers=_LAYERS.value,
                       num_heads=_HEADS.value, num_kv_heads=_KV.value,
                       head_dim=_HEAD_DIM.value, d_ff=_FF.value,
                       max_seq_len=_PROMPT.value + new, compute_dtype="float32",
                       layer_unroll=_UNROLL.value)
  with_tunix = _TUNIX.value and peer_tunix.available()
  result = dict(shape=dict(vocab_size=config.vocab_size, d_model=config.d_model,
                           num_layers=config.num_layers, num_heads=config.num_heads,
                           num_kv_heads=config.num_kv_heads, head_dim=config.head_dim,
                           d_ff=config.d_ff, prompt_len=_PROMPT.value, new_tokens=new,
                           dtype="float32", layer_unroll=config.layer_unroll),
                tunix=with_tunix, devices=jax.device_count(), batch={})
  for b in [int(x) for x in _BATCH.value.split(",")]:
    result["batch"][str(b)] = measure(config, b, _PROMPT.value, new, _REPEATS.value,
                                      with_tunix)
  print(json.dumps(result))


if __name__ == "__main__":
  app.run(main)
