"""Model shape and numerics configuration.

A `ModelConfig` fully determines the parameter tree and the compiled forward. Presets:
`tiny` (trains on a laptop CPU), `parity_512` (the d_model-512 parity size), `dense_1b` (the
~1B accelerator check of launch/device_check.py), and the shapes
of Qwen3-0.6B and Qwen3-30B-A3B (instantiable on an accelerator, never in tests).
"""
import dataclasses
from typing import Optional, Sequence

import jax.numpy as jnp

from composer_rl.ops import exact

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
REMAT_POLICIES = ("none", "dots", "full")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Decoder-only transformer (Qwen3 family layout).

  Attributes:
    vocab_size: number of token ids; embedding rows and logit columns.
    d_model: width of the residual stream.
    num_layers: number of transformer blocks.
    num_heads: query heads per attention layer.
    num_kv_heads: key/value heads (grouped-query attention); must divide num_heads.
    head_dim: width of each attention head (Qwen3 decouples it from d_model/num_heads).
    d_ff: hidden width of the dense SwiGLU MLP.
    max_seq_len: length of the KV cache (the longest session or training row).
    rope_theta: RoPE base frequency.
    norm_eps: RMSNorm epsilon.
    qk_norm: RMSNorm on each query/key head before RoPE (Qwen3 does this).
    tie_embeddings: share the embedding matrix with the output projection.
    num_experts: experts per MoE layer (0 = no MoE anywhere).
    experts_per_token: top-k experts each token is routed to.
    moe_d_ff: hidden width of each expert's SwiGLU.
    moe_layers: indices of layers whose feed-forward is MoE; None = every layer when
      num_experts > 0.
    norm_topk_prob: renormalize the top-k router probabilities to sum to 1 (Qwen3-MoE).
    router_aux_loss_coef: weight of the load-balancing auxiliary loss in training.
    param_dtype: dtype of the master parameters (fp32 so small RL updates are not lost).
    compute_dtype: dtype of matmul inputs and the KV cache ('bfloat16' or 'float32');
      accumulation, norms, softmax and final logits are always fp32.
    row_tile: the most rows per mixture-of-experts tile: every tile holds rows of one
      expert; a call's tile is the power of two at or above its mean rows per expert, up to
      this (`composer_rl.ops.grouped.tile_rows`; any tile gives the same bits).
    attention_key_block: keys per block of attention's value sum (`composer_rl.ops.exact`);
      0 = the largest divisor of max_seq_len that is <= 128. Part of the numerics (sampler
      and trainer share it); with exact_numerics it must be <= 256. Packed training rows
      start documents on key-block boundaries.
    token_count: ids the tokenizer has (0 = all `vocab_size`). The logits of ids from
      `token_count` on are -inf, so they are never sampled and carry no probability: the
      embedding rows a checkpoint pads past its tokenizer (Qwen3: 151,936 rows for 151,669
      tokens) can decode to nothing.
    remat: what the training backward keeps of each block's forward: 'none' (everything,
      fastest), 'dots' (matmul outputs; the rest is recomputed) or 'full' (only the block's
      input; the block is recomputed: activation memory of one block, not of all). The
      forward's values, and so every log-prob, are the same bits under every policy.
    layer_unroll: layers per iteration of the layer loop (`lax.scan(unroll=...)`): 1 = one
      compiled layer body, looped (small programs, fast compiles: real sizes); num_layers
      = straight-line code (a few-layer model decoding a handful of rows spends less on
      the loop). The bits are the same for every value.
    exact_numerics: True (default) runs the batch-invariant ops of `composer_rl.ops.exact`
      (fixed contraction chunks, >= 8 rows per dot, attention in fixed key blocks);
      False runs plain whole-width matmuls and one-block attention: sampler and trainer
      log-probs then differ in their low bits (the negative control of the parity suite).
  """
  vocab_size: int = 256
  d_model: int = 64
  num_layers: int = 2
  num_heads: int = 4
  num_kv_heads: int = 2
  head_dim: int = 16
  d_ff: int = 128
  max_seq_len: int = 128
  rope_theta: float = 10000.0
  norm_eps: float = 1e-6
  qk_norm: bool = True
  tie_embeddings: bool = False
  num_experts: int = 0
  experts_per_token: int = 2
  moe_d_ff: int = 64
  moe_layers: Optional[Sequence[int]] = None
  norm_topk_prob: bool = True
  router_aux_loss_coef: float = 0.01
  param_dtype: str = "float32"
  compute_dtype: str = "bfloat16"
  row_tile: int = 16
  attention_key_block: int = 0
  exact_numerics: bool = True
  token_count: int = 0
  remat: str = "none"
  layer_unroll: int = 1

  def __post_init__(self):
    def bad(msg):
      raise ValueError(f"ModelConfig: {msg}")
    for name in ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads",
                 "head_dim", "d_ff", "max_seq_len", "row_tile", "layer_unroll"):
      if int(getattr(self, name)) <= 0:
        bad(f"{name} must be positive, got {getattr(self, name)!r}")
    if not 0 <= self.token_count <= self.vocab_size:
      bad(f"token_count={self.token_count} must be in [0, vocab_size={self.vocab_size}]")
    kb = self.attention_key_block
    if kb < 0 or (kb and self.max_seq_len % kb):
      bad(f"attention_key_block={kb} must be 0 (automatic) or divide max_seq_len="
          f"{self.max_seq_len}")
    if self.exact_numerics and self.key_block > exact.CONTRACTION_CHUNK:
      bad(f"attention_key_block={kb} must be <= {exact.CONTRACTION_CHUNK} with "
          "exact_numerics (a wider value sum is not row-invariant on XLA:CPU)")
    if self.exact_numerics and self.head_dim > exact.CONTRACTION_CHUNK:
      bad(f"head_dim={self.head_dim} must be <= {exact.CONTRACTION_CHUNK} with exact_numerics")
    if self.num_heads % self.num_kv_heads:
      bad(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
    if self.head_dim % 2:
      bad(f"head_dim={self.head_dim} must be even for RoPE")
    if self.remat not in REMAT_POLICIES:
      bad(f"remat={self.remat!r}; choose one of {list(REMAT_POLICIES)}")
    for name in ("param_dtype", "compute_dtype"):
      if getattr(self, name) not in _DTYPES:
        bad(f"{name}={getattr(self, name)!r}; choose one of {sorted(_DTYPES)}")
    if self.num_experts < 0:
      bad(f"num_experts must be >= 0, got {self.num_experts}")
    if self.num_experts:
      if not 0 < self.experts_per_token <= self.num_experts:
        bad(f"experts_per_token={self.experts_per_token} must be in [1, num_experts="
            f"{self.num_experts}]")
      if self.moe_d_ff <= 0:
        bad(f"moe_d_ff must be positive, got {self.moe_d_ff}")
      for i in self.moe_layers or ():
        if not 0 <= i < self.num_layers:
          bad(f"moe_layers contains {i}, outside [0, num_layers={self.num_layers})")
    elif self.moe_layers:
      bad("moe_layers is set but num_experts is 0")

  def is_moe_layer(self, i: int) -> bool:
    if not self.num_experts:
      return False
    return self.moe_layers is None or i in tuple(self.moe_layers)

  @property
  def num_moe_layers(self) -> int:
    return sum(self.is_moe_layer(i) for i in range(self.num_layers))

  @property
  def param_jnp_dtype(self):
    return _DTYPES[self.param_dtype]

  @property
  def compute_jnp_dtype(self):
    return _DTYPES[self.compute_dtype]

  @property
  def key_block(self) -> int:
    """The attention key block in force (resolves attention_key_block=0)."""
    if self.attention_key_block:
      return self.attention_key_block
    return max(d for d in range(1, min(self.max_seq_len, 128) + 1) if self.max_seq_len % d == 0)

  def replace(self, **kw) -> "ModelConfig":
    return dataclasses.replace(self, **kw)


# ModelConfig fields that decide the parameters' names and shapes (or the function they
# compute), so a converted checkpoint's values for them are the only valid ones.
ARCHITECTURE_FIELDS = ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads",
                       "head_dim", "d_ff", "rope_theta", "norm_eps", "qk_norm",
                       "tie_embeddings", "num_experts", "experts_per_token", "moe_d_ff",
                       "moe_layers", "norm_topk_prob")


PRESETS = {
    "tiny": ModelConfig(),
    "tiny_moe": ModelConfig(num_experts=4, experts_per_token=2, moe_d_ff=64, moe_layers=(1,)),
    "parity_512": ModelConfig(vocab_size=2048, d_model=512, num_layers=4, num_heads=8,
                              num_kv_heads=4, head_dim=64, d_ff=1024, max_seq_len=256),
    "parity_512_moe": ModelConfig(vocab_size=2048, d_model=512, num_layers=4, num_heads=8,
                                  num_kv_heads=4, head_dim=64, d_ff=1024, max_seq_len=256,
                                  num_experts=8, experts_per_token=2, moe_d_ff=512,
                                  moe_layers=(1, 3)),
    # ~0.98B parameters (dense, untied): the accelerator benchmark/parity size of
    # launch/device_check.py.
    "dense_1b": ModelConfig(vocab_size=32000, d_model=2048, num_layers=18, num_heads=16,
                            num_kv_heads=8, head_dim=128, d_ff=5632, max_seq_len=2048,
                            row_tile=128, attention_key_block=128),
    # Shapes of the public Qwen3 checkpoints (config.json of Qwen/Qwen3-0.6B, -30B-A3B).
    "qwen3_0_6b": ModelConfig(vocab_size=151936, d_model=1024, num_layers=28, num_heads=16,
                              num_kv_heads=8, head_dim=128, d_ff=3072, max_seq_len=40960,
                              rope_theta=1000000.0, tie_embeddings=True, row_tile=128,
                              attention_key_block=128),
    "qwen3_30b_a3b": ModelConfig(vocab_size=151936, d_model=2048, num_layers=48,
                                 num_heads=32, num_kv_heads=4, head_dim=128, d_ff=6144,
                                 max_seq_len=40960, rope_theta=1000000.0, num_experts=128,
                                 experts_per_token=8, moe_d_ff=768, row_tile=128,
                                 attention_key_block=128),
}


def get_preset(name: str, **overrides) -> ModelConfig:
  if name not in PRESETS:
    raise ValueError(f"unknown model preset {name!r}; known: {sorted(PRESETS)}")
  return PRESETS[name].replace(**overrides)
