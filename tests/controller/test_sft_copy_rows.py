"""The SFT stage's copy rows (config.sft.copy_rows / copy_rows_kind / copy_only_steps): which
rows each batch holds, and clear errors for settings that cannot work."""
import os
import sys

import pytest

from composer_rl.controller import agent_setup, agent_sft
from composer_rl.train import stages

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "experiments"))
import tiny_compaction  # noqa: E402


def _config(**sft):
  c = tiny_compaction.get_config("smoke")
  c.sft.update(dict(steps=4, batch_size=3, copy_rows=1, copy_only_steps=2, log_every=1), **sft)
  return c


def test_copy_only_steps_then_mixed_batches(tmp_path, monkeypatch):
  s = agent_setup.Setup(_config(), str(tmp_path))
  seen = []
  real = stages.build_batch

  def spy(recs, *a, **k):
    # demonstration contexts carry logprobs; copy rows are tokens + loss_mask only
    seen.append([("logprobs" in r, len(r["tokens"])) for r in recs])
    return real(recs, *a, **k)
  monkeypatch.setattr(stages, "build_batch", spy)
  agent_sft.sft_stage(s)
  demo_rows = [sum(d for d, _ in b) for b in seen]
  assert demo_rows == [0, 0, 2, 2]  # copy rows alone, then batch_size - copy_rows demos
  assert all(len(b) == 3 and all(n <= s.model_config.max_seq_len for _, n in b) for b in seen)


@pytest.mark.parametrize("sft, match", [
    (dict(copy_rows=3), "copy_rows=3"),
    (dict(copy_only_steps=5), "copy_only_steps=5"),
    (dict(copy_rows_kind="nope"), r"config\.sft\.copy_rows_kind: 'nope'; choose one of"),
    (dict(copy_rows_args=dict(alphabet="AB")), "alphabet"),
])
def test_bad_copy_settings_fail_before_training(tmp_path, sft, match):
  with pytest.raises((ValueError, KeyError, TypeError), match=match):
    agent_sft.sft_stage(agent_setup.Setup(_config(**sft), str(tmp_path)))
  assert not [p for p in os.listdir(tmp_path) if p.startswith("demos_")]  # nothing made yet
