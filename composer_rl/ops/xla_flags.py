"""XLA flags that the parity contract depends on, set at import time.

Why: on XLA:CPU (jaxlib 0.10.x) the YNNPACK backend fuses reductions and single dots into
kernels chosen *by problem size*, so the same row of a matmul or the same softmax
normalizer comes out with different bits in a batch of 1 and a batch of 8. Disabling those
fusion kinds is the one flag-level fix; the rest of the parity design is structural (see
`composer_rl.ops.exact`). The flags only take effect if they are in `XLA_FLAGS` before the
first JAX backend is created, so the library sets them itself when it is imported: users
cannot forget them.
"""
import os
import warnings

# Flag -> reason. Kept as a dict so BUILD_NOTES and the error message can cite reasons.
PARITY_FLAGS = {
    "--xla_cpu_experimental_ynn_fusion_type=-reduce,-individual_dot":
        "YNNPACK picks reduction/dot kernels by size, so a row's bits depend on batch shape",
}


def _backend_initialized() -> bool:
  try:
    from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
    return bool(getattr(xla_bridge, "_backends", {}))
  except Exception:  # pragma: no cover - private API moved; assume not initialized.
    return False


def configure() -> None:
  """Appends the parity flags to XLA_FLAGS unless already present."""
  current = os.environ.get("XLA_FLAGS", "")
  missing = [f for f in PARITY_FLAGS if f.split("=")[0] not in current]
  if not missing:
    return
  if _backend_initialized():
    warnings.warn(
        "composer_rl was imported after a JAX backend was created, so its parity XLA flags "
        f"{missing} could not take effect; sampler/trainer logprobs may not match bit for "
        "bit. Import composer_rl before running any JAX computation.", RuntimeWarning)
  os.environ["XLA_FLAGS"] = " ".join([current, *missing]).strip()
