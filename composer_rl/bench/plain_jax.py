"""The fastest plain-JAX baselines we can write for the model's shape: a greedy sampler and
an RL train step. No exactness, no log-prob bookkeeping beyond what the job needs: whole-batch
matmuls, `jax.nn.dot_product_attention`, the decode loop in one `lax.fori_loop`, one
`value_and_grad` over the whole batch and optax's AdamW. The benchmarks measure the exact
Engine (`bench.peer`) and the exact train step (`bench.train`) against these, in one run.
"""
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from composer_rl.model import ModelConfig

F32 = jnp.float32


def _norm(c: ModelConfig, v, scale):
  return v * jax.lax.rsqrt(jnp.mean(v * v, -1, keepdims=True) + c.norm_eps) * scale


def _layer(c: ModelConfig, blk, x, pos, k_cache, v_cache, start, mask):
  """One decoder layer over x [B, S, D] at positions pos, writing its keys and values into
  the caches [B, L, G, hd] at `start` (caches None: attend to its own keys only, causally;
  the train step); mask [1, 1, S, L]."""
  a = blk["attn"]
  b, s, d = x.shape
  x = x.reshape(b * s, d)  # 2-D matmuls: XLA:CPU's backward of [B, S, D] dots is ~3x slower
  h = _norm(c, x, a["norm"])
  q = (h @ a["wq"]).reshape(b, s, c.num_heads, c.head_dim)
  k = (h @ a["wk"]).reshape(b, s, c.num_kv_heads, c.head_dim)
  v = (h @ a["wv"]).reshape(b, s, c.num_kv_heads, c.head_dim)
  if c.qk_norm:
    q, k = _norm(c, q, a["q_norm"]), _norm(c, k, a["k_norm"])
  half = c.head_dim // 2
  freq = 1.0 / (c.rope_theta ** (jnp.arange(half, dtype=F32) * 2.0 / c.head_dim))
  ang = pos[..., None].astype(F32) * freq
  cos, sin = jnp.cos(ang)[:, :, None], jnp.sin(ang)[:, :, None]
  rot = lambda t: jnp.concatenate([t[..., :half] * cos - t[..., half:] * sin,
                                   t[..., half:] * cos + t[..., :half] * sin], -1)
  q, k = rot(q), rot(k)
  if k_cache is None:
    att = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")
  else:
    k_cache = jax.lax.dynamic_update_slice_in_dim(k_cache, k, start, 1)
    v_cache = jax.lax.dynamic_update_slice_in_dim(v_cache, v, start, 1)
    att = jax.nn.dot_product_attention(q, k_cache, v_cache, mask=mask, implementation="xla")
  x = x + att.reshape(b * s, -1) @ a["wo"]
  f = blk["ffn"]
  h = _norm(c, x, f["norm"])
  x = x + (jax.nn.silu(h @ f["w_gate"]) * (h @ f["w_up"])) @ f["w_down"]
  return x.reshape(b, s, d), k_cache, v_cache


def forward(c: ModelConfig, w, tokens, start, caches=None):
  """tokens [B, S] at positions start.. -> final-normed hidden states [B, S, D], caches
  (caches None: a causal forward from position 0 with no cache)."""
  b, s = tokens.shape
  x = w["embed"][tokens]
  pos = start + jnp.broadcast_to(jnp.arange(s), (b, s))
  if caches is None:
    caches, mask = [(None, None)] * c.num_layers, None
  else:
    keys = jnp.arange(caches[0][0].shape[1])
    mask = (keys[None, :] <= pos[0][:, None])[None, None]  # [1, 1, S, L]
  new = []
  for i, (kc, vc) in enumerate(caches):
    x, kc, vc = _layer(c, w["blocks"][i], x, pos, kc, vc, start, mask)
    new.append((kc, vc))
  return _norm(c, x, w["final_norm"]), new


def _head(c: ModelConfig, w):
  return w["embed"].T if c.tie_embeddings else w["lm_head"]


