"""Tests of composer_rl.online."""
