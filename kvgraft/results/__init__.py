"""Typed results: one pydantic model per check kind's result and report data, the one source of its JSON Schema."""
