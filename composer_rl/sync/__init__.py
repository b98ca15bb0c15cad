"""Weight sync: sparse bit-level deltas of the inference weights through Orbax."""
