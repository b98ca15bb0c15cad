"""Turns a parity config (experiments/parity.py) into a suite run and a JSON report."""
import json

from composer_rl.model.config import ModelConfig
from composer_rl.parity.suite import run_suite
from composer_rl.sampling.sampler import SamplingConfig


def _ints(text: str):
  return [int(x) for x in str(text).split(",") if x.strip() != ""]


def model_configs(config):
  m = dict(config.model)
  layers = _ints(m.pop("moe_layers"))
  out = []
  for dtype in str(config.compute_dtypes).split(","):
    out.append(ModelConfig(**m, moe_layers=tuple(layers) or None,
                           compute_dtype=dtype.strip()))
  return out


def run(config) -> dict:
  sampling = SamplingConfig(seed=config.seed, **dict(config.sampling))
  report = run_suite(
      model_configs(config), sampling, num_prompts=config.num_prompts,
      prompt_len_range=(config.prompt_len_min, config.prompt_len_max),
      batch_sizes=_ints(config.batch_sizes),
      prefill_chunks=[c or None for c in _ints(config.prefill_chunks)],
      prompt_buckets=_ints(config.prompt_buckets),
      train_batch_sizes=_ints(config.train_batch_sizes),
      num_devices=_ints(config.num_devices), seed=config.seed)
  for m in report["models"]:
    for case in m["cases"]:
      print(f"{m['model']['compute_dtype']:>8} {case['case']:<55} tokens={case['tokens']:<6} "
            f"mismatched={case['mismatched']} routing={case['routing_mismatches']}")
  summary = {k: v for k, v in report.items() if k != "models"}
  print(json.dumps(summary), flush=True)
  return report
