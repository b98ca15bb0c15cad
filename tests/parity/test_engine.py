"""Continuous batching: sessions share slots, release them for tool calls, and resume with
only their new tokens prefilled; every log-prob still equals the trainer's, bit for bit."""
import jax
import numpy as np
import pytest
from flax import nnx

from composer_rl.model import Transformer, get_preset
from composer_rl.model.kv_cache import bucket_length, decode_length
from composer_rl.sampling.engine import Engine, Request
from composer_rl.sampling.sampler import Sampler, SamplingConfig
from composer_rl.train.scoring import score_tokens


@pytest.fixture(scope="module", params=["tiny", "tiny_moe"])
def model(request):
  return Transformer(get_preset(request.param, max_seq_len=96), rngs=nnx.Rngs(3))


def _score(model, seqs, req):
  width = max(len(s) for s in seqs)
  toks = np.zeros((len(seqs), width), np.int32)
  segs = np.zeros_like(toks)
  for i, s in enumerate(seqs):
    toks[i, :len(s)] = s
    segs[i, :len(s)] = 1
  rows = jax.tree.map(lambda x: np.repeat(np.asarray(x), len(seqs)), req.rows())
  return jax.device_get(jax.jit(score_tokens)(model, toks, rows, segs))


def test_multi_turn_sessions_interleaved_in_slots_are_exact(model):
  eng = Engine(model, slots=2, prefill_chunk=8)
  params = eng.load_params()
  rng = np.random.default_rng(0)
  reqs = [Request(seq_id=10 + i, seed=4, temperature=1.0, top_k=20) for i in range(3)]
  history = [rng.integers(1, 200, int(rng.integers(3, 12))).tolist() for _ in range(3)]
  gen_pos = [[] for _ in range(3)]      # positions (in history) of generated tokens
  gen_lp = [[] for _ in range(3)]
  saved = [None] * 3
  state = eng.init_decode_state()
  # Turn plan: each session gets 2 turns of 5 tokens with a 4-token "tool result" between;
  # 3 sessions, 2 slots, so slots are handed over between turns.
  schedule = [(0, 0), (1, 1), (2, 0), (0, 1), (1, 0), (2, 1)]
  for sess, slot in schedule:
    new = history[sess][int(saved[sess].length):] if saved[sess] is not None else history[sess]
    prefix = eng.prefill(params=params, padded_tokens=new, request=reqs[sess],
                         existing_prefix=saved[sess])
    gen_pos[sess].append(len(history[sess]))
    gen_lp[sess].append(prefix.logprob)
    history[sess].append(int(prefix.token))
    state = eng.insert(prefix, state, slot)
    for _ in range(4):
      state, step = eng.generate(params, state)
      gen_pos[sess].append(len(history[sess]))
      gen_lp[sess].append(step.logprobs[slot])
      history[sess].append(int(step.tokens[slot]))
    saved[sess] = eng.release(state, slot)
    # A parked session keeps only the cache its tokens need (a power-of-two bucket).
    kept = int(saved[sess].length)
    assert saved[sess].cache.length == bucket_length(kept, 96) < 96
    assert saved[sess].cache.k.shape[3] == saved[sess].cache.length
    state = eng.free(state, slot)
    # The last sampled token was never fed; the tool result follows it.
    history[sess] += rng.integers(1, 200, 4).tolist()
  scores = _score(model, history, reqs[0])
  compared = 0
  for s in range(3):
    want = np.asarray([float(x) for x in gen_lp[s]], np.float32)
    got = scores.logprobs[s, np.asarray(gen_pos[s]) - 1]
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    compared += len(want)
  assert compared == 3 * 2 * 5


def test_engine_first_turn_equals_batch_sampler(model):
  """Same (seed, seq_id, position) keys -> the engine and the batch sampler agree."""
  prompt = [5, 9, 3, 7, 1, 2]
  req = Request(seq_id=42, seed=9, top_p=0.9)
  eng = Engine(model, slots=3, prefill_chunk=4)
  params = eng.load_params()
  prefix = eng.prefill(params=params, padded_tokens=prompt, request=req)
  state = eng.insert(prefix, eng.init_decode_state(), 2)
  toks, lps = [int(prefix.token)], [float(prefix.logprob)]
  for _ in range(7):
    state, step = eng.generate(params, state)
    toks.append(int(step.tokens[2]))
    lps.append(float(step.logprobs[2]))
  ref = Sampler(model).generate([prompt], [42], SamplingConfig(top_p=0.9, seed=9,
                                                               max_new_tokens=8))[0]
  assert toks == ref.tokens
  np.testing.assert_array_equal(np.asarray(lps, np.float32).view(np.uint32),
                                ref.logprobs.view(np.uint32))


