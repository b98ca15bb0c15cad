"""Serving: adapters that put the exact engine behind standard serving interfaces."""
