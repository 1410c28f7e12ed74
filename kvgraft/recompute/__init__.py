"""Recompute: the recompute audit of stored KV (whole entries and prefixes), the numerical-noise bound it
judges by, tensor comparison, and the determinism matrix."""
