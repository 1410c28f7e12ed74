"""Serving kvgraft releases in vLLM: a KV connector that grafts only verified entries.

Importing this package imports nothing from vLLM; `kvgraft.vllm.connector` does (it runs inside
vLLM's engine process, in a venv with vLLM installed: `make vllm-venv`).
"""

from __future__ import annotations

CONNECTOR_NAME = "KvgraftConnector"
CONNECTOR_MODULE = "kvgraft.vllm.connector"

__all__ = ["CONNECTOR_MODULE", "CONNECTOR_NAME"]
