"""Runs the parity suite; see experiments/parity.py for the command and the config."""
import os

# The multi-device cases need several devices; on CPU fake 8 (no effect on GPU/TPU).
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + " --xla_force_host_platform_device_count=8").strip()

import composer_rl  # noqa: E402,F401  (sets the parity XLA flags before JAX starts)
from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from composer_rl.parity import main as parity_main  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Parity config file.",
                                          lock_config=True)


def main(argv):
  del argv
  parity_main.run(_CONFIG.value)


if __name__ == "__main__":
  flags.mark_flags_as_required(["config"])
  app.run(main)
