"""Parity suite: sampler vs trainer log-probs, compared bit for bit.

Run (default: the d_model-512 MoE model, 8 fake CPU devices):
  python launch/parity.py --config=experiments/parity.py
Other sizes: `--config=experiments/parity.py:tiny` (also tiny_moe, d512, d512_moe), and any
field below can be overridden, e.g.
  python launch/parity.py --config=experiments/parity.py:tiny \
      --config.model.d_model=96 --config.model.num_experts=6 --config.model.moe_layers=0,1 \
      --config.seed=7 --config.sampling.top_p=0.8
The last stdout line is one JSON object:
  {"tokens": N, "mismatched_tokens": 0, "max_abs_diff": 0.0, "routing_mismatches": 0, ...}
"""
import dataclasses

import ml_collections

from composer_rl.model.config import get_preset

_VARIANTS = {"tiny": "tiny", "tiny_moe": "tiny_moe", "d512": "parity_512",
             "d512_moe": "parity_512_moe"}


def get_config(variant: str = "d512_moe") -> ml_collections.ConfigDict:
  if variant not in _VARIANTS:
    raise ValueError(f"unknown parity variant {variant!r}; choose one of {sorted(_VARIANTS)}")
  preset = dataclasses.asdict(get_preset(_VARIANTS[variant]))
  c = ml_collections.ConfigDict()
  # Model shape. moe_layers is a comma list of layer indices ('' = every layer if
  # num_experts > 0); compute_dtypes lists the compute dtypes to run the whole suite under.
  c.model = ml_collections.ConfigDict({k: preset[k] for k in (
      "vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads", "head_dim", "d_ff",
      "max_seq_len", "num_experts", "experts_per_token", "moe_d_ff", "row_tile",
      "attention_key_block")})
  c.model.moe_layers = ",".join(str(i) for i in preset["moe_layers"] or ())
  c.compute_dtypes = "bfloat16,float32"
  c.sampling = ml_collections.ConfigDict(dict(
      temperature=1.0,  # divides logits
      top_k=40,         # 0 = off
      top_p=0.95,       # 1.0 = off
      max_new_tokens=40))
  c.num_prompts = 24            # distinct prompts; each case re-generates/re-scores all
  c.prompt_len_min = 3
  c.prompt_len_max = 60
  c.batch_sizes = "1,7"         # sampler batch sizes (prompts shuffled into slots)
  c.prefill_chunks = "0,13"     # prefill chunk lengths; 0 = whole prompt at once
  c.prompt_buckets = "16"       # prompt padding multiples
  c.train_batch_sizes = "5,24"  # trainer batch sizes (random extra right padding)
  c.num_devices = "1,8"         # device counts; >1 runs the batch sharded over a mesh
  c.seed = 0                    # model init, prompts, sequence ids and sampling keys
  return c
