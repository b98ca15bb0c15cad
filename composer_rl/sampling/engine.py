"""Continuous-batching inference engine with JetStream's Engine shape.

A fixed number of decode *slots* is shared by many concurrent agent sessions:

  prefix = engine.prefill(params=..., padded_tokens=..., true_length=..., request=...)
  state  = engine.insert(prefix, state, slot)          # the session occupies a slot
  state, step = engine.generate(params, state)         # one token for every slot
  saved  = engine.release(state, slot)                 # turn ended: keep its KV, free the slot
  prefix = engine.prefill(..., existing_prefix=saved)  # tool result: prefill only new tokens
  prefixes = engine.prefill_many(params=..., items=[(tokens, request, saved_or_None), ...])
  state, steps = engine.generate_many(params, state, budgets, stop_tokens, k)  # k steps, on device

`prefill` with `existing_prefix` feeds only the new tokens at the end of the session's saved
cache: the history is never re-prefilled. A parked `Prefix` (`release`, `park`) holds a
cache as long as its session (a power-of-two bucket, `kv_cache.bucket_length`), not
`max_seq_len`, and so does a prefill batch; the decode state's cache is as long as its
longest live session needs (`kv_cache.decode_length`: grown when a session would pass it,
shrunk when the sessions need a quarter of it): sessions cost memory in proportion to
their tokens, not the window, and never a different bit (attention masks empty slots). Every
computation is the model's one forward and the shared token head, so a token's log-prob is
identical, bit for bit, to the trainer's recomputation, whatever the slot or the other
sessions in the batch (the parity design of `composer_rl.ops.exact`).

Method names and argument order follow `jetstream.engine.engine_api.Engine` (prefill,
insert, generate, init_decode_state, max_concurrent_decodes, max_prefill_length); `release`
is our addition for tool waits. `composer_rl.serving.jetstream_adapter` wraps this class
for JetStream's orchestrator when that optional extra is installed.
"""
import dataclasses
from typing import List, Optional, Sequence, Tuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from flax import nnx

