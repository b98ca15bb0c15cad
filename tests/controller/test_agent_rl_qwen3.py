"""Agent RL in Qwen3's chat format (`config.chat.format='qwen3'`): a byte-level BPE tokenizer
shaped like Qwen3's is trained here on the tasks' code (nothing downloaded); demonstrations,
SFT, rollouts, RL and evaluation then run with its ids, `<|im_start|>` turns and
`<tool_call>` calls that the harness parses; bad chat settings fail naming the field."""
import glob
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("tokenizers")

from composer_rl.controller import agent_setup, agent_sft  # noqa: E402
from composer_rl.data.hf_tokenizer import HfTokenizer  # noqa: E402
from tests import qwen3_artifacts  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
import tiny_bugfix  # noqa: E402


@pytest.fixture
def tokenizer_dir(qwen3_tokenizer):
  return qwen3_tokenizer


@pytest.fixture
def checkpoint(qwen3_checkpoint):
  return qwen3_checkpoint


def _rows(path):
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def test_agent_rl_runs_a_converted_checkpoint_in_qwen3_format(tmp_path, tokenizer_dir,
                                                               checkpoint):
  """The checkpoint's architecture, weights and tokenizer (its hf_files/) start the run."""
  wd = tmp_path / "wd"
  cmd = [sys.executable, os.path.join(ROOT, "launch", "train.py"),
         f"--config={os.path.join(ROOT, 'experiments', 'tiny_bugfix.py')}:smoke",
         f"--workdir={wd}", "--config.chat.format=qwen3",
         f"--config.init_checkpoint={checkpoint}", "--config.sft.num_demos=6",
         "--config.rl.max_turn_tokens=48", "--config.model.max_seq_len=2048"]
  out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
  assert out.returncode == 0, out.stderr[-3000:]
  summary = json.loads(out.stdout.strip().splitlines()[-1])
  assert 0.0 <= summary["heldout_solve_rate_rl"] <= 1.0
  tok = HfTokenizer(tokenizer_dir)
  im_start, im_end = tok.token_id("<|im_start|>"), tok.token_id("<|im_end|>")
  (demo_file,) = glob.glob(str(wd / "demos_*.jsonl"))
  demos = _rows(demo_file)
  # The demonstrator wrote Qwen3 calls, the harness parsed every one, and the fixing
  # demonstrations earned their reward in the sandbox.
  assert all(text.startswith("<tool_call>\n") for d in demos for text in d["turn_texts"])
  assert all(d["metrics"]["malformed_calls"] == 0 for d in demos)
  assert any(d["reward"] == 1.0 for d in demos)
  for d in demos:
    assert d["tokens"][0] == im_start and d["tokens"].count(im_end) >= 3
    # every model turn ends on <|im_end|>, the token the trainer learns to stop with
    ends = [t for t, m in zip(d["tokens"], d["loss_mask"]) if m]
    assert ends.count(im_end) == d["turns"]
  rl = sorted(p for p in os.listdir(wd / "rollouts") if p.startswith("rl_step_"))
  sessions = [t for p in rl for t in _rows(wd / "rollouts" / p)]
  assert sessions and all(t["tokens"][0] == im_start for t in sessions)
  assert all(max(t["tokens"]) < tok.vocab_size for t in sessions)
  assert all(t["logprobs_are_uint32_bits"] and sum(t["loss_mask"]) > 0 for t in sessions)
  _export_loads_in_transformers_and_generates(wd, tokenizer_dir, checkpoint)
  # The viewer reads the run's Qwen3 calls and token names (its chat.json).
  from composer_rl.viewer import build  # pylint: disable=import-outside-toplevel
  assert build.build(str(wd))["sessions"] >= len(demos) + len(sessions)
  (demo_shard,) = glob.glob(str(wd / "viewer" / "data" / "shards" / "demos_*.0.json"))
  with open(demo_shard) as f:
    demo_views = json.load(f)
  for v in demo_views:
    assert v["tokens"]["names"][str(im_end)] == "<|im_end|>"
    assert all(t["call"] is not None and t["error"] is None for t in v["turns_detail"])


