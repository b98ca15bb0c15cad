"""Trains an experiment: python launch/train.py --config=experiments/X.py --workdir=DIR

The config file's `get_config()` is loaded and locked, so a misspelled or mistyped
`--config.<field>=...` override fails at start, naming the field; the library validates
every value again (`composer_rl.train.config`) before any work starts.
"""
import composer_rl  # noqa: F401  (sets the parity XLA flags before JAX starts)
from absl import app, flags, logging
from ml_collections import config_flags

from composer_rl.controller import agent_rl
from composer_rl.train import trainer

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config file",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "checkpoints, metrics and logs go here")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)  # Orbax logs every save step at INFO
  config = _CONFIG.value
  if config.get("kind") == "agent_rl":  # SFT + RL of an agent in the sandbox (controller)
    agent_rl.run(config, _WORKDIR.value)
  else:  # SFT / synthetic-RL experiments of the trainer alone
    trainer.train(config, _WORKDIR.value)


if __name__ == "__main__":
  app.run(main)
