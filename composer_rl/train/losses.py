"""Token-level policy objectives, KL estimators and loss aggregation, chosen by name.

All functions are pure jnp on [B, T] arrays aligned with `Scores.logprobs` (position t
predicts token t+1). `mask` is 1 exactly where the *model sampled* the predicted token;
prompts, tool observations and padding are 0, so they never carry loss.

Policy losses (per token, to be minimized; `r = exp(logp - behaviour_logp)` is the
importance ratio of the current policy to the policy that sampled the token -- exactly 1.0
for on-policy tokens because sampler and trainer log-probs are bitwise equal):

* ``ppo_clip``  -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A). PPO / GRPO with
                eps_low == eps_high; DAPO's "clip-higher" with eps_high > eps_low.
* ``tis``       -stop_grad(min(r, tis_cap)) A logp. Truncated importance sampling
                (IMPALA-style): an unbiased-up-to-truncation policy gradient for stale
                samples whose ratio has drifted; the cap bounds the variance.
* ``sft``       -logp. Maximum likelihood on the masked tokens (advantages ignored).

KL penalty to a reference policy (added as kl_coef * estimator per token), with
d = ref_logp - logp: ``k1`` = -d, ``k2`` = d^2 / 2, ``k3`` = exp(d) - d - 1 (Schulman's
low-variance, always >= 0 estimator, as in GRPO).

Aggregation of per-token losses into the scalar objective:

* ``token_mean``           sum over all tokens / number of loss tokens in the *whole batch*
                           (DAPO: every token weighs the same, long answers are not diluted).
* ``seq_mean_token_mean``  mean over sequences of each sequence's token mean (original GRPO).
* ``seq_mean_token_sum_norm``  sum over tokens / (num sequences * norm_length) (Dr. GRPO:
                           a constant normalizer, no length bias).

Normalizers are global (whole batch) scalars passed in, so a batch split into microbatches
or device shards sums to exactly the objective of the whole batch.
"""
import dataclasses
from typing import Callable, Dict, NamedTuple

import jax
import jax.numpy as jnp

F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class LossConfig:
  """Hyperparameters of the objective.

  policy_loss: 'ppo_clip', 'tis' or 'sft' (see module docstring).
  clip_eps_low: ppo_clip lower clip; the ratio is floored at 1 - clip_eps_low when A < 0.
  clip_eps_high: ppo_clip upper clip; ceiling 1 + clip_eps_high when A > 0 (DAPO: 0.28).
  tis_cap: truncation C of the importance weight min(r, C) in 'tis'.
  kl_coef: weight of the KL penalty to the reference policy (0 = off, no reference needed).
  kl_estimator: 'k1', 'k2' or 'k3'.
  entropy_coef: weight of an entropy bonus (subtracted from the loss; 0 = off).
  aggregation: 'token_mean', 'seq_mean_token_mean' or 'seq_mean_token_sum_norm'.
  norm_length: the constant of 'seq_mean_token_sum_norm' (0 = the padded length T).
  """
  policy_loss: str = "ppo_clip"
  clip_eps_low: float = 0.2
  clip_eps_high: float = 0.2
  tis_cap: float = 2.0
  kl_coef: float = 0.0
  kl_estimator: str = "k3"
  entropy_coef: float = 0.0
  aggregation: str = "token_mean"
  norm_length: int = 0

  def __post_init__(self):
    if self.policy_loss not in POLICY_LOSSES:
      raise ValueError(f"policy_loss={self.policy_loss!r}; known: {sorted(POLICY_LOSSES)}")
    if self.kl_estimator not in KL_ESTIMATORS:
      raise ValueError(f"kl_estimator={self.kl_estimator!r}; known: {sorted(KL_ESTIMATORS)}")
    if self.aggregation not in AGGREGATIONS:
      raise ValueError(f"aggregation={self.aggregation!r}; known: {sorted(AGGREGATIONS)}")
    for name in ("clip_eps_low", "clip_eps_high", "kl_coef", "entropy_coef", "norm_length"):
      if getattr(self, name) < 0:
        raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
    if not self.clip_eps_low < 1:
      raise ValueError(f"clip_eps_low must be < 1, got {self.clip_eps_low}")
    if not self.tis_cap > 0:
      raise ValueError(f"tis_cap must be > 0, got {self.tis_cap}")


# ---- per-token policy losses: (logp, behaviour_logp, adv, cfg) -> (loss, clipped) -------
def ppo_clip(logp, behaviour_logp, adv, cfg: LossConfig):
  ratio = jnp.exp(logp - behaviour_logp)
  unclipped = ratio * adv
  clipped = jnp.clip(ratio, 1.0 - cfg.clip_eps_low, 1.0 + cfg.clip_eps_high) * adv
  return -jnp.minimum(unclipped, clipped), (clipped < unclipped).astype(F32)


def tis(logp, behaviour_logp, adv, cfg: LossConfig):
  ratio = jax.lax.stop_gradient(jnp.exp(logp - behaviour_logp))
  weight = jnp.minimum(ratio, cfg.tis_cap)
  return -weight * adv * logp, (ratio > cfg.tis_cap).astype(F32)


def sft(logp, behaviour_logp, adv, cfg: LossConfig):
  del behaviour_logp, adv, cfg
  return -logp, jnp.zeros_like(logp)


POLICY_LOSSES: Dict[str, Callable] = {"ppo_clip": ppo_clip, "tis": tis, "sft": sft}


# ---- KL estimators: (logp, ref_logp) -> per-token KL(pi || ref) estimate ----------------
def k1(logp, ref_logp):
  return logp - ref_logp


def k2(logp, ref_logp):
  return 0.5 * jnp.square(ref_logp - logp)


