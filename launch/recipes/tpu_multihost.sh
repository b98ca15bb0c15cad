#!/usr/bin/env bash
# Cloud TPU multi-host training: every host (worker) of a TPU VM slice runs the same
# command; `--distributed=auto` makes jax.distributed read the coordinator address, process
# count and process id from the TPU metadata server (multi-controller SPMD). The parameters
# are FSDP-sharded over all chips (config.mesh.fsdp=-1), each host builds the same batch and
# its chips take their rows; every host writes its own Orbax shards.
#
#   bash launch/recipes/tpu_multihost.sh                 # runs on the TPU VMs (gcloud ssh)
#   DRY_RUN=1 bash launch/recipes/tpu_multihost.sh       # prints the plan, here, no TPU
#
# Edit these (or set them in the environment):
TPU_NAME=${TPU_NAME:-composer-rl-v5p-32}   # the TPU VM slice (gcloud compute tpus tpu-vm)
ZONE=${ZONE:-us-east5-a}
PROJECT=${PROJECT:-my-project}
HOSTS=${HOSTS:-4}                          # hosts in the slice (v5p-32: 4 hosts x 4 chips)
CHIPS_PER_HOST=${CHIPS_PER_HOST:-4}
REPO=${REPO:-composer_rl}   # this repository on every host (relative to the ssh home)
CONFIG=${CONFIG:-experiments/sft_tiny.py}
# Must be one directory every host sees (a Filestore/NFS or gcsfuse mount): Orbax writes
# each host's shards and process 0's metadata there, and resumption reads them back.
WORKDIR=${WORKDIR:-/mnt/shared/composer_rl/sft_tpu}
EXTRA=${EXTRA:-"--config.train.batch_size=256 --config.train.micro_batch_size=4"}

set -euo pipefail
cd "$(dirname "$0")/../.."
FLAGS="--config=$CONFIG --workdir=$WORKDIR --distributed=auto --config.mesh.fsdp=-1 $EXTRA"
if [ "${DRY_RUN:-0}" = 1 ]; then
  # shellcheck disable=SC2086
  exec python launch/train.py $FLAGS --dry_run \
    --topology="platform=tpu,processes=$HOSTS,devices_per_process=$CHIPS_PER_HOST"
fi
gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --project="$PROJECT" --worker=all \
  --command="cd $REPO && python launch/train.py $FLAGS"
