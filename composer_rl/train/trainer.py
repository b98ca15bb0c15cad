"""The training loop: `train(config, workdir)` for the SFT, continued-pretraining and
synthetic-RL experiments.

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
from composer_rl.data import packing
from composer_rl.train import data, loop, metrics as metrics_lib, pretrain, rl_synthetic, sft, stages
from composer_rl.train.batch import build_packed_batch
from composer_rl.train.checkpoint import Checkpointer
from composer_rl.train.train_step import make_train_step

# Test hook: sleep inside step k (after the update is dispatched, before it is saved) and
# drop a marker file, so a test can SIGKILL the process in the middle of a step. Earlier
# asynchronous checkpoint saves are finished first, so what the kill interrupts is exactly
# step k (how far an async save got before a kill would otherwise depend on timing).
STALL_ENV = "COMPOSER_RL_TEST_STALL_AT_STEP"


def _maybe_stall(step: int, workdir: str, ckpt: Checkpointer) -> None:
  if os.environ.get(STALL_ENV) == str(step):
    ckpt.wait()
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
  """Yields (TrainBatch, info) per step from the configured data; exposes iterator state.

  Each mode's data is built by its entry in SOURCES: fn(source, exp, step_fn) -> (Grain
  dataset of per-step items, fn(item, params, version) -> (TrainBatch, info))."""

  def __init__(self, exp: config_lib.Experiment, step_fn, data_state, workdir: str):
    self.exp, self.workdir = exp, workdir
    self.rows = exp.raw.train.batch_size
    self.num_rows = stages.padded_rows(step_fn, self.rows)
    ds, self._make = SOURCES[exp.mode](self, exp, step_fn)
    self.it = data.iterator(ds, data_state)

  def next(self, params, version: int):
    return self._make(next(self.it), params, version)


def _sft_source(src: _Source, exp, step_fn):
  del step_fn
  c = exp.raw
  recs = (data.read_jsonl(c.data.jsonl) if c.data.jsonl else
          sft.synthetic_records(c.data.synthetic_num, exp.seed))
  return (data.sft_batches(recs, src.rows, c.train.seq_len, exp.seed),
          lambda item, params, version: (sft.sft_batch(item, c.train.seq_len, src.num_rows),
                                         {}))


def _rl_synthetic_source(src: _Source, exp, step_fn):
  if jax.process_count() > 1:
    raise ValueError("mode='rl_synthetic' runs its sampler in one process; in a "
                     f"{jax.process_count()}-process job use mode='sft', or agent RL with "
                     "remote rollout workers (BUILD_NOTES: deployment modes)")
  c, r = exp.raw, exp.raw.rl
  prompts = rl_synthetic.make_prompts(r.num_prompts, r.prompt_len, exp.model.vocab_size,
                                      exp.seed)
  sampler = Sampler(_fresh_model(exp), mesh=step_fn.mesh if step_fn.num_shards > 1 else None)
  sampling = SamplingConfig(temperature=r.temperature, max_new_tokens=r.max_new_tokens,
                            seed=exp.seed)

  def make(item, params, version):
    sampler.update_state(params)
    return rl_synthetic.rollout_batch(sampler, item, sampling, r.target_token,
                                      r.advantage_estimator, c.train.seq_len, src.num_rows,
                                      version)
  return data.task_groups(prompts, r.group_size, r.groups_per_step, exp.seed), make


def _pretrain_source(src: _Source, exp, step_fn):
  c = exp.raw
  tok = pretrain.TOKENIZERS[c.corpus.get("tokenizer", "byte")](exp.init_checkpoint)
  src.corpus = pretrain.load_corpus(c.corpus, exp.seed, src.workdir)
  align = pretrain.alignment(exp.model)
  src.heldout = pretrain.heldout_rows(src.corpus, tok, c.train.seq_len,
                                      c.corpus.get("eval_max_rows", 64), align)
  src.nll_fn = pretrain.make_nll_fn(step_fn)
  rows = pretrain.train_rows(src.corpus, tok, c.train.seq_len, exp.seed, align)
  ds = rows.batch(src.rows, drop_remainder=True, batch_fn=list)
  return ds, lambda item, params, version: (
      build_packed_batch(item, src.num_rows),
      dict(padding_fraction=packing.padding_fraction(item)))


# config.mode -> its data source
SOURCES = {"sft": _sft_source, "rl_synthetic": _rl_synthetic_source,
           "pretrain": _pretrain_source}


def _heldout_eval(source: _Source, step_fn, params, workdir: str, tag: str) -> Dict:
  """Held-out perplexity (pretrain mode) at this point; `before` is kept in the workdir so
  a resumed run reports the perplexity its first run started from."""
  path = os.path.join(workdir, f"heldout_{tag}.json")
  if tag == "before" and os.path.exists(path):
    with open(path) as f:
      return json.load(f)
  out = pretrain.heldout_perplexity(source.nll_fn, step_fn, params, source.heldout,
                                    source.num_rows)
  if jax.process_index() == 0:
    with open(path + ".tmp", "w") as f:
      json.dump(out, f)
    os.replace(path + ".tmp", path)
  return out


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
  source = _Source(exp, step_fn, restored.data_state if restored else None, workdir)
  before = (_heldout_eval(source, step_fn, state.params, workdir, "before")
            if exp.mode == "pretrain" else None)
  # Several processes: every one runs the step and writes its checkpoint shards; process 0
  # alone writes the metrics log and the console.
  chief = jax.process_index() == 0
  log = metrics_lib.MetricsWriter(workdir) if chief else None
  if log:
    log.truncate_phase(exp.mode, start + 1)  # rows are numbered by steps done

  def update(step, state, item):
    batch, info = item
    state, m = step_fn.step(state, step_fn.shard_batch(batch))
    _maybe_stall(step, workdir, ckpt)
    m = stages.host_metrics(m)
    m.update(info)
    return state, m

  def save(done, state):
    ckpt.save(done, state, source.it.get_state(), ledger={"consumed_batches": done})
  t0 = time.time()
  state, history = loop.run(
      state, start=start, steps=c.train.steps, phase=exp.mode, label=exp.mode,
      fetch=lambda step, state: source.next(state.params, step), update=update, metrics=log,
      save=save, checkpoint_every=c.checkpoint.every_steps, echo_every=c.train.log_every,
      row_offset=1, show_progress=chief)
  ckpt.close()
  if log:
    log.close()
  if exp.init_checkpoint:  # exportable with launch/convert_checkpoint.py --export_from
    from composer_rl.model import hf_qwen3  # pylint: disable=g-import-not-at-top
    hf_qwen3.save_trained(os.path.join(workdir, "final_params"), exp.model, state.params,
                          exp.init_checkpoint)
  summary = metrics_lib.summary(exp.mode, start, c.train.steps, history, time.time() - t0)
  if before is not None:
    after = _heldout_eval(source, step_fn, state.params, workdir, "after")
    summary.update(heldout_perplexity_before=before["perplexity"],
                   heldout_perplexity_after=after["perplexity"],
                   heldout_tokens=after["tokens"], heldout_repos=after["repos"],
                   corpus=source.corpus.stats)
  if chief:
    print(json.dumps(summary), flush=True)
  sys.stdout.flush()
  return summary


def final_params(config, workdir: str):
  """The parameters of the newest good checkpoint of the run in `workdir` (as placed on
  the experiment's train mesh): what a later stage starts from."""
  exp = config_lib.build(config)
  step_fn = make_train_step(exp.model, exp.train, _mesh(exp.mesh),
                            exp.rules or shd.DEFAULT_RULES)
  ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), async_save=False)
  restored = ckpt.restore(step_fn.abstract_state())
  ckpt.close()
  if restored is None:
    raise FileNotFoundError(f"no usable checkpoint in {workdir}/checkpoints")
  return restored.state.params
