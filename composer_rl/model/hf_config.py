"""Hugging Face Qwen3 / Qwen3-MoE `config.json` <-> `ModelConfig` (the architecture half of
`composer_rl.model.hf_qwen3`): what is supported, checked field by field, with a
`ConversionError` naming what is not; and a run's ModelConfig from a converted checkpoint's
`model_config.json` (`run_model_config`)."""
import json
import os
from typing import Any, Dict, Optional, Tuple

from composer_rl.model.config import ARCHITECTURE_FIELDS, ModelConfig
from composer_rl.model.safetensors_io import ConversionError

MODEL_CONFIG_FILE = "model_config.json"  # a converted checkpoint's ModelConfig
ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}


def _rope_theta(hf: Dict[str, Any]) -> float:
  rope = hf.get("rope_parameters") or {}
  scaling = hf.get("rope_scaling") or {}
  for r in (rope, scaling):
    kind = r.get("rope_type", r.get("type", "default"))
    if kind not in ("default", None):
      raise ConversionError(f"config.json: RoPE scaling {kind!r} is not supported (composer_rl "
                            "implements plain RoPE only)")
  theta = rope.get("rope_theta", hf.get("rope_theta"))
  if theta is None:
    raise ConversionError("config.json: no rope_theta (nor rope_parameters.rope_theta)")
  return float(theta)


def moe_layers_from_hf(hf: Dict[str, Any]) -> Tuple[int, ...]:
  """Indices of MoE layers: Qwen3-MoE's `decoder_sparse_step` / `mlp_only_layers` rule."""
  n, step = int(hf["num_hidden_layers"]), int(hf.get("decoder_sparse_step", 1))
  only_mlp = set(hf.get("mlp_only_layers") or ())
  return tuple(i for i in range(n) if i not in only_mlp and (i + 1) % step == 0)


def config_from_hf(hf: Dict[str, Any], **overrides) -> ModelConfig:
  """`ModelConfig` of a Qwen3 / Qwen3-MoE `config.json` dict; `overrides` set the fields HF
  does not determine (compute_dtype, row_tile, max_seq_len = KV cache length, ...)."""
  kind = hf.get("model_type")
  if kind not in ARCHITECTURES:
    raise ConversionError(f"config.json: unsupported architecture model_type={kind!r} "
                          f"(architectures={hf.get('architectures')}); supported: "
                          f"{sorted(ARCHITECTURES)}")
  need = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
          "intermediate_size", "rms_norm_eps")
  missing = [k for k in need if k not in hf]
  if missing:
    raise ConversionError(f"config.json: missing field(s) {missing}")
  if hf.get("attention_bias"):
    raise ConversionError("config.json: attention_bias=true is not supported (no biases)")
  if hf.get("hidden_act", "silu") != "silu":
    raise ConversionError(f"config.json: hidden_act={hf['hidden_act']!r}; only 'silu'")
  if hf.get("use_sliding_window"):
    raise ConversionError("config.json: use_sliding_window=true is not supported")
  heads = int(hf["num_attention_heads"])
  kw = dict(vocab_size=int(hf["vocab_size"]), d_model=int(hf["hidden_size"]),
            num_layers=int(hf["num_hidden_layers"]), num_heads=heads,
            num_kv_heads=int(hf.get("num_key_value_heads") or heads),
            head_dim=int(hf.get("head_dim") or int(hf["hidden_size"]) // heads),
            d_ff=int(hf["intermediate_size"]),
            max_seq_len=int(hf.get("max_position_embeddings", 4096)),
            rope_theta=_rope_theta(hf), norm_eps=float(hf["rms_norm_eps"]), qk_norm=True,
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)))
  experts = int(hf.get("num_experts", hf.get("num_local_experts", 0)) or 0)
  if kind == "qwen3_moe" and experts:
    layers = moe_layers_from_hf(hf)
    kw.update(num_experts=experts, experts_per_token=int(hf["num_experts_per_tok"]),
              moe_d_ff=int(hf["moe_intermediate_size"]),
              moe_layers=None if len(layers) == kw["num_layers"] else layers,
              norm_topk_prob=bool(hf.get("norm_topk_prob", False)))
    if "router_aux_loss_coef" in hf:
      kw["router_aux_loss_coef"] = float(hf["router_aux_loss_coef"])
  kw.update(overrides)
  try:
    return ModelConfig(**kw)
  except (TypeError, ValueError) as e:
    raise ConversionError(f"config.json does not make a valid ModelConfig: {e}") from None


