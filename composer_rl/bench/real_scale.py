"""A real model's shape on this machine: compile time, peak memory, an RL train step, the
Engine with many sessions, KV bytes per session, and parity. Prints one JSON object.

  python -m composer_rl.bench.real_scale                      # Qwen3-0.6B shape, random init
  python -m composer_rl.bench.real_scale --preset=tiny --train_len=64 --prompt_len=16 \\
      --new_tokens=8 --max_seq_len=256                          # a seconds-long smoke run

Each measured part runs in its own process, so `peak_rss_gb` is that part's own peak:

* `engine`: the bf16 inference copy in an `Engine` with `sessions` slots: `sessions`
  random prompts of `prompt_len` tokens prefilled in one batch, then `new_tokens` decoded
  on device (`generate_many`, sampled at temperature 1); compile seconds of the first call,
  tokens/s of the timed repeat, KV bytes of a decode slot and of a parked session (the
  bucketed `Prefix` `release` returns). `parity`: the trainer's `score_tokens` on the fp32
  master scores every generated token; `mismatched_tokens` counts log-probs whose uint32
  bits differ from the Engine's.
* `train`: one RL step (GRPO-style policy loss, AdamW) of `train_rows` sessions x
  `train_len` tokens, one row per microbatch as agent RL runs it, on `--train_mesh` (e.g.
  `fsdp=8`: parameters, moments and gradients split 8 ways inside the step; a CPU host
  shows that many devices). XLA's memory analysis of the compiled step (per device) comes
  first; the step runs only when all local devices' bytes fit `--memory_budget_gb`
  (otherwise the JSON says so, with the predicted bytes).
* `paper`: bytes per part for `--paper_presets` (parameters, AdamW, gradients held,
  KV per token and per session) -- for shapes that cannot run here.
"""
import json
import math
import os
import resource
import subprocess
import sys
import time

from absl import app, flags

_PRESET = flags.DEFINE_string("preset", "qwen3_0_6b", "Model preset (composer_rl.model).")
_PARTS = flags.DEFINE_list("parts", ["engine", "train", "paper"], "Parts to run.")
_SESSIONS = flags.DEFINE_integer("sessions", 16, "Engine slots / concurrent sessions.")
_PROMPT = flags.DEFINE_integer("prompt_len", 128, "Prompt tokens per session.")
_NEW = flags.DEFINE_integer("new_tokens", 32, "Decoded tokens per session.")
_MAX_SEQ = flags.DEFINE_integer("max_seq_len", 2048, "Window (decode slot length).")
_ROWS = flags.DEFINE_integer("train_rows", 8, "Sessions per RL train step.")
_LEN = flags.DEFINE_integer("train_len", 1024, "Tokens per session in the train step.")
_REMAT = flags.DEFINE_enum("remat", "full", ["none", "dots", "full"],
                           "ModelConfig.remat of the train step.")
_MESH = flags.DEFINE_string("train_mesh", "data=1",
                            "Mesh of the train step, axis=size[,axis=size] (composer_rl.model."
                            "sharding.MESH_AXES); on CPU that many host devices are made.")
_BUDGET = flags.DEFINE_float("memory_budget_gb", 20.0, "Run the train step only below this.")
_PAPER = flags.DEFINE_list("paper_presets", ["qwen3_0_6b", "qwen3_30b_a3b"],
                           "Presets sized on paper.")
_PAPER_FSDP = flags.DEFINE_integer("paper_fsdp", 64, "FSDP ways the paper part sizes a "
                                   "device's share at.")
_CHILD = flags.DEFINE_string("child", "", "Internal: run one part in this process.")

GB = 1 << 30


def _peak_rss_gb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB


def _config():
  from composer_rl.model import get_preset
  return get_preset(_PRESET.value, max_seq_len=_MAX_SEQ.value, remat=_REMAT.value)


def _mesh_shape() -> dict:
  try:
    shape = {k.strip(): int(v) for k, v in (a.split("=") for a in _MESH.value.split(","))}
  except ValueError:
    raise app.UsageError(f"--train_mesh={_MESH.value!r}: write axis=size[,axis=size]")
  return shape


def kv_bytes_per_token(cfg) -> int:
  import jax.numpy as jnp
  return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * jnp.dtype(
      cfg.compute_jnp_dtype).itemsize + 4  # keys + values, and the slot's segment id


