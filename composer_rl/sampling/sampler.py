"""Batched generation with the KV cache, through the model's one forward.

Every generated token's log-prob is computed by `composer_rl.sampling.head.token_head`, the
same row-tile computation the trainer differentiates, on hidden states that the one forward
produces bit-identically in prefill, decode and training (`composer_rl.ops.exact`). The RNG
key of a token depends only on (seed, sequence id, position), so what a sequence samples does
not depend on its batch, slot, padding or how its prompt was chunked.
"""
import dataclasses
from typing import List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from composer_rl.model import sharding
from composer_rl.model.kv_cache import KVCache
from composer_rl.model.transformer import Transformer
from composer_rl.sampling import head as head_lib


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """How to sample.

  temperature: divides the logits (> 0; greedy is top_k=1).
  top_k: keep the k most likely tokens (0 = off).
  top_p: nucleus mass to keep (1.0 = off).
  max_new_tokens: generation budget per sequence.
  stop_tokens: token ids that end a sequence (the stop token is kept in the output).
  seed: base of every token's RNG key (with the sequence id and position).
  """
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  max_new_tokens: int = 32
  stop_tokens: Tuple[int, ...] = ()
  seed: int = 0

  def rows(self, n: int) -> head_lib.RowSampling:
    return head_lib.RowSampling.broadcast(n, self.temperature, self.top_k, self.top_p)


@dataclasses.dataclass
class Sample:
  """One generated sequence.

  tokens: generated token ids (including the stop token if one was hit).
  logprobs: fp32 log-prob of each generated token under the sampled distribution.
  expert_ids: [len(prompt) + len(tokens) - 1, num_moe_layers, k] experts chosen for every
    token the model consumed (the prompt, then each generated token but the last).
  finish_reason: 'stop' or 'length'.
  """
  tokens: List[int]
  logprobs: np.ndarray
  expert_ids: np.ndarray
  finish_reason: str


def _prefill(model: Transformer, tokens, segments, chunk: int):
  """Feeds right-padded prompts [B, P] in chunks of `chunk`; returns last hidden, cache, ids."""
  b, p = tokens.shape
  cache = KVCache.init(model.config, b)
  positions = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32)[None], (b, p))
  hidden, ids = [], []
  for start in range(0, p, chunk):
    sl = slice(start, min(start + chunk, p))
    out = model.forward(tokens[:, sl], positions[:, sl], cache,
                        jnp.full((b,), start, jnp.int32), segments[:, sl])
    cache = out.cache
    hidden.append(out.hidden)
    ids.append(out.expert_ids)
  return jnp.concatenate(hidden, 1), cache, jnp.concatenate(ids, 1)


def generate_arrays(model: Transformer, prompt_tokens, prompt_lens, seq_ids, seed,
                    sampling: head_lib.RowSampling, stop_tokens, max_new_tokens: int,
                    prefill_chunk: int):
  """Pure, jittable generation. Returns dict of arrays with a leading batch axis."""
  c = model.config
  b, p = prompt_tokens.shape
  segments = (jnp.arange(p)[None, :] < prompt_lens[:, None]).astype(jnp.int32)
  hidden, cache, prompt_ids = _prefill(model, prompt_tokens, segments, prefill_chunk)
  last_hidden = jnp.take_along_axis(hidden, (prompt_lens - 1)[:, None, None], 1)[:, 0]

  def sample_at(h, positions):
    keys = head_lib.token_keys(seed, seq_ids, positions)
    return head_lib.token_head(model.logits, h, keys, jnp.full((b,), -1, jnp.int32),
                               sampling)

  first = sample_at(last_hidden, prompt_lens)
  m, k = prompt_ids.shape[2], prompt_ids.shape[3]
  out_tokens = jnp.zeros((b, max_new_tokens), jnp.int32).at[:, 0].set(first.tokens)
  out_lp = jnp.zeros((b, max_new_tokens), jnp.float32).at[:, 0].set(first.logprobs)
  out_ids = jnp.zeros((b, max_new_tokens, m, k), jnp.int32)
  done = jnp.isin(first.tokens, stop_tokens)
  num_new = jnp.ones((b,), jnp.int32)

  def cond(state):
    step, _, _, _, _, _, done, _ = state
    return (step < max_new_tokens) & ~jnp.all(done)

  def body(state):
    step, cache, last, out_tokens, out_lp, out_ids, done, num_new = state
    slot = prompt_lens + step - 1  # where the last sampled token goes
    out = model.forward(last[:, None], slot[:, None], cache, slot,
                        jnp.ones((b, 1), jnp.int32))
    nxt = sample_at(out.hidden[:, 0], slot + 1)
    live = ~done
    out_tokens = out_tokens.at[:, step].set(jnp.where(live, nxt.tokens, 0))
    out_lp = out_lp.at[:, step].set(jnp.where(live, nxt.logprobs, 0.0))
    out_ids = out_ids.at[:, step - 1].set(out.expert_ids[:, 0])
    num_new = num_new + live.astype(jnp.int32)
    done = done | jnp.isin(nxt.tokens, stop_tokens)
    return step + 1, out.cache, nxt.tokens, out_tokens, out_lp, out_ids, done, num_new

  state = (jnp.int32(1), cache, first.tokens, out_tokens, out_lp, out_ids, done, num_new)
  _, _, _, out_tokens, out_lp, out_ids, done, num_new = jax.lax.while_loop(cond, body, state)
  return dict(tokens=out_tokens, logprobs=out_lp, decode_expert_ids=out_ids,
              prompt_expert_ids=prompt_ids, num_new=num_new, stopped=done)


