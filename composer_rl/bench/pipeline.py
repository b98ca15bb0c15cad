"""Pipeline benchmark: the default experiment's RL stage in `sync` mode (rollouts, then a
train step, in turn) and in `async` mode (the two factories overlap), from the same SFT
policy, in one process. Prints one JSON object.

  python -m composer_rl.bench.pipeline --sft_workdir=/tmp/tiny_bugfix [--steps=20]

--sft_workdir: a workdir of experiments/tiny_bugfix.py whose RL step-0 checkpoint (the SFT
policy) is the starting point; without one the SFT stage runs first (minutes).
Reported per mode: RL steps per hour, the trainer's idle fraction (waiting for rollouts),
groups dropped as stale, sampler seconds per generated token divided by trainer seconds
per trained token (the brief's "inference costs about a third of training per token"), and
how many cores this process and the whole host kept busy.
The first `--warmup` steps of each mode (compilation) are left out of the rates.
"""
import json
import os
import tempfile
import time

import jax
from absl import app, flags

import composer_rl  # noqa: F401  (parity XLA flags)
from ml_collections import config_flags

from composer_rl.controller import agent_rl, agent_setup, agent_sft
from composer_rl.train.checkpoint import Checkpointer

_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(os.path.dirname(__file__), "..", "..", "experiments",
                           "tiny_bugfix.py"), "the experiment")
_SFT = flags.DEFINE_string("sft_workdir", None, "workdir holding the SFT checkpoint (step 0)")
_STEPS = flags.DEFINE_integer("steps", 20, "RL steps per mode (after warmup); short runs "
                             "overweight the rollout factory's fill at the start")
_WARMUP = flags.DEFINE_integer("warmup", 1, "RL steps per mode left out of the rates")


def _initial_state(s, step):
  if _SFT.value:
    ckpt = Checkpointer(os.path.join(_SFT.value, "checkpoints"))
    restored = ckpt.restore(step.abstract_state(), step=0)
    ckpt.close()
    if restored is None:
      raise FileNotFoundError(f"no RL step-0 (SFT) checkpoint under {_SFT.value}")
    return restored.state
  return step.init_state(s.config.seed, params=agent_sft.sft_stage(s).params)


def _host_busy_seconds():
  """CPU seconds the whole host has spent busy (Linux /proc/stat), or None."""
  try:
    with open("/proc/stat") as f:
      fields = [int(x) for x in f.readline().split()[1:]]
  except (OSError, ValueError):
    return None
  idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
  return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _mode(config, mode: str, s, step, state0) -> dict:
  with config.unlocked():
    config.rl.mode = mode
    config.rl.steps = _WARMUP.value + _STEPS.value
    config.rl.checkpoint_every = 10**6  # keep checkpoint I/O out of the timing
  s.config = config
  with tempfile.TemporaryDirectory() as d:
    ckpt = Checkpointer(d, async_save=False)
    s.metrics.history.clear()
    # the train step donates its input state: each mode starts from its own copy
    t0, h0, w0 = os.times(), _host_busy_seconds(), time.perf_counter()
    _, info = agent_rl.rl_stage(s, step, jax.tree.map(lambda x: x.copy(), state0), {}, ckpt)
    t1, h1, w1 = os.times(), _host_busy_seconds(), time.perf_counter()
    ckpt.close()
  rows = [r for r in s.metrics.history if r["phase"] == "rl"][_WARMUP.value:]
  seconds = sum(r["step_seconds"] for r in rows)
  idle = sum(r["idle_seconds"] for r in rows)
  stats = info["sampler_stats"]
  sampler_s_per_tok = ((stats["decode_seconds"] + stats["prefill_seconds"])
                       / max(stats["generated_tokens"], 1))
  # Where the CPU went over the whole mode (warm-up included): this process (trainer,
  # sampler, controller) and the whole host (adds the sandboxed tool and grading processes,
  # and anything else running); host_cores_busy near os.cpu_count() means the host, not
  # the pipeline, is the limit.
  own_cpu = (t1.user - t0.user) + (t1.system - t0.system)
  wall = max(w1 - w0, 1e-9)
  return dict(rl_steps_per_hour=len(rows) / max(seconds, 1e-9) * 3600,
              controller_cores_busy=own_cpu / wall,
              host_cores_busy=(h1 - h0) / wall if h0 is not None else None,
              trainer_idle_fraction=idle / max(seconds, 1e-9),
              groups_dropped_stale=info["groups_dropped_stale"],
              sampler_seconds_per_generated_token=sampler_s_per_tok,
              trainer_seconds_per_trained_token=info["train_seconds_per_token"],
              sampler_over_trainer_seconds_per_token=sampler_s_per_tok
              / max(info["train_seconds_per_token"], 1e-12),
              reward_mean=sum(r.get("reward_mean", 0.0) for r in rows) / max(len(rows), 1))


def main(argv):
  del argv
  config = _CONFIG.value
  wd = tempfile.mkdtemp(prefix="bench_pipeline_")
  s = agent_setup.Setup(config, wd)
  step = agent_rl.make_rl_step(s)
  state0 = _initial_state(s, step)
  out = {"config": {"steps": _STEPS.value, "warmup": _WARMUP.value,
                    "groups_per_step": config.rl.groups_per_step,
                    "group_size": config.rl.group_size, "slots": config.rl.slots}}
  for mode in ("sync", "async"):
    out[mode] = _mode(config, mode, s, step, state0)
  out["async_over_sync_steps_per_hour"] = (out["async"]["rl_steps_per_hour"]
                                           / max(out["sync"]["rl_steps_per_hour"], 1e-9))
  print(json.dumps(out), flush=True)


if __name__ == "__main__":
  app.run(main)
