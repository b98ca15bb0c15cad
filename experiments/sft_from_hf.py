"""SFT starting from a converted Hugging Face Qwen3 / Qwen3-MoE checkpoint.

Convert, then train (the trajectories' token ids must come from the checkpoint's tokenizer,
e.g. `composer_rl.data.hf_tokenizer.HfTokenizer(CKPT + "/hf_files")`):
  python launch/convert_checkpoint.py --hf_dir=Qwen3-0.6B --out=ckpt/qwen3 --max_seq_len=4096
  python launch/train.py --config=experiments/sft_from_hf.py --workdir=/tmp/sft_qwen \
      --config.init_checkpoint=ckpt/qwen3 --config.data.jsonl=/path/to/trajectories.jsonl
Export the result for other engines:
  python launch/convert_checkpoint.py --export_from=/tmp/sft_qwen/final_params --out=Qwen3-0.6B-sft
`model` holds only fields that do not change the parameters; the architecture comes from
the checkpoint (composer_rl.train.config.ARCHITECTURE_FIELDS).
"""
import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sft_tiny import base_config  # noqa: E402  (experiments/ is not a package)


def get_config() -> ml_collections.ConfigDict:
  c = base_config()
  c.init_checkpoint = ""  # required: the launch/convert_checkpoint.py output directory
  c.model = ml_collections.ConfigDict(dict(
      max_seq_len=512,           # KV-cache length (the checkpoint's context is far longer)
      row_tile=64,               # rows per exact matmul tile
      # query positions per attention dot
      attention_key_block=128,   # keys per online-softmax block (divides max_seq_len)
      compute_dtype="bfloat16"))
  c.optimizer.update(learning_rate=1e-5, warmup_steps=20, total_steps=500, weight_decay=0.0)
  c.train.update(steps=500, batch_size=8, seq_len=512, micro_batch_size=2, log_every=10)
  c.checkpoint.update(every_steps=100)
  return c
