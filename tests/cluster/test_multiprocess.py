"""Two JAX processes x four CPU devices (jax.distributed on loopback, gloo collectives) run
the sharded SFT train step of launch/train.py, with the parameters FSDP-sharded across both
processes. Loss, gradient norm and the whole train state match the one-process 8-device run
bit for bit, and Orbax checkpoints cross over: written by two processes, resumed by one, and
the other way round, ending on the same bits."""
import json
import os
import shutil
import socket
import subprocess
import sys

import jax
import numpy as np

from composer_rl.model import sharding as shd
from composer_rl.train import config as config_lib
from composer_rl.train.checkpoint import Checkpointer
from composer_rl.train.train_step import make_train_step

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
import sft_tiny  # noqa: E402
CONFIG = os.path.join(ROOT, "experiments", "sft_tiny.py")
# 16 rows = 8 shards x 2 rows: one microbatch per device, so 1, 2x4 and 8 devices agree.
COMMON = ["--config.train.micro_batch_size=2", "--config.checkpoint.every_steps=2",
          "--config.train.log_every=1", "--config.checkpoint.max_to_keep=4"]
TIMEOUT_S = 240


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _env(devices_flag: bool):
  env = dict(os.environ)
  flags = [f for f in env.get("XLA_FLAGS", "").split()
           if "xla_force_host_platform_device_count" not in f]
  if devices_flag:
    flags.append("--xla_force_host_platform_device_count=8")
  env["XLA_FLAGS"] = " ".join(flags)
  return env


def _cmd(workdir, steps, *extra):
  return [sys.executable, os.path.join(ROOT, "launch", "train.py"), f"--config={CONFIG}",
          f"--workdir={workdir}", f"--config.train.steps={steps}", *COMMON, *extra]


def one_process(workdir, steps):
  out = subprocess.run(_cmd(workdir, steps, "--config.mesh.data=-1"), cwd=ROOT,
                       env=_env(True), capture_output=True, text=True, timeout=TIMEOUT_S)
  assert out.returncode == 0, out.stderr[-3000:]
  return out.stdout


def two_processes(workdir, steps):
  port = _free_port()
  procs = [subprocess.Popen(
      _cmd(workdir, steps, "--config.mesh.fsdp=-1", "--distributed=explicit",
           f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
           f"--process_id={i}", "--cpu_devices=4", "--distributed_timeout_s=120"),
      cwd=ROOT, env=_env(False), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
      for i in range(2)]
  outs = []
  try:
    for p in procs:
      stdout, stderr = p.communicate(timeout=TIMEOUT_S)
      assert p.returncode == 0, stderr[-3000:]
      outs.append(stdout)
  finally:
    for p in procs:
      p.kill()
  return outs


def metrics(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [{k: r[k] for k in ("step", "loss", "grad_norm", "logp_mean")}
            for r in map(json.loads, f)]


def digest(workdir, step):
  with open(os.path.join(workdir, "checkpoints", str(step), "meta", "metadata")) as f:
    return json.load(f)["digest"]


def restore_params(workdir, step):
  """Restores a checkpoint in this (one) process onto a 1-device mesh."""
  exp = config_lib.build(sft_tiny.get_config())
  step_fn = make_train_step(exp.model, exp.train, shd.make_mesh({"data": 1}, jax.devices()[:1]))
  ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), async_save=False)
  got = ckpt.restore(step_fn.abstract_state(), step=step)
  ckpt.close()
  assert got is not None
  return got.state.params


def _bits(tree):
  return [np.asarray(x).view(np.uint32) for x in jax.tree.leaves(jax.device_get(tree))]


def test_two_processes_match_one_process_and_checkpoints_cross_over(tmp_path):
  one, two = tmp_path / "one", tmp_path / "two"
  one_process(one, 4)
  outs = two_processes(two, 4)
  # Process 0 alone writes the console summary and the metrics log.
  assert json.loads(outs[0].strip().splitlines()[-1])["steps"] == 4
  assert not [l for l in outs[1].splitlines() if l.startswith(("{", "step "))]
  assert metrics(one) == metrics(two)
  assert len(metrics(two)) == 4
  for step in (2, 4):
    assert digest(one, step) == digest(two, step)
  # Written by two processes (each its FSDP shards), read by one, compared as bits.
  for a, b in zip(_bits(restore_params(one, 4)), _bits(restore_params(two, 4))):
    np.testing.assert_array_equal(a, b)

  # Two processes resume a one-process checkpoint, and one process a two-process one.
  for src, dst, resume in ((one, tmp_path / "two_from_one", two_processes),
                           (two, tmp_path / "one_from_two", one_process)):
    os.makedirs(dst / "checkpoints")
    shutil.copytree(src / "checkpoints" / "2", dst / "checkpoints" / "2")
    out = resume(dst, 4)
    text = out[0] if isinstance(out, list) else out
    assert "resumed from step 2" in text
    assert digest(dst, 4) == digest(one, 4)
    assert metrics(dst) == metrics(one)[2:]
