"""The parity suite: sampler log-probs vs trainer log-probs, compared as bits.

One reference generation (all prompts in one batch, whole-prompt prefill, one device) is
compared with every *case*, each a different way of producing the same numbers:

* sampler cases, all through the continuous-batching `Engine` (`Sampler` is a few lines
  over it): fewer slots than prompts (sessions wait, take freed slots, decode beside
  others), shuffled order, chunked prefill, other prompt padding, a prompt prefilled in
  two parts onto the saved prefix, the bf16 inference copy of the weights, and (with >= 2
  devices) the engine on a device mesh. The same sequence must sample the same tokens with
  the same log-prob bits and the same experts.
* trainer cases: `score_tokens` on the finished sequences (decode vs full forward) in a
  forward-only program and inside `jax.value_and_grad` (also with every layer
  rematerialized, `remat='full'`), with other batch groupings and paddings, on one device
  and sharded.

Every compared float is compared through its `uint32` view; `max_abs_diff` is reported
only to size a failure.
"""
import dataclasses
import time
from typing import Any, Dict, List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from composer_rl.model import sharding
from composer_rl.progress import progress
from composer_rl.model.config import ModelConfig
from composer_rl.model.transformer import Transformer, inference_copy
from composer_rl.sampling.sampler import Sample, Sampler, SamplingConfig
from composer_rl.train.scoring import score_tokens


@dataclasses.dataclass
class Tally:
  """Running totals over cases."""
  tokens: int = 0
  mismatched_tokens: int = 0
  routing_mismatches: int = 0
  max_abs_diff: float = 0.0
  cases: int = 0
  per_case: List[Dict] = dataclasses.field(default_factory=list)

  def add(self, name: str, ref_lp: np.ndarray, lp: np.ndarray, ref_tokens=None, tokens=None,
          ref_ids=None, ids=None) -> None:
    ref_lp, lp = np.asarray(ref_lp, np.float32), np.asarray(lp, np.float32)
    bad = ref_lp.view(np.uint32) != lp.view(np.uint32)
    if ref_tokens is not None:
      bad |= np.asarray(ref_tokens) != np.asarray(tokens)
    routing = 0
    if ref_ids is not None and ref_ids.size:
      routing = int(np.any((ref_ids != ids).reshape(len(ref_ids), -1), axis=-1).sum())
    diff = float(np.max(np.abs(ref_lp - lp))) if ref_lp.size else 0.0
    self.tokens += int(ref_lp.size)
    self.mismatched_tokens += int(bad.sum())
    self.routing_mismatches += routing
    self.max_abs_diff = max(self.max_abs_diff, diff)
    self.per_case.append(dict(case=name, tokens=int(ref_lp.size), mismatched=int(bad.sum()),
                              routing_mismatches=routing, max_abs_diff=diff))

  def merge_case(self, name: str, parts: List["Tally"]) -> None:
    """Folds per-sequence tallies into one named case."""
    for p in parts:
      self.tokens += p.tokens
      self.mismatched_tokens += p.mismatched_tokens
      self.routing_mismatches += p.routing_mismatches
      self.max_abs_diff = max(self.max_abs_diff, p.max_abs_diff)
    self.cases += 1
    self.per_case.append(dict(
        case=name, tokens=sum(p.tokens for p in parts),
        mismatched=sum(p.mismatched_tokens for p in parts),
        routing_mismatches=sum(p.routing_mismatches for p in parts),
        max_abs_diff=max([p.max_abs_diff for p in parts] or [0.0])))


def _compare_samples(ref: Sequence[Sample], got: Sequence[Sample]) -> List[Tally]:
  parts = []
  for r, g in zip(ref, got):
    t = Tally()
    n = min(len(r.tokens), len(g.tokens))
    lp_ref = np.concatenate([r.logprobs, np.full(max(0, len(g.tokens) - n), np.nan, np.float32)])
    lp_got = np.concatenate([g.logprobs, np.full(max(0, len(r.tokens) - n), np.nan, np.float32)])
    tok_ref = r.tokens + [-1] * (len(lp_ref) - len(r.tokens))
    tok_got = g.tokens + [-1] * (len(lp_got) - len(g.tokens))
    m = min(len(r.expert_ids), len(g.expert_ids))
    t.add("", lp_ref, lp_got, tok_ref, tok_got, r.expert_ids[:m], g.expert_ids[:m])
    parts.append(t)
  return parts


def _training_batch(prompts, samples, order, pad_to: int):
  """Right-padded [B, S] tokens, segments and loss mask (1 where predicting a generated
  token) for the sequences prompt+completion in `order`."""
  seqs = [(len(prompts[i]), list(prompts[i]) + samples[i].tokens) for i in order]
  width = max(max(len(s) for _, s in seqs), pad_to)
  tokens = np.zeros((len(seqs), width), np.int32)
  segments = np.zeros_like(tokens)
  loss_mask = np.zeros((len(seqs), width - 1), np.float32)
  for row, (plen, s) in enumerate(seqs):
    tokens[row, :len(s)] = s
    segments[row, :len(s)] = 1
    loss_mask[row, plen - 1:len(s) - 1] = 1.0
  return tokens, segments, loss_mask


