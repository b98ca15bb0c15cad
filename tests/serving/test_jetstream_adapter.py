"""The JetStream adapter (only where the `jetstream` extra is installed): JetStream's
prefill / insert / generate calls reach the exact engine and return its tokens."""
import numpy as np
import pytest

engine_api = pytest.importorskip("jetstream.engine.engine_api")

from flax import nnx  # noqa: E402

from composer_rl.model import Transformer, get_preset  # noqa: E402
from composer_rl.sampling.engine import Engine, Request  # noqa: E402
from composer_rl.serving.jetstream_adapter import JetStreamAdapter  # noqa: E402


def test_adapter_drives_the_engine_like_jetstream_does():
  model = Transformer(get_preset("tiny", vocab_size=264, max_seq_len=64), rngs=nnx.Rngs(0))
  eng = Engine(model, slots=2, prefill_chunk=8)
  js = JetStreamAdapter(eng, Request(seq_id=5, seed=1, top_k=20))
  assert isinstance(js, engine_api.Engine) and js.max_concurrent_decodes == 2
  params = js.load_params()
  state = js.init_decode_state()
  prefix, first = js.prefill(params=params, padded_tokens=np.array([1, 7, 9, 11]), true_length=4)
  slot = first.convert_to_numpy().get_result_at_slot(0)
  assert int(slot.tokens[0, 0]) == int(prefix.token) and int(slot.lengths[0]) == 5
  # the same request through the engine directly samples the same token
  direct = eng.prefill(params=params, padded_tokens=[1, 7, 9, 11],
                       request=Request(seq_id=5, seed=1, top_k=20))
  assert int(direct.token) == int(prefix.token)
  state = js.insert(prefix, state, 1)
  state, res = js.generate(params, state)
  res = res.convert_to_numpy()
  assert int(res.get_result_at_slot(1).valid[0, 0]) == 1
  assert int(res.get_result_at_slot(0).valid[0, 0]) == 0
  with pytest.raises(ValueError, match="samplers"):
    js.generate(params, state, sampler=lambda x: x)
