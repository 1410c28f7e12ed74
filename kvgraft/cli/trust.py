"""The trust options of every command that reads a release, declared once, and the one policy they make."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from kvgraft.signing.policy import VerifyPolicy

# The trust options every command that reads a release takes (verify, run, pull, audit recompute, sample and
# generalization): one declaration, so their names and help read the same everywhere.
KeysOpt = Annotated[list[Path] | None, typer.Option(
    "--key", "-k", metavar="PEM", help="PEM public key the signature must verify with; twice for two signers (the "
                                       "kvgraft bundle and model.sig), each signature verifying with one of them and "
                                       "each key verifying one.")]
IdentityOpt = Annotated[str | None, typer.Option("--certificate-identity", help="Sigstore: required signer identity.")]
IssuerOpt = Annotated[str | None, typer.Option("--certificate-oidc-issuer", help="Sigstore: required OIDC issuer.")]
OfflineOpt = Annotated[bool, typer.Option("--offline", help="Sigstore: the embedded or cached trust root.")]
RequireSignatureOpt = Annotated[bool, typer.Option(
    "--require-signature", help="Refuse a release that is unsigned or whose signature is not checked (--key or "
                                "Sigstore identity).")]
OmsSignatureOpt = Annotated[Path | None, typer.Option(
    "--oms-signature", help="A detached OpenSSF model signing signature of the folder, stored outside it.")]


@dataclass(frozen=True)
class Trust:
    """A command's trust options (--key, --certificate-identity, --certificate-oidc-issuer, --offline, --oms-signature,
    --require-signature; `verify`'s --staging and --trusted-root): `policy` is the one place they become a policy."""

    keys: list[Path] | None = None
    identity: str | None = None
    issuer: str | None = None
    offline: bool = False
    oms_signature: Path | None = None
    require_signature: bool = False
    staging: bool = False
    trusted_root: Path | None = None

    def policy(self) -> VerifyPolicy:
        """The policy `kvgraft verify` checks a release under with the same options; each key must verify one of the
        signatures, so a stray one fails."""
        from kvgraft.signing.policy import keys_policy
        from kvgraft.signing.sigstore import SigstoreTrust

        trust = SigstoreTrust(staging=self.staging, offline=self.offline, trusted_root=self.trusted_root)
        return keys_policy(self.keys, identity=self.identity, issuer=self.issuer, trust=trust,
                           require_signature=self.require_signature, oms_signature=self.oms_signature)
