"""The training loop: `train(config, workdir)` for the SFT and synthetic-RL experiments.

Resumption is exact: the checkpoint holds params, optimizer state, step, RNG and the data
iterator's position, every source of randomness is a function of (seed, step or sequence
id), and the metrics log is truncated back to the restored step. A run of N steps and a
run killed at any point and resumed therefore end with the same bits.
"""
import json
import os
import sys
import time
from typing import Any, Dict

import jax
import numpy as np

from composer_rl.model import sharding as shd
from composer_rl.sampling.sampler import Sampler, SamplingConfig
from composer_rl.train import config as config_lib
from composer_rl.train import data, metrics as metrics_lib, rl_synthetic, sft
from composer_rl.train.checkpoint import Checkpointer
from composer_rl.train.train_step import make_train_step

# Test hook: sleep inside step k (after the update is dispatched, before it is saved) and
# drop a marker file, so a test can SIGKILL the process in the middle of a step.
STALL_ENV = "COMPOSER_RL_TEST_STALL_AT_STEP"


def _maybe_stall(step: int, workdir: str) -> None:
  if os.environ.get(STALL_ENV) == str(step):
    with open(os.path.join(workdir, "STALLED"), "w") as f:
      f.write(str(step))
    time.sleep(3600)


def _mesh(mesh_shape: Dict[str, int]):
  sizes = list(mesh_shape.values()) or [1]
  if -1 in sizes:  # one axis takes all remaining devices
    return shd.make_mesh(mesh_shape, jax.devices())
  n = int(np.prod(sizes))
  if n > jax.device_count():
    raise ValueError(f"config.mesh {mesh_shape} needs {n} devices, {jax.device_count()} "
                     "available")
  if jax.process_count() > 1 and n != jax.device_count():
    # Every process runs the same program; each must hold a part of the mesh.
    raise ValueError(f"config.mesh {mesh_shape} uses {n} of {jax.device_count()} devices; "
                     f"with {jax.process_count()} processes the mesh must span all devices "
                     "(set one axis to -1)")
  return shd.make_mesh(mesh_shape, jax.devices()[:n])


class _Source:
  """Yields (TrainBatch, info) per step from the configured data; exposes iterator state."""

  def __init__(self, exp: config_lib.Experiment, step_fn, data_state):
    c, self.exp = exp.raw, exp
    self.rows = c.train.batch_size
    per = step_fn.num_shards * exp.train.micro_batch_size
    self.num_rows = -(-self.rows // per) * per
    if exp.mode == "sft":
      recs = (data.read_jsonl(c.data.jsonl) if c.data.jsonl else
              sft.synthetic_records(c.data.synthetic_num, exp.seed))
      ds = data.sft_batches(recs, self.rows, c.train.seq_len, exp.seed)
    else:
      if jax.process_count() > 1:
        raise ValueError("mode='rl_synthetic' runs its sampler in one process; in a "
                         f"{jax.process_count()}-process job use mode='sft', or agent RL with "
                         "remote rollout workers (BUILD_NOTES: deployment modes)")
      r = c.rl
      prompts = rl_synthetic.make_prompts(r.num_prompts, r.prompt_len, exp.model.vocab_size,
                                          exp.seed)
      ds = data.task_groups(prompts, r.group_size, r.groups_per_step, exp.seed)
      mesh = step_fn.mesh if step_fn.num_shards > 1 else None
      self.sampler = Sampler(_fresh_model(exp), mesh=mesh)
      self.sampling = SamplingConfig(temperature=r.temperature, max_new_tokens=r.max_new_tokens,
                                     seed=exp.seed)
    self.it = data.iterator(ds, data_state)

  def next(self, params, version: int):
    c = self.exp.raw
    item = next(self.it)
    if self.exp.mode == "sft":
      return sft.sft_batch(item, c.train.seq_len, self.num_rows), {}
    self.sampler.update_state(params)
    return rl_synthetic.rollout_batch(self.sampler, item, self.sampling, c.rl.target_token,
                                      c.rl.advantage_estimator, c.train.seq_len,
                                      self.num_rows, version)


def _fresh_model(exp):
  from flax import nnx  # local: only the RL source needs a concrete model object
  from composer_rl.model.transformer import Transformer
  return Transformer(exp.model, rngs=nnx.Rngs(exp.seed))


def train(config, workdir: str) -> Dict[str, Any]:
  """Runs (or resumes) the experiment in `config` under `workdir`; returns the summary,
  which is also printed as the last stdout line (JSON)."""
  exp = config_lib.build(config)
  os.makedirs(workdir, exist_ok=True)
  c = exp.raw
  mesh = _mesh(exp.mesh)
  step_fn = make_train_step(exp.model, exp.train, mesh, exp.rules or shd.DEFAULT_RULES)
  ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), c.checkpoint.max_to_keep,
                      c.checkpoint.async_save)
  restored = ckpt.restore(step_fn.abstract_state())
  if restored is not None:
    state, start = restored.state, restored.step
    print(f"composer_rl: resumed from step {start} in {workdir} (process "
          f"{jax.process_index()} of {jax.process_count()})", flush=True)
  elif exp.init_checkpoint:  # a converted Hugging Face checkpoint, into the mesh
    from composer_rl.model import hf_qwen3  # pylint: disable=g-import-not-at-top
    params = hf_qwen3.load_params(exp.init_checkpoint,
                                  target=step_fn.abstract_state().params)
    state, start = step_fn.init_state(exp.seed, params=params), 0
    print(f"composer_rl: starting from {exp.init_checkpoint}", flush=True)
  else:
    state, start = step_fn.init_state(exp.seed), 0
  source = _Source(exp, step_fn, restored.data_state if restored else None)
  # Several processes: every one runs the step and writes its checkpoint shards; process 0
  # alone writes the metrics log and the console.
  chief = jax.process_index() == 0
  log = (metrics_lib.MetricsLog(os.path.join(workdir, "metrics.jsonl"), resume_step=start)
         if chief else None)
  t0, history = time.time(), []
  for step in range(start, c.train.steps):
    batch, info = source.next(state.params, step)
    state, m = step_fn.step(state, step_fn.shard_batch(batch))
    _maybe_stall(step, workdir)
    m = {k: float(v) for k, v in jax.device_get(m).items()}
    m.update(info, step=step + 1, seconds=round(time.time() - t0, 3))
    history.append(m)
    if log:
      log.write(m)
    if chief and ((step + 1) % c.train.log_every == 0 or step + 1 == c.train.steps):
      print(metrics_lib.console_line(m), flush=True)
    if (step + 1) % c.checkpoint.every_steps == 0 or step + 1 == c.train.steps:
      ckpt.save(step + 1, state, source.it.get_state(),
                ledger={"consumed_batches": step + 1})
  ckpt.close()
  if log:
    log.close()
  if exp.init_checkpoint:  # exportable with launch/convert_checkpoint.py --export_from
    from composer_rl.model import hf_qwen3  # pylint: disable=g-import-not-at-top
    hf_qwen3.save_trained(os.path.join(workdir, "final_params"), exp.model, state.params,
                          exp.init_checkpoint)
  summary = metrics_lib.summary(exp.mode, start, c.train.steps, history, time.time() - t0)
  if chief:
    print(json.dumps(summary), flush=True)
  sys.stdout.flush()
  return summary
