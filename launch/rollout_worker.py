"""A remote rollout worker: python launch/rollout_worker.py --config=experiments/X.py
--shared_dir=DIR --worker=NAME

Runs until the controller (launch/train.py with --config.rl.rollouts=remote
--config.rl.shared_dir=DIR) finishes. Start any number, on any hosts that see DIR; kill
and restart them at will (a restarted worker keeps its NAME to finish its own claims).
"""
import json

import composer_rl  # noqa: F401  (sets the parity XLA flags before JAX starts)
from absl import app, flags, logging
from ml_collections import config_flags

from composer_rl.controller.rollout_worker import run_worker

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config file",
                                          lock_config=True)
_SHARED = flags.DEFINE_string("shared_dir", None, "the controller's rl.shared_dir")
_WORKER = flags.DEFINE_string("worker", "w0", "this worker's name (stable across restarts)")
flags.mark_flags_as_required(["config", "shared_dir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)
  print(json.dumps(run_worker(_CONFIG.value, _SHARED.value, _WORKER.value)), flush=True)


if __name__ == "__main__":
  app.run(main)
