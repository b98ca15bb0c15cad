"""The single controller: carves meshes, runs the rollout and trainer factories, logs."""
