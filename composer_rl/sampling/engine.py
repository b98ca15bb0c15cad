"""Continuous-batching inference engine with JetStream's Engine shape.

A fixed number of decode *slots* is shared by many concurrent agent sessions:

  prefix = engine.prefill(params=..., padded_tokens=..., true_length=..., request=...)
  state  = engine.insert(prefix, state, slot)          # the session occupies a slot
  state, step = engine.generate(params, state)         # one token for every slot
  saved  = engine.release(state, slot)                 # turn ended: keep its KV, free the slot
  prefix = engine.prefill(..., existing_prefix=saved)  # tool result: prefill only new tokens

`prefill` with `existing_prefix` feeds only the new tokens at the end of the session's saved
cache: the history is never re-prefilled. Every computation is the model's one forward and
the shared token head, so a token's log-prob is identical, bit for bit, to the trainer's
recomputation, whatever the slot or the other sessions in the batch (the parity design of
`composer_rl.ops.exact`).

Method names and argument order follow `jetstream.engine.engine_api.Engine` (prefill,
insert, generate, init_decode_state, max_concurrent_decodes, max_prefill_length); `release`
is our addition for tool waits. `composer_rl.serving.jetstream_adapter` wraps this class
for JetStream's orchestrator when that optional extra is installed.
"""
import dataclasses
from typing import Optional, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from flax import nnx

from composer_rl.model.kv_cache import KVCache
from composer_rl.model.transformer import Transformer
from composer_rl.sampling import head as head_lib


@dataclasses.dataclass(frozen=True)
class Request:
  """Per-session sampling settings (see `composer_rl.sampling.head.RowSampling`).

  seq_id: the session's id; with `seed` and the position it keys every token's RNG.
  """
  seq_id: int
  seed: int = 0
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0

  def rows(self) -> head_lib.RowSampling:
    return head_lib.RowSampling.broadcast(1, self.temperature, self.top_k, self.top_p)


@flax.struct.dataclass
class Prefix:
  """One session's KV cache plus the token sampled after it (not yet in the cache).

  length: number of tokens in `cache`; token: the sampled next token and its logprob;
  expert_ids: [chunked_tokens, num_moe_layers, k] experts of the tokens this prefill fed.
  """
  cache: KVCache
  length: jax.Array
  token: jax.Array
  logprob: jax.Array
  top_ids: jax.Array
  top_logprobs: jax.Array
  seq_id: jax.Array
  seed: jax.Array
  sampling: head_lib.RowSampling
  expert_ids: jax.Array


@flax.struct.dataclass
class DecodeState:
  """Slots x (cache, bookkeeping). `last_token` is fed at slot position `lengths`."""
  cache: KVCache
  lengths: jax.Array
  last_token: jax.Array
  seq_ids: jax.Array
  seeds: jax.Array
  sampling: head_lib.RowSampling
  active: jax.Array


@flax.struct.dataclass
class StepResult:
  """What one `generate` call produced per slot: the new token, its logprob, the engine's
  `top_logprobs` most likely tokens and their log-probs, the experts of the token that was
  fed, and whether the slot was active."""
  tokens: jax.Array
  logprobs: jax.Array
  top_ids: jax.Array
  top_logprobs: jax.Array
  fed_expert_ids: jax.Array
  active: jax.Array


