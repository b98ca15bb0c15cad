"""Scale-out: joining multi-process JAX jobs and planning meshes over a cluster's devices."""
