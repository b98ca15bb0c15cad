"""Fixtures shared by the context-compaction and truncation tests."""
import pytest
from flax import nnx

from composer_rl.data.byte_tokenizer import ByteTokenizer
from composer_rl.model import Transformer, get_preset
from composer_rl.sampling.engine import Engine


@pytest.fixture(scope="module")
def window_160():
  """(tokenizer, tiny byte-level model with a 160-token window, one 2-slot engine): a window
  small enough that sessions of a few turns outgrow it; one engine (and its compiled
  programs) per test module."""
  tok = ByteTokenizer()
  model = Transformer(get_preset("tiny", vocab_size=tok.vocab_size, max_seq_len=160),
                      rngs=nnx.Rngs(0))
  return tok, model, Engine(model, slots=2, prefill_chunk=16)