def _f32(params):
  """An nnx.State or a pure dict of weights (a dense model's) -> a pure dict of new f32
  arrays with one entry per layer under "blocks": the layer loop here is unrolled over
  separate arrays, its fastest form on XLA:CPU."""
  pure = dict(params if isinstance(params, dict) else nnx.to_pure_dict(params))
  stacks = pure.pop("layers")
  pure["blocks"] = [{"attn": {k: a[i] for k, a in stacks["attn"].items()},
                     "ffn": {k: a[i] for k, a in stacks["mlp"].items()}}
                    for i in range(len(stacks["attn"]["norm"]))]
  return jax.tree.map(lambda x: jnp.array(x, F32), pure)


def _caches(c: ModelConfig, batch: int, length: int):
  shape = (batch, length, c.num_kv_heads, c.head_dim)
  return [(jnp.zeros(shape, F32), jnp.zeros(shape, F32)) for _ in range(c.num_layers)]


class FastSampler:
  """Plain-JAX greedy generation over the same weights (no exactness, no log-probs)."""

  def __init__(self, config: ModelConfig, params, max_len: int):
    self.c, self.max_len = config, max_len
    self.w = _f32(params)
    self._run = jax.jit(self._generate, static_argnums=(2,))

  def _generate(self, w, prompts, new_tokens):
    c, (b, p) = self.c, prompts.shape
    h, caches = forward(c, w, prompts, 0, _caches(c, b, self.max_len))
    out = jnp.zeros((b, new_tokens), jnp.int32).at[:, 0].set(
        jnp.argmax(h[:, -1] @ _head(c, w), -1))

    def step(i, carry):
      out, caches = carry
      last = jax.lax.dynamic_slice_in_dim(out, i - 1, 1, 1)
      h, caches = forward(c, w, last, p + i - 1, caches)
      return out.at[:, i].set(jnp.argmax(h[:, -1] @ _head(c, w), -1).astype(jnp.int32)), caches

    out, _ = jax.lax.fori_loop(1, new_tokens, step, (out, caches))
    return out

  def generate(self, prompts: np.ndarray, new_tokens: int) -> np.ndarray:
    return np.asarray(self._run(self.w, jnp.asarray(prompts, jnp.int32), new_tokens))


class PlainTrainStep:
  """A PPO-clip step over the whole batch: one value_and_grad (token log-probs of the
  sampled continuation, clipped importance ratio against the behaviour log-probs, masked
  token mean), global-norm clip and AdamW from optax, one jitted program."""

  def __init__(self, config: ModelConfig, params, learning_rate: float = 1e-3,
               clip_eps: float = 0.2, max_grad_norm: float = 1.0):
    self.c, self.eps = config, clip_eps
    self.opt = optax.chain(optax.clip_by_global_norm(max_grad_norm),
                           optax.adamw(learning_rate))
    self.params = _f32(params)  # new arrays: the step donates its parameters
    self.opt_state = self.opt.init(self.params)
    self._step = jax.jit(self._update, donate_argnums=(0, 1))

  def _loss(self, w, tokens, mask, behaviour_logp, adv):
    """tokens [B, S]; mask and behaviour_logp [B, S-1] (for token t+1); adv [B]."""
    c = self.c
    h, _ = forward(c, w, tokens[:, :-1], 0)
    logits = h.reshape(-1, c.d_model) @ _head(c, w)
    logp = (jnp.take_along_axis(logits, tokens[:, 1:].reshape(-1, 1), -1)[:, 0]
            - jax.nn.logsumexp(logits, -1)).reshape(behaviour_logp.shape)
    ratio = jnp.exp(logp - behaviour_logp)
    a = adv[:, None]
    per = -jnp.minimum(ratio * a, jnp.clip(ratio, 1 - self.eps, 1 + self.eps) * a)
    return jnp.sum(per * mask) / jnp.maximum(jnp.sum(mask), 1.0)

  def _update(self, params, opt_state, tokens, mask, behaviour_logp, adv):
    loss, grads = jax.value_and_grad(self._loss)(params, tokens, mask, behaviour_logp, adv)
    updates, opt_state = self.opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  def step(self, tokens, mask, behaviour_logp, adv) -> float:
    self.params, self.opt_state, loss = self._step(
        self.params, self.opt_state, jnp.asarray(tokens, jnp.int32), jnp.asarray(mask, F32),
        jnp.asarray(behaviour_logp, F32), jnp.asarray(adv, F32))
    return float(loss)
