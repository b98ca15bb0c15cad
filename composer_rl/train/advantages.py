"""Group-relative advantage estimators (GRPO family), chosen by name.

Every estimator maps per-sequence rewards `r[N]` and group ids `g[N]` (the G rollouts of one
task share a group id; ids are arbitrary ints, groups may be ragged) to per-sequence
advantages `A[N]`. The trainer broadcasts A over the sequence's generated tokens.

* ``grpo``     A_i = (r_i - mean_g) / (std_g + eps)   (DeepSeekMath GRPO; population std)
* ``rloo``     A_i = r_i - mean_{j in g, j != i} r_j   (leave-one-out baseline, REINFORCE
               Leave-One-Out; unbiased because the baseline excludes the sample itself)
* ``dr_grpo``  A_i = r_i - mean_g                       (Dr. GRPO: no std normalization, which
               would up-weight near-deterministic groups)

A group of one sample gets advantage 0 (there is no baseline to compare against).
Pure jnp; jit-able; `rows_valid` (0/1, default all 1) drops padding rows from the statistics.
"""
from typing import Callable, Dict, Optional

import jax
import jax.numpy as jnp

F32 = jnp.float32


def _group_stats(rewards, group_ids, valid):
  """Per-row (count, sum, sum of squared deviations) of the row's group."""
  _, inverse = jnp.unique(group_ids, return_inverse=True, size=group_ids.shape[0])
  inverse = inverse.reshape(-1)
  n = group_ids.shape[0]
  count = jax.ops.segment_sum(valid, inverse, n)
  total = jax.ops.segment_sum(rewards * valid, inverse, n)
  mean = total / jnp.maximum(count, 1.0)
  dev2 = jax.ops.segment_sum(jnp.square(rewards - mean[inverse]) * valid, inverse, n)
  return count[inverse], total[inverse], dev2[inverse]


def grpo(rewards, group_ids, valid, eps: float = 1e-6):
  count, total, dev2 = _group_stats(rewards, group_ids, valid)
  mean = total / jnp.maximum(count, 1.0)
  std = jnp.sqrt(dev2 / jnp.maximum(count, 1.0))
  return jnp.where(count > 1, (rewards - mean) / (std + eps), 0.0)


def rloo(rewards, group_ids, valid, eps: float = 1e-6):
  del eps
  count, total, _ = _group_stats(rewards, group_ids, valid)
  baseline = (total - rewards) / jnp.maximum(count - 1.0, 1.0)
  return jnp.where(count > 1, rewards - baseline, 0.0)


def dr_grpo(rewards, group_ids, valid, eps: float = 1e-6):
  del eps
  count, total, _ = _group_stats(rewards, group_ids, valid)
  return jnp.where(count > 1, rewards - total / jnp.maximum(count, 1.0), 0.0)


ESTIMATORS: Dict[str, Callable] = {"grpo": grpo, "rloo": rloo, "dr_grpo": dr_grpo}


def compute_advantages(name: str, rewards, group_ids, rows_valid: Optional[jax.Array] = None,
                       eps: float = 1e-6) -> jax.Array:
  """Advantages [N] by estimator `name` (see module docstring); padding rows get 0.

  Args:
    name: one of ESTIMATORS.
    rewards: [N] per-sequence scalar rewards.
    group_ids: [N] int group of each sequence.
    rows_valid: [N] 1 for real rows, 0 for padding rows (excluded from group statistics).
    eps: added to the group std (``grpo``) so constant-reward groups give 0, not NaN.
  """
  if name not in ESTIMATORS:
    raise ValueError(f"unknown advantage estimator {name!r}; known: {sorted(ESTIMATORS)}")
  rewards = jnp.asarray(rewards, F32)
  valid = jnp.ones_like(rewards) if rows_valid is None else jnp.asarray(rows_valid, F32)
  adv = ESTIMATORS[name](rewards, jnp.asarray(group_ids, jnp.int32), valid, eps)
  return jnp.where(valid > 0, adv, 0.0)
