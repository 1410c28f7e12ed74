"""Inference: models by spec, the run's recorded conditions, tensors as bytes, the one runtime, and the two
operations on a release that need a model: capture (records into a release) and graft (a release's KV back into a cache)."""
