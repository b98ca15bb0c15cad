"""Attention key-block sweep for an agent-RL experiment's model: what the key block
(`attention_key_block`; a call reads only the key blocks up to the furthest key it can see)
costs decode, prefill and the train step. Prints one JSON object; ratios are against the
first entry.

  python -m composer_rl.bench.attention_blocks --blocks=0,32,64,128,0:inexact

Each entry is a key block (0 = the model's default); a second field `inexact`
(e.g. 0:inexact) runs the non-exact fast mode, the floor exactness is paid over. The experiment's
model (default experiments/tiny_bugfix.py), its decode slots holding sessions of spread
lengths (like a running rollout factory), and its RL batch (groups_per_step x group_size
rows of max_seq_len tokens, 450 of them real).
"""
import json
import os
import time

from absl import app, flags

import composer_rl  # noqa: F401  (parity XLA flags)
import jax
import numpy as np
from flax import nnx
from ml_collections import config_flags

from composer_rl.data.byte_tokenizer import ByteTokenizer
from composer_rl.model import ModelConfig, Transformer, sharding
from composer_rl.sampling.engine import Engine, Request
from composer_rl.train.batch import build_batch
from composer_rl.train.optimizer import OptimizerConfig
from composer_rl.train.train_step import TrainConfig, make_train_step

_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(os.path.dirname(__file__), "..", "..", "experiments",
                           "tiny_bugfix.py"), "the experiment")
_BLOCKS = flags.DEFINE_string("blocks", "0,32,64,128,0:inexact",
                              "key blocks (optionally :inexact), comma separated")


def _measure(cfg: ModelConfig, slots: int, rows: int) -> dict:
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  eng = Engine(model, slots=slots, prefill_chunk=64)
  params = eng.load_params()
  state = eng.init_decode_state()
  # Sessions at lengths spread over the session budget, as in a running factory.
  for i in range(slots):
    n = 40 + (cfg.max_seq_len - 160) * i // max(slots - 1, 1)
    prefix = eng.prefill(params=params, padded_tokens=[1 + t % 200 for t in range(n)],
                         request=Request(seq_id=i))
    state = eng.insert(prefix, state, i)
  state, out = eng.generate(params, state)
  np.asarray(out.tokens)
  t0 = time.perf_counter()
  for _ in range(40):
    state, out = eng.generate(params, state)
    np.asarray(out.tokens)
  decode = (time.perf_counter() - t0) / 40
  eng.prefill(params=params, padded_tokens=list(range(1, 129)), request=Request(seq_id=1))
  t0 = time.perf_counter()
  for _ in range(5):
    prefix = eng.prefill(params=params, padded_tokens=list(range(1, 129)),
                         request=Request(seq_id=1))
  jax.block_until_ready(prefix.token)
  prefill = (time.perf_counter() - t0) / (5 * 128)
  rng = np.random.default_rng(0)
  recs = [dict(tokens=rng.integers(1, cfg.vocab_size, 450).tolist(),
               loss_mask=[0] * 300 + [1] * 150, logprobs=[-1.0] * 450, versions=[0] * 450)
          for _ in range(rows)]
  step = make_train_step(cfg, TrainConfig(optimizer=OptimizerConfig(total_steps=10)),
                         sharding.make_mesh({"data": -1}))
  st = step.init_state(0)
  batch = step.shard_batch(build_batch(recs, cfg.max_seq_len, num_rows=rows,
                                       advantages=np.ones(rows)))
  st, m = step.step(st, batch)
  jax.block_until_ready(m)
  t0 = time.perf_counter()
  for _ in range(2):
    st, m = step.step(st, batch)
    jax.block_until_ready(m)
  return dict(decode_ms_per_step=decode * 1e3, prefill_us_per_token=prefill * 1e6,
              train_s_per_step=(time.perf_counter() - t0) / 2)


def main(argv):
  del argv
  c = _CONFIG.value
  rows = c.rl.groups_per_step * c.rl.group_size
  out = {"slots": c.rl.slots, "train_rows": rows, "blocks": {}}
  for pair in _BLOCKS.value.split(","):
    kb, *mode = pair.split(":")  # a second field 'inexact': the non-exact fast mode
    cfg = ModelConfig(**{**dict(c.model), "exact_numerics": mode != ["inexact"],
                         "attention_key_block": int(kb)}, vocab_size=ByteTokenizer().vocab_size)
    out["blocks"][pair] = _measure(cfg, c.rl.slots, rows)
  base = next(iter(out["blocks"].values()))
  for r in out["blocks"].values():
    r["decode_vs_first"] = r["decode_ms_per_step"] / base["decode_ms_per_step"]
    r["train_vs_first"] = r["train_s_per_step"] / base["train_s_per_step"]
  print(json.dumps(out), flush=True)


if __name__ == "__main__":
  app.run(main)
