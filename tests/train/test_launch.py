"""Config validation and launch: typos and wrong types fail at start, naming the field; the
RL experiment learns (reward rises) with on-policy ratios exactly 1."""
import os
import subprocess
import sys

import pytest

from composer_rl.train import config as config_lib
from composer_rl.train import trainer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
import rl_synthetic_tiny  # noqa: E402
import sft_tiny  # noqa: E402


def _launch(tmp_path, *flags):
  cmd = [sys.executable, os.path.join(ROOT, "launch", "train.py"),
         "--config=" + os.path.join(ROOT, "experiments", "sft_tiny.py"),
         f"--workdir={tmp_path}", *flags]
  return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_misspelled_override_fails_at_start_naming_the_field(tmp_path):
  out = _launch(tmp_path, "--config.optimizer.lerning_rate=0.1")
  assert out.returncode != 0
  assert "lerning_rate" in out.stderr
  assert not os.path.exists(tmp_path / "checkpoints")


def test_mistyped_override_fails_at_start_naming_the_field(tmp_path):
  out = _launch(tmp_path, "--config.train.steps=many")
  assert out.returncode != 0
  assert "steps" in out.stderr


@pytest.mark.parametrize("section,field,value,match", [
    ("optimizer", "lerning_rate", 0.1, "config.optimizer.lerning_rate: unknown field"),
    ("model", "d_model", -4, "d_model must be positive"),
    ("loss", "aggregation", "mean", "aggregation"),
    ("train", "seq_len", 4096, "config.train.seq_len"),
    ("mesh", "pipeline", 2, "config.mesh.pipeline"),
])
def test_library_validation_names_the_field(section, field, value, match):
  c = sft_tiny.get_config()
  with c.unlocked():
    c[section][field] = value
  with pytest.raises(config_lib.ConfigError, match=match):
    config_lib.build(c)


def test_rl_synthetic_reward_rises_with_exact_on_policy_ratios(tmp_path):
  c = rl_synthetic_tiny.get_config()
  c.model.num_layers = 1
  c.train.steps = 30
  c.optimizer.total_steps = 30
  c.optimizer.learning_rate = 3e-2
  summary = trainer.train(c, str(tmp_path))
  assert summary["ratio_not_one_frac_max"] == 0.0
  assert summary["reward_mean_first"] < 0.05
  assert summary["reward_mean_last"] > 0.5, summary


@pytest.mark.slow
def test_sft_tiny_end_to_end(tmp_path):
  out = _launch(tmp_path)
  assert out.returncode == 0, out.stderr[-3000:]
  import json
  summary = json.loads(out.stdout.strip().splitlines()[-1])
  assert summary["loss_last"] < 0.7 * summary["loss_first"]
