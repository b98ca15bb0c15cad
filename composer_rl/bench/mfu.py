"""Model FLOPs utilization (MFU) arithmetic for the train step.

MFU = achieved model FLOP/s / the device's peak dense bf16 FLOP/s, where the model FLOPs of
one trained token follow the PaLM convention (Chowdhery et al. 2022, appendix B):
  6 * N_matmul + 12 * num_layers * num_heads * head_dim * seq_len
N_matmul counts the weights that take part in a matmul for one token (all projections, the
active experts and the router of MoE layers, the output head; not the input embedding
lookup, not norm scales); 6 = forward 2 + backward 4 FLOPs per weight. The attention term
counts QK^T and PV over the full sequence (no causal discount, as in PaLM), forward and
backward. Model FLOPs ignore what this implementation spends on top (exact numerics'
padding, remat), so MFU is comparable across implementations: that is why it is used.
Pure arithmetic (no JAX), so the numbers can be checked by hand (tests/bench).
"""
from typing import Optional

from composer_rl.model.config import ModelConfig

# Peak dense (no sparsity) bf16 FLOP/s by `jax.devices()[0].device_kind` substring; the
# first match wins, so more specific names come first. Vendor datasheet numbers.
PEAK_BF16_FLOPS = (
    ("H100 PCIe", 756e12),
    ("H100", 989e12),
    ("H200", 989e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("L4", 121e12),
    ("TPU v4", 275e12),
    ("TPU v5 lite", 197e12),
    ("TPU v5", 459e12),  # v5p
    ("TPU v6", 918e12),  # v6e (Trillium)
)


def peak_flops(device_kind: str) -> Optional[float]:
  """Peak dense bf16 FLOP/s of one device, or None if unknown (CPU included)."""
  for name, peak in PEAK_BF16_FLOPS:
    if name.lower() in str(device_kind).lower():
      return peak
  return None


def matmul_params(cfg: ModelConfig) -> int:
  """Weights one token multiplies through (see module docstring): the 6N of 6N + attn."""
  d, hd = cfg.d_model, cfg.head_dim
  attn = d * hd * (2 * cfg.num_heads + 2 * cfg.num_kv_heads)  # wq, wo, wk, wv
  dense_ffn = 3 * d * cfg.d_ff
  moe_ffn = 3 * d * cfg.moe_d_ff * cfg.experts_per_token + d * cfg.num_experts  # + router
  ffn = sum(moe_ffn if cfg.is_moe_layer(i) else dense_ffn for i in range(cfg.num_layers))
  return cfg.num_layers * attn + ffn + d * cfg.vocab_size  # + output head


def attention_flops_per_token(cfg: ModelConfig, seq_len: int) -> int:
  """QK^T and PV (2 FLOPs per multiply-add each) over seq_len keys, times 3 for backward."""
  return 12 * cfg.num_layers * cfg.num_heads * cfg.head_dim * seq_len


def train_flops_per_token(cfg: ModelConfig, seq_len: int) -> int:
  return 6 * matmul_params(cfg) + attention_flops_per_token(cfg, seq_len)


def mfu(cfg: ModelConfig, seq_len: int, tokens_per_s: float, device_kind: str,
        num_devices: int = 1) -> dict:
  """Achieved model FLOP/s of a train step and its MFU (None on an unknown device)."""
  flops = train_flops_per_token(cfg, seq_len) * float(tokens_per_s)
  peak = peak_flops(device_kind)
  return dict(flops_per_token=train_flops_per_token(cfg, seq_len),
              matmul_params=matmul_params(cfg), model_flops_per_s=flops,
              peak_flops_per_s=peak * num_devices if peak else None,
              mfu=flops / (peak * num_devices) if peak else None)
