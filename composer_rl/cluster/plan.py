"""The deployment plan of an experiment on a cluster: meshes, device counts, and what each
process does -- computed from the config and a topology, without touching a device.

`launch/train.py --dry_run --topology=platform=tpu,processes=16,devices_per_process=4`
prints it; the cluster recipes in `launch/` dry-run through it in CI, so a recipe whose mesh
does not divide its allocation, or that asks a multi-controller job for something only one
controller can do, fails there and not after the queue wait.

Two deployment shapes (BUILD_NOTES: "Deployment modes"):
  * trainer experiments (mode 'sft'): SPMD over every process (`--distributed=auto` or
    `explicit`); each process builds the same host batch and its devices take their rows;
    Orbax writes each process's shards.
  * agent RL (kind 'agent_rl'): one controller. Under Pathways (`--distributed=pathways`)
    it sees every slice; the train mesh gets whole slices and the inference meshes the rest,
    and weights move by `device_put` between meshes. Several controllers cannot move
    arrays between meshes on disjoint hosts, so there the rollouts run as separate jobs
    (`launch/rollout_worker.py`, `rl.rollouts='remote'`) and weights reach them as Orbax
    deltas in `rl.shared_dir` (`composer_rl.sync`).
"""
import dataclasses
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from composer_rl.controller import placement
from composer_rl.model import sharding as shd

PLATFORMS = ("cpu", "gpu", "tpu")
SINGLE_CONTROLLER = ("off", "pathways")


@dataclasses.dataclass(frozen=True)
class Topology:
  """The devices a job gets.

  platform: cpu / gpu / tpu.
  processes: JAX processes (hosts under multi-controller; 1 under Pathways or one host).
  devices_per_process: accelerators each process drives (under Pathways: all devices).
  slices: TPU slices (multislice / Pathways); devices are numbered slice by slice.
  """
  platform: str = "cpu"
  processes: int = 1
  devices_per_process: int = 1
  slices: int = 1

  def __post_init__(self):
    if self.platform not in PLATFORMS:
      raise ValueError(f"topology platform {self.platform!r}; choose one of {PLATFORMS}")
    for name in ("processes", "devices_per_process", "slices"):
      if getattr(self, name) < 1:
        raise ValueError(f"topology {name} must be >= 1, got {getattr(self, name)}")
    if self.devices % self.slices:
      raise ValueError(f"{self.devices} devices do not split into {self.slices} slices")

  @property
  def devices(self) -> int:
    return self.processes * self.devices_per_process

  @classmethod
  def parse(cls, text: str) -> "Topology":
    """'platform=tpu,processes=4,devices_per_process=4,slices=1' (any subset)."""
    known = {f.name: f.type for f in dataclasses.fields(cls)}
    kw = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
      key, sep, value = item.partition("=")
      if not sep or key not in known:
        raise ValueError(f"--topology item {item!r}: want key=value with key in "
                         f"{sorted(known)}")
      kw[key] = value if key == "platform" else int(value)
    return cls(**kw)

  @classmethod
  def current(cls) -> "Topology":
    """This job's devices (after `distributed.initialize`)."""
    import jax  # pylint: disable=g-import-not-at-top
    slices = len({getattr(d, "slice_index", 0) for d in jax.devices()})
    return cls(jax.devices()[0].platform if jax.devices()[0].platform in PLATFORMS else "tpu",
               jax.process_count(), jax.local_device_count(), slices)


def _ranges(ids: Sequence[int]) -> str:
  """[0,1,2,3,8,9] -> '0-3,8-9' (plans of 1000-device jobs stay readable)."""
  out, ids = [], sorted(ids)
  i = 0
  while i < len(ids):
    j = i
    while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
      j += 1
    out.append(f"{ids[i]}" if i == j else f"{ids[i]}-{ids[j]}")
    i = j + 1
  return ",".join(out)


def _resolve(mesh: Dict[str, int], n: int) -> Dict[str, int]:
  sizes = {a: int(mesh.get(a, 1)) for a in shd.MESH_AXES}
  known = int(np.prod([v for v in sizes.values() if v != -1]))
  for a, v in sizes.items():
    if v == -1:
      if n % known:
        raise ValueError(f"config.mesh {mesh}: {n} devices do not divide by {known}")
      sizes[a] = n // known
  return sizes


def _power_of_two(x: int) -> bool:
  return x > 0 and x & (x - 1) == 0


