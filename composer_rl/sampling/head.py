"""The token head: logits -> sampling transform -> log-probs -> token, shared by sampler and
trainer.

The sampler and the trainer run the *same* row-tile computation (`token_head`), so the
log-probability the sampler recorded for a token and the one the trainer differentiates are
produced by identical code on identical bits. The sampler passes `targets = -1` (sample with
Gumbel-max from a per-token key); the trainer passes the tokens it is scoring.

The transform is applied in the order temperature -> top-k -> top-p, and the log-probs
returned are those *of the distribution actually sampled from* (renormalized over the kept
support; -inf outside it). Greedy decoding is `top_k = 1` (log-prob 0).
"""
from typing import NamedTuple, Optional

import flax.struct
import jax
import jax.numpy as jnp
from jax import lax

from composer_rl.ops import exact

F32 = jnp.float32


@flax.struct.dataclass
class RowSampling:
  """Per-row sampling transform (arrays of shape [R]).

  temperature: > 0; logits are divided by it.
  top_k: keep the k most likely tokens; 0 = no limit.
  top_p: keep the smallest prefix of the sorted distribution whose mass reaches top_p
    (the token that crosses it is kept); 1.0 = no limit.
  """
  temperature: jax.Array
  top_k: jax.Array
  top_p: jax.Array

  @classmethod
  def broadcast(cls, rows: int, temperature: float = 1.0, top_k: int = 0,
                top_p: float = 1.0) -> "RowSampling":
    if not temperature > 0:
      raise ValueError(f"temperature must be > 0 (use top_k=1 for greedy), got {temperature}")
    if top_k < 0:
      raise ValueError(f"top_k must be >= 0 (0 = off), got {top_k}")
    if not 0.0 < top_p <= 1.0:
      raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    return cls(temperature=jnp.full((rows,), temperature, F32),
               top_k=jnp.full((rows,), top_k, jnp.int32), top_p=jnp.full((rows,), top_p, F32))


def masked_logits(logits: jax.Array, s: RowSampling) -> jax.Array:
  """[T, V] fp32 logits -> tempered logits on the kept support, -inf outside it.

  The kept support is {z >= threshold}. The threshold is the k-th largest value (top-k)
  or the value of the last token of the nucleus (top-p), found by sorting the vocabulary;
  the sort runs only when some row asks for top_k > 1 or top_p < 1. Otherwise the
  threshold is the maximum (greedy, top_k = 1) or -inf (no cut): the same values the
  sorting path finds for such rows, so a row's bits do not depend on its neighbours.
  """
  vocab = logits.shape[-1]
  z = logits.astype(F32) / s.temperature[:, None]

  def sorted_threshold():
    ranks = jnp.arange(vocab, dtype=jnp.int32)[None, :]
    sorted_desc = -lax.sort(-z, dimension=1)
    k = jnp.where(s.top_k > 0, jnp.minimum(s.top_k, vocab), vocab)
    in_top_k = ranks < k[:, None]
    sorted_probs = exact.softmax(jnp.where(in_top_k, sorted_desc, -jnp.inf))
    mass_before = exact.row_cumsum(sorted_probs) - sorted_probs
    keep = in_top_k & ((s.top_p[:, None] >= 1.0) | (mass_before < s.top_p[:, None])
                       | (ranks == 0))
    num_keep = jnp.sum(keep.astype(jnp.int32), axis=-1)
    return jnp.take_along_axis(sorted_desc, (num_keep - 1)[:, None], axis=-1)

  def simple_threshold():
    return jnp.where(s.top_k[:, None] == 1, jnp.max(z, axis=-1, keepdims=True), -jnp.inf)

  needs_sort = jnp.any((s.top_k > 1) | (s.top_p < 1.0))
  threshold = lax.stop_gradient(lax.cond(needs_sort, sorted_threshold, simple_threshold))
  return jnp.where(z >= threshold, z, -jnp.inf)


def transformed_logprobs(logits: jax.Array, s: RowSampling) -> jax.Array:
  """[T, V] fp32 logits -> log-probs of the transformed distribution ([T, V], -inf = cut)."""
  return exact.log_softmax(masked_logits(logits, s))


class HeadOutput(NamedTuple):
  tokens: jax.Array     # [R] int32 sampled (or scored) token
  logprobs: jax.Array   # [R] fp32 log-prob of that token under the transformed distribution
  entropy: jax.Array    # [R] fp32 entropy of the transformed distribution
  # [R, K] the K most likely tokens of the transformed distribution and their log-probs
  # (K = `token_head(top=K)`, 0 by default: what a server returns as `top_logprobs`).
  top_ids: jax.Array
  top_logprobs: jax.Array


