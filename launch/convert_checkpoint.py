"""Converts Hugging Face Qwen3 / Qwen3-MoE checkpoints to composer_rl and back.

  # HF directory (config.json + safetensors, sharded or not) -> converted checkpoint
  python launch/convert_checkpoint.py --hf_dir=Qwen3-0.6B --out=ckpt/qwen3_0_6b \\
      [--max_seq_len=8192] [--compute_dtype=bfloat16] [--row_tile=128]
  # converted (or trained and saved with hf_qwen3.save_params) checkpoint -> HF directory
  python launch/convert_checkpoint.py --export_from=ckpt/qwen3_0_6b --out=exported \\
      [--dtype=bfloat16] [--max_shard_gb=5]

Streams tensor by tensor (see composer_rl.model.hf_qwen3); prints one JSON line.
"""
import json

import composer_rl  # noqa: F401  (sets the parity XLA flags before JAX starts)
from absl import app, flags, logging

from composer_rl.model import hf_qwen3

_HF_DIR = flags.DEFINE_string("hf_dir", None, "Hugging Face checkpoint directory to import.")
_OUT = flags.DEFINE_string("out", None, "Output directory (converted checkpoint or HF dir).")
_EXPORT_FROM = flags.DEFINE_string("export_from", None,
                                   "Converted checkpoint to export to Hugging Face format.")
_MAX_SEQ_LEN = flags.DEFINE_integer("max_seq_len", None, "KV cache length (default: the "
                                    "config's max_position_embeddings).")
_COMPUTE_DTYPE = flags.DEFINE_enum("compute_dtype", None, ["bfloat16", "float32"],
                                   "ModelConfig.compute_dtype (default bfloat16).")
_ROW_TILE = flags.DEFINE_integer("row_tile", None, "ModelConfig.row_tile.")
_DTYPE = flags.DEFINE_enum("dtype", None, ["bfloat16", "float32", "float16"],
                           "Export tensor dtype (default: the imported checkpoint's).")
_MAX_SHARD_GB = flags.DEFINE_float("max_shard_gb", 5.0, "Export shard size limit in GB.")


def run(hf_dir=None, out=None, export_from=None, dtype=None, max_shard_gb=5.0, **overrides):
  """The command, callable from tests: returns the JSON summary it prints."""
  if not out or bool(hf_dir) == bool(export_from):
    raise app.UsageError("give --out and exactly one of --hf_dir (import) or --export_from")
  if export_from:
    names = hf_qwen3.export_checkpoint(export_from, out, dtype,
                                       int(max_shard_gb * (1 << 30)))
    return dict(exported=out, tensors=len(names))
  overrides = {k: v for k, v in overrides.items() if v is not None}
  cfg = hf_qwen3.convert(hf_dir, out, **overrides)
  return dict(converted=out, num_layers=cfg.num_layers, num_experts=cfg.num_experts,
              vocab_size=cfg.vocab_size, max_seq_len=cfg.max_seq_len)


def main(argv):
  logging.set_verbosity(logging.WARNING)  # Orbax logs every write at INFO
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  print(json.dumps(run(_HF_DIR.value, _OUT.value, _EXPORT_FROM.value, _DTYPE.value,
                       _MAX_SHARD_GB.value, max_seq_len=_MAX_SEQ_LEN.value,
                       compute_dtype=_COMPUTE_DTYPE.value, row_tile=_ROW_TILE.value)))


if __name__ == "__main__":
  app.run(main)
