"""Training: scoring, losses, advantages and the sharded train step. Knows no controller."""