def _head(logits_fn, top, with_entropy, args):
  hidden, keys, targets, samp = args
  z = masked_logits(logits_fn(hidden), samp)
  peak = jnp.max(z, axis=-1, keepdims=True)
  shifted = z - jnp.where(jnp.isfinite(peak), peak, 0.0)
  lse = jnp.log(exact.row_sum(jnp.exp(shifted)))  # log_softmax = shifted - lse
  # Gumbel-max sampling. Noise is drawn only when some row samples from more than one
  # token; greedy rows (top_k = 1) and scored rows (targets >= 0) take none, so a row's
  # token never depends on whether its neighbours drew noise.
  noisy = (targets < 0) & (samp.top_k != 1)

  def with_noise():
    g = jax.vmap(lambda k: jax.random.gumbel(jax.random.wrap_key_data(k), z.shape[-1:], F32)
                 )(keys)
    return jnp.argmax(shifted + jnp.where(noisy[:, None], g, 0.0), axis=-1)

  def without_noise():  # no argmax when every row is scored (the trainer's case)
    return lax.cond(jnp.all(targets >= 0), lambda: jnp.zeros_like(targets),
                    lambda: jnp.argmax(shifted, axis=-1).astype(jnp.int32))

  sampled = lax.cond(jnp.any(noisy), lambda: with_noise().astype(jnp.int32), without_noise)
  tokens = jnp.where(targets >= 0, targets, sampled)
  # The token's log-prob, the same arithmetic as element `tokens` of the full log-softmax.
  logprob = jnp.take_along_axis(shifted, tokens[:, None], axis=-1)[:, 0] - lse
  zeros = jnp.zeros(z.shape[:1], F32)
  entropy, top_lp, top_ids = zeros, zeros[:, None][:, :0], jnp.zeros(z.shape[:1] + (0,), jnp.int32)
  if with_entropy or top:
    lp = shifted - lse[:, None]
    if with_entropy:
      p = jnp.exp(lp)
      entropy = -jnp.sum(jnp.where(p > 0, p * lp, 0.0), axis=-1)
    if top:
      top_lp, top_ids = lax.top_k(lp, top)
  return HeadOutput(tokens, logprob, entropy, top_ids.astype(jnp.int32), top_lp)


def token_head(logits_fn, hidden: jax.Array, keys: jax.Array, targets: jax.Array,
               sampling: RowSampling, tile: Optional[int] = None, top: int = 0,
               with_entropy: bool = True) -> HeadOutput:
  """Runs the head on rows: hidden [R, d], keys [R, 2] uint32, targets [R] (-1 = sample).

  `logits_fn` maps [T, d] hidden states to [T, V] fp32 logits (`Transformer.logits`).
  `tile` bounds memory (rows per call of the head; a row's bits do not depend on it).
  `top` > 0 also returns each row's `top` most likely tokens and their log-probs (read off
  the same log-probs the token's own comes from). `with_entropy=False` skips the entropy
  (zeros): a sampler needs only the token and its log-prob.
  """
  num_rows = hidden.shape[0]
  rows = exact.pad_rows((hidden, keys, targets.astype(jnp.int32), sampling))
  out = exact.map_row_tiles(lambda a: _head(logits_fn, top, with_entropy, a), rows, tile)
  return jax.tree.map(lambda x: x[:num_rows], out)


# Elements of one tile's [rows, vocab] fp32 logits in training (~40 MiB): the head's
# softmax, log-softmax and entropy over Qwen3's 151,936 tokens would otherwise hold ~16
# copies of [tokens, vocab] (10 GB for one 1,024-token row); small vocabularies get one tile.
# Qwen3 gets 64-row tiles: with 128 (8 tiles per 1,024-token row) XLA:CPU unrolled the tile
# loop and kept every tile's logits live, 1.3 GiB more in the 0.6B train step (measured).
TRAIN_TILE_ELEMENTS = 10 << 20


def train_tile(vocab_size: int) -> int:
  """Rows per head call when scoring for training (a power of two, at least 16)."""
  rows = max(16, TRAIN_TILE_ELEMENTS // vocab_size)
  return 1 << (rows.bit_length() - 1)


def token_keys(seed, seq_ids: jax.Array, positions: jax.Array) -> jax.Array:
  """Raw threefry keys [R, 2] for the tokens at `positions` of sequences `seq_ids`.

  The key depends only on (seed, sequence id, position), never on the batch slot, so a
  sequence's sample is the same whatever else shares its batch.
  """
  base = jax.random.key(seed, impl="threefry2x32")

  def one(sid, pos):
    return jax.random.key_data(jax.random.fold_in(jax.random.fold_in(base, sid), pos))

  return jax.vmap(one)(seq_ids.astype(jnp.uint32), positions.astype(jnp.uint32))
