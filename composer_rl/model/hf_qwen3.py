"""Hugging Face Qwen3 / Qwen3-MoE checkpoints <-> composer_rl parameters, streamed.

The `config.json` side is `composer_rl.model.hf_config`; its names are part of this API.

Users start RL from an open checkpoint and serve the result elsewhere, so this module maps
both ways between a Hugging Face directory (`config.json` + `model.safetensors` or sharded
`model-*.safetensors` with `model.safetensors.index.json`) and the parameter tree of
`composer_rl.model.Transformer` (`nnx.to_pure_dict(nnx.split(model)[1])`, the tree
`TrainState.params` holds); the tensor-by-tensor mapping (layer-stacked leaves,
transposes) is `composer_rl.model.hf_names`.

Safetensors go through `composer_rl.model.safetensors_io` (numpy, bfloat16 included, one
tensor at a time), so neither direction ever holds more than one layer of one composer
leaf (an expert stack at most) plus its source tensors in memory; conversion fills
memory-mapped scratch files layer by layer and the Orbax write reads from them.
Widening bf16/f16 to the fp32 master dtype and narrowing back is exact, so
import -> export reproduces every tensor's bytes.
"""
import dataclasses
import json
import os
import shutil
from typing import Any, Dict, List, Optional, Tuple

import jax
import numpy as np
from flax import nnx

from composer_rl.model.config import ModelConfig
from composer_rl.model.hf_config import (  # noqa: F401  (part of this module's API)
    ARCHITECTURES, MODEL_CONFIG_FILE, check_converted, config_from_hf, config_to_hf,
    load_model_config, moe_layers_from_hf, run_model_config)
from composer_rl.model.safetensors_io import (  # noqa: F401  (part of this module's API)
    INDEX_FILE, NAME_TO_NP, SINGLE_FILE, ConversionError, SafetensorsReader,
    write_safetensors)
from composer_rl.model.hf_names import hf_shape, iter_params, mapped_leaves, tensor_order
from composer_rl.model.transformer import Transformer

# Files of a converted checkpoint directory.
PARAMS_DIR, HF_CONFIG_FILE = "params", "hf_config.json"  # and MODEL_CONFIG_FILE
HF_FILES_DIR = "hf_files"  # the source's tokenizer and generation files, copied back on export
HF_EXTRA_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json",
                  "special_tokens_map.json", "vocab.json", "merges.txt", "added_tokens.json",
                  "chat_template.jinja")


def _set(tree: Dict, path: Tuple[Any, ...], value) -> None:
  for k in path[:-1]:
    tree = tree.setdefault(k, {})
  tree[path[-1]] = value


def _get(tree, path: Tuple[Any, ...]):
  for k in path:
    tree = tree[k]
  return tree


def read_hf_config(hf_dir: str) -> Dict[str, Any]:
  path = os.path.join(hf_dir, "config.json")
  if not os.path.exists(path):
    raise ConversionError(f"{hf_dir}: no config.json")
  with open(path) as f:
    return json.load(f)


def _assembled(reader: SafetensorsReader, cfg: ModelConfig, alloc):
  """(path, array) for every leaf once all its pieces are in (a stacked leaf arrives one
  layer at a time); `alloc(n, shape, dtype)` gives the n-th leaf's writable array."""
  n = 0
  for leaf, j, value in iter_params(reader, cfg):
    if j is None or j == 0:
      out, n = alloc(n, leaf.shape, value.dtype), n + 1
    out[... if j is None else j] = value
    if j is None or j == leaf.shape[0] - 1:
      yield leaf.path, out


def import_hf(hf_dir: str, **overrides) -> Tuple[ModelConfig, Dict]:
  """(ModelConfig, params pure dict of numpy arrays) of a Hugging Face directory, in memory
  (tests, small models); `convert` streams into an Orbax checkpoint instead."""
  cfg = config_from_hf(read_hf_config(hf_dir), **overrides)
  params: Dict = {}
  for path, value in _assembled(SafetensorsReader(hf_dir), cfg,
                                lambda n, shape, dt: np.empty(shape, dt)):
    _set(params, path, value)
  return cfg, params


def abstract_params(cfg: ModelConfig) -> Dict:
  """ShapeDtypeStructs of the parameter pure dict (no memory allocated)."""
  return jax.eval_shape(lambda: nnx.to_pure_dict(nnx.split(
      Transformer(cfg, rngs=nnx.Rngs(0)))[1]))


def build_model(cfg: ModelConfig, params: Dict) -> Transformer:
  """A `Transformer` holding `params` (a pure dict), without a random init."""
  graphdef, state = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
  nnx.replace_by_pure_dict(state, jax.tree.map(jax.numpy.asarray, params))
  return nnx.merge(graphdef, state)


