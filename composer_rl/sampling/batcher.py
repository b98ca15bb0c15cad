"""The one continuous-batching loop over the engine's decode slots.

Both the rollout runner (`composer_rl.rollout.runner`: agent sessions, turn by turn) and
the server's generator (`composer_rl.serving.generator`: request-driven completions) are
made of this: a source of sequences that decides what to admit, this batcher, which owns
the engine's decode state, the slots and the weights, and a sink (the caller) that takes
each sequence whose run ended. What a sequence is, when it ends and what its tokens mean
belong to the caller, through a `SlotClient`:

  context(seq) -> the tokens of the sequence's current context (cache positions from 0);
  request(seq) -> its `Request` (session id, seed, sampling transform);
  budget(seq)  -> tokens it may still sample in this run (>= 1);
  on_token(seq, token, logprob, top_ids, top_logprobs, version) -> True when the run ends;
  keep_cache(seq) -> whether an ended run keeps its KV cache for a later admission.

A sequence carries `saved` (the engine `Prefix` it continues from, or None) and
`saved_version` (the weight version that computed it). A saved cache is only ever
extended under the version that computed it: a sequence is never fed to the engine with a
cache from other weights, so each of its tokens' log-probs is exactly the trainer's
recomputation under the version recorded with it.

Exactness does not depend on what shares a batch (`composer_rl.ops.exact`): admitting
several sequences in one prefill, and decoding `decode_steps` steps per call
(`Engine.generate_many`), give the bits one sequence alone would get.
"""
import time
from typing import Any, Dict, List, Optional

import numpy as np

from composer_rl.sampling.engine import Engine

STAT_KEYS = ("decode_steps", "generated_tokens", "prefill_tokens", "decode_seconds",
             "prefill_seconds")


class SlotBatcher:
  """See module docstring.

  engine: the engine; client: the `SlotClient`; params/version: the weights to sample with.
  decode_steps: engine decode steps per call (1 = `generate`, else `generate_many`: one
    dispatch and one host sync per block; a slot whose run ends inside a block stops there).
  stop_token: the id that ends a run inside a `generate_many` block (-1 = none); the
    client's `on_token` still decides on the host.
  stats: a dict to add `STAT_KEYS` counters to (the caller's, so its stats hold both).
  """

  def __init__(self, engine: Engine, client, params, version: int, decode_steps: int = 1,
               stop_token: int = -1, stats: Optional[Dict[str, float]] = None):
    if decode_steps < 1:
      raise ValueError(f"decode_steps must be >= 1, got {decode_steps}")
    self.engine, self.client = engine, client
    self.params, self.version = params, int(version)
    self.decode_steps, self.stop_token = int(decode_steps), int(stop_token)
    self.stats = stats if stats is not None else {}
    for k in STAT_KEYS:
      self.stats.setdefault(k, 0)
    self.reset()

  def reset(self) -> None:
    """Empties every slot (their sequences are forgotten) with a fresh decode state."""
    self.state = self.engine.init_decode_state()
    self.slots: List[Optional[Any]] = [None] * self.engine.slots

  @property
  def free(self) -> int:
    return self.slots.count(None)

  @property
  def busy(self) -> bool:
    return any(s is not None for s in self.slots)

  def switch(self, params, version: int) -> List[Any]:
    """Installs new weights. Sequences in slots are taken out with their caches dropped
    (they are re-prefilled under the new version when admitted again) and returned in
    slot order."""
    self.params, self.version = params, int(version)
    out = []
    for i, s in enumerate(self.slots):
      if s is not None:
        s.saved = None
        out.append(self.evict(i))
    return out

  def evict(self, slot: int) -> Any:
    """Frees a slot without keeping its cache; returns the sequence that held it."""
    s, self.slots[slot] = self.slots[slot], None
    self.state = self.engine.free(self.state, slot)
    return s

  def admit(self, seqs: List[Any]) -> List[Any]:
    """Prefills the sequences' uncached tokens in one batch and samples each one's next
    token; those whose run goes on take free slots. Returns those whose first token
    ended the run (with `saved` set as `keep_cache` says)."""
    if len(seqs) > self.free:
      raise ValueError(f"{len(seqs)} sequences for {self.free} free slots")
    c = self.client
    items = []
    for s in seqs:
      if s.saved is not None and s.saved_version != self.version:
        s.saved = None  # never extend a cache computed under other weights
      cached = int(s.saved.length) if s.saved is not None else 0
      items.append((c.context(s)[cached:], c.request(s), s.saved))
    t0 = time.perf_counter()
    prefixes = self.engine.prefill_many(params=self.params, items=items)
    self.stats["prefill_seconds"] += time.perf_counter() - t0
    self.stats["prefill_tokens"] += sum(len(t) for t, _, _ in items)
    ended = []
    for s, prefix in zip(seqs, prefixes):
      s.saved, s.saved_version = None, self.version
      self.stats["generated_tokens"] += 1
      if c.on_token(s, int(prefix.token), float(prefix.logprob), np.asarray(prefix.top_ids),
                    np.asarray(prefix.top_logprobs), self.version):
        s.saved = self.engine.park(prefix) if c.keep_cache(s) else None
        ended.append(s)
      else:
        slot = self.slots.index(None)
        self.state = self.engine.insert(prefix, self.state, slot)
        self.slots[slot] = s
    return ended

  def decode(self) -> List[Any]:
    """One engine call for every occupied slot (`decode_steps` steps); returns the
    sequences whose run ended, in slot order, their slots freed."""
    if not self.busy:
      return []
    eng, k = self.engine, self.decode_steps
    t0 = time.perf_counter()
    if k == 1:
      self.state, out = eng.generate(self.params, self.state)
      out = [np.asarray(a)[None] for a in (out.tokens, out.logprobs, out.top_ids,
                                           out.top_logprobs)]
      live = np.asarray([[s is not None for s in self.slots]])
    else:
      budgets = [0 if s is None else self.client.budget(s) for s in self.slots]
      self.state, res = eng.generate_many(self.params, self.state, budgets, self.stop_token, k)
      out = [np.asarray(a) for a in (res.tokens, res.logprobs, res.top_ids, res.top_logprobs)]
      live = np.asarray(res.active)
    self.stats["decode_seconds"] += time.perf_counter() - t0
    self.stats["decode_steps"] += k
    toks, lps, top_ids, top_lps = out
    ended = []
    for i, s in enumerate(self.slots):
      if s is None:
        continue
      for j in range(toks.shape[0]):
        if not live[j, i]:
          continue
        self.stats["generated_tokens"] += 1
        if self.client.on_token(s, int(toks[j, i]), float(lps[j, i]), top_ids[j, i],
                                top_lps[j, i], self.version):
          s.saved = eng.release(self.state, i) if self.client.keep_cache(s) else None
          self.evict(i)
          ended.append(s)
          break
    return ended
