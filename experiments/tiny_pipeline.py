"""Continued pretraining on code -> SFT -> RL, one experiment, against SFT -> RL alone.

Run (CPU; stage 1 a few minutes, then the tiny_bugfix agent twice, ~15 min each):
  python launch/train.py --config=experiments/tiny_pipeline.py --workdir=/tmp/tiny_pipeline
Smoke (seconds): --config=experiments/tiny_pipeline.py:smoke
Without the comparison arm: --config.compare_without_pretraining=False

Stage 1 is `experiments/cpt_code.py` (the Python standard library and site-packages of
this machine, split by repository); stages 2 and 3 are `experiments/tiny_bugfix.py` with
SFT starting from stage 1's weights. The summary (last stdout line) has held-out perplexity
before/after stage 1, held-out solve rates after stages 2 and 3, and the same solve rates
of the arm without stage 1.
"""
import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpt_code  # noqa: E402  (experiments/ is not a package)
import tiny_bugfix  # noqa: E402


def get_config(variant: str = "default") -> ml_collections.ConfigDict:
  if variant not in ("default", "smoke"):
    raise ValueError(f"unknown variant {variant!r}; choose 'default' or 'smoke'")
  c = ml_collections.ConfigDict()
  c.kind = "pipeline"
  c.compare_without_pretraining = True  # also run stages 2+3 from scratch
  c.agent = tiny_bugfix.get_config(variant)
  c.pretrain = cpt_code.get_config("tiny" if variant == "smoke" else "default")
  # One architecture for both stages: the agent's (compute fields stay per stage).
  arch = ("d_model", "num_layers", "num_heads", "num_kv_heads", "head_dim", "d_ff")
  c.pretrain.model.update({k: c.agent.model[k] for k in arch})
  c.pretrain.seed = c.agent.seed
  return c
