"""Training stages the controllers compose: SFT on rows, and one RL update on finished
sessions. Each is a plain function over a `TrainStep` (the one compiled update,
`composer_rl.train.train_step`) and its state, so agent RL, online RL, the pipeline and the
ablation train the same way; what differs between them (where rows and sessions come
from, how advantages group) is an argument.
"""
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import jax
import numpy as np

from composer_rl.progress import progress
from composer_rl.train.batch import build_batch
from composer_rl.train.optimizer import OptimizerConfig
from composer_rl.train.sft import make_sft_step
from composer_rl.train.train_step import TrainStep


def padded_rows(step: TrainStep, n: int, multiple: int = 1) -> int:
  """Batch rows for n records: up to a multiple of `multiple` (so the step's shape, and its
  compiled program, changes only when it must), then of the step's batch shards x
  micro-batch."""
  n = -(-n // multiple) * multiple
  per = step.num_shards * step.config.micro_batch_size
  return -(-n // per) * per


def host_metrics(m) -> Dict[str, float]:
  """A step's metrics (device scalars) as host floats."""
  return {k: float(v) for k, v in jax.device_get(m).items()}


def sft_stage(model_config, mesh, *, learning_rate: float, warmup_steps: int, steps: int,
              batch_size: int, sample: Callable[[int], Sequence[Any]], metrics,
              log_every: int, seed: int, init_params=None):
  """SFT for `steps` steps from `init_params` (None = a fresh initialization with `seed`):
  step k trains on `sample(k)` (records with tokens + loss_mask, at most `batch_size`),
  logging the step's metrics every `log_every` steps and at the last one (phase 'sft').
  Returns the `TrainState`."""
  step = make_sft_step(model_config, OptimizerConfig(
      learning_rate=learning_rate, warmup_steps=warmup_steps, total_steps=steps), mesh)
  state = step.init_state(seed, params=init_params)
  rows = padded_rows(step, batch_size)
  for k in progress(steps, "SFT", "steps", iterable=range(steps)):
    batch = build_batch(sample(k), model_config.max_seq_len, num_rows=rows)
    state, m = step.step(state, step.shard_batch(batch))
    if k % log_every == 0 or k == steps - 1:
      metrics.write(k, host_metrics(m), phase="sft")
  return state


def rl_update(step: TrainStep, state, records: Sequence[Any], advantages, *,
              temperature: float, top_k: int = 0, top_p: float = 1.0,
              row_multiple: int = 1, seq_len: Optional[int] = None
              ) -> Tuple[Any, Dict[str, float]]:
  """One policy-gradient update on finished sessions (records with tokens, loss_mask and
  the sampled log-probs and versions; one advantage each), scored under the sampling
  transform they were drawn with. Returns (state, metrics), with `trained_tokens` (tokens
  through forward and backward)."""
  seq_len = seq_len or step.model_config.max_seq_len
  batch = build_batch(records, seq_len, num_rows=padded_rows(step, len(records), row_multiple),
                      advantages=np.asarray(advantages, np.float32), temperature=temperature,
                      top_k=top_k, top_p=top_p)
  state, m = step.step(state, step.shard_batch(batch))
  out = host_metrics(m)
  out["trained_tokens"] = float(sum(len(r.tokens) if hasattr(r, "tokens") else len(r["tokens"])
                                    for r in records))
  return state, out
