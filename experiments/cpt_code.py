"""Continued pretraining on code: next-token training on packed source files.

Run (CPU, a few minutes; the corpus is this machine's Python standard library and
site-packages, which exist offline everywhere):
  python launch/train.py --config=experiments/cpt_code.py --workdir=/tmp/cpt_code
Tiny variant (seconds; a few hundred files):
  python launch/train.py --config=experiments/cpt_code.py:tiny --workdir=/tmp/cpt_tiny
Your own corpus: --config.corpus.dirs=/path/repos (each entry of a root is one repository)
or JSONL shards of {"repo", "path", "text"}: --config.corpus.jsonl=a.jsonl,b.jsonl.

The summary (last stdout line) reports held-out perplexity before and after, measured by
repository on repositories that are never trained on. Re-running with the same workdir
resumes exactly (params, optimizer, RNG and the Grain packing iterator's position).
"""
import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sft_tiny import base_config  # noqa: E402  (experiments/ is not a package)


def get_config(variant: str = "default") -> ml_collections.ConfigDict:
  c = base_config()
  c.mode = "pretrain"
  # The tiny_bugfix agent's architecture, so the pipeline experiment can start its SFT
  # from these weights (experiments/tiny_pipeline.py); max_seq_len is a compute field.
  c.model.update(d_model=128, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32,
                 d_ff=384, max_seq_len=256, row_tile=32,
                 # packed documents start on key blocks: 32 keys wastes little padding
                 attention_key_block=32, compute_dtype="float32")
  c.optimizer.update(learning_rate=2e-3, warmup_steps=30, total_steps=600, end_lr_ratio=0.1,
                     weight_decay=0.01)
  c.train.update(steps=600, batch_size=8, seq_len=256, micro_batch_size=8, log_every=50)
  c.checkpoint.update(every_steps=100, max_to_keep=2)
  c.corpus = ml_collections.ConfigDict(dict(
      dirs=(),              # () = the stdlib and site-packages of this Python
      jsonl=(), array_record=(),
      tokenizer="byte",     # composer_rl.train.pretrain.TOKENIZERS
      languages=("python",),
      min_bytes=256,        # smaller files are mostly __init__ stubs
      max_bytes=64 * 1024,  # larger ones are mostly generated tables
      heldout_fraction=0.1,  # of repositories (top-level packages), by a stable hash
      near_dup_threshold=0.8,  # MinHash Jaccard above which a file is a near-duplicate
      max_files=4000,       # files read (0 = all); bounds corpus building on a laptop
      eval_max_rows=64))    # held-out rows of the perplexity evaluation
  if variant == "tiny":
    c.train.update(steps=6, log_every=1)
    c.optimizer.update(warmup_steps=2, total_steps=6)
    c.checkpoint.update(every_steps=2, max_to_keep=4)
    c.model.update(max_seq_len=64, d_model=32, d_ff=64, head_dim=8, num_heads=2,
                   num_kv_heads=1, row_tile=16)
    c.train.update(seq_len=64, batch_size=4, micro_batch_size=4)
    c.corpus.update(max_files=300, eval_max_rows=8, heldout_fraction=0.2)
  elif variant != "default":
    raise ValueError(f"unknown variant {variant!r}; choose 'default' or 'tiny'")
  return c
