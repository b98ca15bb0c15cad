"""Hugging Face Qwen3 / Qwen3-MoE tensor names <-> composer_rl parameter leaves.

Block parameters are stacked over layers (`layers.attn.*` [L, ...] for every layer,
`layers.mlp.*` for the dense layers and `layers.moe.*` for the MoE layers, in layer
order); row i of a stack is layer i's tensor (of that kind):

  composer leaf                      Hugging Face tensor                      transform
  embed            [V, D]            model.embed_tokens.weight     [V, D]     copy
  lm_head          [D, V]            lm_head.weight                [V, D]     .T (absent if tied)
  final_norm       [D]               model.norm.weight             [D]        copy
  layers.attn.norm[i]                model.layers.i.input_layernorm.weight    copy
  layers.attn.wq[i] [D, H*hd]        ...self_attn.q_proj.weight    [H*hd, D]  .T
  layers.attn.wk / wv[i] [D, G*hd]   ...self_attn.k_proj / v_proj  [G*hd, D]  .T
  layers.attn.wo[i] [H*hd, D]        ...self_attn.o_proj.weight    [D, H*hd]  .T
  layers.attn.q_norm / k_norm[i]     ...self_attn.q_norm / k_norm  [hd]       copy
  layers.mlp/moe.norm[i]             ...post_attention_layernorm.weight       copy
  mlp:   w_gate / w_up [D, F]        ...mlp.gate_proj / up_proj    [F, D]     .T
         w_down [F, D]               ...mlp.down_proj.weight       [D, F]     .T
  moe:   router [D, E]               ...mlp.gate.weight            [E, D]     .T
         w_gate / w_up [E, D, f]     ...mlp.experts.e.gate_proj / up_proj [f, D]  stack of .T
         w_down [E, f, D]            ...mlp.experts.e.down_proj    [D, f]     stack of .T

Both sides lay heads out the same way (head h is rows h*hd:(h+1)*hd of the projection, and
query head h reads kv head h // (H/G)), both use rotate-half RoPE after the per-head q/k
RMSNorm, and both route on top-k of the softmax (renormalized iff `norm_topk_prob`), so the
mapping is transposes only. Import also accepts the fused expert layout transformers >= 5
keeps in memory (`mlp.experts.gate_up_proj` [E, 2f, D], `mlp.experts.down_proj` [E, D, f]);
export always writes the per-expert layout the published checkpoints use.
"""
import dataclasses
from typing import Any, Iterator, List, Optional, Tuple

import numpy as np

from composer_rl.model.config import ModelConfig
from composer_rl.model.safetensors_io import ConversionError, SafetensorsReader
from composer_rl.model.transformer import block_params

# A block parameter (`composer_rl.model.transformer.block_params`) -> its tensor in layer i
# ("model.layers.{i}." + this) and how it maps ('experts_t': one tensor per expert {j}).
_HF_NAMES = {
    "attn": {"norm": ("input_layernorm.weight", "copy"),
             "wq": ("self_attn.q_proj.weight", "t"), "wk": ("self_attn.k_proj.weight", "t"),
             "wv": ("self_attn.v_proj.weight", "t"), "wo": ("self_attn.o_proj.weight", "t"),
             "q_norm": ("self_attn.q_norm.weight", "copy"),
             "k_norm": ("self_attn.k_norm.weight", "copy")},
    "mlp": {"norm": ("post_attention_layernorm.weight", "copy"),
            "w_gate": ("mlp.gate_proj.weight", "t"), "w_up": ("mlp.up_proj.weight", "t"),
            "w_down": ("mlp.down_proj.weight", "t")},
    "moe": {"norm": ("post_attention_layernorm.weight", "copy"),
            "router": ("mlp.gate.weight", "t"),
            "w_gate": ("mlp.experts.{j}.gate_proj.weight", "experts_t"),
            "w_up": ("mlp.experts.{j}.up_proj.weight", "experts_t"),
            "w_down": ("mlp.experts.{j}.down_proj.weight", "experts_t")},
}


@dataclasses.dataclass(frozen=True)
class Leaf:
  """One composer leaf and the Hugging Face tensors it is made of.

  shape: the composer leaf's shape (stacked leaves lead with their layer count).
  hf_names: one group of tensor names per piece: per layer for a stacked leaf (the E
    experts' tensors for 'experts_t'), a single group otherwise.
  kind: 'copy', 't' (transpose), 'experts_t' (stack of per-expert transposes).
  """
  path: Tuple[Any, ...]
  shape: Tuple[int, ...]
  hf_names: Tuple[Tuple[str, ...], ...]
  kind: str
  stacked: bool = False

  def pieces(self):
    """(index in the layer stack or None, tensor names) for every piece."""
    return [(j if self.stacked else None, names) for j, names in enumerate(self.hf_names)]

  @property
  def piece_shape(self) -> Tuple[int, ...]:
    return self.shape[1:] if self.stacked else self.shape


