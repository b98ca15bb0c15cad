"""Prepared accelerator check: one command, one JSON report, under ten minutes.

On a GPU host (or through the device tool, whose $OUT receives the report):
  python launch/device_check.py --scale=1b
CPU dry run of the same pipeline at tiny sizes (tests/bench/test_device_check.py):
  python launch/device_check.py --scale=tiny --budget_s=300
Options: --parts=env,train (a subset, run in the order given), --out=PATH (default
$OUT/device_check.json, else ./device_check.json), --part_timeouts=train:60 (override),
--extra_xla_flags='--xla_...' (appended to every part's XLA_FLAGS, to try a flag).

Parts: `env` (devices, versions), `parity_default` / `parity_deterministic` (the parity
suite on a small MoE and a ~1B dense model, under the library's default XLA flags and under
`GPU_DETERMINISTIC_FLAGS` via COMPOSER_RL_GPU_ROUTE=deterministic: which route is bitwise
on this backend, and by how much the other misses), `sampler`, `train` (its rows carry
model FLOP/s and MFU, `composer_rl.bench.mfu`) and `weight_sync` benchmarks at ~1B.

Why subprocesses: XLA flags are fixed when a backend starts, so each route needs its own
process; and a hang, crash or OOM in one part must cost only that part. Each part gets a
timeout (its weight's share of the budget still left, so time a fast part saves goes to the
later ones), its process group is killed on timeout, and the last JSON line of its stdout is
its result (the parity child prints a cumulative line after each model, so a timeout still
reports the models that finished). This process never starts a JAX backend: on a GPU that
would hold device memory the parts need.
"""
import datetime
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import time

_BASE_XLA_FLAGS = os.environ.get("XLA_FLAGS", "")  # before composer_rl appends its own
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import composer_rl  # noqa: E402,F401  (parity XLA flags before JAX, for the child parts)
from absl import app, flags  # noqa: E402

from composer_rl.ops import xla_flags  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# part -> (weight in the budget, XLA flag route)
PARTS = {"env": (1, "default"), "parity_default": (3, "default"),
         "parity_deterministic": (3, "deterministic"), "sampler": (4, "default"),
         "train": (4, "default"), "weight_sync": (3, "default")}
# Benchmark arguments per scale: tiny keeps the CPU dry run to a few minutes on 2 cores.
BENCH_ARGS = {
    "tiny": dict(
        sampler=["--preset=tiny", "--batch_sizes=1,8", "--new_tokens=8", "--prompt_len=8",
                 "--train_len=16", "--train_batch=4", "--repeats=1",
                 "--parity_prompts=2"],
        train=["--sizes=tiny", "--devices=1", "--modes=exact,inexact", "--rows=4",
               "--seq_len=32", "--steps=1"],
        weight_sync=["--sizes=tiny", "--steps=2", "--lrs=1e-6"]),
    "1b": dict(
        sampler=["--preset=dense_1b", "--batch_sizes=1,32", "--new_tokens=32",
                 "--prompt_len=128", "--train_len=512", "--train_batch=4", "--repeats=2",
                 "--parity_prompts=4"],
        train=["--sizes=1b", "--devices=1", "--modes=exact,inexact", "--rows=8",
               "--seq_len=1024", "--steps=3"],
        weight_sync=["--sizes=1b", "--steps=2", "--lrs=1e-6"]),
}
# Parity suite per scale: (label, preset, overrides) run in order (the small MoE first, so
# a slow 1B compile cannot cost its result), and the suite's case lists. tiny checks the
# pipeline, not the numerics (tests/parity does): one model (tiny_moe: layer 0 is dense,
# layer 1 MoE) and the fewest cases, so both routes fit the CPU dry run.
PARITY = {
    "tiny": dict(models=[("moe", "tiny_moe", {})], max_new_tokens=6,
                 suite=dict(num_prompts=3, prompt_len_range=(3, 20), batch_sizes=[1],
                            prefill_chunks=[None], prompt_buckets=[16],
                            train_batch_sizes=[2], num_devices=[1])),
    "1b": dict(models=[("moe", "parity_512_moe", {}),
                       ("dense_1b", "dense_1b", dict(max_seq_len=512))], max_new_tokens=16,
               suite=dict(num_prompts=6, prompt_len_range=(3, 60), batch_sizes=[1],
                          prefill_chunks=[None, 13], prompt_buckets=[16],
                          train_batch_sizes=[5], num_devices=[1, 8])),
}

