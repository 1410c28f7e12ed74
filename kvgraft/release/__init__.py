"""The cache-release format and its integrity: manifest, digests, the path rule, safetensors headers; no torch at import."""