# ---- Orbax checkpoint of the converted parameters -------------------------------------
def _source_dtype(reader: SafetensorsReader, hf: Dict[str, Any]) -> str:
  names = {v: k for k, v in NAME_TO_NP.items()}
  found = sorted(names[d] for d in reader.dtypes())
  if len(found) == 1:
    return found[0]
  return str(hf.get("dtype") or hf.get("torch_dtype") or "bfloat16")


def convert(hf_dir: str, out_dir: str, **overrides) -> ModelConfig:
  """Hugging Face directory -> converted checkpoint `out_dir`, streamed tensor by tensor.

  `out_dir` gets `params/` (Orbax, the parameter pure dict), `model_config.json` (the
  ModelConfig fields), `hf_config.json` (the source config.json plus `composer_rl_dtype`,
  the tensor dtype to export back to) and `hf_files/` (the source's tokenizer and
  generation files, for `HfTokenizer` and for export). Returns the ModelConfig.
  """
  import orbax.checkpoint as ocp  # local: only conversion needs it
  hf = read_hf_config(hf_dir)
  cfg = config_from_hf(hf, **overrides)
  reader = SafetensorsReader(hf_dir)
  out_dir = os.path.abspath(out_dir)
  scratch = os.path.join(out_dir, ".scratch")
  os.makedirs(scratch, exist_ok=True)
  tree: Dict = {}
  try:
    scratch_file = lambda n, shape, dt: np.lib.format.open_memmap(
        os.path.join(scratch, f"{n}.npy"), mode="w+", dtype=dt, shape=shape)
    for path, value in _assembled(reader, cfg, scratch_file):
      value.flush()
      _set(tree, path, np.load(value.filename, mmap_mode="r"))
    ckpt = ocp.StandardCheckpointer()
    ckpt.save(os.path.join(out_dir, PARAMS_DIR), tree, force=True)
    ckpt.wait_until_finished()
  finally:
    tree.clear()
    shutil.rmtree(scratch, ignore_errors=True)
  with open(os.path.join(out_dir, MODEL_CONFIG_FILE), "w") as f:
    json.dump(dataclasses.asdict(cfg), f, indent=2)
  with open(os.path.join(out_dir, HF_CONFIG_FILE), "w") as f:
    json.dump(dict(hf, composer_rl_dtype=_source_dtype(reader, hf)), f, indent=2)
  copy_hf_files(hf_dir, os.path.join(out_dir, HF_FILES_DIR))
  return cfg


def copy_hf_files(src_dir: str, dst_dir: str) -> List[str]:
  """Copies the tokenizer / generation files (`HF_EXTRA_FILES`) present in src_dir."""
  found = [n for n in HF_EXTRA_FILES if os.path.isfile(os.path.join(src_dir, n))]
  if found:
    os.makedirs(dst_dir, exist_ok=True)
  for n in found:
    shutil.copyfile(os.path.join(src_dir, n), os.path.join(dst_dir, n))
  return found


def load_params(ckpt_dir: str, target: Any = None) -> Dict:
  """The parameter pure dict saved by `convert` (or by `save_params`).

  It matches `nnx.to_pure_dict(nnx.split(Transformer(cfg, rngs))[1])`, so it goes straight
  into `TrainStep.init_state(seed, params=load_params(dir))`. `target`: a tree of
  ShapeDtypeStructs with shardings (e.g. `step_fn.abstract_state().params`) to restore
  directly into a mesh; default: `abstract_params` of the saved config, on the default device.
  """
  import orbax.checkpoint as ocp
  if target is None:
    target = abstract_params(load_model_config(ckpt_dir))
  return ocp.StandardCheckpointer().restore(
      os.path.join(os.path.abspath(ckpt_dir), PARAMS_DIR), target)


def save_params(ckpt_dir: str, cfg: ModelConfig, params: Dict,
                hf_config: Optional[Dict[str, Any]] = None) -> None:
  """Writes trained `params` in `convert`'s layout, so `export` can turn it into HF files."""
  import orbax.checkpoint as ocp
  ckpt_dir = os.path.abspath(ckpt_dir)
  os.makedirs(ckpt_dir, exist_ok=True)
  ckpt = ocp.StandardCheckpointer()
  # Arrays go to Orbax as they are: each process writes the shards it holds.
  ckpt.save(os.path.join(ckpt_dir, PARAMS_DIR), params, force=True)
  ckpt.wait_until_finished()
  if jax.process_index() != 0:  # the JSON files are written once
    return
  with open(os.path.join(ckpt_dir, MODEL_CONFIG_FILE), "w") as f:
    json.dump(dataclasses.asdict(cfg), f, indent=2)
  if hf_config is not None:
    with open(os.path.join(ckpt_dir, HF_CONFIG_FILE), "w") as f:
      json.dump(hf_config, f, indent=2)


