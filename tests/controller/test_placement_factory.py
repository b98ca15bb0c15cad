"""The controller's device plan and the rollout factory over several inference meshes:
groups stay whole and are consumed once, each engine computes on its own mesh with weights
moved there by device_put, and the log-probs it records equal the trainer's recomputation
on the train mesh, bit for bit."""
import jax
import pytest
from flax import nnx

from composer_rl.controller.placement import carve
from composer_rl.controller.rollout_factory import Ledger, RolloutFactory
from composer_rl.data.byte_tokenizer import ByteTokenizer
from composer_rl.model import Transformer, get_preset
from composer_rl.rollout.chat import ChatFormat
from composer_rl.rollout.runner import RolloutConfig, RolloutRunner
from composer_rl.sampling.engine import Engine
from tests.rollout.test_runner import CountingEnv, _verify


def _ids(mesh):
  return sorted(d.id for d in mesh.devices.flat)


def test_carve_splits_devices_and_colocates_on_one():
  devs = jax.devices()
  assert len(devs) == 8
  p = carve(devs, train_fraction=0.5, inference_meshes=2)
  assert _ids(p.train_mesh) == [0, 1, 2, 3]
  assert [_ids(m) for m in p.inference_meshes] == [[4, 5], [6, 7]] and not p.colocated
  p = carve(devs, train_fraction=0.9, inference_meshes=1)  # leaves one for inference
  assert _ids(p.train_mesh) == list(range(7)) and _ids(p.inference_meshes[0]) == [7]
  one = carve(devs[:1], inference_meshes=2)
  assert one.colocated and _ids(one.train_mesh) == [0]
  with pytest.raises(ValueError, match="split evenly"):
    carve(devs, train_fraction=0.5, inference_meshes=3)
  with pytest.raises(ValueError, match="train_fraction"):
    carve(devs, train_fraction=1.0)
  with pytest.raises(ValueError, match="cannot hold"):
    carve(devs[:2], inference_meshes=2)


def test_the_train_mesh_splits_parameters_fsdp_ways():
  devs = jax.devices()
  p = carve(devs, 0.5, 2, train_fsdp=-1)  # FSDP over all four train devices
  assert dict(p.train_mesh.shape)["fsdp"] == 4 and dict(p.train_mesh.shape)["data"] == 1
  p = carve(devs, 0.5, 2, train_fsdp=2)
  assert (dict(p.train_mesh.shape)["fsdp"], dict(p.train_mesh.shape)["data"]) == (2, 2)
  assert _ids(p.train_mesh) == [0, 1, 2, 3]
  assert dict(carve(devs[:1], train_fsdp=-1).train_mesh.shape)["fsdp"] == 1
  with pytest.raises(ValueError, match="config.mesh.train_fsdp=3 does not divide the 4"):
    carve(devs, 0.5, 2, train_fsdp=3)


def test_factory_runs_whole_groups_on_two_inference_meshes_exactly():
  tok = ByteTokenizer()
  model = Transformer(get_preset("tiny", vocab_size=tok.vocab_size, max_seq_len=160),
                      rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model)
  plan = carve(jax.devices(), 0.5, 2)
  params = jax.device_put(params, jax.sharding.NamedSharding(plan.train_mesh,
                                                             jax.sharding.PartitionSpec()))
  cfg = RolloutConfig(max_turns=2, max_turn_tokens=5, top_k=50, seed=3, tool_workers=2)
  engines = [Engine(model, slots=2, prefill_chunk=16, mesh=m) for m in plan.inference_meshes]
  runners = [RolloutRunner(e, ChatFormat(tok), cfg, e.place(params)) for e in engines]
  for e, r in zip(engines, runners):  # weights were moved onto each engine's own mesh
    for leaf in jax.tree.leaves(r.params):
      assert leaf.sharding.device_set == set(e.mesh.devices.flat)
  gids = iter(range(100))
  factory = RolloutFactory(runners, lambda: (lambda g: (g, 10 + g))(next(gids)),
                           lambda task: CountingEnv(turns=2, delay=0.005), group_size=3,
                           max_in_flight=3, queue_groups=2, ledger=Ledger(),
                           place_params=lambda p, i: engines[i].place(p))
  groups = factory.collect(4)  # sync: both engines at once, exactly 4 groups
  assert [g.group_id for g in groups] == [0, 1, 2, 3]
  for g in groups:
    assert g.task_index == 10 + g.group_id
    assert [t.session_id for t in g.trajectories] == [3 * g.group_id + i for i in range(3)]
  trajs = [t for g in groups for t in g.trajectories]
  assert _verify(trajs, {0: params}, graphdef, cfg) == sum(t.num_generated for t in trajs)
  assert factory.stats()["decode_steps"] > 0

  factory.start()  # async: groups keep coming while new weights are published
  got = [factory.get(timeout=120)]
  p1 = jax.tree.map(lambda x: x * 1.01, params)
  factory.set_params(p1, 1)
  got += [factory.get(timeout=120) for _ in range(3)]
  factory.stop()
  factory.record([g.group_id for g in got], [])
  led = Ledger.from_json(factory.ledger_json())
  assert len(set(led.consumed)) == 4 and set(led.consumed) <= set(led.issued)
  assert all(len(g.trajectories) == 3 for g in got)
