"""The server's request-driven continuous batching (composer_rl.serving.generator): requests
share decode slots, every token's log-prob equals the trainer's recomputation bit for bit,
seeds reproduce under load, stop strings / budgets / cancellation end completions, streamed
text adds up to the final text, and a weight switch never splits a completion."""
import concurrent.futures as cf
import threading

import jax
import numpy as np
import pytest
from flax import nnx

from composer_rl.data.byte_tokenizer import ByteTokenizer
from composer_rl.model import Transformer, get_preset
from composer_rl.sampling.engine import Engine
from composer_rl.sampling.head import RowSampling
from composer_rl.serving.generator import Generator, QueueFullError, SamplingParams
from composer_rl.train.scoring import score_tokens

TOP = 5


@pytest.fixture(scope="module")
def model():
  tok = ByteTokenizer()
  return tok, Transformer(get_preset("tiny", vocab_size=tok.vocab_size, max_seq_len=96),
                          rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def gen(model):
  tok, m = model
  eng = Engine(m, slots=2, prefill_chunk=16, top_logprobs=TOP)
  g = Generator(eng, eng.place(nnx.state(m)), version=0, tokenizer=tok)
  yield g
  g.close()


def _prompt(tok, text):
  return [tok.BOS, tok.USER] + tok.encode(text) + [tok.EOT, tok.ASSISTANT]


def _assert_exact(model, params, prompt, choice, sp):
  """Every sampled token's log-prob (and its top alternatives' ids and log-probs) equal the
  trainer's scoring of prompt + completion under the same transform, as uint32 bits."""
  _, m = model
  graphdef = nnx.graphdef(m)
  rows = RowSampling.broadcast(1, sp.temperature, sp.top_k, sp.top_p)
  toks = np.asarray(prompt + choice.token_ids, np.int32)[None]
  got = np.asarray(jax.jit(lambda p, t: score_tokens(nnx.merge(graphdef, p), t, rows))(
      params, toks).logprobs[0])
  want = np.asarray(choice.logprobs, np.float32)
  assert np.array_equal(got[len(prompt) - 1:].view(np.uint32), want.view(np.uint32))
  for pos, top in enumerate(choice.top_logprobs):
    assert len(top) == sp.top_logprobs
    lps = np.asarray([lp for _, lp in top], np.float32)
    assert np.all(np.diff(lps) <= 0)                      # most likely first
    if choice.token_ids[pos] in [i for i, _ in top]:      # the sampled one, same bits
      k = [i for i, _ in top].index(choice.token_ids[pos])
      assert lps[k].view(np.uint32) == want[pos].view(np.uint32)


def test_concurrent_requests_share_slots_exactly(model, gen):
  tok, m = model
  sp = SamplingParams(max_tokens=24, temperature=0.8, top_p=0.9, n=3, seed=7, top_logprobs=TOP)
  prompts = [_prompt(tok, "fix the bug " * k) for k in (1, 2, 3, 4)]
  futs = [gen.submit(p, sp) for p in prompts]  # 12 completions through 2 slots
  results = [f.result(timeout=120) for f in futs]
  params = nnx.state(m)
  for p, choices in zip(prompts, results):
    assert [c.index for c in choices] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in choices}) > 1  # choices draw different streams
    for c in choices:
      assert c.finish_reason in ("stop", "length") and c.version == 0
      assert len(c.token_ids) <= 24 and c.timings["ttft_s"] <= c.timings["total_s"]
      _assert_exact(model, params, p, c, sp)
  assert gen.stats["completions"] >= 12


def test_seed_reproduces_alone_and_under_load(model, gen):
  tok, _ = model
  p = _prompt(tok, "hello")
  sp = SamplingParams(max_tokens=16, temperature=1.0, seed=123)
  alone = gen.submit(p, sp).result(timeout=60)[0]
  noise = [gen.submit(_prompt(tok, f"other {i}"), SamplingParams(max_tokens=16))
           for i in range(3)]
  loaded = gen.submit(p, sp).result(timeout=60)[0]
  [f.result(timeout=60) for f in noise]
  assert loaded.token_ids == alone.token_ids
  assert np.array_equal(np.asarray(loaded.logprobs, np.float32).view(np.uint32),
                        np.asarray(alone.logprobs, np.float32).view(np.uint32))
  other = gen.submit(p, SamplingParams(max_tokens=16, seed=124)).result(timeout=60)[0]
  assert other.token_ids != alone.token_ids


