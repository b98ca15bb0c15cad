"""The launch flags that place a process in a cluster (shared by the absl entry points).

  --distributed=off|auto|explicit|pathways   how processes find each other (`distributed`)
  --coordinator_address, --num_processes, --process_id   explicit mode
  --cpu_devices          (fake) CPU devices per process
  --dry_run, --topology  print the deployment plan (`plan`) instead of running
"""
from absl import flags

from composer_rl.cluster import distributed

DISTRIBUTED = flags.DEFINE_enum("distributed", "off", sorted(distributed.MODES),
                                "how this process joins a multi-process job")
COORDINATOR = flags.DEFINE_string("coordinator_address", "",
                                  "explicit mode: host:port of process 0's coordinator")
NUM_PROCESSES = flags.DEFINE_integer("num_processes", 0, "explicit mode: processes in the job")
PROCESS_ID = flags.DEFINE_integer("process_id", -1, "explicit mode: this process's rank")
CPU_DEVICES = flags.DEFINE_integer("cpu_devices", 0,
                                   "CPU devices per process (0 = JAX default)")
INIT_TIMEOUT = flags.DEFINE_integer("distributed_timeout_s", 300,
                                    "seconds to wait for every process to join")
DRY_RUN = flags.DEFINE_bool("dry_run", False,
                            "print the deployment plan (meshes, device counts, process roles) "
                            "as JSON and exit; no device is used")
TOPOLOGY = flags.DEFINE_string(
    "topology", "", "dry run: the allocation to plan for, e.g. "
    "'platform=tpu,processes=16,devices_per_process=4,slices=1' (default: this machine)")


def spec() -> distributed.DistributedSpec:
  return distributed.DistributedSpec(
      mode=DISTRIBUTED.value, coordinator_address=COORDINATOR.value,
      num_processes=NUM_PROCESSES.value, process_id=PROCESS_ID.value,
      cpu_devices=CPU_DEVICES.value, initialization_timeout_s=INIT_TIMEOUT.value)
