"""What one verification checked, as the tests read it: `verify(source, policy, scope)` and its `VerifyResult`,
the release's source closed before it returns (a test reads the result, not the release)."""

from __future__ import annotations

from pathlib import Path

from kvgraft.release.sources import Source
from kvgraft.signing.policy import ALL, Scope, SignatureNotChecked, VerifyPolicy
from kvgraft.signing.verify import VerifyResult, verify


def verify_result(source: str | Path | Source, policy: VerifyPolicy | None = None, scope: Scope = ALL) -> VerifyResult:
    """`verify(source, policy, scope).checked`: every file by default (`kvgraft verify`'s scope), the signature not
    checked unless `policy` says with what."""
    with verify(source, SignatureNotChecked() if policy is None else policy, scope) as checked:
        return checked.checked