class Sampler:
  """Generates from a `Transformer` (or its split graphdef/state) on the default device.

  prefill_chunk: prompt tokens fed per forward call in prefill (None = whole prompt).
  prompt_bucket: prompts are right-padded to a multiple of this, so compiled programs are
    reused across prompt lengths (padding never changes a result).
  mesh: if given, the batch is split over the mesh's batch axes and each device runs the
    single-device program on its shard (`composer_rl.model.sharding.shard_batch`); the
    batch is padded with dummy prompts to a multiple of the shard count.
  """

  def __init__(self, model: Transformer, prefill_chunk: Optional[int] = None,
               prompt_bucket: int = 16, mesh=None):
    self.config = model.config
    self.graphdef, self.state = nnx.split(model)
    self.prefill_chunk = prefill_chunk
    self.prompt_bucket = prompt_bucket
    self.mesh = mesh
    self._fn = jax.jit(self._run, static_argnames=("max_new_tokens", "prefill_chunk"))

  def update_state(self, state) -> None:
    """Swaps in new weights (same tree structure); compiled programs are reused."""
    self.state = state

  def _run(self, state, seed, stop_tokens, prompt_tokens, prompt_lens, seq_ids, sampling,
           max_new_tokens, prefill_chunk):
    def run(state, seed, stop_tokens, prompt_tokens, prompt_lens, seq_ids, sampling):
      model = nnx.merge(self.graphdef, state)
      return generate_arrays(model, prompt_tokens, prompt_lens, seq_ids, seed, sampling,
                             stop_tokens, max_new_tokens, prefill_chunk)
    if self.mesh is not None:
      run = sharding.shard_batch(run, self.mesh, num_replicated=3)
    return run(state, seed, stop_tokens, prompt_tokens, prompt_lens, seq_ids, sampling)

  def pack_prompts(self, prompts: Sequence[Sequence[int]], max_new_tokens: int):
    lens = np.array([len(p) for p in prompts], np.int32)
    if len(prompts) == 0 or lens.min() < 1:
      raise ValueError("every prompt needs at least one token")
    width = -(-int(lens.max()) // self.prompt_bucket) * self.prompt_bucket
    if int(lens.max()) + max_new_tokens > self.config.max_seq_len:
      raise ValueError(f"prompt of {int(lens.max())} tokens + max_new_tokens={max_new_tokens} "
                       f"exceeds max_seq_len={self.config.max_seq_len}")
    width = min(width, self.config.max_seq_len)
    tokens = np.zeros((len(prompts), width), np.int32)
    for i, p in enumerate(prompts):
      tokens[i, :len(p)] = p
    return tokens, lens

  def generate_raw(self, prompts, seq_ids, cfg: SamplingConfig):
    """Returns (dict of numpy arrays with a leading batch axis, prompt lengths)."""
    if len(seq_ids) != len(prompts):
      raise ValueError(f"{len(seq_ids)} seq_ids for {len(prompts)} prompts")
    n = len(prompts)
    prompts, seq_ids = list(prompts), list(seq_ids)
    if self.mesh is not None:  # pad the batch to a multiple of the shard count
      extra = -n % sharding.num_batch_shards(self.mesh)
      prompts, seq_ids = prompts + [[0]] * extra, seq_ids + [0] * extra
    tokens, lens = self.pack_prompts(prompts, cfg.max_new_tokens)
    chunk = self.prefill_chunk or tokens.shape[1]
    stop = jnp.asarray(list(cfg.stop_tokens) or [-1], jnp.int32)
    out = self._fn(self.state, jnp.uint32(cfg.seed), stop, jnp.asarray(tokens),
                   jnp.asarray(lens), jnp.asarray(seq_ids, jnp.int32), cfg.rows(len(prompts)),
                   max_new_tokens=cfg.max_new_tokens, prefill_chunk=chunk)
    out = jax.tree.map(lambda x: x[:n], jax.device_get(out))
    return out, lens[:n]

  def generate(self, prompts: Sequence[Sequence[int]], seq_ids: Sequence[int],
               cfg: SamplingConfig) -> List[Sample]:
    out, lens = self.generate_raw(prompts, seq_ids, cfg)
    return unpack_samples(out, lens)


def unpack_samples(out, lens) -> List[Sample]:
  samples = []
  for i, plen in enumerate(lens):
    n = int(out["num_new"][i])
    ids = np.concatenate([out["prompt_expert_ids"][i, :plen], out["decode_expert_ids"][i, :n - 1]])
    samples.append(Sample(tokens=out["tokens"][i, :n].tolist(),
                          logprobs=np.asarray(out["logprobs"][i, :n]), expert_ids=ids,
                          finish_reason="stop" if out["stopped"][i] else "length"))
  return samples