_SCALE = flags.DEFINE_enum("scale", "1b", sorted(BENCH_ARGS), "model sizes of every part")
_BUDGET = flags.DEFINE_float("budget_s", 540, "total seconds for all parts")
_PARTS = flags.DEFINE_list("parts", list(PARTS), f"parts to run, in order: {list(PARTS)}")
_OUT = flags.DEFINE_string("out", None, "report path (default $OUT/device_check.json, "
                           "else ./device_check.json)")
_PART_TIMEOUTS = flags.DEFINE_list("part_timeouts", [], "part:seconds overrides")
_EXTRA = flags.DEFINE_string("extra_xla_flags", "", "appended to every part's XLA_FLAGS")
_CHILD = flags.DEFINE_enum("child_part", None, ["env", "parity"], "internal: run one part")


def _child_env() -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  import jaxlib  # pylint: disable=g-import-not-at-top
  from composer_rl.bench import mfu  # pylint: disable=g-import-not-at-top
  kind = jax.devices()[0].device_kind
  return dict(platform=jax.default_backend(), device_kind=kind,
              device_count=jax.device_count(), devices=[str(d) for d in jax.devices()[:8]],
              jax=jax.__version__, jaxlib=jaxlib.__version__,
              peak_bf16_flops=mfu.peak_flops(kind), xla_flags=os.environ.get("XLA_FLAGS"))


def _child_parity(scale: str) -> None:
  """Runs the suite model by model, printing the cumulative report after each."""
  import jax  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top
  from composer_rl.model.config import get_preset  # pylint: disable=g-import-not-at-top
  from composer_rl.model.transformer import Transformer  # pylint: disable=g-import-not-at-top
  from composer_rl.parity.suite import run_suite  # pylint: disable=g-import-not-at-top
  from composer_rl.sampling.sampler import SamplingConfig  # pylint: disable=g-import-not-at-top
  spec = PARITY[scale]
  sampling = SamplingConfig(temperature=1.0, top_k=40, top_p=0.95,
                            max_new_tokens=spec["max_new_tokens"], seed=0)
  out = dict(route=os.environ.get(xla_flags.ROUTE_ENV), xla_flags=os.environ.get("XLA_FLAGS"),
             platform=jax.default_backend(), device_kind=jax.devices()[0].device_kind,
             models=[], bitwise=None, done=False)
  for label, preset, overrides in spec["models"]:
    cfg = get_preset(preset, **overrides)
    shapes = nnx.eval_shape(lambda c=cfg: Transformer(c, rngs=nnx.Rngs(0)))
    params = sum(x.size for x in jax.tree.leaves(nnx.state(shapes)))
    r = run_suite([cfg], sampling, seed=0, **spec["suite"])
    bad = [dict(case=c["case"], mismatched=c["mismatched"], max_abs_diff=c["max_abs_diff"],
                routing_mismatches=c["routing_mismatches"])
           for m in r["models"] for c in m["cases"] if c["mismatched"] or c["routing_mismatches"]]
    out["models"].append(dict(
        model=label, preset=preset, params=int(params), compute_dtype=cfg.compute_dtype,
        bitwise=not (r["mismatched_tokens"] or r["routing_mismatches"]),
        **{k: r[k] for k in ("tokens", "mismatched_tokens", "max_abs_diff",
                             "routing_mismatches", "cases", "devices",
                             "skipped_device_counts", "seconds")}, mismatched_cases=bad[:20]))
    out["bitwise"] = all(m["bitwise"] for m in out["models"])
    print(json.dumps(out), flush=True)
  out["done"] = True
  print(json.dumps(out), flush=True)


def _last_json(text: str):
  for line in reversed(text.strip().splitlines()):
    try:
      value = json.loads(line)
    except ValueError:
      continue
    if isinstance(value, dict):
      return value
  return None


