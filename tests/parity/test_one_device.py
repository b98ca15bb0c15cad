"""Exactness in a one-device process. XLA:CPU picks other matmul kernels when a process has
one host device than when it has eight (the test suite's default, `tests/conftest.py`):
measured, a dot of 2..7 rows and more than 2048 output columns differs from the same rows
in a larger call only with one device. So the checks that depend on it run here in a
child process that sets no device count, as a one-GPU or one-CPU user's process would."""
import json
import os
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import json
    import jax, jax.numpy as jnp, numpy as np
    from composer_rl.model import ModelConfig
    from composer_rl.ops import exact
    from composer_rl.parity.suite import run_suite
    from composer_rl.sampling.sampler import SamplingConfig

    out = dict(devices=jax.device_count(), dense={})
    rng = np.random.default_rng(0)
    for width, cols in [(128, 2048), (128, 4096), (256, 4096), (128, 8192)]:
      x = jnp.asarray(rng.standard_normal((300, width)), jnp.float32)
      w = jnp.asarray(rng.standard_normal((width, cols)) * 0.05, jnp.float32)
      f = jax.jit(lambda x: exact.dense(x, w, jnp.float32))
      ref = np.asarray(f(x)).view(np.uint32)
      out["dense"][f"{width}x{cols}"] = [
          m for m in (1, 2, 3, 5, 7, 8, 9, 40)
          if not (np.asarray(f(x[:m])).view(np.uint32) == ref[:m]).all()]
    # Wide dots: the head (vocab 4096) and the fused gate/up (2 x 1536 columns).
    cfg = ModelConfig(vocab_size=4096, d_model=256, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=64, d_ff=1536, max_seq_len=64,
                      compute_dtype="float32")
    out["parity"] = run_suite([cfg], SamplingConfig(top_k=40, max_new_tokens=10, seed=1),
                              num_prompts=5, prompt_len_range=(2, 20), batch_sizes=[1, 3],
                              prefill_chunks=[None], prompt_buckets=[16],
                              train_batch_sizes=[5], num_devices=[], seed=1)
    print(json.dumps(out))
""")


def test_one_device_process_is_exact():
  env = dict(os.environ)
  env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                              if "device_count" not in f)
  done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                        text=True, timeout=900)
  assert done.returncode == 0, done.stderr[-3000:]
  out = json.loads(done.stdout.strip().splitlines()[-1])
  assert out["devices"] == 1
  assert out["dense"] == {"128x2048": [], "128x4096": [], "256x4096": [], "128x8192": []}
  report = out["parity"]
  assert report["tokens"] > 0 and report["mismatched_tokens"] == 0, report
  assert report["max_abs_diff"] == 0.0