def mapped_leaves(cfg: ModelConfig) -> List[Leaf]:
  d, v = cfg.d_model, cfg.vocab_size
  out = [Leaf(("embed",), (v, d), (("model.embed_tokens.weight",),), "copy")]
  moe = [cfg.is_moe_layer(i) for i in range(cfg.num_layers)]
  layers = {"attn": range(cfg.num_layers), "mlp": [i for i, m in enumerate(moe) if not m],
            "moe": [i for i, m in enumerate(moe) if m]}
  for kind, ids in layers.items():
    for name, shape, _, _, _ in (block_params(cfg, kind) if ids else ()):
      suffix, how = _HF_NAMES[kind][name]
      experts = range(cfg.num_experts) if how == "experts_t" else [None]
      groups = tuple(tuple(f"model.layers.{i}." + suffix.format(j=j) for j in experts)
                     for i in ids)
      out.append(Leaf(("layers", kind, name), (len(ids),) + shape, groups, how, True))
  out.append(Leaf(("final_norm",), (d,), (("model.norm.weight",),), "copy"))
  if not cfg.tie_embeddings:
    out.append(Leaf(("lm_head",), (d, v), (("lm_head.weight",),), "t"))
  return out


def tensor_order(name: str) -> Tuple[int, int]:
  """Hugging Face's tensor order: embeddings, then layer by layer, then the rest."""
  if name.startswith("model.layers."):
    return (1, int(name.split(".")[2]))
  return (0 if name.startswith("model.embed") else 2, 0)


def hf_shape(leaf: Leaf) -> Tuple[int, ...]:
  shape = leaf.piece_shape
  return shape if leaf.kind == "copy" else shape[-1:] + shape[-2:-1]  # per expert


def _fused(reader: SafetensorsReader, leaf: Leaf, names: Tuple[str, ...]
           ) -> Tuple[np.ndarray, List[str]]:
  """An expert stack from the fused layout (`mlp.experts.gate_up_proj` / `down_proj`)."""
  prefix = names[0].split("experts.")[0] + "experts."
  e, a, b = leaf.piece_shape
  if leaf.path[-1] == "w_down":  # [E, D, f] -> [E, f, D]
    name = prefix + "down_proj"
    return reader.get(name, (e, b, a)).transpose(0, 2, 1), [name]
  name = prefix + "gate_up_proj"  # [E, 2f, D]: gate rows first, then up
  w = reader.get(name, (e, 2 * b, a))
  half = w[:, :b] if leaf.path[-1] == "w_gate" else w[:, b:]
  return half.transpose(0, 2, 1), [name]


def iter_params(reader: SafetensorsReader, cfg: ModelConfig
                ) -> Iterator[Tuple[Leaf, Optional[int], np.ndarray]]:
  """(leaf, index in its layer stack or None, array in cfg.param_dtype) for every piece of
  every leaf (one layer of a stacked leaf at a time), reading tensors lazily.
  Raises ConversionError naming missing, unexpected or misshapen tensors."""
  dt = np.dtype(cfg.param_jnp_dtype)
  leaves = mapped_leaves(cfg)
  expected = {n for leaf in leaves for group in leaf.hf_names for n in group}
  have = set(reader.names())
  fused_ok = {n for n in have if n.endswith(("mlp.experts.gate_up_proj",
                                             "mlp.experts.down_proj"))}
  missing = sorted(expected - have)
  if fused_ok:
    missing = [n for n in missing if ".mlp.experts." not in n]
  if missing:
    raise ConversionError(f"checkpoint is missing {len(missing)} tensor(s) the config needs, "
                          f"e.g. {missing[:5]}")
  extra = sorted(have - expected - fused_ok)
  if cfg.tie_embeddings and "lm_head.weight" in extra:
    extra.remove("lm_head.weight")  # a redundant copy of the tied embedding; checked below
  if extra:
    raise ConversionError(f"checkpoint has {len(extra)} tensor(s) the config does not explain "
                          f"(wrong config.json or unsupported variant), e.g. {extra[:5]}")
  for leaf in leaves:
    for j, names in leaf.pieces():
      if leaf.kind == "experts_t" and names[0] not in have:
        value, _ = _fused(reader, leaf, names)
      elif leaf.kind == "experts_t":
        value = np.stack([reader.get(n, hf_shape(leaf)).T for n in names])
      else:
        value = reader.get(names[0], hf_shape(leaf))
        value = value.T if leaf.kind == "t" else value
      if leaf.path == ("embed",) and cfg.tie_embeddings and "lm_head.weight" in have:
        head = reader.get("lm_head.weight", leaf.shape)
        if head.tobytes() != value.tobytes():
          raise ConversionError("tie_word_embeddings=true but lm_head.weight differs from "
                                "model.embed_tokens.weight")
      yield leaf, j, np.ascontiguousarray(value.astype(dt))