def run_part(argv, env, timeout: float) -> dict:
  """Runs one part's command; records its result or why it has none."""
  start = time.time()
  proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env, cwd=ROOT, start_new_session=True)
  timed_out = False
  try:
    out, err = proc.communicate(timeout=max(timeout, 0.1))
  except subprocess.TimeoutExpired:
    timed_out = True
    os.killpg(proc.pid, signal.SIGKILL)  # the part's whole process group, grandchildren too
    out, err = proc.communicate()
  result = _last_json(out)
  rec = dict(ok=not timed_out and proc.returncode == 0 and result is not None,
             seconds=round(time.time() - start, 1), timeout_s=round(timeout, 1),
             returncode=proc.returncode, command=" ".join(argv[1:]))
  if rec["ok"]:
    rec["result"] = result
    return rec
  rec["error"] = (f"timed out after {timeout:.0f}s" if timed_out else
                  f"exit code {proc.returncode}" if proc.returncode else "no JSON on stdout")
  rec["partial_result"] = result
  rec["stderr_tail"] = err[-3000:]
  return rec


def _command(part: str, scale: str):
  if part in ("env", "parity_default", "parity_deterministic"):
    child = "env" if part == "env" else "parity"
    return [sys.executable, os.path.abspath(__file__), f"--child_part={child}",
            f"--scale={scale}"]
  return [sys.executable, "-m", f"composer_rl.bench.{part}", *BENCH_ARGS[scale][part]]


def _versions() -> dict:
  out = {}
  for name in ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt", "flax", "libtpu"):
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      pass
  return out


def _summary(parts: dict) -> dict:
  """The headline numbers, lifted out of the part results."""
  res = lambda p: (parts.get(p) or {}).get("result") or {}
  env = res("env")
  train = [{k: r.get(k) for k in ("size", "mode", "devices", "seq_len", "tokens_per_s",
                                  "flops_per_token", "model_flops_per_s", "mfu")}
           for r in res("train").get("results", [])]
  return dict(device_kind=env.get("device_kind"), device_count=env.get("device_count"),
              platform=env.get("platform"),
              parity_bitwise={r: ((parts.get(f"parity_{r}") or {}).get("result") or {}).get(
                  "bitwise") for r in ("default", "deterministic")},
              train_mfu=train, ok=all(p["ok"] for p in parts.values()))


def main(argv):
  del argv
  if _CHILD.value == "env":
    print(json.dumps(_child_env()))
    return
  if _CHILD.value == "parity":
    _child_parity(_SCALE.value)
    return
  unknown = [p for p in _PARTS.value if p not in PARTS]
  if unknown:
    raise app.UsageError(f"unknown parts {unknown}; choose from {list(PARTS)}")
  overrides = {k: float(v) for k, v in (x.split(":") for x in _PART_TIMEOUTS.value)}
  out_path = _OUT.value or os.path.join(os.environ.get("OUT") or ".", "device_check.json")
  start = time.time()
  report = dict(check="device_check", scale=_SCALE.value, budget_s=_BUDGET.value,
                started=datetime.datetime.now(datetime.timezone.utc).isoformat(),
                host=dict(python=sys.version.split()[0], cpus=os.cpu_count(), **_versions()),
                gpu_deterministic_flags=xla_flags.GPU_DETERMINISTIC_FLAGS, parts={})
  todo = list(_PARTS.value)
  while todo:
    part = todo.pop(0)
    weight, route = PARTS[part]
    left = _BUDGET.value - (time.time() - start)
    timeout = overrides.get(part, left * weight / (weight + sum(PARTS[p][0] for p in todo)))
    current = " ".join(x for x in (_BASE_XLA_FLAGS, _EXTRA.value) if x)
    env = dict(os.environ, XLA_FLAGS=current, PYTHONPATH=os.pathsep.join(
        [ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    env[xla_flags.ROUTE_ENV] = route
    if left < 2 and part not in overrides:
      rec = dict(ok=False, error="budget exhausted before this part started", seconds=0.0)
    else:
      print(f"[device_check] {part}: timeout {timeout:.0f}s", file=sys.stderr, flush=True)
      rec = run_part(_command(part, _SCALE.value), env, timeout)
    rec.update(route=route, xla_flags=xla_flags.effective_flags(current, route))
    report["parts"][part] = rec
    print(f"[device_check] {part}: ok={rec['ok']} {rec['seconds']}s {rec.get('error', '')}",
          file=sys.stderr, flush=True)
  report["wall_s"] = round(time.time() - start, 1)
  report["summary"] = _summary(report["parts"])
  os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
  with open(out_path, "w") as f:
    json.dump(report, f, indent=1)
  print(json.dumps(report), flush=True)
  sys.exit(0 if report["summary"]["ok"] else 1)


if __name__ == "__main__":
  app.run(main)
