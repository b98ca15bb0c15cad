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
* fast: plain JAX, whole-batch matmuls, `jax.nn.dot_product_attention` over the cache, the
  whole decode loop in one `lax.fori_loop` on device, argmax sampling, no log-probs kept:
  the plainest fast sampler (`FastSampler` below), same weights as the exact model.
* tunix: `composer_rl.bench.peer_tunix` (optional extra `.[peer]`; see its docstring).
"""
import json
import time

from absl import app, flags

import composer_rl  # noqa: F401  (parity XLA flags, as for every composer_rl program)
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from composer_rl.bench import peer_tunix
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
F32 = jnp.float32


class FastSampler:
  """Plain-JAX greedy generation over the same weights (no exactness, no log-probs)."""

  def __init__(self, config: ModelConfig, params, max_len: int):
    self.c, self.max_len = config, max_len
    p = nnx.to_pure_dict(params)
    self.w = jax.tree.map(lambda x: jnp.asarray(x, F32), p)
    self._run = jax.jit(self._generate, static_argnums=(2,))

  def _layer(self, blk, x, pos, k_cache, v_cache, start, mask):
    c = self.c
    a = blk["attn"]
    norm = lambda v, s: v * jax.lax.rsqrt(jnp.mean(v * v, -1, keepdims=True) + c.norm_eps) * s
    b, s, _ = x.shape
    h = norm(x, a["norm"])
    q = (h @ a["wq"]).reshape(b, s, c.num_heads, c.head_dim)
    k = (h @ a["wk"]).reshape(b, s, c.num_kv_heads, c.head_dim)
    v = (h @ a["wv"]).reshape(b, s, c.num_kv_heads, c.head_dim)
    if c.qk_norm:
      q, k = norm(q, a["q_norm"]), norm(k, a["k_norm"])
    half = c.head_dim // 2
    freq = 1.0 / (c.rope_theta ** (jnp.arange(half, dtype=F32) * 2.0 / c.head_dim))
    ang = pos[..., None].astype(F32) * freq
    cos, sin = jnp.cos(ang)[:, :, None], jnp.sin(ang)[:, :, None]
    rot = lambda t: jnp.concatenate([t[..., :half] * cos - t[..., half:] * sin,
                                     t[..., half:] * cos + t[..., :half] * sin], -1)
    q, k = rot(q), rot(k)
    k_cache = jax.lax.dynamic_update_slice_in_dim(k_cache, k, start, 1)
    v_cache = jax.lax.dynamic_update_slice_in_dim(v_cache, v, start, 1)
    att = jax.nn.dot_product_attention(q, k_cache, v_cache, mask=mask, implementation="xla")
    x = x + att.reshape(b, s, -1) @ a["wo"]
    f = blk["ffn"]
    h = norm(x, f["norm"])
    return x + (jax.nn.silu(h @ f["w_gate"]) * (h @ f["w_up"])) @ f["w_down"], k_cache, v_cache

  def _forward(self, w, tokens, start, caches):
    """tokens [B, S] at positions start.. -> last logits, new caches."""
    b, s = tokens.shape
    x = w["embed"][tokens]
    pos = start + jnp.broadcast_to(jnp.arange(s), (b, s))
    keys = jnp.arange(self.max_len)
    mask = (keys[None, :] <= pos[0][:, None])[None, None]  # [1, 1, S, L]
    new = []
    for i, (kc, vc) in enumerate(caches):
      x, kc, vc = self._layer(w["blocks"][i], x, pos, kc, vc, start, mask)
      new.append((kc, vc))
    h = x[:, -1]
    h = h * jax.lax.rsqrt(jnp.mean(h * h, -1, keepdims=True) + self.c.norm_eps) * \
        w["final_norm"]
    head = w["embed"].T if self.c.tie_embeddings else w["lm_head"]
    return h @ head, new

  def _generate(self, w, prompts, new_tokens):
    c, (b, p) = self.c, prompts.shape
    shape = (b, self.max_len, c.num_kv_heads, c.head_dim)
    caches = [(jnp.zeros(shape, F32), jnp.zeros(shape, F32)) for _ in range(c.num_layers)]
    logits, caches = self._forward(w, prompts, 0, caches)
    out = jnp.zeros((b, new_tokens), jnp.int32).at[:, 0].set(jnp.argmax(logits, -1))

    def step(i, carry):
      out, caches = carry
      last = jax.lax.dynamic_slice_in_dim(out, i - 1, 1, 1)
      logits, caches = self._forward(w, last, p + i - 1, caches)
      return out.at[:, i].set(jnp.argmax(logits, -1).astype(jnp.int32)), caches

    out, _ = jax.lax.fori_loop(1, new_tokens, step, (out, caches))
    return out

  def generate(self, prompts: np.ndarray, new_tokens: int) -> np.ndarray:
    return np.asarray(self._run(self.w, jnp.asarray(prompts, jnp.int32), new_tokens))


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
                       max_seq_len=_PROMPT.value + new, compute_dtype="float32")
  with_tunix = _TUNIX.value and peer_tunix.available()
  result = dict(shape=dict(vocab_size=config.vocab_size, d_model=config.d_model,
                           num_layers=config.num_layers, num_heads=config.num_heads,
                           num_kv_heads=config.num_kv_heads, head_dim=config.head_dim,
                           d_ff=config.d_ff, prompt_len=_PROMPT.value, new_tokens=new,
                           dtype="float32"),
                tunix=with_tunix, devices=jax.device_count(), batch={})
  for b in [int(x) for x in _BATCH.value.split(",")]:
    result["batch"][str(b)] = measure(config, b, _PROMPT.value, new, _REPEATS.value,
                                      with_tunix)
  print(json.dumps(result))


if __name__ == "__main__":
  app.run(main)
