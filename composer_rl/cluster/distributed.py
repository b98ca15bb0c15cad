"""Joining a multi-process JAX job (`jax.distributed`) from launch flags.

How a run is spread over machines is chosen by name (`--distributed=` of the launchers):

  off       one process, one controller (a laptop, one GPU host, one TPU VM).
  auto      `jax.distributed.initialize()` with JAX's cluster auto-detection: on Cloud TPU
            the coordinator and process ids come from the TPU metadata server, under Slurm
            from SLURM_* variables, likewise Open MPI and Kubernetes. Every process runs the
            same command (multi-controller SPMD).
  explicit  coordinator address, process count and process id given by flags (any cluster,
            and the two-process CPU test on loopback).
  pathways  one Python controller drives remote TPU slices through the Pathways proxy
            backend (`JAX_PLATFORMS=proxy`); no `jax.distributed` -- every device of every
            slice is in this process's `jax.devices()`.

On CPU, cross-process collectives need an implementation: gloo (shipped with jaxlib) is
selected before the backend starts. `cpu_devices` sets the number of (fake) CPU devices per
process, as `--xla_force_host_platform_device_count` does for one process.
"""
import dataclasses
import os
from typing import Callable, Dict

import jax


@dataclasses.dataclass(frozen=True)
class DistributedSpec:
  """What the launch flags asked for.

  mode: one of MODES.
  coordinator_address: 'host:port' of process 0's coordinator service (explicit mode).
  num_processes / process_id: this job's size and this process's rank (explicit mode).
  cpu_devices: CPU devices per process (0 = JAX's default); for CPU clusters and tests.
  initialization_timeout_s: how long a process waits for the others to join.
  """
  mode: str = "off"
  coordinator_address: str = ""
  num_processes: int = 0
  process_id: int = -1
  cpu_devices: int = 0
  initialization_timeout_s: int = 300


def _off(spec: DistributedSpec) -> None:
  del spec


def _auto(spec: DistributedSpec) -> None:
  jax.distributed.initialize(initialization_timeout=spec.initialization_timeout_s)


def _explicit(spec: DistributedSpec) -> None:
  jax.distributed.initialize(spec.coordinator_address, num_processes=spec.num_processes,
                             process_id=spec.process_id,
                             initialization_timeout=spec.initialization_timeout_s)


def _pathways(spec: DistributedSpec) -> None:
  del spec
  if os.environ.get("JAX_PLATFORMS", "") != "proxy":
    raise ValueError("--distributed=pathways needs JAX_PLATFORMS=proxy (and "
                     "JAX_BACKEND_TARGET=grpc://<pathways proxy>:<port>) in the environment; "
                     "see launch/recipes/pathways.sh")
  try:  # Pathways-on-Cloud registers the proxy backend and its Orbax handlers.
    import pathwaysutils  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ValueError("--distributed=pathways needs the `pathwaysutils` package on the "
                     "controller host (pip install pathwaysutils)") from e
  pathwaysutils.initialize()


MODES: Dict[str, Callable[[DistributedSpec], None]] = {
    "off": _off, "auto": _auto, "explicit": _explicit, "pathways": _pathways}


def initialize(spec: DistributedSpec) -> Dict[str, int]:
  """Joins the job described by `spec` (call before any JAX computation); returns this
  process's view: process index/count, local and global device counts."""
  if spec.mode not in MODES:
    raise ValueError(f"--distributed={spec.mode!r}: unknown mode; known: {sorted(MODES)}")
  if spec.mode == "explicit" and (not spec.coordinator_address or spec.num_processes < 1 or
                                  not 0 <= spec.process_id < spec.num_processes):
    raise ValueError(
        "--distributed=explicit needs --coordinator_address=host:port, --num_processes >= 1 "
        f"and 0 <= --process_id < --num_processes; got {spec.coordinator_address!r}, "
        f"{spec.num_processes}, {spec.process_id}")
  if spec.cpu_devices:
    jax.config.update("jax_num_cpu_devices", int(spec.cpu_devices))
  if spec.mode in ("auto", "explicit"):
    # Only the CPU client reads this; GPU/TPU collectives are NCCL / ICI.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  MODES[spec.mode](spec)
  return dict(process_index=jax.process_index(), process_count=jax.process_count(),
              local_devices=jax.local_device_count(), devices=jax.device_count())