def save_trained(out_dir: str, cfg: ModelConfig, params: Dict, init_checkpoint: str) -> None:
  """Trained `params` of a run that started from `init_checkpoint`, in `convert`'s layout
  with that checkpoint's HF config and tokenizer files: `export_checkpoint(out_dir, ...)`
  then writes a Hugging Face directory that other engines serve."""
  with open(os.path.join(init_checkpoint, HF_CONFIG_FILE)) as f:
    hf_config = json.load(f)
  save_params(out_dir, cfg, params, hf_config=hf_config)
  copy_hf_files(os.path.join(init_checkpoint, HF_FILES_DIR),
                os.path.join(os.path.abspath(out_dir), HF_FILES_DIR))


# ---- export ---------------------------------------------------------------------------
def export_hf(params: Dict, cfg: ModelConfig, out_dir: str,
              base_config: Optional[Dict[str, Any]] = None, dtype: Optional[str] = None,
              max_shard_bytes: int = 5 << 30) -> List[str]:
  """Writes `params` as Hugging Face safetensors (sharded past `max_shard_bytes`, with the
  index file) + config.json into `out_dir`; returns the tensor names written.

  dtype: tensor dtype ('bfloat16', 'float32', 'float16'); default the source checkpoint's
  (`base_config['composer_rl_dtype']`), else bfloat16. Leaves are converted one at a time.
  """
  base = dict(base_config or {})
  dtype = dtype or base.pop("composer_rl_dtype", None) or "bfloat16"
  base.pop("composer_rl_dtype", None)
  if dtype not in NAME_TO_NP:
    raise ConversionError(f"unknown export dtype {dtype!r}; choose one of {sorted(NAME_TO_NP)}")
  np_dt = NAME_TO_NP[dtype]
  os.makedirs(out_dir, exist_ok=True)
  leaves = mapped_leaves(cfg)
  for leaf in leaves:
    got = tuple(np.shape(_get(params, leaf.path)))
    if got != leaf.shape:
      raise ConversionError(f"param {'.'.join(map(str, leaf.path))} has shape {list(got)}, "
                            f"expected {list(leaf.shape)} for this ModelConfig")
  owner = {}  # HF name -> (leaf, index in the layer stack or None, expert or None)
  for leaf in leaves:
    for j, names in leaf.pieces():
      for e, n in enumerate(names):
        owner[n] = (leaf, j, e if leaf.kind == "experts_t" else None)
  # A layer's expert tensors stay together, so its expert stack is fetched once (`produce`).
  specs = [(n, hf_shape(owner[n][0]), np_dt) for n in sorted(owner, key=tensor_order)]
  shards: List[List] = [[]]
  size = 0
  for s in specs:
    n = int(np.prod(s[1])) * np_dt.itemsize
    if shards[-1] and size + n > max_shard_bytes:
      shards.append([])
      size = 0
    shards[-1].append(s)
    size += n

  cache: Dict[str, Any] = {}

  def produce(name: str) -> np.ndarray:
    leaf, j, e = owner[name]
    if cache.get("key") != (leaf.path, j):  # one layer of one leaf on the host at a time
      w = _get(params, leaf.path)
      cache.update(key=(leaf.path, j), value=np.asarray(jax.device_get(
          w if j is None else w[j])))
    w = cache["value"]
    w = w[e].T if e is not None else (w.T if leaf.kind == "t" else w)
    return w.astype(np_dt)

  files = ([SINGLE_FILE] if len(shards) == 1 else
           [f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors" for k in range(len(shards))])
  for fname, shard in zip(files, shards):
    write_safetensors(os.path.join(out_dir, fname), shard, produce)
  if len(shards) > 1:
    total = sum(int(np.prod(s[1])) * np_dt.itemsize for s in specs)
    weight_map = {s[0]: fname for fname, shard in zip(files, shards) for s in shard}
    with open(os.path.join(out_dir, INDEX_FILE), "w") as f:
      json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
  with open(os.path.join(out_dir, "config.json"), "w") as f:
    json.dump(config_to_hf(cfg, base, dtype), f, indent=2)
  return [s[0] for s in specs]


def export_checkpoint(ckpt_dir: str, out_dir: str, dtype: Optional[str] = None,
                      max_shard_bytes: int = 5 << 30) -> List[str]:
  """Converted checkpoint (`convert` / `save_params` layout) -> Hugging Face directory,
  with the source's tokenizer and generation files when the checkpoint kept them."""
  cfg = load_model_config(ckpt_dir)
  base = None
  path = os.path.join(ckpt_dir, HF_CONFIG_FILE)
  if os.path.exists(path):
    with open(path) as f:
      base = json.load(f)
  names = export_hf(load_params(ckpt_dir), cfg, out_dir, base, dtype, max_shard_bytes)
  copy_hf_files(os.path.join(ckpt_dir, HF_FILES_DIR), out_dir)
  return names