def k3(logp, ref_logp):
  d = ref_logp - logp
  return jnp.exp(d) - d - 1.0


KL_ESTIMATORS: Dict[str, Callable] = {"k1": k1, "k2": k2, "k3": k3}


# ---- aggregation ---------------------------------------------------------------------
class Normalizers(NamedTuple):
  """Whole-batch denominators (scalars): loss tokens, valid sequences, padded length T."""
  num_tokens: jax.Array
  num_seqs: jax.Array
  length: jax.Array


def normalizers(mask, rows_valid) -> Normalizers:
  """From the *whole* batch: mask [B, T], rows_valid [B]. Counts are integers in fp32, so
  their sum is exact in any order (< 2^24) and identical across device counts."""
  return Normalizers(num_tokens=jnp.maximum(jnp.sum(mask.astype(F32)), 1.0),
                     num_seqs=jnp.maximum(jnp.sum(rows_valid.astype(F32)), 1.0),
                     length=jnp.asarray(mask.shape[1], F32))


def token_mean(per_token, mask, norms: Normalizers, cfg: LossConfig):
  del cfg
  return jnp.sum(per_token * mask) / norms.num_tokens


def seq_mean_token_mean(per_token, mask, norms: Normalizers, cfg: LossConfig):
  del cfg
  per_seq = jnp.sum(per_token * mask, -1) / jnp.maximum(jnp.sum(mask, -1), 1.0)
  return jnp.sum(per_seq) / norms.num_seqs


def seq_mean_token_sum_norm(per_token, mask, norms: Normalizers, cfg: LossConfig):
  length = jnp.asarray(cfg.norm_length, F32) if cfg.norm_length else norms.length
  return jnp.sum(per_token * mask) / (norms.num_seqs * length)


AGGREGATIONS: Dict[str, Callable] = {
    "token_mean": token_mean, "seq_mean_token_mean": seq_mean_token_mean,
    "seq_mean_token_sum_norm": seq_mean_token_sum_norm}


def policy_objective(logp, behaviour_logp, adv, mask, norms: Normalizers, cfg: LossConfig,
                     ref_logp=None, entropy=None):
  """The scalar loss of (a slice of) a batch, and summable metrics.

  Args:
    logp: [B, T] current-policy log-probs (differentiated).
    behaviour_logp: [B, T] log-probs the sampler recorded (0 where mask is 0).
    adv: [B] or [B, T] advantages (broadcast over tokens).
    mask: [B, T] 1 on model-sampled tokens.
    norms: whole-batch `Normalizers`.
    ref_logp: [B, T] reference-policy log-probs (needed iff cfg.kl_coef > 0).
    entropy: [B, T] entropy of the current policy (needed iff cfg.entropy_coef > 0).

  Returns:
    (loss, metrics) where every metric is a sum over this slice (or a max / min for keys
    ending in _max / _min) so that slices combine by addition.
  """
  mask = mask.astype(F32)
  on = mask > 0
  # Masked positions may hold -inf (outside a top-k support); zero them so no inf/NaN
  # enters the arithmetic or its gradient.
  logp = jnp.where(on, logp, 0.0)
  behaviour_logp = jnp.where(on, behaviour_logp, 0.0)
  adv = jnp.broadcast_to(adv[:, None] if adv.ndim == 1 else adv, logp.shape).astype(F32)
  per_token, clipped = POLICY_LOSSES[cfg.policy_loss](logp, behaviour_logp, adv, cfg)
  agg = AGGREGATIONS[cfg.aggregation]
  loss = agg(per_token, mask, norms, cfg)
  lp_sg = jax.lax.stop_gradient(logp)
  ratio = jnp.exp(lp_sg - behaviour_logp)
  metrics = {
      "policy_loss": jax.lax.stop_gradient(loss),
      "tokens": jnp.sum(mask),
      "ratio_sum": jnp.sum(ratio * mask),
      "ratio_max": jnp.max(jnp.where(on, ratio, -jnp.inf)),
      "ratio_min": jnp.min(jnp.where(on, ratio, jnp.inf)),
      "ratio_not_one": jnp.sum(jnp.where(on & (ratio != 1.0), 1.0, 0.0)),
      "clipped": jnp.sum(clipped * mask),
      "kl_behaviour_sum": jnp.sum(k3(lp_sg, behaviour_logp) * mask),
      "logp_sum": jnp.sum(lp_sg * mask),
  }
  if cfg.kl_coef > 0:
    ref_logp = jnp.where(on, jax.lax.stop_gradient(ref_logp), 0.0)
    kl = KL_ESTIMATORS[cfg.kl_estimator](logp, ref_logp)
    kl_loss = agg(kl, mask, norms, cfg)
    loss = loss + cfg.kl_coef * kl_loss
    metrics["kl_ref"] = jax.lax.stop_gradient(kl_loss)
  if entropy is not None:
    ent = jnp.where(on, entropy, 0.0)
    metrics["entropy_sum"] = jax.lax.stop_gradient(jnp.sum(ent * mask))
    if cfg.entropy_coef > 0:
      loss = loss - cfg.entropy_coef * agg(ent, mask, norms, cfg)
  return loss, metrics


def combine_metrics(a: Dict[str, jax.Array], b: Dict[str, jax.Array]) -> Dict[str, jax.Array]:
  """Combines two slices' metrics (sum, or max/min by key suffix)."""
  out = {}
  for k in a:
    if k.endswith("_max"):
      out[k] = jnp.maximum(a[k], b[k])
    elif k.endswith("_min"):
      out[k] = jnp.minimum(a[k], b[k])
    else:
      out[k] = a[k] + b[k]
  return out
