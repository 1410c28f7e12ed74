"""Sigstore bundles: the trust root, and a bundle verified under an identity policy (offline or online).

Imports no torch; the sigstore package is imported only when a bundle or trust root is checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kvgraft._internal import jsonio
from kvgraft._internal.digest import sha256_hex
from kvgraft.errors import InputError, VerificationError
from kvgraft.release.hashing import hash_file
from kvgraft.signing import attest

if TYPE_CHECKING:
    from sigstore.verify import Verifier

MAX_TRUST_BYTES = 16 * 1024 * 1024


def _one_line(text: str) -> str:
    return " ".join(text.split())



@dataclass(frozen=True)
class SigstoreTrust:
    """Which Sigstore root of trust: production (default), staging, or a trusted-root file.

    `offline` uses the trusted root embedded in sigstore-python (or its local TUF cache) instead of
    refreshing it over the network. `trusted_root` is a TrustedRoot or ClientTrustConfig JSON file.
    """

    staging: bool = False
    offline: bool = False
    trusted_root: Path | None = None


@dataclass(frozen=True)
class SigstoreVerified:
    """A bundle that passed Sigstore verification under an identity policy."""

    identity: str
    issuer: str
    payload_type: str | None  # DSSE bundles: the verified envelope's payload
    payload: bytes | None


def sigstore_verifier(trust: SigstoreTrust) -> Verifier:
    """A sigstore `Verifier` for `trust`; a trust root that cannot be loaded is unusable input."""
    from sigstore.errors import Error as SigstoreError
    from sigstore.models import ClientTrustConfig, TrustedRoot
    from sigstore.verify import Verifier

    try:
        if trust.trusted_root is not None:
            if trust.staging:
                raise InputError("give --trusted-root or --staging, not both")
            path = Path(trust.trusted_root)
            raw = jsonio.read_bounded(path, MAX_TRUST_BYTES, "JSON")
            doc = jsonio.loads_strict(raw, str(path))
            media_type = doc.get("mediaType", "") if isinstance(doc, dict) else ""
            kind = media_type if isinstance(media_type, str) else ""  # any other JSON value: refused below
            if kind.startswith("application/vnd.dev.sigstore.clienttrustconfig"):
                root = ClientTrustConfig.from_json(raw.decode()).trusted_root
            elif kind.startswith("application/vnd.dev.sigstore.trustedroot"):
                root = TrustedRoot.from_file(str(path))
            else:
                raise InputError(f"{path}: not a Sigstore trusted root or client trust config (mediaType {media_type!r})")
            return Verifier(trusted_root=root)
        if trust.staging:
            return Verifier.staging(offline=trust.offline)
        return Verifier.production(offline=trust.offline)
    except SigstoreError as exc:
        hint = "" if trust.offline or trust.trusted_root else " (pass --offline to use the embedded trusted root)"
        raise InputError(f"cannot load the Sigstore trusted root: {_one_line(exc.diagnostics())}{hint}") from None
    except ValueError as exc:  # pydantic validation of a trust file
        raise InputError(f"{trust.trusted_root}: not a valid Sigstore trust root: {_one_line(str(exc))[:300]}") from None


def verify_sigstore_bundle(artifact: bytes | Path | None, bundle: bytes, *, identity: str, issuer: str,
                           trust: SigstoreTrust | None = None, where: str = "bundle") -> SigstoreVerified:
    """Verify a Sigstore bundle (and its artifact) under the policy "signed by `identity` via `issuer`".

    Checks the certificate chain to the trusted root, the identity policy, the transparency-log
    inclusion proof/promise and signed time, and the signature: over `artifact` for a message-
    signature bundle (`artifact` required), or over the DSSE envelope for a DSSE bundle, whose
    verified payload is returned (and, when `artifact` is given, must list its SHA-256 as a subject).
    Raises InputError for an unusable bundle or trust root, VerificationError when a check fails.
    """
    if len(bundle) > attest.MAX_BUNDLE_BYTES:
        raise InputError(f"{where}: {len(bundle)} bytes exceeds the {attest.MAX_BUNDLE_BYTES}-byte limit for a bundle")
    doc = jsonio.loads_strict(bundle, where)  # refuses duplicate keys before sigstore parses it
    if not isinstance(doc, dict):
        raise InputError(f"{where}: not a Sigstore bundle (not a JSON object)")

    from sigstore.errors import Error as SigstoreError
    from sigstore.hashes import Hashed
    from sigstore.models import Bundle, InvalidBundle
    from sigstore.verify import policy
    from sigstore_models.common.v1 import HashAlgorithm

    try:
        parsed = Bundle.from_json(bundle)
    except InvalidBundle as exc:
        raise InputError(f"{where}: not a valid Sigstore bundle: {_one_line(str(exc))[:300]}") from None
    except ValueError as exc:
        raise InputError(f"{where}: not a valid Sigstore bundle: {_one_line(str(exc))[:300]}") from None
    verifier = sigstore_verifier(trust or SigstoreTrust())
    rule = policy.Identity(identity=identity, issuer=issuer)
    payload_type: str | None = None
    payload: bytes | None = None
    try:
        if "dsseEnvelope" in doc:
            payload_type, payload = verifier.verify_dsse(parsed, rule)
        else:
            if artifact is None:
                raise InputError(f"{where}: a message-signature bundle is verified against its artifact; none given")
            if isinstance(artifact, Path):
                digest, _ = hash_file(artifact)
                hashed = Hashed(algorithm=HashAlgorithm.SHA2_256, digest=bytes.fromhex(digest))
                verifier.verify_artifact(hashed, parsed, rule)
            else:
                verifier.verify_artifact(artifact, parsed, rule)
    except SigstoreError as exc:
        raise VerificationError(f"{where}: Sigstore verification failed: {_one_line(str(exc))}") from None
    if payload is not None and artifact is not None:
        sha = hash_file(artifact)[0] if isinstance(artifact, Path) else sha256_hex(artifact)
        stmt = jsonio.loads_strict(payload, f"{where}: statement")
        listed = stmt.get("subject", []) if isinstance(stmt, dict) else []
        if not any(isinstance(s, dict) and isinstance(s.get("digest"), dict) and s["digest"].get("sha256") == sha
                   for s in listed):
            raise VerificationError(f"{where}: the artifact's sha256 {sha} is not a subject of the signed statement")
    return SigstoreVerified(identity, issuer, payload_type, payload)


def integrated_time(bundle: bytes) -> str | None:
    """The UTC time the transparency log integrated a bundle's signature (ISO 8601), read from a bundle that
    verification already accepted (it checked that time against the certificate); None where it states none."""
    import datetime

    doc = jsonio.loads_strict(bundle, "bundle")
    entries = doc.get("verificationMaterial", {}).get("tlogEntries") if isinstance(doc, dict) else None
    first = entries[0] if isinstance(entries, list) and entries and isinstance(entries[0], dict) else {}
    raw = first.get("integratedTime")
    if not isinstance(raw, (str, int)) or not str(raw).isdigit() or len(str(raw)) > 12:
        return None
    when = datetime.datetime.fromtimestamp(int(raw), tz=datetime.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")