def engine_part() -> dict:
  import jax
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx
  from composer_rl.model import Transformer
  from composer_rl.model.transformer import inference_copy
  from composer_rl.sampling.engine import Engine, Request
  from composer_rl.train.scoring import score_tokens
  cfg = _config()
  n, p_len, new = _SESSIONS.value, _PROMPT.value, _NEW.value
  t0 = time.perf_counter()
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  engine = Engine(model, slots=n, prefill_chunk=min(128, p_len))
  master = engine.params
  params = inference_copy(master, cfg)
  init_s = time.perf_counter() - t0
  rng = np.random.default_rng(0)
  prompts = rng.integers(1, cfg.vocab_size, (n, p_len), dtype=np.int32)
  reqs = [Request(seq_id=i, seed=1) for i in range(n)]

  def run():
    t = time.perf_counter()
    prefixes = engine.prefill_many(params=params, items=[(p, r, None)
                                                         for p, r in zip(prompts, reqs)])
    state = engine.init_decode_state()
    for slot, prefix in enumerate(prefixes):
      state = engine.insert(prefix, state, slot)
    jax.block_until_ready(state)
    t_prefill = time.perf_counter() - t
    t = time.perf_counter()
    state, steps = engine.generate_many(params, state, [new - 1] * n, -1, new - 1)
    jax.block_until_ready(steps)
    return prefixes, state, steps, t_prefill, time.perf_counter() - t

  t = time.perf_counter()
  run()
  first_s = time.perf_counter() - t
  prefixes, state, steps, prefill_s, decode_s = run()
  parked = engine.release(state, 0)
  per_token = kv_bytes_per_token(cfg)
  # Parity: the trainer (fp32 master, score_tokens) scores every generated token.
  toks = np.concatenate([prompts, np.asarray([int(p.token) for p in prefixes])[:, None],
                         np.asarray(steps.tokens).T], axis=1)
  want = np.concatenate([np.asarray([float(p.logprob) for p in prefixes],
                                    np.float32)[:, None],
                         np.asarray(steps.logprobs, np.float32).T], axis=1)
  model_m = nnx.merge(engine.graphdef, master)
  rows = jax.tree.map(lambda x: jnp.repeat(x, n), reqs[0].rows())
  t = time.perf_counter()
  got = np.asarray(jax.jit(score_tokens)(model_m, jnp.asarray(toks), rows).logprobs)
  score_s = time.perf_counter() - t
  got = got[:, p_len - 1:p_len - 1 + new]
  mismatched = int((got.view(np.uint32) != want.view(np.uint32)).sum())
  return {
      "sessions": n, "prompt_len": p_len, "new_tokens": new, "max_seq_len": cfg.max_seq_len,
      "init_seconds": round(init_s, 2),
      "compile_seconds": round(first_s - prefill_s - decode_s, 2),
      "prefill_tokens_per_s": round(n * p_len / prefill_s, 1),
      "decode_tokens_per_s": round(n * (new - 1) / decode_s, 1),
      "generated_tokens_per_s": round(n * new / (prefill_s + decode_s), 1),
      "kv_bytes_per_token": per_token,
      # measured: the decode state's cache follows its sessions (kv_cache.decode_length)
      "decode_slot_length": state.cache.length,
      "kv_bytes_decode_slot": int(sum(x.nbytes for x in jax.tree.leaves(state.cache))) // n,
      "kv_bytes_parked_session": int(sum(x.nbytes for x in jax.tree.leaves(parked.cache))),
      "parked_session_tokens": int(parked.length),
      "parity": {"tokens": int(want.size), "mismatched_tokens": mismatched,
                 "score_seconds": round(score_s, 2)},
      "peak_rss_gb": round(_peak_rss_gb(), 2)}


def train_part() -> dict:
  import jax
  import numpy as np
  from composer_rl.model import sharding as shd
  from composer_rl.train.batch import TrainBatch
  from composer_rl.train.train_step import TrainConfig, make_train_step
  from composer_rl.sampling.head import RowSampling
  cfg = _config()
  rows, length = _ROWS.value, _LEN.value
  shape = _mesh_shape()
  devices = math.prod(shape.values())
  mesh = shd.make_mesh(shape, devices=jax.devices()[:devices])
  step = make_train_step(cfg, TrainConfig(micro_batch_size=1), mesh)
  rng = np.random.default_rng(0)
  ones = np.ones((rows, length), np.float32)
  batch = TrainBatch(
      tokens=rng.integers(1, cfg.vocab_size, (rows, length), dtype=np.int32),
      segment_ids=ones.astype(np.int32), positions=np.tile(np.arange(length, dtype=np.int32),
                                                           (rows, 1)),
      loss_mask=ones[:, 1:], behaviour_logprobs=np.zeros((rows, length - 1), np.float32),
      advantages=rng.standard_normal(rows).astype(np.float32),
      rows_valid=np.ones(rows, np.float32), versions=np.zeros((rows, length - 1), np.int32),
      sampling=RowSampling.broadcast(rows))
  t = time.perf_counter()
  abstract = step.abstract_state()
  compiled = step.step.lower(abstract, jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype), batch)).compile()
  compile_s = time.perf_counter() - t
  mem = compiled.memory_analysis()
  predicted = mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes \
      - mem.alias_size_in_bytes
  out = {"rows": rows, "tokens_per_row": length, "micro_batch_size": 1, "remat": cfg.remat,
         "mesh": shape, "compile_seconds": round(compile_s, 2),
         "predicted_bytes_per_device": {"arguments": mem.argument_size_in_bytes,
                             "temporaries": mem.temp_size_in_bytes,
                             "outputs": mem.output_size_in_bytes,
                             "aliased": mem.alias_size_in_bytes, "total": predicted}}
  if predicted * devices > _BUDGET.value * GB:
    out["ran"] = False
    out["why_not"] = (f"predicted {devices} x {predicted / GB:.1f} GB > memory_budget_gb="
                      f"{_BUDGET.value}")
  else:
    state = step.init_state(0)
    # Behaviour log-probs are the model's own (ratios 1, as on-policy RL has them): a fixed
    # value far from a random model's log-probs clips every ratio and zeroes the gradient.
    from composer_rl.train.scoring import score_tokens
    lp = jax.jit(score_tokens)(step.model(state.params), batch.tokens, batch.sampling).logprobs
    batch = batch.replace(behaviour_logprobs=np.asarray(lp))
    sharded = step.shard_batch(batch)
    t = time.perf_counter()
    state, metrics = compiled(state, sharded)
    jax.block_until_ready(metrics)
    out.update(ran=True, step_seconds=round(time.perf_counter() - t, 2),
               tokens_per_s=round(rows * length / (time.perf_counter() - t), 1),
               loss=float(metrics["loss"]), grad_norm=float(metrics["grad_norm"]))
  out["peak_rss_gb"] = round(_peak_rss_gb(), 2)
  return out


