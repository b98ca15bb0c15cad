"""Real Qwen3 artifacts made on the spot (nothing downloaded): a byte-level BPE tokenizer
shaped like Qwen3's (`data.bpe.train_qwen3_style`) trained on the tasks' code and the
tools block, and a Qwen3-architecture model created by `transformers` (random init),
saved as a Hugging Face checkpoint with that tokenizer and converted
(`model.hf_qwen3.convert`): what a user's `launch/convert_checkpoint.py` run gives.
The session-scoped fixtures `qwen3_tokenizer` and `qwen3_checkpoint` (tests/conftest.py)
build them once per test process."""
import json
import os
import shutil

import pytest


def make_tokenizer(out_dir: str, vocab_size: int = 1000) -> str:
  from composer_rl.data import bpe  # pylint: disable=import-outside-toplevel
  from composer_rl.env import get_task  # pylint: disable=import-outside-toplevel
  from composer_rl.env.qwen3_calls import format_call  # pylint: disable=import-outside-toplevel
  from composer_rl.rollout import qwen3_chat  # pylint: disable=import-outside-toplevel
  texts = [qwen3_chat.TOOLS_HEADER + qwen3_chat.TOOLS_FOOTER] * 20
  texts += [json.dumps(t, ensure_ascii=False) for t in qwen3_chat.env_tools()] * 20
  for i in range(40):
    t = get_task("generated", "train", i)
    texts += [t.prompt, *t.files.values()]
    texts.append(format_call("edit", {"path": "tools.py", "old": "x", "new": "y"}))
  bpe.train_qwen3_style(texts, vocab_size, out_dir)
  return out_dir


def make_checkpoint(tokenizer_dir: str, hf_dir: str, out_dir: str, vocab_size: int = 1024,
                    **arch) -> str:
  """`make_hf_model` into `hf_dir`, converted into `out_dir`."""
  from composer_rl.model import hf_qwen3  # pylint: disable=import-outside-toplevel
  make_hf_model(tokenizer_dir, hf_dir, vocab_size, **arch)
  hf_qwen3.convert(hf_dir, out_dir)
  return out_dir


def make_hf_model(tokenizer_dir: str, hf_dir: str, vocab_size: int = 1024, **arch) -> str:
  """A random `transformers` Qwen3 model (2 layers, d_model 32 unless `arch` says
  otherwise; vocabulary padded past the tokenizer, as Qwen3's is) saved with the tokenizer
  in `hf_dir`: what a user downloads."""
  transformers = pytest.importorskip("transformers")
  torch = pytest.importorskip("torch")
  torch.manual_seed(0)
  kw = dict(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, head_dim=16, rms_norm_eps=1e-6,
            max_position_embeddings=2048, tie_word_embeddings=True)
  kw.update(arch)
  transformers.Qwen3ForCausalLM._from_config(transformers.Qwen3Config(**kw)).save_pretrained(
      hf_dir)
  shutil.copy(os.path.join(tokenizer_dir, "tokenizer.json"), os.path.join(hf_dir,
                                                                          "tokenizer.json"))
  return hf_dir
