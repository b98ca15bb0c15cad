"""Whole-batch generation (`Sampler.generate`): a few lines over the continuous-batching
`Engine`, which is the one sampling path.

Every generated token's log-prob is computed by `composer_rl.sampling.head.token_head`, the
same computation the trainer differentiates, on hidden states that the one forward
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

from composer_rl.model.transformer import Transformer
from composer_rl.sampling import head as head_lib
from composer_rl.sampling.engine import Engine, Request


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


class Sampler:
  """Generates whole batches of prompts through the continuous-batching `Engine`, the one
  sampling path (the rollout runner and the server drive the same Engine).

  slots: decode slots; prompts beyond them wait and take a slot as one frees (default:
    one slot per prompt).
  prefill_chunk: prompt tokens per prefill call (None = the prompts' length rounded up to
    `prompt_bucket`, one call).
  decode_steps: decode steps per `Engine.generate_many` call.
  prefix_split: > 0 prefills each prompt's first `prefix_split` tokens, then the rest onto
    the saved prefix (as a session's next turn is prefilled), instead of all at once.
  mesh: the engine's mesh (every slot computed on every device of it; see `Engine`).
  """

  def __init__(self, model: Transformer, prefill_chunk: Optional[int] = None,
               prompt_bucket: int = 16, mesh=None, slots: Optional[int] = None,
               decode_steps: int = 8, prefix_split: int = 0):
    self.config = model.config
    self.graphdef, self.state = nnx.split(model)
    self._model = model
    self.prefill_chunk, self.prompt_bucket = prefill_chunk, prompt_bucket
    self.mesh, self.slots, self.decode_steps = mesh, slots, decode_steps
    self.prefix_split = prefix_split
    self._engines = {}

  def update_state(self, state) -> None:
    """Swaps in new weights (same tree structure); compiled programs are reused."""
    self.state = state

  def _engine(self, slots: int, chunk: int) -> Engine:
    if (slots, chunk) not in self._engines:
      self._engines[slots, chunk] = Engine(self._model, slots=slots, prefill_chunk=chunk,
                                           mesh=self.mesh)
    return self._engines[slots, chunk]

  def generate(self, prompts: Sequence[Sequence[int]], seq_ids: Sequence[int],
               cfg: SamplingConfig) -> List[Sample]:
    if len(seq_ids) != len(prompts):
      raise ValueError(f"{len(seq_ids)} seq_ids for {len(prompts)} prompts")
    lens = [len(p) for p in prompts]
    if not prompts or min(lens) < 1:
      raise ValueError("every prompt needs at least one token")
    if max(lens) + cfg.max_new_tokens > self.config.max_seq_len:
      raise ValueError(f"prompt of {max(lens)} tokens + max_new_tokens={cfg.max_new_tokens} "
                       f"exceeds max_seq_len={self.config.max_seq_len}")
    chunk = self.prefill_chunk or -(-max(lens) // self.prompt_bucket) * self.prompt_bucket
    eng = self._engine(self.slots or len(prompts), chunk)
    params = eng.place(self.state)
    stops = list(cfg.stop_tokens) or [-1]
    out = [dict(tokens=[], logprobs=[], ids=[]) for _ in prompts]
    waiting, slots = list(range(len(prompts))), [None] * eng.slots
    state = eng.init_decode_state()
    while waiting or any(i is not None for i in slots):
      free = [j for j, i in enumerate(slots) if i is None]
      admit, waiting = waiting[:len(free)], waiting[len(free):]
      requests = [Request(seq_id=int(seq_ids[i]), seed=cfg.seed, temperature=cfg.temperature,
                          top_k=cfg.top_k, top_p=cfg.top_p) for i in admit]
      saved = [None] * len(admit)
      if self.prefix_split:  # prefill the head of each prompt, then the rest onto it
        cut = [min(self.prefix_split, len(prompts[i]) - 1) for i in admit]
        heads = [k for k in range(len(admit)) if cut[k] > 0]
        for k, p in zip(heads, eng.prefill_many(params=params, items=[
            (prompts[admit[k]][:cut[k]], requests[k], None) for k in heads])):
          saved[k] = p
      prefixes = eng.prefill_many(params=params, items=[
          (prompts[i][0 if p is None else int(p.length):], r, p)
          for i, r, p in zip(admit, requests, saved)])
      for k, p in enumerate(saved):  # the experts of the tokens the first prefill fed
        if p is not None:
          prefixes[k] = prefixes[k].replace(expert_ids=np.concatenate(
              [p.expert_ids, prefixes[k].expert_ids]))
      for i, prefix in zip(admit, prefixes):
        o = out[i]
        o["tokens"].append(int(prefix.token))
        o["logprobs"].append(np.float32(prefix.logprob))
        o["ids"].append(np.asarray(prefix.expert_ids))
        if int(prefix.token) in stops or cfg.max_new_tokens == 1:
          continue
        j = free.pop(0)
        state = eng.insert(prefix, state, j)
        slots[j] = i
      budgets = [0 if i is None else cfg.max_new_tokens - len(out[i]["tokens"]) for i in slots]
      if not any(budgets):
        continue
      state, step = eng.generate_many(params, state, budgets, stops, self.decode_steps)
      step, active = jax.device_get((step, state.active))
      for j, i in enumerate(slots):
        if i is None:
          continue
        o = out[i]
        for t in np.nonzero(step.active[:, j])[0]:
          o["tokens"].append(int(step.tokens[t, j]))
          o["logprobs"].append(np.float32(step.logprobs[t, j]))
          o["ids"].append(step.fed_expert_ids[t, j][None])
        if not active[j]:
          slots[j] = None
    return [Sample(tokens=o["tokens"], logprobs=np.asarray(o["logprobs"], np.float32),
                   expert_ids=np.concatenate(o["ids"]),
                   finish_reason="stop" if o["tokens"][-1] in stops else "length")
            for o in out]