class Engine:
  """Exact continuous-batching engine over a `Transformer`.

  slots: concurrent decode slots (`max_concurrent_decodes`).
  prefill_chunk: tokens per prefill call; inputs are padded to a multiple of it so a few
    compiled programs serve every length.
  top_logprobs: how many most likely alternatives every sampled token comes with
    (`Prefix.top_*`, `StepResult.top_*`; a server's `top_logprobs`); 0 computes none.
  mesh: the inference mesh the engine runs on (params passed in must live there, e.g.
    `jax.device_put(params, engine.replicated)`); None = the default device. Every slot is
    computed on every device of the mesh (replicated); a mesh per engine is how a host's
    devices are split between training and inference.
  """

  def __init__(self, model: Transformer, slots: int, prefill_chunk: int = 32,
               mesh: Optional[Mesh] = None, top_logprobs: int = 0):
    self.config = model.config
    self.top_logprobs = int(top_logprobs)
    self.mesh = mesh
    self.replicated = NamedSharding(mesh, P()) if mesh is not None else None
    self.graphdef, self.params = nnx.split(model)
    self.slots = slots
    self.prefill_chunk = prefill_chunk
    self._prefill_chunk_fn = jax.jit(self._prefill_chunk_impl)
    self._generate_fn = jax.jit(self._generate_impl, donate_argnums=(1,))
    self._insert_fn = jax.jit(self._insert_impl, donate_argnums=(1,))
    self._release_fn = jax.jit(self._release_impl)
    self._sample_fn = jax.jit(self._sample_impl)
    self._generate_many_fn = jax.jit(self._generate_many_impl, donate_argnums=(1,),
                                     static_argnums=(4,))

  # ---- JetStream-shaped surface --------------------------------------------------------
  @property
  def max_concurrent_decodes(self) -> int:
    return self.slots

  @property
  def max_prefill_length(self) -> int:
    return self.config.max_seq_len

  def load_params(self, state=None):
    """Returns the params to pass to prefill/generate (the model's state by default)."""
    return self.params if state is None else state

  def place(self, tree):
    """Puts arrays (params, caches) on the engine's mesh; a no-op without one."""
    return tree if self.mesh is None else jax.device_put(tree, self.replicated)

  def init_decode_state(self) -> DecodeState:
    n = self.slots
    return self.place(DecodeState(cache=KVCache.init(self.config, n), lengths=jnp.zeros((n,), jnp.int32),
                       last_token=jnp.zeros((n,), jnp.int32), seq_ids=jnp.zeros((n,), jnp.int32),
                       seeds=jnp.zeros((n,), jnp.uint32),
                       sampling=head_lib.RowSampling.broadcast(n), active=jnp.zeros((n,), bool)))

  def prefill(self, *, params, padded_tokens: Sequence[int], true_length: Optional[int] = None,
              request: Request, existing_prefix: Optional[Prefix] = None) -> Prefix:
    """Feeds `padded_tokens[:true_length]` after `existing_prefix` (or from an empty cache)
    and samples the next token."""
    tokens = np.asarray(padded_tokens, np.int32)
    n = len(tokens) if true_length is None else int(true_length)
    start = 0 if existing_prefix is None else int(existing_prefix.length)
    if n < 1:
      raise ValueError("prefill needs at least one new token")
    if start + n >= self.config.max_seq_len:
      raise ValueError(f"session would hold {start + n} tokens; max_seq_len is "
                       f"{self.config.max_seq_len} (compact or end the session)")
    c = self.prefill_chunk
    padded = np.zeros(-(-n // c) * c, np.int32)
    padded[:n] = tokens[:n]
    cache = (self.place(KVCache.init(self.config, 1)) if existing_prefix is None
             else existing_prefix.cache)
    ids, last = [], None
    for off in range(0, len(padded), c):
      valid = min(c, n - off)
      cache, hidden, chunk_ids = self._prefill_chunk_fn(
          params, cache, jnp.asarray(padded[None, off:off + c]), jnp.int32(start + off),
          jnp.int32(valid))
      ids.append(chunk_ids[:valid])
      last = hidden
    rows = request.rows()
    head = self._sample_fn(params, last, jnp.int32(start + n), jnp.int32(request.seq_id),
                           jnp.uint32(request.seed), rows)
    return Prefix(cache=cache, length=jnp.int32(start + n), token=head.tokens[0],
                  logprob=head.logprobs[0], top_ids=head.top_ids[0],
                  top_logprobs=head.top_logprobs[0], seq_id=jnp.int32(request.seq_id), seed=jnp.uint32(request.seed),
                  sampling=rows, expert_ids=jnp.concatenate(ids))

  def insert(self, prefix: Prefix, decode_state: DecodeState, slot: int) -> DecodeState:
    if not 0 <= slot < self.slots:
      raise ValueError(f"slot {slot} outside [0, {self.slots})")
    return self._insert_fn(prefix, decode_state, jnp.int32(slot))

  def generate(self, params, decode_state: DecodeState):
    """One decode step for every slot; returns (new state, StepResult)."""
    return self._generate_fn(params, decode_state)

  def generate_many(self, params, decode_state: DecodeState, budgets, stop_token: int,
                    steps: int):
    """Up to `steps` decode steps in one call (one dispatch, one host sync). A slot stops,
    and is left inactive, once it samples `stop_token` or has sampled `budgets[slot]`
    tokens. Returns (new state, StepResult with a leading [steps] axis; `active` marks the
    tokens that count). Each step is the computation of `generate`, so the tokens and
    log-probs are the ones `steps` calls of `generate` would give."""
    return self._generate_many_fn(params, decode_state, jnp.asarray(budgets, jnp.int32),
                                  jnp.int32(stop_token), steps)

  def release(self, decode_state: DecodeState, slot: int) -> Prefix:
    """Copies a slot's session out (its cache and pending token) so the slot can be reused;
    pass the result as `existing_prefix` to continue the session later."""
    return self._release_fn(decode_state, jnp.int32(slot))

  def free(self, decode_state: DecodeState, slot: int) -> DecodeState:
    return decode_state.replace(active=decode_state.active.at[slot].set(False))

  # ---- jitted implementations ----------------------------------------------------------
  def _prefill_chunk_impl(self, params, cache, tokens, start, valid):
    model = nnx.merge(self.graphdef, params)
    c = tokens.shape[1]
    segs = (jnp.arange(c)[None] < valid).astype(jnp.int32)
    pos = start + jnp.arange(c, dtype=jnp.int32)[None]
    out = model.forward(tokens, pos, cache, start[None], segs)
    hidden = jax.lax.dynamic_index_in_dim(out.hidden[0], valid - 1, 0, keepdims=True)
    return out.cache, hidden, out.expert_ids[0]

  def _sample_impl(self, params, hidden, position, seq_id, seed, rows):
    model = nnx.merge(self.graphdef, params)
    keys = head_lib.token_keys(seed, seq_id[None], position[None])
    return head_lib.token_head(model.logits, hidden, keys, jnp.full((1,), -1), rows,
                               top=self.top_logprobs)

  def _insert_impl(self, prefix: Prefix, state: DecodeState, slot):
    def put(full, one):
      return jax.lax.dynamic_update_index_in_dim(full, one[0].astype(full.dtype), slot, 0)
    cache = jax.tree.map(put, state.cache, prefix.cache)
    sampling = jax.tree.map(put, state.sampling, prefix.sampling)
    return DecodeState(cache=cache, lengths=state.lengths.at[slot].set(prefix.length),
                       last_token=state.last_token.at[slot].set(prefix.token),
                       seq_ids=state.seq_ids.at[slot].set(prefix.seq_id),
                       seeds=state.seeds.at[slot].set(prefix.seed), sampling=sampling,
                       active=state.active.at[slot].set(True))

  def _release_impl(self, state: DecodeState, slot):
    take = lambda x: jax.lax.dynamic_index_in_dim(x, slot, 0, keepdims=True)
    cfg = self.config
    return Prefix(cache=jax.tree.map(take, state.cache), length=state.lengths[slot],
                  token=state.last_token[slot], logprob=jnp.float32(0.0),
                  top_ids=jnp.zeros((self.top_logprobs,), jnp.int32),
                  top_logprobs=jnp.zeros((self.top_logprobs,), jnp.float32), seq_id=state.seq_ids[slot], seed=state.seeds[slot],
                  sampling=jax.tree.map(take, state.sampling),
                  expert_ids=jnp.zeros((0, cfg.num_moe_layers,
                                        cfg.experts_per_token if cfg.num_moe_layers else 0),
                                       jnp.int32))

  def _generate_many_impl(self, params, state: DecodeState, budgets, stop_token, steps):
    def body(carry, _):
      st, left = carry
      st, out = self._generate_impl(params, st)
      left = left - out.active.astype(jnp.int32)
      done = out.active & ((out.tokens == stop_token) | (left <= 0))
      return (st.replace(active=st.active & ~done), left), out
    (state, _), outs = jax.lax.scan(body, (state, budgets), None, length=steps)
    return state, outs

  def _generate_impl(self, params, state: DecodeState):
    model = nnx.merge(self.graphdef, params)
    slot_pos = state.lengths
    out = model.forward(state.last_token[:, None], slot_pos[:, None], state.cache, slot_pos,
                        state.active[:, None].astype(jnp.int32))
    keys = jax.vmap(lambda s, q, p: head_lib.token_keys(s, q[None], p[None])[0])(
        state.seeds, state.seq_ids, slot_pos + 1)
    nxt = head_lib.token_head(model.logits, out.hidden[:, 0], keys,
                              jnp.full((self.slots,), -1), state.sampling,
                              top=self.top_logprobs)
    live = state.active
    new_state = state.replace(cache=out.cache, lengths=jnp.where(live, slot_pos + 1, slot_pos),
                              last_token=jnp.where(live, nxt.tokens, state.last_token))
    return new_state, StepResult(tokens=nxt.tokens, logprobs=nxt.logprobs, top_ids=nxt.top_ids,
                                 top_logprobs=nxt.top_logprobs, fed_expert_ids=out.expert_ids[:, 0], active=live)
