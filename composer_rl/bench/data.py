"""Pretraining data benchmark: corpus build stats over the stdlib + site-packages, packed
pipeline tokens/s with 0 and 2 Grain worker processes, and the tiny pretraining model's
train-step tokens/s in the same run. Prints one JSON object.

  python -m composer_rl.bench.data                    # ~2-3 min on 2 cores
  python -m composer_rl.bench.data --max_files=0      # the whole stdlib + site-packages

`pipeline_over_train` = slowest pipeline tokens/s / fastest train-step tokens/s: > 1 means
data is never the bottleneck. The train step is `composer_rl.bench.train.measure` (the full
sharded step, value_and_grad + AdamW) on the model of `experiments/cpt_code.py`.
"""
import json
import os
import sys
import time

from absl import app, flags

import composer_rl  # noqa: F401  (parity XLA flags before JAX starts)

from composer_rl.bench import train as train_bench
from composer_rl.data import corpus as corpus_lib
from composer_rl.data import packing
from composer_rl.data.byte_tokenizer import ByteTokenizer
from composer_rl.model.config import ModelConfig

_MAX_FILES = flags.DEFINE_integer(
    "max_files", 6000, "files of the kept languages read at most (CorpusConfig.max_files; 0 = all)")
_PIPE_ROWS = flags.DEFINE_integer("pipeline_rows", 3000,
                                  "rows timed per pipeline measurement (in batches of --rows)")
_WORKERS = flags.DEFINE_list("workers", ["0", "2"], "Grain worker process counts")
_BINS = flags.DEFINE_integer("bins", 8, "first-fit packing bins")
# bench.train's flags mean the same here (--seq_len: tokens per row, --rows: rows per
# train step, --modes, --steps); only their defaults change.
FLAGS = flags.FLAGS
FLAGS.set_default("seq_len", 256)
FLAGS.set_default("rows", 8)

# The model of experiments/cpt_code.py (byte vocabulary; experiments/ is not importable).
PRETRAIN_TINY = ModelConfig(vocab_size=264, d_model=128, num_layers=2, num_heads=4,
                            num_kv_heads=2, head_dim=32, d_ff=384, max_seq_len=256,
                            row_tile=32, compute_dtype="float32")


def _pipeline(docs, workers: int):
  """Tokens/s of `packed_rows` batched as the train step consumes it ([--rows, --seq_len]),
  timed after the first batch (worker start-up reported apart)."""
  batch, n = FLAGS.rows, _PIPE_ROWS.value // FLAGS.rows
  t = time.perf_counter()
  it = iter(packing.packed_rows(docs, ByteTokenizer(), FLAGS.seq_len, seed=0,
                                num_packing_bins=_BINS.value, worker_count=workers,
                                batch_size=batch))
  first = next(it)
  startup = time.perf_counter() - t
  t = time.perf_counter()
  batches = [next(it) for _ in range(n)]
  dt = time.perf_counter() - t
  pad = float(sum((b["loss_weights"] == 0).sum() for b in [first] + batches)
              / ((n + 1) * batch * FLAGS.seq_len))
  return dict(workers=workers, batches=n, batch=batch, startup_s=round(startup, 2),
              rows_per_s=round(n * batch / dt, 1),
              tokens_per_s=round(n * batch * FLAGS.seq_len / dt, 1),
              non_pad_tokens_per_s=round(n * batch * FLAGS.seq_len * (1 - pad) / dt, 1),
              padding_fraction=round(pad, 4))


def main(_):
  t = time.perf_counter()
  roots = corpus_lib.stdlib_and_site_packages_roots()
  cfg = corpus_lib.CorpusConfig(max_files=_MAX_FILES.value or None)
  corpus = corpus_lib.build_corpus([("dirs", roots)], cfg)
  build_s = time.perf_counter() - t
  print(json.dumps(corpus.stats), file=sys.stderr, flush=True)

  pipes = [_pipeline(corpus.train, int(w)) for w in _WORKERS.value]
  for p in pipes:
    print(json.dumps(p), file=sys.stderr, flush=True)

  steps = [train_bench.measure(PRETRAIN_TINY, "pretrain_tiny", mode, 1, FLAGS.rows,
                               FLAGS.seq_len, FLAGS.steps) for mode in FLAGS.modes]
  slowest_pipe = min(p["tokens_per_s"] for p in pipes)
  fastest_step = max(s["tokens_per_s"] for s in steps)
  print(json.dumps(dict(
      bench="pretrain_data", host_cpus=os.cpu_count(), roots=roots,
      max_files=_MAX_FILES.value, corpus_build_s=round(build_s, 2), corpus=corpus.stats,
      seq_len=FLAGS.seq_len, packing_bins=_BINS.value, pipeline=pipes,
      train_step=[{k: s[k] for k in ("mode", "params", "rows", "seq_len", "step_s",
                                     "tokens_per_s", "first_step_s")} for s in steps],
      pipeline_over_train=round(slowest_pipe / fastest_step, 2))))


if __name__ == "__main__":
  app.run(main)
