"""`JetStreamAdapter`: the exact engine behind JetStream's `engine_api.Engine` interface.

Installed with the optional extra (`pip install -e .[jetstream]`; google-jetstream 0.2.2
pulls in TensorFlow, ~2 GB, and its repository was archived in Feb 2026, so the core
package does not depend on it). JetStream's orchestrator can then drive composer_rl's
`sampling.engine.Engine` (prefill / insert / generate over fixed slots) unchanged: the
tokens it samples, and their log-probs, are the ones the trainer recomputes bit for bit.

JetStream requests carry no sampling settings, so the adapter samples every request with
one `Request` template (seed, temperature, top-k, top-p) and gives each prefill a fresh
sequence id (which keys its random stream). Samplers passed through JetStream's `sampler=`
argument are refused: sampling is part of the exact token head and cannot be swapped.
"""
import itertools
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jetstream.engine import engine_api, tokenizer_pb2

from composer_rl.sampling.engine import Engine, Request


def _result(tokens, valid, lengths) -> engine_api.ResultTokens:
  """JetStream's packed [slots, 3] (token, valid, length) result."""
  data = jnp.stack([jnp.asarray(tokens, jnp.int32), jnp.asarray(valid, jnp.int32),
                    jnp.asarray(lengths, jnp.int32)], axis=-1)
  return engine_api.ResultTokens(data=data, tokens_idx=(0, 1), valid_idx=(1, 2),
                                 length_idx=(2, 3), samples_per_slot=1)


class JetStreamAdapter(engine_api.Engine):
  """Wraps `engine`; `request` is the sampling template (its seq_id is replaced)."""

  def __init__(self, engine: Engine, request: Request = Request(seq_id=0),
               tokenizer_path: str = "composer_rl:bytes"):
    self.engine, self.request, self.tokenizer_path = engine, request, tokenizer_path
    self._ids = itertools.count(request.seq_id)

  def prefill(self, *, params, existing_prefix=None, padded_tokens, true_length: int,
              sampler=None):
    if sampler is not None:
      raise ValueError("custom samplers are not supported: sampling is part of the exact "
                       "token head shared with the trainer")
    req = Request(seq_id=next(self._ids), seed=self.request.seed,
                  temperature=self.request.temperature, top_k=self.request.top_k,
                  top_p=self.request.top_p)
    prefix = self.engine.prefill(params=params, padded_tokens=np.asarray(padded_tokens),
                                 true_length=true_length, request=req,
                                 existing_prefix=existing_prefix)
    return prefix, _result(prefix.token[None], jnp.ones((1,)), prefix.length[None] + 1)

  def generate(self, params, decode_state, sampler=None):
    if sampler is not None:
      raise ValueError("custom samplers are not supported (see prefill)")
    state, step = self.engine.generate(params, decode_state)
    return state, _result(step.tokens, step.active, state.lengths + 1)

  def insert(self, prefix, decode_state, slot: int):
    return self.engine.insert(prefix, decode_state, slot)

  def free_resource(self, slot: int) -> Any:
    return None  # dense per-slot caches: nothing to give back (the engine's free() is pure)

  def load_params(self, *args, **kwargs):
    return self.engine.load_params(*args, **kwargs)

  def get_prefix_destination_sharding(self) -> Any:
    return self.engine.replicated

  def get_tokenizer(self) -> tokenizer_pb2.TokenizerParameters:
    return tokenizer_pb2.TokenizerParameters(path=self.tokenizer_path)

  def build_tokenizer(self, metadata):
    from composer_rl.data.byte_tokenizer import ByteTokenizer  # pylint: disable=g-import-not-at-top
    return ByteTokenizer()

  def init_decode_state(self, *args, **kwargs):
    return self.engine.init_decode_state()

  @property
  def max_concurrent_decodes(self) -> int:
    return self.engine.max_concurrent_decodes

  @property
  def samples_per_slot(self) -> int:
    return 1

  @property
  def max_prefill_length(self) -> int:
    return self.engine.max_prefill_length

  @property
  def mesh(self) -> Optional[jax.sharding.Mesh]:
    return self.engine.mesh

  @property
  def colocated_cpus(self):
    return None