def config_to_hf(cfg: ModelConfig, base: Optional[Dict[str, Any]] = None,
                 dtype: str = "bfloat16") -> Dict[str, Any]:
  """`config.json` for `cfg`: `base` (e.g. the imported checkpoint's own config.json, so
  token ids and other serving fields survive) with every field the model determines set."""
  hf = dict(base or {})
  moe = cfg.num_experts > 0 and cfg.num_moe_layers > 0
  kind = "qwen3_moe" if moe else "qwen3"
  if hf.get("model_type") not in (None, kind):
    hf = {k: v for k, v in hf.items() if k not in (
        "num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
        "decoder_sparse_step", "mlp_only_layers", "norm_topk_prob", "output_router_logits",
        "router_aux_loss_coef", "layer_types", "max_window_layers")}
  hf.update(architectures=[ARCHITECTURES[kind]], model_type=kind, vocab_size=cfg.vocab_size,
            hidden_size=cfg.d_model, num_hidden_layers=cfg.num_layers,
            num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim, intermediate_size=cfg.d_ff, rms_norm_eps=cfg.norm_eps,
            tie_word_embeddings=cfg.tie_embeddings, attention_bias=False, hidden_act="silu")
  hf.setdefault("max_position_embeddings", cfg.max_seq_len)
  if isinstance(hf.get("rope_parameters"), dict):
    hf["rope_parameters"] = dict(hf["rope_parameters"], rope_theta=cfg.rope_theta)
  else:
    hf["rope_theta"] = cfg.rope_theta
  hf["dtype" if "dtype" in hf else "torch_dtype"] = dtype
  if moe:
    layers = tuple(i for i in range(cfg.num_layers) if cfg.is_moe_layer(i))
    if "decoder_sparse_step" not in hf or moe_layers_from_hf(hf) != layers:
      hf["decoder_sparse_step"] = 1
      hf["mlp_only_layers"] = [i for i in range(cfg.num_layers) if i not in layers]
    hf["num_local_experts" if "num_local_experts" in hf else "num_experts"] = cfg.num_experts
    hf.update(num_experts_per_tok=cfg.experts_per_token, moe_intermediate_size=cfg.moe_d_ff,
              norm_topk_prob=cfg.norm_topk_prob, router_aux_loss_coef=cfg.router_aux_loss_coef)
  return hf


def load_model_config(ckpt_dir: str, **overrides) -> ModelConfig:
  """The ModelConfig saved by `convert`, with `overrides` (e.g. compute_dtype, max_seq_len)."""
  with open(os.path.join(ckpt_dir, MODEL_CONFIG_FILE)) as f:
    kw = json.load(f)
  if kw.get("moe_layers") is not None:
    kw["moe_layers"] = tuple(kw["moe_layers"])
  kw.update(overrides)
  return ModelConfig(**kw)


def check_converted(ckpt_dir: str, field: str = "config.init_checkpoint") -> None:
  """FileNotFoundError naming `field` unless `ckpt_dir` is a directory written by `convert`."""
  if not os.path.exists(os.path.join(ckpt_dir, MODEL_CONFIG_FILE)):
    raise FileNotFoundError(f"{field}={ckpt_dir!r}: no {MODEL_CONFIG_FILE} (convert a Hugging "
                            "Face checkpoint with launch/convert_checkpoint.py)")


def run_model_config(fields: Dict[str, Any], ckpt_dir: str, token_count: int) -> ModelConfig:
  """A run's ModelConfig: `fields` (config.model) with the tokenizer's vocabulary, or, with
  a converted checkpoint, the checkpoint's architecture and only the runtime fields of
  `fields` (max_seq_len, compute_dtype, ...). Embedding rows past the tokenizer's
  `token_count` ids (a padded vocabulary) are never sampled (`ModelConfig.token_count`)."""
  fields = dict(fields)
  if fields.get("moe_layers") is not None:
    fields["moe_layers"] = tuple(fields["moe_layers"])
  if not ckpt_dir:
    if fields.get("vocab_size", token_count) != token_count:
      raise ValueError(f"config.model.vocab_size={fields['vocab_size']} but the tokenizer has "
                       f"{token_count} ids")
    return ModelConfig(**{**fields, "vocab_size": token_count})
  check_converted(ckpt_dir)
  runtime = {k: v for k, v in fields.items() if k not in ARCHITECTURE_FIELDS}
  mc = load_model_config(ckpt_dir, **runtime)
  if token_count > mc.vocab_size:
    raise ValueError(f"the tokenizer has {token_count} tokens but the model in {ckpt_dir} "
                     f"has a vocabulary of {mc.vocab_size}: they do not belong together "
                     "(chat.tokenizer / chat.format)")
  return mc if mc.token_count else mc.replace(token_count=token_count)
