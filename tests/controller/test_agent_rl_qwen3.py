"""Agent RL in Qwen3's chat format (`config.chat.format='qwen3'`): a byte-level BPE tokenizer
shaped like Qwen3's is trained here on the tasks' code (nothing downloaded); demonstrations,
SFT, rollouts, RL and evaluation then run with its ids, `<|im_start|>` turns and
`<tool_call>` calls that the harness parses; bad chat settings fail naming the field."""
import glob
import json
import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("tokenizers")

from composer_rl.controller import agent_setup, agent_sft  # noqa: E402
from composer_rl.data import bpe  # noqa: E402
from composer_rl.data.hf_tokenizer import HfTokenizer  # noqa: E402
from composer_rl.env import get_task  # noqa: E402
from composer_rl.env.qwen3_calls import format_call  # noqa: E402
from composer_rl.rollout import qwen3_chat  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
import tiny_bugfix  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
  # The tools block of the system message and the tasks' code, as a checkpoint's tokenizer
  # would have seen text like them.
  texts = [qwen3_chat.TOOLS_HEADER + qwen3_chat.TOOLS_FOOTER] * 20
  texts += [json.dumps(t, ensure_ascii=False) for t in qwen3_chat.env_tools()] * 20
  for i in range(40):
    t = get_task("generated", "train", i)
    texts += [t.prompt, *t.files.values()]
    texts.append(format_call("edit", {"path": "tools.py", "old": "x", "new": "y"}))
  out = str(tmp_path_factory.mktemp("qwen3_tok"))
  bpe.train_qwen3_style(texts, 1000, out)
  return out


def _convert(tokenizer_dir, hf_dir, out, vocab_size):
  """A Qwen3-architecture model made by `transformers` (random init, 2 layers), saved with
  the tokenizer, then converted: what a user's `launch/convert_checkpoint.py` run gives."""
  transformers = pytest.importorskip("transformers")
  torch = pytest.importorskip("torch")
  from composer_rl.model import hf_qwen3  # pylint: disable=import-outside-toplevel
  torch.manual_seed(0)
  cfg = transformers.Qwen3Config(
      vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
      num_attention_heads=2, num_key_value_heads=1, head_dim=16, rms_norm_eps=1e-6,
      max_position_embeddings=2048, tie_word_embeddings=True)
  transformers.Qwen3ForCausalLM._from_config(cfg).save_pretrained(str(hf_dir))
  shutil.copy(os.path.join(tokenizer_dir, "tokenizer.json"), os.path.join(hf_dir,
                                                                          "tokenizer.json"))
  hf_qwen3.convert(str(hf_dir), str(out))
  return str(out)


@pytest.fixture(scope="module")
def checkpoint(tokenizer_dir, tmp_path_factory):
  # The embedding is padded past the tokenizer's ~1,000 tokens, as Qwen3's is.
  return _convert(tokenizer_dir, tmp_path_factory.mktemp("qwen3_hf"),
                  tmp_path_factory.mktemp("qwen3_ckpt"), 1024)


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


def _config(**chat):
  c = tiny_bugfix.get_config("smoke")
  c.chat.update(chat)
  return c


def test_bad_chat_settings_are_named(tmp_path, tokenizer_dir):
  with pytest.raises(ValueError, match=r"config\.chat\.tokenizer"):
    agent_setup.Setup(_config(format="qwen3"), str(tmp_path))
  with pytest.raises(FileNotFoundError, match="no tokenizer.json in"):
    agent_setup.Setup(_config(format="qwen3", tokenizer=str(tmp_path)), str(tmp_path))
  c = _config(format="qwen3", tokenizer=tokenizer_dir)
  c.rl.compaction = dict(enabled=True, mode="compaction")
  with pytest.raises(ValueError, match="supports chat.format='byte' only"):
    agent_setup.Setup(c, str(tmp_path))
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
  small = _convert(tokenizer_dir, tmp_path / "hf_small", tmp_path / "ckpt_small", 512)
  c.init_checkpoint = small
  with pytest.raises(ValueError, match=r"has a vocabulary of 512: they do not belong"):
    agent_setup.Setup(c, str(tmp_path / "mismatch"))