def test_stop_strings_budgets_and_streaming(model, gen):
  tok, _ = model
  p = _prompt(tok, "stream")
  base = gen.submit(p, SamplingParams(max_tokens=12, seed=5, top_k=0)).result(timeout=60)[0]
  assert base.finish_reason == "length" and len(base.token_ids) == 12
  text = base.text
  assert len(text) >= 3
  stop = text[2:4]  # a string the same seeded completion is known to produce
  events = []
  got = gen.submit(p, SamplingParams(max_tokens=12, seed=5, stop=(stop,)),
                   on_token=events.append).result(timeout=60)[0]
  assert got.finish_reason == "stop" and got.text == text[:text.find(stop)]
  assert got.token_ids == base.token_ids[:len(got.token_ids)]  # the tokens as sampled
  assert "".join(e.text_delta for e in events) == got.text
  assert [e.token_id for e in events] == got.token_ids
  with pytest.raises(ValueError, match="context"):
    gen.submit([tok.BOS] * 95, SamplingParams(max_tokens=4))
  with pytest.raises(ValueError, match="top_logprobs"):
    gen.submit(p, SamplingParams(max_tokens=4, top_logprobs=TOP + 1))
  with pytest.raises(ValueError, match="temperature"):
    gen.submit(p, SamplingParams(max_tokens=4, temperature=0.0))
  # The context bounds the budget: a prompt leaving 3 positions gets at most 3 tokens.
  short = gen.submit([tok.BOS] * 92, SamplingParams(max_tokens=50, seed=1)).result(timeout=60)
  assert len(short[0].token_ids) <= 3


def test_cancel_and_queue_limit(model):
  tok, m = model
  eng = Engine(m, slots=1, prefill_chunk=16)
  g = Generator(eng, eng.place(nnx.state(m)), version=0, tokenizer=tok, max_waiting=2)
  try:
    gate = threading.Event()
    first = g.submit(_prompt(tok, "a"), SamplingParams(max_tokens=80, seed=1),
                     on_token=lambda e: gate.wait(30))  # holds the only slot
    with pytest.raises(QueueFullError):
      g.submit(_prompt(tok, "b"), SamplingParams(max_tokens=4, n=3))
    g.cancel(first)
    gate.set()
    with pytest.raises(cf.CancelledError):
      first.result(timeout=60)
    after = g.submit(_prompt(tok, "c"), SamplingParams(max_tokens=4, seed=2)).result(timeout=60)
    assert len(after[0].token_ids) >= 1
  finally:
    g.close()


def test_weight_switch_never_splits_a_completion(model):
  tok, m = model
  eng = Engine(m, slots=2, prefill_chunk=16)
  old = nnx.state(m)
  new = jax.tree.map(lambda x: x * 1.01, old)
  g = Generator(eng, eng.place(old), version=0, tokenizer=tok)
  try:
    switched = threading.Event()

    def switch_once(e):
      if not switched.is_set():
        switched.set()
        g.set_params(eng.place(new), 1)
    sp = SamplingParams(max_tokens=20, temperature=1.0, seed=3)
    first = g.submit(_prompt(tok, "one"), sp, on_token=switch_once)
    switched.wait(60)
    later = g.submit(_prompt(tok, "two"), sp)
    a, b = first.result(timeout=60)[0], later.result(timeout=60)[0]
    assert (a.version, b.version) == (0, 1)
    _assert_exact(model, old, _prompt(tok, "one"), a, sp)
    _assert_exact(model, new, _prompt(tok, "two"), b, sp)
  finally:
    g.close()


def test_decode_blocks_give_the_same_completions(model, gen):
  """decode_steps > 1 (one engine call per block of steps, as rollouts run) gives every
  completion's tokens, log-prob bits, top alternatives, stop-string cuts and finish
  reasons exactly as one step per call does, with streamed text adding up the same."""
  tok, m = model
  eng = Engine(m, slots=2, prefill_chunk=16, top_logprobs=TOP)
  blocks = Generator(eng, eng.place(nnx.state(m)), version=0, tokenizer=tok, decode_steps=4)
  try:
    sps = [SamplingParams(max_tokens=19, temperature=0.8, n=3, seed=11, top_logprobs=TOP),
           SamplingParams(max_tokens=30, temperature=1.0, n=2, seed=3, stop=("e", "\n")),
           SamplingParams(max_tokens=9, top_k=1)]
    prompts = [_prompt(tok, "print the sum " * k) for k in (1, 2, 3)]
    for p, sp in zip(prompts, sps):
      streamed = {}
      def on_token(ev, streamed=streamed):
        streamed[ev.choice] = streamed.get(ev.choice, "") + ev.text_delta
      want = gen.submit(p, sp).result(timeout=120)
      got = blocks.submit(p, sp, on_token=on_token).result(timeout=120)
      for a, b in zip(want, got):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert a.text == b.text == streamed[b.index]
        assert np.array_equal(np.asarray(a.logprobs, np.float32).view(np.uint32),
                              np.asarray(b.logprobs, np.float32).view(np.uint32))
        assert a.top_logprobs == b.top_logprobs
    assert blocks.stats["decode_steps"] % 4 == 0
  finally:
    blocks.close()