class ParityRunner:
  """Runs all cases for one model config; see module docstring."""

  def __init__(self, model_config: ModelConfig, sampling: SamplingConfig, num_prompts: int,
               prompt_len_range, batch_sizes, prefill_chunks, prompt_buckets,
               train_batch_sizes, num_devices: Sequence[int], seed: int,
               params: Optional[Any] = None):
    self.config, self.sampling, self.seed = model_config, sampling, seed
    self.batch_sizes, self.prefill_chunks = batch_sizes, prefill_chunks
    self.prompt_buckets, self.train_batch_sizes = prompt_buckets, train_batch_sizes
    self.num_devices = [d for d in num_devices if d > 1 and d <= jax.device_count()]
    self.skipped_devices = [d for d in num_devices if d > jax.device_count()]
    self.model = Transformer(model_config, rngs=nnx.Rngs(seed))
    self.graphdef, self.state = nnx.split(self.model)
    if params is not None:  # given weights (e.g. an imported checkpoint's pure dict)
      nnx.replace_by_pure_dict(self.state, jax.tree.map(jnp.asarray, params))
      nnx.update(self.model, self.state)
    rng = np.random.default_rng(seed)
    lo, hi = prompt_len_range
    self.prompts = [rng.integers(1, model_config.vocab_size, int(rng.integers(lo, hi + 1))
                                 ).tolist() for _ in range(num_prompts)]
    self.seq_ids = [int(x) for x in rng.permutation(10 * num_prompts)[:num_prompts]]
    self.rng = rng

  # ---- sampler side -------------------------------------------------------------------
  def _sample(self, order, slots, chunk, bucket, mesh=None, prefix_split=0,
              state=None) -> List[Sample]:
    """Every prompt through one Engine with `slots` slots, in `order`: sessions beyond the
    slots wait and take the slot a finished one frees."""
    sampler = Sampler(self.model, prefill_chunk=chunk, prompt_bucket=bucket, mesh=mesh,
                      slots=slots, prefix_split=prefix_split)
    if state is not None:
      sampler.update_state(state)
    got = sampler.generate([self.prompts[i] for i in order], [self.seq_ids[i] for i in order],
                           self.sampling)
    out: Dict[int, Sample] = dict(zip(order, got))
    return [out[i] for i in range(len(self.prompts))]

  # ---- trainer side -------------------------------------------------------------------
  def _score_fn(self, with_grad: bool, mesh=None, remat: Optional[str] = None):
    graphdef, sampling = self.graphdef, self.sampling
    if remat not in (None, self.config.remat):  # the same weights; the backward rematerializes layers
      graphdef = nnx.split(nnx.eval_shape(lambda: Transformer(
          self.config.replace(remat=remat), rngs=nnx.Rngs(0))))[0]

    def scores(state, tokens, segments):
      model = nnx.merge(graphdef, state)
      rows = sampling.rows(tokens.shape[0])
      return score_tokens(model, tokens, rows, segments)

    def fn(state, tokens, segments, loss_mask):
      if not with_grad:
        s = scores(state, tokens, segments)
        return s.logprobs, s.expert_ids

      def loss(st):  # policy-gradient-shaped: only generated tokens carry loss
        s = scores(st, tokens, segments)
        return -jnp.sum(s.logprobs * loss_mask), s
      (_, s), grads = jax.value_and_grad(loss, has_aux=True)(state)
      gnorm = sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(grads))
      return s.logprobs, s.expert_ids, jnp.broadcast_to(gnorm, (tokens.shape[0],))

    if mesh is not None:
      fn = sharding.shard_batch(fn, mesh, num_replicated=1)
    return jax.jit(fn)

  def _score(self, samples, order, batch_size, pad_to, with_grad, mesh=None, remat=None):
    fn = self._score_fn(with_grad, mesh, remat)
    shards = sharding.num_batch_shards(mesh) if mesh is not None else 1
    parts = []
    for start in range(0, len(order), batch_size):
      idx = list(order[start:start + batch_size])
      idx_padded = idx + [idx[0]] * (-len(idx) % shards)
      batch = _training_batch(self.prompts, samples, idx_padded, pad_to)
      out = jax.device_get(fn(self.state, *batch))
      lps, ids = out[0], out[1]
      if with_grad and not np.all(np.isfinite(out[2])):
        raise FloatingPointError("non-finite gradient in the parity grad program")
      for row, i in enumerate(idx):
        plen, s = len(self.prompts[i]), samples[i]
        t = Tally()
        consumed = plen + len(s.tokens) - 1
        t.add("", s.logprobs, lps[row, plen - 1:plen - 1 + len(s.tokens)],
              ref_ids=s.expert_ids, ids=ids[row, :consumed])
        parts.append(t)
    return parts

  def run(self) -> Tally:
    tally = Tally()
    cases = (2 + len(self.batch_sizes) * len(self.prefill_chunks) * len(self.prompt_buckets)
             + (self.config.compute_dtype != self.config.param_dtype)
             + 2 * len(self.train_batch_sizes) + 1 + 3 * len(self.num_devices))
    bar = progress(cases, f"parity ({self.config.compute_dtype})", "cases")

    def merge(name, parts):
      tally.merge_case(name, parts)
      bar.update(1)
    everyone = list(range(len(self.prompts)))
    ref = self._sample(everyone, len(everyone), None, 16)
    merge("reference_self", _compare_samples(ref, ref))
    for bs in self.batch_sizes:
      for chunk in self.prefill_chunks:
        for bucket in self.prompt_buckets:
          order = [int(i) for i in self.rng.permutation(len(everyone))]
          got = self._sample(order, bs, chunk, bucket)
          merge(f"sampler/slots={bs}/chunk={chunk}/bucket={bucket}/shuffled",
                           _compare_samples(ref, got))
    order = [int(i) for i in self.rng.permutation(len(everyone))]
    split = max(1, min(len(p) for p in self.prompts) // 2)
    got = self._sample(order, max(1, len(everyone) // 2), None, 16, prefix_split=split)
    merge(f"sampler/saved_prefix={split}", _compare_samples(ref, got))
    if self.config.compute_dtype != self.config.param_dtype:
      got = self._sample(order, len(everyone), None, 16,
                         state=inference_copy(self.state, self.config))
      merge("sampler/inference_copy", _compare_samples(ref, got))
    for bs in self.train_batch_sizes:
      for with_grad in (False, True):
        order = [int(i) for i in self.rng.permutation(len(everyone))]
        pad_to = int(self.rng.integers(0, self.config.max_seq_len + 1))
        kind = "value_and_grad" if with_grad else "forward"
        merge(f"trainer/{kind}/batch={bs}/pad_to={pad_to}",
                         self._score(ref, order, bs, pad_to, with_grad))
    order = [int(i) for i in self.rng.permutation(len(everyone))]
    merge("trainer/value_and_grad/remat=full",
          self._score(ref, order, self.train_batch_sizes[-1], 0, True, remat="full"))
    for n in self.num_devices:
      mesh = sharding.make_mesh({"data": n}, jax.devices()[:n])
      order = [int(i) for i in self.rng.permutation(len(everyone))]
      got = self._sample(order, len(everyone), self.prefill_chunks[-1], 16, mesh)
      merge(f"sampler/devices={n}", _compare_samples(ref, got))
      for with_grad in (False, True):
        kind = "value_and_grad" if with_grad else "forward"
        merge(f"trainer/{kind}/devices={n}",
                         self._score(ref, order, len(everyone), 0, with_grad, mesh))
    bar.close()
    return tally


def run_suite(model_configs: Sequence[ModelConfig], sampling: SamplingConfig,
              params: Optional[Sequence[Any]] = None, **kw) -> Dict:
  """Runs ParityRunner for each model config; returns the JSON-able report.

  params: optional, one parameter pure dict (or None = random init from `seed`) per model
    config, e.g. `composer_rl.model.hf_qwen3.import_hf(...)[1]` for an imported checkpoint.
  """
  start = time.time()
  total, reports, skipped = Tally(), [], set()
  params = list(params) if params is not None else [None] * len(model_configs)
  if len(params) != len(model_configs):
    raise ValueError(f"run_suite: {len(params)} params for {len(model_configs)} model configs")
  for mc, p in zip(model_configs, params):
    runner = ParityRunner(mc, sampling, params=p, **kw)
    t = runner.run()
    skipped.update(runner.skipped_devices)
    reports.append(dict(model=dataclasses.asdict(mc), tokens=t.tokens,
                        mismatched_tokens=t.mismatched_tokens,
                        routing_mismatches=t.routing_mismatches,
                        max_abs_diff=t.max_abs_diff, cases=t.per_case))
    total.tokens += t.tokens
    total.mismatched_tokens += t.mismatched_tokens
    total.routing_mismatches += t.routing_mismatches
    total.max_abs_diff = max(total.max_abs_diff, t.max_abs_diff)
    total.cases += t.cases
  return dict(tokens=total.tokens, mismatched_tokens=total.mismatched_tokens,
              max_abs_diff=total.max_abs_diff, routing_mismatches=total.routing_mismatches,
              cases=total.cases, devices=jax.device_count(),
              skipped_device_counts=sorted(skipped), seconds=round(time.time() - start, 1),
              models=reports)
