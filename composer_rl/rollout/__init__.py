"""Rollouts: whole agent sessions driven through the engine and the environment."""
