"""XLA flags that the parity contract depends on, set at import time.

Why: on XLA:CPU (jaxlib 0.10.x) the YNNPACK backend fuses reductions and single dots into
kernels chosen *by problem size*, so the same row of a matmul or the same softmax
normalizer comes out with different bits in a batch of 1 and a batch of 8. Disabling those
fusion kinds is the one flag-level fix; the rest of the parity design is structural (see
`composer_rl.ops.exact`). The flags only take effect if they are in `XLA_FLAGS` before the
first JAX backend is created, so the library sets them itself when it is imported: users
cannot forget them.

GPU route: `configure()` cannot see the platform (no backend exists yet), so the GPU
numerics flags are opt-in: with `COMPOSER_RL_GPU_ROUTE=deterministic` in the environment it
also appends `GPU_DETERMINISTIC_FLAGS`. The default (variable unset or `default`) applies
only `PARITY_FLAGS`, so CPU behaviour is unchanged. `launch/device_check.py` runs the
parity suite under both routes and reports which one is bitwise on the device.
"""
import os
import sys
import warnings

# Flag -> reason. Kept as a dict so BUILD_NOTES and the error message can cite reasons.
PARITY_FLAGS = {
    "--xla_cpu_experimental_ynn_fusion_type=-reduce,-individual_dot":
        "YNNPACK picks reduction/dot kernels by size, so a row's bits depend on batch shape",
    "--xla_cpu_max_isa=AVX":
        "no fused multiply-add in XLA-generated code: LLVM contracts a*b + c into an FMA "
        "where the fusion allows it, so the same expression (RoPE's sin/cos polynomials, a "
        "sum of squares) came out with other bits in another program (measured: eager vs "
        "jit, sampler vs trainer); Eigen's matmuls are not affected",
}

# Flag -> reason for the GPU deterministic route. Every name is checked to parse in this
# jaxlib (an unknown name in XLA_FLAGS aborts the process): tests/bench/test_device_check.py.
# The structural design already gives every matmul one fixed shape ([row_tile, K] tiles);
# these flags make the same shape compile to the same kernel in every program.
GPU_DETERMINISTIC_FLAGS = {
    "--xla_gpu_deterministic_ops=true":
        "no atomics-based scatter/reduction (the embedding gradient's scatter-add) and no "
        "timing-dependent choices: run-to-run identical bits",
    "--xla_gpu_autotune_level=0":
        "no autotuning: a GEMM's algorithm is picked by shape heuristics, not by timings "
        "that can differ between the sampler's and the trainer's compiles",
    "--xla_gpu_enable_triton_gemm=false":
        "dots go to cuBLAS, not Triton GEMM fusions whose tiling/split-K depends on the "
        "fused neighbours (different in prefill, decode and the value_and_grad program)",
    "--xla_allow_excess_precision=false":
        "bf16 values are rounded where the program says, not kept in fp32 inside some "
        "fusions only (fusion decisions differ between programs)",
}

ROUTE_ENV = "COMPOSER_RL_GPU_ROUTE"
ROUTES = ("default", "deterministic")


def route_flags(route: str) -> dict:
  """Flag -> reason dict for a route name (see ROUTES)."""
  if route not in ROUTES:
    raise ValueError(f"{ROUTE_ENV}={route!r}; choose one of {ROUTES}")
  return {**PARITY_FLAGS, **(GPU_DETERMINISTIC_FLAGS if route == "deterministic" else {})}


def _missing(current: str, route: str) -> list:
  return [f for f in route_flags(route) if f.split("=")[0] not in current]


def effective_flags(current: str, route: str = "default") -> str:
  """XLA_FLAGS after `configure()` for a route: `current` plus the route's flags whose
  name is not already set (a user's explicit value wins)."""
  return " ".join([current, *_missing(current, route)]).strip()


def _backend_initialized() -> bool:
  # Without jax imported there is no backend; importing it here would load JAX into
  # processes that never use it (the environment layer, `composer_rl.env`).
  if "jax" not in sys.modules:
    return False
  try:
    from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
    return bool(getattr(xla_bridge, "_backends", {}))
  except Exception:  # pragma: no cover - private API moved; assume not initialized.
    return False


def configure() -> None:
  """Appends the parity flags (and the GPU route's, if selected) to XLA_FLAGS unless
  already present."""
  current = os.environ.get("XLA_FLAGS", "")
  route = os.environ.get(ROUTE_ENV, "") or "default"
  missing = _missing(current, route)
  if not missing:
    return
  if _backend_initialized():
    warnings.warn(
        "composer_rl was imported after a JAX backend was created, so its parity XLA flags "
        f"{missing} could not take effect; sampler/trainer logprobs "
        "may not match bit for bit. Import composer_rl before running any JAX computation.",
        RuntimeWarning)
  os.environ["XLA_FLAGS"] = effective_flags(current, route)