def paper(name: str, rows: int, length: int, ways: int) -> dict:
  """Bytes per part of a preset: fp32 master + AdamW + the gradients the step holds
  (streaming tree: bit_length(rows - 1) partial sums + the one being computed; before: one
  per microbatch), the bf16 inference copy, KV per token / per session, and one device's
  share with parameters split `ways` ways inside the step (FSDP): master, AdamW and the
  partial sums divided by `ways`, plus what is whole for a moment -- the largest layer's
  gathered weights and gradient, and the embedding with its gradient."""
  import jax
  import numpy as np
  from flax import nnx
  from composer_rl.model import Transformer, get_preset
  cfg = get_preset(name)
  shapes = nnx.to_pure_dict(nnx.state(nnx.eval_shape(
      lambda: Transformer(cfg, rngs=nnx.Rngs(0)))))
  count = sum(int(x.size) for x in jax.tree.leaves(shapes))
  per_token = kv_bytes_per_token(cfg)
  f32 = 4 * count
  layer = max(sum(int(np.prod(x.shape[1:])) for x in jax.tree.leaves(group))
              for group in shapes["layers"].values())
  outside = sum(int(x.size) for k, x in shapes.items() if k != "layers")
  rounds = max(rows // ways, 1)
  held = (max(rounds - 1, 0).bit_length() + 1) * f32
  return {"parameters": count, "fp32_master_bytes": f32, "adamw_bytes": 2 * f32,
          "inference_copy_bytes": count * 2,
          "gradient_bytes_held": {"per_microbatch_before": rows * f32,
                                  "streaming_tree_now": ((rows - 1).bit_length() + 1) * f32},
          f"fsdp_{ways}_bytes_per_device": {
              "master_adamw_gradients": (3 * f32 + held) // ways,
              "whole_for_a_moment": 4 * 2 * (layer + outside)},
          "kv_bytes_per_token": per_token,
          "kv_bytes_per_session": {"window_before": per_token * cfg.max_seq_len,
                                   f"bucketed_now_{length}_tokens": per_token * length},
          "window": cfg.max_seq_len}


def _run_child(part: str) -> dict:
  args = [sys.executable, "-m", "composer_rl.bench.real_scale", f"--child={part}"]
  args += [f for f in sys.argv[1:] if not f.startswith("--child")]
  t = time.perf_counter()
  env = dict(os.environ)
  devices = math.prod(_mesh_shape().values())
  if part == "train" and devices > 1 and "xla_force_host_platform_device_count" not in \
      env.get("XLA_FLAGS", ""):  # CPU: that many host devices (accelerators have theirs)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                        f" --xla_force_host_platform_device_count={devices}").strip()
  proc = subprocess.run(args, capture_output=True, text=True, env=env)
  if proc.returncode:
    return {"error": f"exit {proc.returncode}", "stderr_tail": proc.stderr[-2000:]}
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  out["wall_seconds"] = round(time.perf_counter() - t, 1)
  return out


def main(argv):
  del argv
  if _CHILD.value:
    import composer_rl  # noqa: F401  (parity XLA flags)
    fn = {"engine": engine_part, "train": train_part}[_CHILD.value]
    print(json.dumps(fn()))
    return
  unknown = set(_PARTS.value) - {"engine", "train", "paper"}
  if unknown:
    raise app.UsageError(f"unknown --parts {sorted(unknown)}; choose engine, train, paper")
  out = {"preset": _PRESET.value, "cpu_count": os.cpu_count()}
  for part in ("engine", "train"):
    if part in _PARTS.value:
      print(f"[real_scale] {part} ...", file=sys.stderr, flush=True)
      out[part] = _run_child(part)
  if "paper" in _PARTS.value:
    out["paper"] = {n: paper(n, _ROWS.value, _LEN.value, _PAPER_FSDP.value)
                    for n in _PAPER.value}
  print(json.dumps(out, indent=1))


if __name__ == "__main__":
  app.run(main)
