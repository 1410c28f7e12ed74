"""SHA-256 digests of bytes and of canonical JSON: the one home of the hex digest every commitment uses."""

from __future__ import annotations

import hashlib
from typing import Any

from kvgraft._internal.jsonio import canonical


def sha256_hex(data: bytes | bytearray | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def digest_json(obj: Any) -> str:
    """SHA-256 over the RFC 8785 canonical JSON of `obj`."""
    return sha256_hex(canonical(obj))
