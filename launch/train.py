"""Trains an experiment: python launch/train.py --config=experiments/X.py --workdir=DIR

The config file's `get_config()` is loaded and locked, so a misspelled or mistyped
`--config.<field>=...` override fails at start, naming the field; the library validates
every value again (`composer_rl.train.config`) before any work starts.

On a cluster every process runs the same command with `--distributed=auto` (Cloud TPU,
Slurm) or `explicit` (see `composer_rl.cluster.flags` and the recipes in launch/);
`--dry_run` prints the deployment plan without touching a device.
"""
import json
import sys

import composer_rl  # noqa: F401  (sets the parity XLA flags before JAX starts)
from absl import app, flags, logging
from ml_collections import config_flags

from composer_rl.cluster import distributed
from composer_rl.cluster import flags as cluster_flags
from composer_rl.cluster import plan as plan_lib

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config file",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "checkpoints, metrics and logs go here")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)  # Orbax logs every save step at INFO
  config = _CONFIG.value
  # Unknown fields, wrong types and bad values fail here, naming the field, before any
  # work (or any JAX backend) starts; missing optional fields get their defaults.
  from composer_rl.controller import config as config_lib  # pylint: disable=g-import-not-at-top
  try:
    config_lib.validate(config)
  except config_lib.ConfigError as e:
    raise app.UsageError(str(e)) from None
  if cluster_flags.DRY_RUN.value:
    topology = (plan_lib.Topology.parse(cluster_flags.TOPOLOGY.value)
                if cluster_flags.TOPOLOGY.value else plan_lib.Topology.current())
    p = plan_lib.plan(config, topology, cluster_flags.DISTRIBUTED.value, _WORKDIR.value)
    print("\n".join(plan_lib.describe(p)), file=sys.stderr)
    print(json.dumps(p))
    return
  distributed.initialize(cluster_flags.spec())
  # Imported after the job is joined: nothing may create a JAX backend before that.
  from composer_rl.controller import ablation, agent_rl, online_rl, pipeline  # pylint: disable=g-import-not-at-top
  from composer_rl.train import trainer  # pylint: disable=g-import-not-at-top
  # config.kind -> what runs it: SFT + RL of an agent in the sandbox (the controller), the
  # pretraining -> SFT -> RL pipeline, the context-compaction ablation (one agent run per
  # arm), online RL through the server, or (no kind) an SFT / pretraining / synthetic-RL
  # experiment of the trainer alone.
  kinds = {"agent_rl": agent_rl.run, "pipeline": pipeline.run,
           "compaction_ablation": ablation.run, "online_rl": online_rl.run,
           "": trainer.train}
  kinds[config.get("kind", "")](config, _WORKDIR.value)


if __name__ == "__main__":
  app.run(main)
