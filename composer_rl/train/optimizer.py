"""Optimizer: AdamW on fp32 master weights, linear warmup + cosine decay, global-norm clip.

Gradient clipping is *not* an optax transform here: the train step computes the global norm
itself, on the replicated, deterministically reduced gradients, so the clip factor (a
reduction over every parameter) has the same bits on 1 device and on N. What remains in
optax is elementwise (Adam moments, decoupled weight decay, the update), hence bitwise
under any parameter sharding.
"""
import dataclasses

import jax
import jax.numpy as jnp
import optax


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """AdamW and its schedule.

  learning_rate: peak learning rate (reached at the end of warmup).
  warmup_steps: steps of linear warmup from 0 to learning_rate.
  total_steps: horizon of the cosine decay (warmup included); after it the rate stays at
    the end value.
  end_lr_ratio: final learning rate as a fraction of the peak.
  weight_decay: decoupled weight decay; applied to weight matrices, not to norm scales
    (leaves named `*norm`, which are stacked over layers like the matrices).
  b1, b2, eps: Adam moment decay rates and denominator epsilon.
  max_grad_norm: clip gradients to this global L2 norm (0 = no clipping).
  """
  learning_rate: float = 1e-3
  warmup_steps: int = 10
  total_steps: int = 1000
  end_lr_ratio: float = 0.1
  weight_decay: float = 0.0
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-8
  max_grad_norm: float = 1.0

  def __post_init__(self):
    if not self.learning_rate > 0:
      raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
    if self.warmup_steps < 0 or self.total_steps <= 0:
      raise ValueError(f"need warmup_steps >= 0 and total_steps > 0, got "
                       f"{self.warmup_steps}, {self.total_steps}")
    for name in ("end_lr_ratio", "weight_decay", "max_grad_norm"):
      if getattr(self, name) < 0:
        raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
    if not (0 <= self.b1 < 1 and 0 <= self.b2 < 1):
      raise ValueError(f"b1, b2 must be in [0, 1), got {self.b1}, {self.b2}")


def schedule(cfg: OptimizerConfig) -> optax.Schedule:
  warmup = min(cfg.warmup_steps, max(cfg.total_steps - 1, 0))
  if warmup == 0:  # (optax warns about a zero-length warmup segment)
    return optax.cosine_decay_schedule(cfg.learning_rate, cfg.total_steps, cfg.end_lr_ratio)
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=cfg.learning_rate, warmup_steps=warmup,
      decay_steps=cfg.total_steps, end_value=cfg.learning_rate * cfg.end_lr_ratio)


def make_optimizer(cfg: OptimizerConfig) -> optax.GradientTransformation:
  def decay_mask(params):
    def decays(path, p):
      name = getattr(path[-1], "key", getattr(path[-1], "name", ""))
      return p.ndim >= 2 and not str(name).endswith("norm")
    return jax.tree_util.tree_map_with_path(decays, params)
  return optax.adamw(schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                     weight_decay=cfg.weight_decay, mask=decay_mask)


def clip_by_global_norm(grads, norm: jax.Array, max_norm: float):
  """Scales grads by min(1, max_norm / norm) (identity when max_norm is 0)."""
  if not max_norm:
    return grads
  scale = jnp.minimum(1.0, max_norm / jnp.maximum(norm, 1e-12))
  return jax.tree.map(lambda g: g * scale, grads)
