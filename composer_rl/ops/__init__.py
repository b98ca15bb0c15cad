"""Numerics layer: the few operations whose bits must not depend on batch shape."""