def _trainer_plan(config, topo: Topology, mode: str) -> Dict[str, Any]:
  if config.mode != "sft" and topo.processes > 1 and mode not in SINGLE_CONTROLLER:
    raise ValueError(f"mode={config.mode!r} samples in one process; a {topo.processes}-"
                     "process job can run mode='sft' (or agent RL with remote workers)")
  mesh = _resolve(dict(config.mesh), topo.devices)
  used = int(np.prod(list(mesh.values())))
  if used > topo.devices:
    raise ValueError(f"config.mesh {mesh} needs {used} devices; the topology has "
                     f"{topo.devices}")
  if topo.processes > 1 and used != topo.devices:
    raise ValueError(f"config.mesh {mesh} uses {used} of {topo.devices} devices; a "
                     "multi-process mesh must span every process (set an axis to -1)")
  shards = int(np.prod([mesh[a] for a in ("data", "fsdp")]))
  rows, micro = int(config.train.batch_size), int(config.train.micro_batch_size)
  padded = -(-rows // (shards * micro)) * shards * micro
  per_device = padded // shards // micro
  per_proc = topo.devices_per_process
  processes = [dict(process=p, devices=_ranges(range(p * per_proc, min((p + 1) * per_proc,
                                                                        used))),
                    does="train-step shards of its devices' rows; its Orbax array shards"
                    + ("; metrics.jsonl, console, checkpoint JSON items" if p == 0 else ""))
               for p in range(topo.processes) if p * per_proc < used]
  return dict(
      train_mesh=dict(axes=mesh, devices=used),
      batch=dict(rows=rows, padded_rows=padded, batch_shards=shards,
                 rows_per_device=padded // shards, microbatches_per_device=per_device),
      bitwise_across_device_counts=bool(config.train.grad_reduce == "tree"
                                        and _power_of_two(per_device)
                                        and _power_of_two(shards)),
      weights_to_inference="none (trainer experiment)",
      processes=processes)


def _agent_plan(config, topo: Topology, mode: str) -> Dict[str, Any]:
  remote = config.rl.get("rollouts", "local") == "remote"
  if topo.processes > 1 and mode not in SINGLE_CONTROLLER:
    raise ValueError(
        f"kind='agent_rl' is one controller, but the topology has {topo.processes} "
        "processes: run it under Pathways (--distributed=pathways) or on one host, with "
        "rollouts in separate jobs (rl.rollouts='remote', launch/rollout_worker.py)")
  per_slice = topo.devices // topo.slices
  slice_ids = [i // per_slice for i in range(topo.devices)]
  train, inference = placement.split_indices(topo.devices, config.mesh.train_fraction,
                                             config.mesh.inference_meshes, slice_ids)
  slices_of = lambda ids: sorted({slice_ids[i] for i in ids})
  return dict(
      train_mesh=dict(axes=placement.train_axes(len(train), config.mesh.get("train_fsdp", 1)),
                      devices=len(train),
                      device_ids=_ranges(train), slices=slices_of(train)),
      inference_meshes=[dict(devices=len(m), device_ids=_ranges(m), slices=slices_of(m))
                        for m in inference],
      colocated=bool(set(train) & {i for m in inference for i in m}),
      weights_to_inference=(
          "Orbax weight deltas in rl.shared_dir (composer_rl.sync), read by "
          "launch/rollout_worker.py jobs" if remote else
          "device_put from the train mesh to each inference mesh (one controller)"),
      processes=[dict(process=0, devices=_ranges(range(topo.devices)),
                      does="the controller: train step, engines, sandboxes, ledger, metrics")])


def plan(config, topology: Topology, mode: str = "off",
         workdir: Optional[str] = None) -> Dict[str, Any]:
  """The plan for running `config` on `topology` under `--distributed=mode`; raises
  ValueError naming what does not fit."""
  if mode == "off" and topology.processes > 1:
    raise ValueError(f"the topology has {topology.processes} processes but --distributed=off;"
                     " use auto (Cloud TPU, Slurm), explicit or pathways")
  if config.get("kind") in ("pipeline", "compaction_ablation"):
    # One controller runs every stage or arm; the agent runs (engines, sandboxes) set its
    # placement.
    config = config.agent
  agent = config.get("kind") == "agent_rl"
  body = _agent_plan(config, topology, mode) if agent else _trainer_plan(config, topology, mode)
  out: Dict[str, Any] = dict(
      dry_run=True, distributed=mode,
      controllers=1 if mode in SINGLE_CONTROLLER else topology.processes,
      topology=dataclasses.asdict(topology), devices=topology.devices,
      experiment="agent_rl" if agent else config.mode, workdir=workdir)
  out.update(body)
  return out


def describe(p: Dict[str, Any]) -> List[str]:
  """A few human lines for the console (the JSON is the record)."""
  lines = [f"{p['experiment']} on {p['devices']} {p['topology']['platform']} devices, "
           f"{p['topology']['processes']} process(es), {p['controllers']} controller(s)",
           f"train mesh: {p['train_mesh']['axes']}"]
  for m in p.get("inference_meshes", []):
    lines.append(f"inference mesh: devices {m['device_ids']} (slices {m['slices']})")
  lines.append(f"weights to inference: {p['weights_to_inference']}")
  return lines
