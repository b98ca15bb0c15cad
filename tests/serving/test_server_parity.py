"""Parity through the server: the log-probs a client gets and the server records equal the
trainer's recomputation of the same tokens, bit for bit, across sampling settings, n > 1,
streaming and concurrent clients; a multi-turn conversation is recorded so that the
ingestion stage rebuilds it as one trajectory the train step scores with ratio exactly 1."""
import concurrent.futures as cf
import os
import sys

import jax
import numpy as np
import openai
import pytest
from flax import nnx

from composer_rl.model import Transformer, sharding
from composer_rl.online import ingest
from composer_rl.sampling.head import RowSampling
from composer_rl.serving import loading
from composer_rl.serving.records import read_records
from composer_rl.serving.threaded import ThreadedServer
from composer_rl.train import losses
from composer_rl.train.batch import build_batch
from composer_rl.train.optimizer import OptimizerConfig
from composer_rl.train.scoring import score_tokens
from composer_rl.train.train_step import TrainConfig, make_train_step

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "experiments"))
import serve_tiny  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def bits(x):
  return np.asarray(x, np.float32).view(np.uint32)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
  config = serve_tiny.get_config()
  workdir = str(tmp_path_factory.mktemp("parity"))
  service = loading.build_service(config, records_dir=os.path.join(workdir, "records"),
                                      model_name="serve_tiny")
  server = ThreadedServer(service)
  client = openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0)
  yield config, service, client, os.path.join(workdir, "records")
  server.stop()
  service.close()


def _trainer_logprobs(config, record):
  """The trainer's log-probs of a record's completion tokens: `score_tokens` over prompt +
  completion with the master parameters (fresh init with the config's seed, as served)."""
  mc = loading.chat_and_model(config)[1]
  model = Transformer(mc, rngs=nnx.Rngs(config.seed))
  s = record["sampling"]  # the transform the engine sampled with (greedy = top_k 1)
  rows = RowSampling.broadcast(1, s["temperature"], s["top_k"], s["top_p"])
  toks = np.asarray(record["prompt_ids"] + record["completion_ids"], np.int32)[None]
  lp = np.asarray(score_tokens(model, toks, rows).logprobs[0])
  return lp[len(record["prompt_ids"]) - 1:]


def test_logprobs_equal_the_trainers_through_the_server(served):
  config, _, client, records_dir = served
  msgs = [{"role": "user", "content": "Which function does this code define?"}]
  calls = [dict(temperature=0.7, top_p=0.9, n=2, seed=1),
           dict(temperature=1.0, seed=2), dict(temperature=0.0),
           dict(temperature=1.3, top_p=0.5, seed=3)]

  def ask(kw):
    return client.chat.completions.create(model="serve_tiny", messages=msgs, max_tokens=24,
                                          logprobs=True, top_logprobs=3, **kw)
  with cf.ThreadPoolExecutor(4) as pool:  # concurrent clients share the engine's slots
    responses = list(pool.map(ask, calls))
  stream = client.chat.completions.create(model="serve_tiny", messages=msgs, max_tokens=24,
                                          temperature=0.9, seed=4, stream=True, logprobs=True)
  streamed = [lp.logprob for chunk in stream for c in chunk.choices
              if c.logprobs and c.logprobs.content for lp in c.logprobs.content]
  recs = {r["id"]: r for r in read_records(records_dir) if r["kind"] == "completion"}
  # The greedy request (temperature 0) is recorded as the engine ran it: top_k 1.
  greedy = recs[f"{responses[2].id}:0"]["sampling"]
  assert (greedy["temperature"], greedy["top_k"]) == (1.0, 1)
  compared = 0
  for resp in responses:
    for choice in resp.choices:
      r = recs[f"{resp.id}:{choice.index}"]
      got = bits([t.logprob for t in choice.logprobs.content])
      # What the client got is what was recorded, which is what the trainer computes.
      assert np.array_equal(got, np.asarray(r["logprobs_bits"][:len(got)], np.uint32))
      assert np.array_equal(np.asarray(r["logprobs_bits"], np.uint32),
                            bits(_trainer_logprobs(config, r)))
      compared += len(r["completion_ids"])
  stream_rec = [r for r in recs.values() if r["sampling"].get("seed") == 4]
  assert len(stream_rec) == 1
  assert np.array_equal(bits(streamed), np.asarray(stream_rec[0]["logprobs_bits"][:len(streamed)],
                                                   np.uint32))
  assert np.array_equal(np.asarray(stream_rec[0]["logprobs_bits"], np.uint32),
                        bits(_trainer_logprobs(config, stream_rec[0])))
  assert compared >= 5


def test_multi_turn_session_trains_with_ratio_one(served):
  """Two turns of one conversation (the client sends the first reply back with a tool
  result) become one trajectory with both completions' tokens trained; a train step on it
  under the serving parameters has importance ratio exactly 1 on every token."""
  config, service, client, records_dir = served
  conv = {"X-Conversation-Id": "parity-multi", "X-Training-Consent": "true"}
  msgs = [{"role": "user", "content": "list the files"}]
  first = client.chat.completions.create(model="serve_tiny", messages=msgs, max_tokens=12,
                                         seed=9, extra_headers=conv)
  msgs += [first.choices[0].message.model_dump(exclude_none=True),
           {"role": "user", "content": "a.py b.py"}]
  second = client.chat.completions.create(model="serve_tiny", messages=msgs, max_tokens=12,
                                          seed=10, extra_headers=conv)
  client.post("/feedback", cast_to=object, body={"conversation_id": "parity-multi",
                                                  "signal": "accepted"})
  src = ingest.OnlineSessionSource(records_dir, ingest.RewardSpec(),
                                   ingest.IngestLimits(max_tokens=10**6, max_age_versions=10),
                                   current_version=0)
  trajs = [src[i] for i in range(len(src)) if src[i].task_id == "parity-multi"]
  assert len(trajs) == 1, "the second prompt must extend the first prompt + completion"
  t = trajs[0]
  assert t.turns == 2 and t.reward == 1.0
  recs = [r for r in read_records(records_dir) if r.get("conversation_id") == "parity-multi"
          and r["kind"] == "completion"]
  assert sum(len(r["completion_ids"]) for r in recs) == sum(t.loss_mask)
  assert {r["completion_id"] for r in recs} == {first.id, second.id}
  mc = loading.chat_and_model(config)[1]
  step = make_train_step(mc, TrainConfig(optimizer=OptimizerConfig(learning_rate=1e-3),
                                         loss=losses.LossConfig(policy_loss="ppo_clip")),
                         sharding.make_mesh({"data": -1}))
  state = step.init_state(config.seed)
  batch = build_batch([t], mc.max_seq_len, advantages=[1.0], num_rows=step.num_shards)
  _, m = step.step(state, step.shard_batch(batch))
  m = jax.device_get(m)
  assert m["ratio_min"] == 1.0 and m["ratio_max"] == 1.0 and m["ratio_not_one_frac"] == 0.0
  assert m["tokens"] == sum(t.loss_mask)
