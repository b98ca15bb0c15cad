"""Shared fixtures for trainer tests: tiny configs and on-policy batches from the Sampler."""
import importlib
import os
import sys

import numpy as np
from flax import nnx

from composer_rl.model import ModelConfig, Transformer
from composer_rl.sampling.sampler import Sampler, SamplingConfig
from composer_rl.train.batch import build_batch

TINY = ModelConfig(vocab_size=64, d_model=32, num_layers=1, num_heads=2, num_kv_heads=1,
                   head_dim=16, d_ff=64, max_seq_len=32, row_tile=8)


def on_policy_records(model_config, params_or_model, num, seed=0, prompt_len=(2, 6),
                      sampling=SamplingConfig(temperature=1.0, max_new_tokens=8, seed=3)):
  """Samples `num` sequences with the real Sampler; returns token-level records."""
  model = params_or_model
  if not isinstance(model, Transformer):
    model = Transformer(model_config, rngs=nnx.Rngs(0))
    graphdef, _ = nnx.split(model)
    model = nnx.merge(graphdef, params_or_model)
  rng = np.random.default_rng(seed)
  prompts = [rng.integers(1, model_config.vocab_size, int(rng.integers(*prompt_len))).tolist()
             for _ in range(num)]
  samples = Sampler(model, prompt_bucket=8).generate(prompts, list(range(num)), sampling)
  records = []
  for p, s in zip(prompts, samples):
    records.append(dict(tokens=p + s.tokens, loss_mask=[0] * len(p) + [1] * len(s.tokens),
                        logprobs=[0.0] * len(p) + s.logprobs.tolist(),
                        versions=[-1] * len(p) + [0] * len(s.tokens)))
  return records, samples


def on_policy_batch(model_config, params, num, seq_len, advantages=None, seed=0,
                    sampling=SamplingConfig(temperature=1.0, max_new_tokens=8, seed=3)):
  records, _ = on_policy_records(model_config, params, num, seed=seed, sampling=sampling)
  if advantages is None:
    advantages = np.random.default_rng(seed + 1).normal(size=num)
  return build_batch(records, seq_len, advantages=advantages,
                     temperature=sampling.temperature, top_k=sampling.top_k,
                     top_p=sampling.top_p)


def load_experiment(name: str, variant: str = ""):
  """`experiments/<name>.py`'s get_config(variant) (experiments/ is not a package)."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  sys.path.insert(0, os.path.join(root, "experiments"))
  module = importlib.import_module(name)
  return module.get_config(variant) if variant else module.get_config()
