"""The pretraining -> SFT -> RL pipeline (experiments/tiny_pipeline.py) at smoke size:
stage 1 reports held-out perplexity, stage 2 starts from stage 1's weights, a re-run reads
finished stages back, and mismatched architectures or corpus settings fail naming the field."""
import json

import jax
import numpy as np
import pytest

from composer_rl.controller import agent_sft, pipeline
from composer_rl.model import hf_qwen3
from composer_rl.train import config as config_lib
from composer_rl.train import trainer
from tests.train import helpers


def _bits(tree):
  return [np.asarray(x).view(np.uint32) for x in jax.tree.leaves(jax.device_get(tree))]


@pytest.mark.slow  # ~72 s; the default suite is over 20 min (BUILD_NOTES)
def test_pipeline_smoke_chains_the_stages(tmp_path, monkeypatch):
  c = helpers.load_experiment("tiny_pipeline", "smoke")
  c.compare_without_pretraining = False
  seen = {}
  real_sft = agent_sft.sft_stage

  def spy(s, init_params=None):
    seen["init"] = init_params
    return real_sft(s, init_params)
  monkeypatch.setattr(agent_sft, "sft_stage", spy)
  out = pipeline.run(c, str(tmp_path))
  assert out["heldout_perplexity_after_cpt"] < out["heldout_perplexity_before_cpt"]
  assert 0.0 <= out["heldout_solve_rate_rl"] <= 1.0 and out["cpt_steps"] == c.pretrain.train.steps
  # Stage 2's SFT started from stage 1's final weights, bit for bit.
  cpt = trainer.final_params(c.pretrain, str(tmp_path / "stage1_cpt"))
  for a, b in zip(_bits(seen["init"]), _bits(cpt)):
    np.testing.assert_array_equal(a, b)
  # A re-run reads the finished stages back instead of training again.
  seen.clear()
  assert pipeline.run(c, str(tmp_path)) == out and not seen
  with open(tmp_path / "summary.json") as f:
    assert json.load(f) == out


def test_mismatched_architectures_and_corpus_settings_name_the_field(tmp_path):
  c = helpers.load_experiment("tiny_pipeline", "smoke")
  c.pretrain.model.d_ff = 2 * c.agent.model.d_ff
  with pytest.raises(config_lib.ConfigError, match="pretrain.model.d_ff"):
    pipeline.run(c, str(tmp_path))
  for overrides, match in (({"corpus.langs": ("python",)}, "corpus.langs: unknown field"),
                           ({"corpus.tokenizer": "sentencepiece"}, "corpus.tokenizer"),
                           ({"model.max_seq_len": 128, "model.attention_key_block": 32,
                             "train.seq_len": 48}, "multiple of"),
                           ({"loss.policy_loss": "ppo_clip"}, "policy_loss")):
    cpt = helpers.load_experiment("cpt_code", "tiny")
    for path, value in overrides.items():
      section, name = path.split(".")
      cpt[section][name] = value
    with pytest.raises(config_lib.ConfigError, match=match):
      config_lib.build(cpt)


@pytest.mark.slow  # ~70 s, like the smoke pipeline above
def test_the_pipeline_starts_from_a_converted_checkpoint(tmp_path, qwen3_checkpoint):
  """`init_checkpoint` on the pipeline: stage 1 continues the checkpoint's weights on the
  corpus in its tokenizer, stage 2 runs in its chat format from stage 1's weights, and the
  final agent is exportable; a stage naming another checkpoint is refused."""
  c = helpers.load_experiment("tiny_pipeline", "smoke")
  c.compare_without_pretraining = False
  c.agent.model.max_seq_len = 1024  # the smoke model's window; Qwen3's tools block is long
  c.agent.env.tools = ("read_file", "edit")
  c.pretrain.train.steps = 2
  c.init_checkpoint = qwen3_checkpoint
  derived = pipeline.with_checkpoint(c)
  assert (derived.pretrain.corpus.tokenizer, derived.agent.chat.format) == ("hf", "qwen3")
  assert "d_model" not in derived.pretrain.model and c.agent.chat.format == "byte"
  out = pipeline.run(c, str(tmp_path))
  assert out["init_checkpoint"] == qwen3_checkpoint and out["cpt_steps"] == 2
  start = hf_qwen3.load_params(qwen3_checkpoint)
  cpt = jax.device_get(trainer.final_params(derived.pretrain, str(tmp_path / "stage1_cpt")))
  assert cpt["embed"].shape == start["embed"].shape
  assert not np.array_equal(cpt["embed"], start["embed"])
  with open(tmp_path / "stage23_after_cpt" / "chat.json") as f:
    assert json.load(f)["format"] == "qwen3"
  assert (tmp_path / "stage23_after_cpt" / "final_params").is_dir()
  c.pretrain.init_checkpoint = str(tmp_path)
  with pytest.raises(config_lib.ConfigError, match=r"config\.pretrain\.init_checkpoint="):
    pipeline.run(c, str(tmp_path / "other"))
