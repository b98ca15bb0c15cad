"""Test-wide setup: 8 fake CPU devices for multi-device tests, parity flags via import."""
import os

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + " --xla_force_host_platform_device_count=8").strip()

import composer_rl  # noqa: E402,F401  (parity XLA flags must precede JAX's backend)

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def qwen3_tokenizer(tmp_path_factory):
  """A Qwen3-style byte-level BPE tokenizer directory (tests/qwen3_artifacts.py)."""
  pytest.importorskip("tokenizers")
  from tests import qwen3_artifacts  # pylint: disable=import-outside-toplevel
  return qwen3_artifacts.make_tokenizer(str(tmp_path_factory.mktemp("qwen3_tok")))


@pytest.fixture(scope="session")
def qwen3_hf_dir(qwen3_tokenizer, tmp_path_factory):
  """A random 2-layer `transformers` Qwen3 model saved with that tokenizer: a Hugging Face
  checkpoint directory (tests/qwen3_artifacts.py)."""
  from tests import qwen3_artifacts  # pylint: disable=import-outside-toplevel
  return qwen3_artifacts.make_hf_model(qwen3_tokenizer, str(tmp_path_factory.mktemp("qwen3_hf")))


@pytest.fixture(scope="session")
def qwen3_checkpoint(qwen3_hf_dir, tmp_path_factory):
  """That checkpoint converted (`hf_qwen3.convert`)."""
  from composer_rl.model import hf_qwen3  # pylint: disable=import-outside-toplevel
  out = str(tmp_path_factory.mktemp("qwen3_ckpt"))
  hf_qwen3.convert(qwen3_hf_dir, out)
  return out
