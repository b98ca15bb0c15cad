"""launch/device_check.py (the prepared accelerator check) and its arithmetic.

The end-to-end CPU dry run (`--scale=tiny`, every part) takes ~3 min on 2 cores and is in the
default suite: it is the issue's check that the prepared GPU run works end to end.
"""
import json
import os
import subprocess
import sys

import pytest

from composer_rl.bench import mfu
from composer_rl.model.config import ModelConfig, get_preset
from composer_rl.ops import xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCHER = os.path.join(ROOT, "launch", "device_check.py")
PARTS = ["env", "parity_default", "parity_deterministic", "sampler", "train", "weight_sync"]


def _launch(args, tmp_path, timeout, out_dir=None):
  env = {k: v for k, v in os.environ.items() if k != "OUT"}
  if out_dir:
    env["OUT"] = out_dir
  proc = subprocess.run([sys.executable, LAUNCHER, *args], capture_output=True, text=True,
                        env=env, cwd=str(tmp_path), timeout=timeout)
  report = json.loads(proc.stdout.strip().splitlines()[-1])
  return proc, report


def test_flops_per_token_hand_computed():
  cfg = ModelConfig()  # vocab 256, d 64, 2 layers, 4/2 heads of 16, d_ff 128, untied
  attn = 64 * 16 * (4 + 4 + 2 + 2)  # wq, wo (4 heads), wk, wv (2 kv heads) = 12288
  ffn = 3 * 64 * 128  # 24576
  n = 2 * (attn + ffn) + 64 * 256  # + output head = 90112
  assert mfu.matmul_params(cfg) == n == 90112
  assert mfu.attention_flops_per_token(cfg, 32) == 12 * 2 * 4 * 16 * 32 == 49152
  assert mfu.train_flops_per_token(cfg, 32) == 6 * 90112 + 49152 == 589824
  # MoE: layer 1 runs 2 of 4 experts of width 64, plus the 64x4 router.
  moe = get_preset("tiny_moe")
  assert mfu.matmul_params(moe) == 2 * attn + ffn + (3 * 64 * 64 * 2 + 64 * 4) + 64 * 256
  # dense_1b: ~0.98B parameters, ~5.94 GFLOP per trained token at 1024 tokens.
  assert mfu.train_flops_per_token(get_preset("dense_1b"), 1024) == 5942280192


def test_matmul_params_match_the_model():
  """Every weight but the embedding lookup and the norm scales is a matmul weight (MoE with
  all experts active, so the count is the whole expert bank)."""
  import jax  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top
  from composer_rl.model.transformer import Transformer  # pylint: disable=g-import-not-at-top
  for cfg in (get_preset("tiny"), get_preset("tiny_moe", experts_per_token=4)):
    state = nnx.to_pure_dict(nnx.state(nnx.eval_shape(lambda c=cfg: Transformer(
        c, rngs=nnx.Rngs(0)))))
    flat = jax.tree_util.tree_flatten_with_path(state)[0]
    counted = sum(x.size for path, x in flat if "norm" not in jax.tree_util.keystr(path)
                  and "embed" not in jax.tree_util.keystr(path))
    assert mfu.matmul_params(cfg) == counted


def test_mfu_and_peak_table():
  assert mfu.peak_flops("NVIDIA H200") == 989e12
  assert mfu.peak_flops("NVIDIA H100 80GB HBM3") == 989e12
  assert mfu.peak_flops("NVIDIA H100 PCIe") == 756e12
  assert mfu.peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
  assert mfu.peak_flops("cpu") is None
  cfg = ModelConfig()
  got = mfu.mfu(cfg, 32, tokens_per_s=1e6, device_kind="NVIDIA H200", num_devices=2)
  assert got["model_flops_per_s"] == 589824 * 1e6
  assert got["mfu"] == pytest.approx(589824e6 / (2 * 989e12))
  assert mfu.mfu(cfg, 32, 1e6, "cpu")["mfu"] is None


