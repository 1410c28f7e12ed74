"""kvgraft: capture, graft, recompute and verify KV-cache releases."""

__version__ = "0.1.0"
