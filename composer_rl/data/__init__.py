"""Tokenizers and data formats shared by rollouts, training and serving."""