from composer_rl.model import kv_cache as kvc
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
    self._prefill_chunk_fn = jax.jit(self._prefill_chunk_impl, donate_argnums=(1,))
    self._put_row_fn = jax.jit(self._put_row_impl, donate_argnums=(0,))
    self._generate_fn = jax.jit(self._generate_impl, donate_argnums=(1,))
    self._insert_fn = jax.jit(self._insert_impl, donate_argnums=(1,))
    self._release_fn = jax.jit(self._release_impl)
    self._resize_fn = jax.jit(kvc.resize, static_argnums=(1,))
    self._longest_fn = jax.jit(lambda lengths, active: jnp.max(jnp.where(active, lengths, 0)))
    self._sample_fn = jax.jit(self._sample_impl, static_argnums=(7,))
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
    cache = KVCache.init(self.config, n, kvc.decode_length(self.config, 0))
    return self.place(DecodeState(cache=cache, lengths=jnp.zeros((n,), jnp.int32),
                       last_token=jnp.zeros((n,), jnp.int32), seq_ids=jnp.zeros((n,), jnp.int32),
                       seeds=jnp.zeros((n,), jnp.uint32),
                       sampling=head_lib.RowSampling.broadcast(n), active=jnp.zeros((n,), bool)))

  def prefill(self, *, params, padded_tokens: Sequence[int], true_length: Optional[int] = None,
              request: Request, existing_prefix: Optional[Prefix] = None) -> Prefix:
    """Feeds `padded_tokens[:true_length]` after `existing_prefix` (or from an empty cache)
    and samples the next token (`prefill_many` with one session)."""
    tokens = np.asarray(padded_tokens, np.int32)
    n = len(tokens) if true_length is None else int(true_length)
    return self.prefill_many(params=params, items=[(tokens[:n], request, existing_prefix)])[0]

  def prefill_many(self, *, params, items: Sequence[Tuple[Sequence[int], Request,
                                                          Optional[Prefix]]]) -> List[Prefix]:
    """Prefills several sessions in one batch: each item is (new tokens, request, the
    session's saved prefix or None). Returns one Prefix per item. The batch is padded to a
    power of two (rows that feed nothing) and the tokens to a multiple of `prefill_chunk`,
    so a few compiled programs serve every mix; a session's bits do not depend on the
    others (`composer_rl.ops.exact`)."""
    n = len(items)
    if n == 0:
      return []
    lens = np.array([len(t) for t, _, _ in items], np.int32)
    starts = np.array([0 if p is None else int(p.length) for _, _, p in items], np.int32)
    for length, start in zip(lens, starts):
      if length < 1:
        raise ValueError("prefill needs at least one new token")
      if start + length >= self.config.max_seq_len:
        raise ValueError(f"session would hold {start + length} tokens; max_seq_len is "
                         f"{self.config.max_seq_len} (compact or end the session)")
    rows = 1 << (n - 1).bit_length()
    c = self.prefill_chunk
    width = -(-int(lens.max()) // c) * c
    tokens = np.zeros((rows, width), np.int32)
    for i, (t, _, _) in enumerate(items):
      tokens[i, :lens[i]] = np.asarray(t, np.int32)[:lens[i]]
    lens = np.pad(lens, (0, rows - n))
    starts = np.pad(starts, (0, rows - n))
    # The batch's cache is as long as its longest session needs (a power-of-two bucket),
    # not the window: the prefixes split from it are that long until `insert` pads them.
    need = kvc.bucket_length(int((starts + lens).max()), self.config.max_seq_len)
    cache = self.place(KVCache.for_tokens(self.config, rows, need))
    for i, (_, _, prefix) in enumerate(items):
      if prefix is not None:
        cache = self._put_row_fn(cache, prefix.cache, jnp.int32(i))
    last = jnp.zeros((rows, self.config.d_model), jnp.float32)
    ids = []
    for off in range(0, width, c):
      cache, last, chunk_ids = self._prefill_chunk_fn(
          params, cache, last, jnp.asarray(tokens[:, off:off + c]), jnp.asarray(starts + off),
          jnp.asarray(np.clip(lens - off, 0, c)))
      ids.append(chunk_ids)
    reqs = [r for _, r, _ in items] + [items[0][1]] * (rows - n)
    sampling = jax.tree.map(lambda *a: jnp.concatenate(a), *[r.rows() for r in reqs])
    # Split into all `rows` prefixes (a program per power of two, not per item count).
    out = self._sample_fn(params, cache, last, jnp.asarray(starts + lens),
                          jnp.asarray([r.seq_id for r in reqs], jnp.int32),
                          jnp.asarray([r.seed for r in reqs], jnp.uint32), sampling, rows)
    # Routing records on the host: slicing per length on device compiles a program per length.
    fed = np.asarray(jnp.concatenate(ids, axis=1))
    return [p.replace(expert_ids=fed[i, :lens[i]]) for i, p in enumerate(out[:n])]

  def insert(self, prefix: Prefix, decode_state: DecodeState, slot: int) -> DecodeState:
    if not 0 <= slot < self.slots:
      raise ValueError(f"slot {slot} outside [0, {self.slots})")
    decode_state = self._fit(decode_state, int(prefix.length), grow_only=True)
    # Without the routing record: its length varies, and the slot does not need it.
    return self._insert_fn(prefix.replace(expert_ids=None), decode_state, jnp.int32(slot))

  def _fit(self, state: DecodeState, tokens: int, grow_only: bool = False) -> DecodeState:
    """`state` with a cache that holds `tokens` per slot: grown to their decode length when
    they do not fit, shrunk to the decode length of twice their number when they need a
    quarter of it or less (unless `grow_only`). Resizing copies the cache; the doubling
    makes it rare."""
    have, want = state.cache.length, kvc.decode_length(self.config, tokens)
    if want > have:
      return state.replace(cache=self._resize_fn(state.cache, want))
    if not grow_only and want * 4 <= have:
      return state.replace(cache=self._resize_fn(
          state.cache, kvc.decode_length(self.config, 2 * tokens)))
    return state

  def _fit_for_steps(self, state: DecodeState, steps: int) -> DecodeState:
    """`state` fitted to its live sessions plus `steps` more tokens each (one small read of
    their lengths from the device)."""
    return self._fit(state, int(self._longest_fn(state.lengths, state.active)) + steps)

  def generate(self, params, decode_state: DecodeState):
    """One decode step for every slot; returns (new state, StepResult)."""
    return self._generate_fn(params, self._fit_for_steps(decode_state, 1))

  def generate_many(self, params, decode_state: DecodeState, budgets, stop_token,
                    steps: int):
    """Up to `steps` decode steps in one call (one dispatch, one host sync). A slot stops,
    and is left inactive, once it samples a stop token (`stop_token`: one id or a sequence
    of ids; -1 = none) or has sampled `budgets[slot]` tokens. Returns (new state, StepResult with a leading [steps] axis; `active` marks the
    tokens that count). Each step is the computation of `generate`, so the tokens and
    log-probs are the ones `steps` calls of `generate` would give."""
    decode_state = self._fit_for_steps(decode_state, steps)
    return self._generate_many_fn(params, decode_state, jnp.asarray(budgets, jnp.int32),
                                  jnp.atleast_1d(jnp.asarray(stop_token, jnp.int32)), steps)

  def release(self, decode_state: DecodeState, slot: int) -> Prefix:
    """Copies a slot's session out (its cache and pending token) so the slot can be reused;
    pass the result as `existing_prefix` to continue the session later. The saved cache is
    as long as the session needs (`kv_cache.bucket_length`), not `max_seq_len`: a parked
    session waiting on a tool holds memory in proportion to its tokens."""
    return self.park(self._release_fn(decode_state, jnp.int32(slot)))

  def park(self, prefix: Prefix) -> Prefix:
    """`prefix` with its cache cut to the bucket its tokens need: what to keep while the
    session waits (a prefix about to be inserted needs no cut)."""
    keep = kvc.bucket_length(int(prefix.length), self.config.max_seq_len)
    return prefix.replace(cache=self._resize_fn(prefix.cache, keep))

  def free(self, decode_state: DecodeState, slot: int) -> DecodeState:
    return decode_state.replace(active=decode_state.active.at[slot].set(False))

  # ---- jitted implementations ----------------------------------------------------------
  def _prefill_chunk_impl(self, params, cache, last, tokens, start, valid):
    """One chunk for every row: row r feeds tokens[r, :valid[r]] at slots start[r].. and
    keeps the hidden state of its last fed token in `last`."""
    model = nnx.merge(self.graphdef, params)
    c = tokens.shape[1]
    segs = (jnp.arange(c)[None] < valid[:, None]).astype(jnp.int32)
    pos = start[:, None] + jnp.arange(c, dtype=jnp.int32)[None]
    out = model.forward(tokens, pos, cache, start, segs)
    at = jnp.take_along_axis(out.hidden, jnp.maximum(valid - 1, 0)[:, None, None], 1)[:, 0]
    return out.cache, jnp.where((valid > 0)[:, None], at, last), out.expert_ids

  def _put_row_impl(self, cache, row_cache, i):
    row_cache = kvc.resize(row_cache, cache.length)
    return jax.tree.map(
        lambda full, one: jax.lax.dynamic_update_index_in_dim(full, one[0], i, 0), cache,
        row_cache)

  def _sample_impl(self, params, cache, last, length, seq_id, seed, rows, n):
    """Samples every row's next token and splits the batch into `n` Prefix objects (their
    expert_ids left for the caller)."""
    model = nnx.merge(self.graphdef, params)
    keys = jax.vmap(lambda s, q, p: head_lib.token_keys(s, q[None], p[None])[0])(
        seed, seq_id, length)
    head = head_lib.token_head(model.logits, last, keys, jnp.full(seq_id.shape, -1), rows,
                               top=self.top_logprobs, with_entropy=False)
    take = lambda x, i: jax.lax.dynamic_index_in_dim(x, i, 0, keepdims=True)
    return tuple(Prefix(cache=jax.tree.map(lambda x: take(x, i), cache), length=length[i],
                        token=head.tokens[i], logprob=head.logprobs[i], top_ids=head.top_ids[i],
                        top_logprobs=head.top_logprobs[i], seq_id=seq_id[i], seed=seed[i],
                        sampling=jax.tree.map(lambda x: take(x, i), rows),
                        expert_ids=None) for i in range(n))

  def _insert_impl(self, prefix: Prefix, state: DecodeState, slot):
    def put(full, one):
      return jax.lax.dynamic_update_index_in_dim(full, one[0].astype(full.dtype), slot, 0)
    cache = jax.tree.map(put, state.cache, kvc.resize(prefix.cache, state.cache.length))
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
      done = out.active & (jnp.isin(out.tokens, stop_token) | (left <= 0))
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
                              top=self.top_logprobs, with_entropy=False)
    live = state.active
    new_state = state.replace(cache=out.cache, lengths=jnp.where(live, slot_pos + 1, slot_pos),
                              last_token=jnp.where(live, nxt.tokens, state.last_token))
    return new_state, StepResult(tokens=nxt.tokens, logprobs=nxt.logprobs, top_ids=nxt.top_ids,
                                 top_logprobs=nxt.top_logprobs, fed_expert_ids=out.expert_ids[:, 0], active=live)
