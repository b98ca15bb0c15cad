"""Test-wide setup: 8 fake CPU devices for multi-device tests, parity flags via import."""
import os

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + " --xla_force_host_platform_device_count=8").strip()

import composer_rl  # noqa: E402,F401  (parity XLA flags must precede JAX's backend)
