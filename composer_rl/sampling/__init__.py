"""Sampling: the token head shared with the trainer, the RNG scheme and the sampler."""