def _export_loads_in_transformers_and_generates(wd, tokenizer_dir, checkpoint):
  """The run's trained weights (final_params/) -> launch/convert_checkpoint.py
  --export_from -> a Hugging Face directory that `transformers` loads and generates with:
  its tensors are the trained ones (not the checkpoint the run started from)."""
  transformers = pytest.importorskip("transformers")
  torch = pytest.importorskip("torch")
  import numpy as np  # pylint: disable=import-outside-toplevel
  from composer_rl.model import hf_qwen3  # pylint: disable=import-outside-toplevel
  out = wd / "exported"
  done = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "convert_checkpoint.py"),
                         f"--export_from={wd / 'final_params'}", f"--out={out}"],
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  assert os.path.exists(out / "tokenizer.json")
  model = transformers.Qwen3ForCausalLM.from_pretrained(str(out), torch_dtype=torch.float32)
  tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(out / "tokenizer.json"))
  trained = hf_qwen3.load_params(str(wd / "final_params"))
  start = hf_qwen3.load_params(checkpoint)
  got = model.model.layers[0].mlp.down_proj.weight.detach().numpy()
  want = np.asarray(trained["blocks"][0]["ffn"]["w_down"]).T
  assert np.array_equal(got, want.astype(got.dtype))
  assert not np.array_equal(want, np.asarray(start["blocks"][0]["ffn"]["w_down"]).T)
  ids = torch.tensor([tok.encode("def add(a, b):")])
  gen = model.generate(ids, max_new_tokens=8, do_sample=False,
                       pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"))
  assert gen.shape[1] > ids.shape[1]


def _config(**chat):
  c = tiny_bugfix.get_config("smoke")
  c.chat.update(chat)
  return c


def test_bad_chat_settings_are_named(tmp_path, tokenizer_dir):
  with pytest.raises(ValueError, match=r"config\.chat\.tokenizer"):
    agent_setup.Setup(_config(format="qwen3"), str(tmp_path))
  with pytest.raises(FileNotFoundError, match="no tokenizer.json in"):
    agent_setup.Setup(_config(format="qwen3", tokenizer=str(tmp_path)), str(tmp_path))
  # A demonstration longer than the window (Qwen3's tools block alone is ~750 tokens of
  # this tokenizer) is named with what to change, before any training.
  c = _config(format="qwen3", tokenizer=tokenizer_dir)
  c.model.max_seq_len = 512
  with pytest.raises(ValueError, match=r"longer than model\.max_seq_len=512"):
    agent_sft.sft_stage(agent_setup.Setup(c, str(tmp_path / "short")))
  s = agent_setup.Setup(_config(format="qwen3", tokenizer=tokenizer_dir), str(tmp_path))
  assert s.model_config.vocab_size == HfTokenizer(tokenizer_dir).vocab_size
  assert s.env_config.call_syntax == "qwen3"


def test_checkpoint_settings_are_checked(tmp_path, tokenizer_dir, checkpoint):
  c = _config(format="qwen3")
  c.init_checkpoint = checkpoint
  c.model.max_seq_len = 256  # a runtime field: taken; the architecture is the checkpoint's
  s = agent_setup.Setup(c, str(tmp_path / "ok"))
  assert (s.model_config.vocab_size, s.model_config.d_model, s.model_config.max_seq_len) == (
      1024, 32, 256)
  c.init_checkpoint = str(tmp_path)
  with pytest.raises(FileNotFoundError, match="no model_config.json"):
    agent_setup.Setup(c, str(tmp_path / "missing"))
  # A model whose vocabulary is smaller than the tokenizer's does not belong with it.
  small = qwen3_artifacts.make_checkpoint(tokenizer_dir, str(tmp_path / "hf_small"),
                                          str(tmp_path / "ckpt_small"), 512)
  c.init_checkpoint = small
  with pytest.raises(ValueError, match=r"has a vocabulary of 512: they do not belong"):
    agent_setup.Setup(c, str(tmp_path / "mismatch"))