def test_gpu_route_flags_parse_and_default_is_unchanged():
  assert xla_flags.effective_flags("", "default") == " ".join(xla_flags.PARITY_FLAGS)
  user = "--xla_gpu_autotune_level=4"  # an explicit user value wins
  flags = xla_flags.effective_flags(user, "deterministic").split()
  assert user in flags and "--xla_gpu_autotune_level=0" not in flags
  code = ("import os, composer_rl, jax; jax.numpy.ones(2).block_until_ready(); "
          "print(os.environ['XLA_FLAGS'])")
  for route, expected in (("deterministic", xla_flags.route_flags("deterministic")),
                          ("", xla_flags.PARITY_FLAGS)):
    env = dict(os.environ, COMPOSER_RL_GPU_ROUTE=route, XLA_FLAGS="")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]  # an unknown flag would abort JAX
    assert out.stdout.split() == list(expected)


def test_timed_out_part_is_recorded_and_later_parts_still_run(tmp_path):
  proc, report = _launch(["--scale=tiny", "--parts=sampler,env", "--part_timeouts=sampler:3",
                          f"--out={tmp_path / 'r.json'}"], tmp_path, timeout=120)
  assert proc.returncode == 1
  assert json.loads((tmp_path / "r.json").read_text()) == report
  sampler, env = report["parts"]["sampler"], report["parts"]["env"]
  assert not sampler["ok"] and "timed out" in sampler["error"] and sampler["seconds"] < 30
  assert env["ok"] and env["result"]["device_count"] >= 1
  assert report["summary"]["device_kind"] == env["result"]["device_kind"]


def test_crashed_part_is_recorded_and_report_goes_to_out_dir(tmp_path):
  proc, report = _launch(["--scale=tiny", "--parts=env",
                          "--extra_xla_flags=--xla_no_such_flag_for_test=1"], tmp_path,
                         timeout=120, out_dir=str(tmp_path / "outdir"))
  assert proc.returncode == 1
  env = report["parts"]["env"]
  assert not env["ok"] and env["error"].startswith("exit code")
  assert "xla_no_such_flag_for_test" in env["stderr_tail"]
  assert "--xla_no_such_flag_for_test=1" in env["xla_flags"]
  assert json.loads((tmp_path / "outdir" / "device_check.json").read_text()) == report


@pytest.mark.slow  # ~200 s on one CI worker; the default suite must stay under 20 min
def test_cpu_dry_run_end_to_end(tmp_path):
  proc, report = _launch(["--scale=tiny", "--budget_s=900", f"--out={tmp_path / 'r.json'}"],
                         tmp_path, timeout=1000)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert json.loads((tmp_path / "r.json").read_text()) == report
  for key in ("scale", "budget_s", "host", "gpu_deterministic_flags", "parts", "wall_s",
              "summary"):
    assert key in report
  assert report["host"]["jax"] and report["host"]["jaxlib"]
  assert list(report["parts"]) == PARTS
  for name, part in report["parts"].items():
    assert part["ok"], (name, part.get("error"), part.get("stderr_tail"))
    assert part["xla_flags"] and part["seconds"] > 0
  parts = {k: v["result"] for k, v in report["parts"].items()}
  assert parts["env"]["platform"] == "cpu" and parts["env"]["peak_bf16_flops"] is None
  for route in ("default", "deterministic"):
    p = parts[f"parity_{route}"]
    assert p["done"] and p["route"] == route and p["models"][0]["tokens"] > 0
  assert parts["parity_default"]["bitwise"] is True  # the CPU contract
  assert report["summary"]["parity_bitwise"]["default"] is True
  det_flags = parts["parity_deterministic"]["xla_flags"].split()
  assert set(xla_flags.GPU_DETERMINISTIC_FLAGS) <= set(det_flags)
  assert parts["sampler"]["sampler"]["batch_8"]["exact"]["decode_tokens_per_s"] > 0
  rows = parts["train"]["results"]
  assert {r["mode"] for r in rows} == {"exact", "inexact"}
  for r in rows:
    assert r["tokens_per_s"] > 0 and r["model_flops_per_s"] > 0 and r["mfu"] is None
  assert report["summary"]["train_mfu"][0]["flops_per_token"] == rows[0]["flops_per_token"]
  assert parts["weight_sync"]["exact"] is True
