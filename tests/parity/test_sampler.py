"""Sampler behaviour: stop tokens, budgets, bad requests."""
import numpy as np
import pytest
from flax import nnx

from composer_rl.model import Transformer, get_preset
from composer_rl.sampling.sampler import Sampler, SamplingConfig


@pytest.fixture(scope="module")
def sampler():
  return Sampler(Transformer(get_preset("tiny"), rngs=nnx.Rngs(0)))


def test_budget_and_stop_tokens(sampler):
  prompts = [[5, 6, 7], [9] * 12]
  free = sampler.generate(prompts, [0, 1], SamplingConfig(max_new_tokens=12, seed=1))
  assert all(len(s.tokens) == 12 and s.finish_reason == "length" for s in free)
  stop = free[0].tokens[4]
  first = free[0].tokens.index(stop)
  got = sampler.generate(prompts, [0, 1], SamplingConfig(max_new_tokens=12, seed=1,
                                                         stop_tokens=(stop,)))
  # Same keys -> same tokens up to and including the first stop token, then it ends.
  assert got[0].tokens == free[0].tokens[:first + 1] and got[0].finish_reason == "stop"
  assert len(got[0].logprobs) == len(got[0].tokens)
  np.testing.assert_array_equal(got[0].logprobs.view(np.uint32),
                                free[0].logprobs[:first + 1].view(np.uint32))


def test_seed_changes_samples(sampler):
  a = sampler.generate([[1, 2, 3]], [0], SamplingConfig(max_new_tokens=16, seed=1))[0]
  b = sampler.generate([[1, 2, 3]], [0], SamplingConfig(max_new_tokens=16, seed=2))[0]
  assert a.tokens != b.tokens


def test_bad_requests_are_clear_errors(sampler):
  with pytest.raises(ValueError, match="max_seq_len"):
    sampler.generate([[1] * 120], [0], SamplingConfig(max_new_tokens=20))
  with pytest.raises(ValueError, match="at least one token"):
    sampler.generate([[]], [0], SamplingConfig())
  with pytest.raises(ValueError, match="seq_ids"):
    sampler.generate([[1], [2]], [0], SamplingConfig())
