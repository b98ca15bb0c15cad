"""Carving a host's devices into a train mesh and inference meshes (the single controller's
device plan).

  placement = carve(jax.devices(), train_fraction=0.5, inference_meshes=2)
  placement.train_mesh        # data-parallel train step (sharding.make_mesh axes)
  placement.inference_meshes  # one engine per mesh; weights reach each by device_put

With one device (a laptop CPU) training and inference are colocated on it. Otherwise the
first round(train_fraction * n) devices (at least one, and leaving at least one per
inference mesh) train, and the rest are split evenly between the inference meshes.
"""
import dataclasses
from typing import List, Sequence

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


def carve(devices: Sequence[jax.Device], train_fraction: float = 0.5,
          inference_meshes: int = 1) -> Placement:
  devices = list(devices)
  n = len(devices)
  if not 0.0 < train_fraction < 1.0:
    raise ValueError(f"train_fraction must be in (0, 1), got {train_fraction}")
  if inference_meshes < 1:
    raise ValueError(f"inference_meshes must be >= 1, got {inference_meshes}")
  if n == 1:
    mesh = sharding.make_mesh({"data": 1}, devices)
    return Placement(mesh, [mesh] * inference_meshes)
  if n < 1 + inference_meshes:
    raise ValueError(f"{n} devices cannot hold a train mesh and {inference_meshes} "
                     "inference meshes (need one device each at least)")
  n_train = min(max(1, round(train_fraction * n)), n - inference_meshes)
  rest = devices[n_train:]
  per = len(rest) // inference_meshes
  if per * inference_meshes != len(rest):
    raise ValueError(f"{len(rest)} inference devices do not split evenly into "
                     f"{inference_meshes} meshes (train_fraction={train_fraction}, {n} devices)")
  return Placement(
      sharding.make_mesh({"data": -1}, devices[:n_train]),
      [sharding.make_mesh({"data": -1}, rest[i * per:(i + 1) * per])
       for i in range(inference_meshes)])
