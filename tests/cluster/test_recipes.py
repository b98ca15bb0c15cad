"""The cluster recipes in launch/recipes dry-run here: each one's command line parses with
the project's flags and prints its deployment plan (meshes, device counts, process roles);
plans that cannot work fail with an error naming the problem."""
import json
import os
import subprocess
import sys

import pytest

from composer_rl.cluster import distributed
from composer_rl.cluster import plan as plan_lib
from composer_rl.controller import placement

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
import sft_tiny  # noqa: E402
import tiny_bugfix  # noqa: E402


def _dry_run(recipe, **env):
  out = subprocess.run(["bash", os.path.join(ROOT, "launch", "recipes", recipe)], cwd="/",
                       env={**os.environ, "DRY_RUN": "1", **env}, capture_output=True,
                       text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def test_tpu_multihost_recipe_plans_fsdp_over_every_host():
  p, console = _dry_run("tpu_multihost.sh")
  assert p["distributed"] == "auto" and p["controllers"] == 4 and p["devices"] == 16
  assert p["train_mesh"]["axes"]["fsdp"] == 16
  assert [q["devices"] for q in p["processes"]] == ["0-3", "4-7", "8-11", "12-15"]
  assert "metrics.jsonl" in p["processes"][0]["does"]
  assert "metrics.jsonl" not in p["processes"][1]["does"]
  assert p["batch"] == dict(rows=256, padded_rows=256, batch_shards=16, rows_per_device=16,
                            microbatches_per_device=4)
  assert p["bitwise_across_device_counts"]
  assert "16 tpu devices" in console


def test_pathways_recipe_puts_training_and_inference_on_different_slices():
  p, _ = _dry_run("pathways.sh", SLICES="4", CHIPS_PER_SLICE="8", INFERENCE_MESHES="2")
  assert p["distributed"] == "pathways" and p["controllers"] == 1
  assert p["train_mesh"]["slices"] == [0, 1] and p["train_mesh"]["devices"] == 16
  assert [m["slices"] for m in p["inference_meshes"]] == [[2], [3]]
  assert not p["colocated"]
  assert p["weights_to_inference"].startswith("device_put")


def test_slurm_recipe_runs_one_process_per_gpu():
  p, _ = _dry_run("slurm_gpu.sbatch", SLURM_JOB_NUM_NODES="4", SLURM_GPUS_ON_NODE="8")
  assert p["topology"] == dict(platform="gpu", processes=32, devices_per_process=1, slices=1)
  assert p["controllers"] == 32 and p["train_mesh"]["axes"]["fsdp"] == 32
  assert [q["devices"] for q in p["processes"][:2]] == ["0", "1"]


def test_a_recipe_whose_batch_does_not_fit_fails_naming_it():
  out = subprocess.run(["bash", os.path.join(ROOT, "launch", "recipes", "tpu_multihost.sh")],
                       env={**os.environ, "DRY_RUN": "1", "HOSTS": "3", "CHIPS_PER_HOST": "4",
                            "EXTRA": "--config.mesh.data=5"},
                       capture_output=True, text=True, timeout=120)
  assert out.returncode != 0
  assert "12 devices do not divide by 5" in out.stderr


def test_plan_errors_name_the_problem():
  topo = plan_lib.Topology("gpu", processes=2, devices_per_process=4)
  with pytest.raises(ValueError, match="one controller.*Pathways"):
    plan_lib.plan(tiny_bugfix.get_config(), topo, "auto")
  with pytest.raises(ValueError, match="--distributed=off"):
    plan_lib.plan(sft_tiny.get_config(), topo, "off")
  c = sft_tiny.get_config()
  c.mesh.data = 4  # half of the 8 devices: process 1 would hold nothing
  with pytest.raises(ValueError, match="must span every process"):
    plan_lib.plan(c, topo, "explicit")
  # Remote rollout workers: weights travel as Orbax deltas, not device_put.
  c = tiny_bugfix.get_config()
  c.rl.rollouts = "remote"
  p = plan_lib.plan(c, plan_lib.Topology("tpu", 1, 8), "off")
  assert "Orbax weight deltas" in p["weights_to_inference"]


def test_multi_stage_kinds_plan_as_their_agent_runs():
  for name, variant in (("tiny_pipeline", "default"), ("tiny_compaction", "ablation")):
    module = __import__(name)
    p = plan_lib.plan(module.get_config(variant), plan_lib.Topology("tpu", 1, 8), "off")
    assert p["experiment"] == "agent_rl" and p["controllers"] == 1
    assert p["train_mesh"]["devices"] + sum(m["devices"] for m in p["inference_meshes"]) == 8


def test_topology_parse_and_bad_items():
  assert plan_lib.Topology.parse("platform=tpu,processes=2,devices_per_process=4") == \
      plan_lib.Topology("tpu", 2, 4, 1)
  with pytest.raises(ValueError, match="chips"):
    plan_lib.Topology.parse("chips=4")
  with pytest.raises(ValueError, match="platform 'npu'"):
    plan_lib.Topology.parse("platform=npu")
  with pytest.raises(ValueError, match="do not split into 3 slices"):
    plan_lib.Topology.parse("devices_per_process=8,slices=3")


def test_placement_gives_whole_slices_to_training():
  slice_ids = [i // 4 for i in range(16)]  # 4 slices x 4 chips
  train, inference = placement.split_indices(16, 0.5, 1, slice_ids)
  assert train == list(range(8)) and inference == [list(range(8, 16))]
  train, inference = placement.split_indices(16, 0.25, 3, slice_ids)
  assert train == [0, 1, 2, 3] and [m[0] for m in inference] == [4, 8, 12]
  # One slice: the device split of a single host.
  train, inference = placement.split_indices(8, 0.5, 2)
  assert train == [0, 1, 2, 3] and inference == [[4, 5], [6, 7]]


def test_explicit_mode_without_a_coordinator_is_refused_before_jax_starts():
  spec = distributed.DistributedSpec(mode="explicit", num_processes=2, process_id=0)
  with pytest.raises(ValueError, match="--coordinator_address"):
    distributed.initialize(spec)
  with pytest.raises(ValueError, match="unknown mode"):
    distributed.initialize(distributed.DistributedSpec(mode="mpi"))
  with pytest.raises(ValueError, match="JAX_PLATFORMS=proxy"):
    distributed.initialize(distributed.DistributedSpec(mode="pathways"))
