#!/usr/bin/env bash
# Pathways: ONE Python controller (this process, on a CPU VM or the head pod) drives several
# TPU slices through the Pathways proxy backend (JAX_PLATFORMS=proxy). Agent RL runs here as
# it does on a laptop: the train mesh gets whole slices, the inference engines the other
# slices (composer_rl.controller.placement), and new weights move train slice -> inference
# slices by device_put, which Pathways carries between slices. No jax.distributed: every
# chip of every slice is in this one process's jax.devices().
#
#   bash launch/recipes/pathways.sh                      # needs a running Pathways cluster
#   DRY_RUN=1 bash launch/recipes/pathways.sh            # prints the plan, here, no TPU
#
# Edit these (or set them in the environment):
PROXY=${PROXY:-pathways-proxy.default.svc.cluster.local:29000}  # the Pathways proxy server
SLICES=${SLICES:-2}                        # TPU slices the Pathways job owns
CHIPS_PER_SLICE=${CHIPS_PER_SLICE:-16}     # e.g. v5p-32: 16 chips
TRAIN_FRACTION=${TRAIN_FRACTION:-0.5}      # share of slices that train (whole slices)
INFERENCE_MESHES=${INFERENCE_MESHES:-1}    # engines over the remaining slices
CONFIG=${CONFIG:-experiments/tiny_bugfix.py}
WORKDIR=${WORKDIR:-/mnt/shared/composer_rl/agent_pathways}
EXTRA=${EXTRA:-}

set -euo pipefail
cd "$(dirname "$0")/../.."
FLAGS="--config=$CONFIG --workdir=$WORKDIR --distributed=pathways \
  --config.mesh.train_fraction=$TRAIN_FRACTION --config.mesh.inference_meshes=$INFERENCE_MESHES $EXTRA"
if [ "${DRY_RUN:-0}" = 1 ]; then
  # shellcheck disable=SC2086
  exec python launch/train.py $FLAGS --dry_run --topology="platform=tpu,processes=1,\
devices_per_process=$((SLICES * CHIPS_PER_SLICE)),slices=$SLICES"
fi
# shellcheck disable=SC2086
JAX_PLATFORMS=proxy JAX_BACKEND_TARGET="grpc://$PROXY" exec python launch/train.py $FLAGS
