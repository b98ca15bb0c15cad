"""Fixtures for the environment tests (helpers live in envtest_helpers.py)."""
from envtest_helpers import sandbox, world  # noqa: F401  (pytest fixtures)
