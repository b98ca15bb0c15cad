"""Carving a host's devices into a train mesh and inference meshes (the single controller's
device plan).

  placement = carve(jax.devices(), train_fraction=0.5, inference_meshes=2, train_fsdp=4)
  placement.train_mesh        # the train step's mesh: fsdp x data (sharding.make_mesh axes)
  placement.inference_meshes  # one engine per mesh; weights reach each by device_put

With one device (a laptop CPU) training and inference are colocated on it. Otherwise the
first round(train_fraction * n) devices (at least one, and leaving at least one per
inference mesh) train, and the rest are split evenly between the inference meshes; devices
of several TPU slices (Pathways) are given out as whole slices (`split_indices`).
"""
import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

import jax
from jax.sharding import Mesh

from composer_rl.model import sharding


@dataclasses.dataclass(frozen=True)
class Placement:
  train_mesh: Mesh
  inference_meshes: List[Mesh]

  @property
  def colocated(self) -> bool:
    train = set(self.train_mesh.devices.flat)
    return any(train & set(m.devices.flat) for m in self.inference_meshes)


def split_indices(n: int, train_fraction: float = 0.5, inference_meshes: int = 1,
                  slice_ids: Optional[Sequence[int]] = None) -> Tuple[List[int], List[List[int]]]:
  """The device plan as indices into a device list of length n: (train, [inference...]).

  slice_ids (one per device, e.g. TPU `device.slice_index`): when the devices span two or
  more slices, whole slices are given to training (round(train_fraction * slices), at
  least one, leaving at least one), so the train step's collectives never cross the slower
  data-center network; the remaining slices' devices are split evenly between the inference
  meshes. With one device, training and inference share it.
  """
  if not 0.0 < train_fraction < 1.0:
    raise ValueError(f"train_fraction must be in (0, 1), got {train_fraction}")
  if inference_meshes < 1:
    raise ValueError(f"inference_meshes must be >= 1, got {inference_meshes}")
  if n == 1:
    return [0], [[0]] * inference_meshes
  if n < 1 + inference_meshes:
    raise ValueError(f"{n} devices cannot hold a train mesh and {inference_meshes} "
                     "inference meshes (need one device each at least)")
  slices = sorted(set(slice_ids)) if slice_ids is not None else []
  if len(slices) >= 2:
    n_slices = min(max(1, round(train_fraction * len(slices))), len(slices) - 1)
    train_slices = set(slices[:n_slices])
    train = [i for i in range(n) if slice_ids[i] in train_slices]
    rest = [i for i in range(n) if slice_ids[i] not in train_slices]
  else:
    n_train = min(max(1, round(train_fraction * n)), n - inference_meshes)
    train, rest = list(range(n_train)), list(range(n_train, n))
  per = len(rest) // inference_meshes
  if per == 0 or per * inference_meshes != len(rest):
    raise ValueError(f"{len(rest)} inference devices do not split evenly into "
                     f"{inference_meshes} meshes (train_fraction={train_fraction}, {n} devices)")
  return train, [rest[i * per:(i + 1) * per] for i in range(inference_meshes)]


def train_axes(devices: int, fsdp: int) -> Dict[str, int]:
  """The train mesh's axes on `devices` devices: parameters split `fsdp` ways inside the
  step (-1: over all of them), data-parallel over the rest."""
  ways = devices if fsdp == -1 else fsdp
  if ways < 1 or devices % ways:
    raise ValueError(f"config.mesh.train_fsdp={fsdp} does not divide the {devices} train "
                     "devices (use a divisor, or -1 for all of them)")
  return {"data": devices // ways, "fsdp": ways}


def carve(devices: Sequence[jax.Device], train_fraction: float = 0.5,
          inference_meshes: int = 1, train_fsdp: int = 1) -> Placement:
  devices = list(devices)
  slice_ids = [getattr(d, "slice_index", 0) for d in devices]
  train, inference = split_indices(len(devices), train_fraction, inference_meshes, slice_ids)
  if len(devices) == 1:
    mesh = sharding.make_mesh(train_axes(1, train_fsdp), devices)
    return Placement(mesh, [mesh] * inference_meshes)
  pick = lambda idx: [devices[i] for i in idx]
  return Placement(sharding.make_mesh(train_axes(len(train), train_fsdp), pick(train)),
                   [sharding.make_mesh({"data": -1}, pick(m)) for m in inference])
