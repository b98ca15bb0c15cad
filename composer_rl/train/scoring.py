"""Training-side scoring: log-probs of given tokens under the sampling transform.

`score_tokens` is what the train step calls inside `jax.value_and_grad`. It runs the model's
one forward over whole sequences with a fresh fixed-length cache and the sampler's own token
head (`composer_rl.sampling.head.token_head`) with the scored tokens as targets, so for every
token the sampler generated the result equals the sampler's log-prob bit for bit.
"""
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from composer_rl.model.kv_cache import KVCache
from composer_rl.model.transformer import LayerGather, Transformer
from composer_rl.sampling import head as head_lib


class Scores(NamedTuple):
  """logprobs/entropy: [B, S-1] for predicting tokens[:, 1:] (0 where not scored).
  expert_ids: [B, S, num_moe_layers, k]; router_probs: [B, S, num_moe_layers, E]."""
  logprobs: jax.Array
  entropy: jax.Array
  expert_ids: jax.Array
  router_probs: jax.Array


def score_tokens(model: Transformer, tokens: jax.Array, sampling: head_lib.RowSampling,
                 segment_ids: Optional[jax.Array] = None,
                 positions: Optional[jax.Array] = None,
                 layer_gather: Optional[LayerGather] = None) -> Scores:
  """Scores right-padded sequences.

  Args:
    model: the policy.
    tokens: [B, S] int32 (prompt + completion, right-padded); S <= max_seq_len.
    sampling: per-sequence sampling transform ([B] arrays) the tokens were sampled under.
    segment_ids: [B, S] int32, 0 on padding (default: all ones).
    positions: [B, S] RoPE positions (default: 0..S-1).
    layer_gather: how the layer loop gets a layer's parameters (`Transformer.forward`; the
      train step's FSDP).
  """
  b, s = tokens.shape
  if s > model.config.max_seq_len:
    raise ValueError(f"sequence length {s} exceeds max_seq_len={model.config.max_seq_len}")
  if positions is None:
    positions = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32)[None], (b, s))
  # The cache holds just these rows (not the model's window), and every key is in it: a
  # static key length, so no per-bucket branches (whose residuals a backward pass would
  # all keep). Attention's bits do not depend on either (`composer_rl.ops.exact`).
  cache = KVCache.for_tokens(model.config, b, s)
  out = model.forward(tokens, positions, cache, jnp.zeros((b,), jnp.int32), segment_ids,
                      key_len=cache.length, for_grad=True, layer_gather=layer_gather)
  rows = b * (s - 1)
  per_row = jax.tree.map(lambda x: jnp.repeat(x, s - 1), sampling)
  head = head_lib.token_head(
      model.logits, out.hidden[:, :-1].reshape(rows, -1), jnp.zeros((rows, 2), jnp.uint32),
      tokens[:, 1:].reshape(rows), per_row, tile=head_lib.train_tile(model.config.vocab_size))
  valid = jnp.ones((b, s), bool) if segment_ids is None else segment_ids > 0
  valid = valid[:, 1:]
  return Scores(logprobs=jnp.where(valid, head.logprobs.reshape(b, s - 1), 0.0),
                entropy=jnp.where(valid, head.entropy.reshape(b, s - 1), 0.0),
                expert_ids=out.expert_ids, router_probs=out.router_probs)