def test_engine_rejects_overflow_and_bad_slots(model):
  eng = Engine(model, slots=1, prefill_chunk=8)
  with pytest.raises(ValueError, match="max_seq_len"):
    eng.prefill(params=eng.load_params(), padded_tokens=[1] * 96, request=Request(seq_id=0))
  prefix = eng.prefill(params=eng.load_params(), padded_tokens=[1, 2], request=Request(seq_id=0))
  with pytest.raises(ValueError, match="slot 1"):
    eng.insert(prefix, eng.init_decode_state(), 1)


def test_engine_on_the_bf16_inference_copy_matches_the_fp32_trainer(model):
  """Weight sync ships `inference_copy` (bf16 leaves, fp32 router); sampling from it must
  still give the trainer's log-prob bits, computed from the fp32 master."""
  from composer_rl.model import inference_copy
  eng = Engine(model, slots=2, prefill_chunk=8)
  copy = inference_copy(eng.params, model.config)
  dtypes = {x.dtype for x in jax.tree.leaves(copy)}
  assert np.dtype("bfloat16") in dtypes
  req = Request(seq_id=5, seed=1, top_k=30)
  prompt = [3, 1, 4, 1, 5, 9, 2, 6]
  prefix = eng.prefill(params=copy, padded_tokens=prompt, request=req)
  state = eng.insert(prefix, eng.init_decode_state(), 0)
  toks, lps = [int(prefix.token)], [prefix.logprob]
  for _ in range(6):
    state, step = eng.generate(copy, state)
    toks.append(int(step.tokens[0]))
    lps.append(step.logprobs[0])
  scores = _score(model, [prompt + toks], req)
  want = np.asarray([float(x) for x in lps], np.float32)
  got = scores.logprobs[0, len(prompt) - 1:len(prompt) - 1 + len(toks)]
  np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_decode_slots_follow_the_sessions_length_and_stay_exact():
  """The decode state's cache grows as a session passes its length and shrinks when the
  sessions left need a quarter of it; the log-probs are the trainer's bits throughout."""
  cfg = get_preset("tiny", max_seq_len=2048)
  model = Transformer(cfg, rngs=nnx.Rngs(5))
  eng = Engine(model, slots=2, prefill_chunk=64)
  params = eng.load_params()
  req = Request(seq_id=1, seed=2, temperature=1.0, top_k=20)
  state = eng.init_decode_state()
  assert state.cache.length == decode_length(cfg, 0) == 256
  prompt = np.random.default_rng(1).integers(1, 200, 230).tolist()
  prefix = eng.prefill(params=params, padded_tokens=prompt, request=req)
  state = eng.insert(prefix, state, 0)
  seq, lps, lengths = prompt + [int(prefix.token)], [prefix.logprob], []
  for _ in range(6):  # 230 -> 710 tokens: the cache passes 256 and 512
    state, steps = eng.generate_many(params, state, [10**6, 0], -1, 80)
    lengths.append(state.cache.length)
    seq += np.asarray(steps.tokens[:, 0]).tolist()
    lps += list(np.asarray(steps.logprobs[:, 0]))
  assert lengths[0] == 512 and lengths[-1] == 1024 and len(seq) == 231 + 480
  want = _score(model, [seq], req).logprobs[0, 229:len(seq) - 1]
  np.testing.assert_array_equal(np.asarray(lps, np.float32).view(np.uint32),
                                np.asarray(want, np.float32).view(np.uint32))
  # The long session leaves; a short one takes the other slot: the cache shrinks.
  eng.release(state, 0)
  state = eng.free(state, 0)
  short = eng.prefill(params=params, padded_tokens=prompt[:20], request=req)
  state = eng.insert(short, state, 1)
  state, steps = eng.generate_many(params, state, [0, 5], -1, 5)
  assert state.cache.length == 256
  short_seq = prompt[:20] + [int(short.token)] + np.asarray(steps.tokens[:, 1]).tolist()
  want = _score(model, [short_seq], req).logprobs[0, 20:25]
  np.testing.assert_array_equal(np.asarray(steps.logprobs[:, 1], np.float32).view(np.uint32),
                                np.asarray(want, np.float32).view(np.uint32))
