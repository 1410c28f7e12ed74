"""Verification policies: which signature a release must carry and whom it must name; its bytes are checked under every one.

In the style of sigstore-python's `sigstore.verify.policy`: one small frozen class per kind of policy, so
that a combination that means nothing (a Sigstore identity without its issuer, a key and an identity at
once, `--require-signature` with nothing to check the signature with) cannot be built. `verify_policy`
turns the command-line options into one, refusing those combinations with the messages the options
name; `kvgraft.signing.verify` checks a release under it. Policies compare by value: a release verified
under one policy is reused only under an equal one (`verify.verified`).

- `SignatureNotChecked`: no key, no identity. A bundle present is read and its statement must match
  the files (a stale bundle fails); an absent one, or an unchecked signature, is a recorded warning.
- `SignedWithKeys`: the signature(s) must verify with these keys, each key verifying one of them (two
  signers: `--key` given twice); an unsigned release fails.
- `SignedByIdentity`: the Sigstore bundle must name this certificate identity and OIDC issuer, under
  the trust root; an unsigned release fails.

- `OwnOutput`: a release kvgraft itself wrote in this process and reads back (an audit's controls
  library, a plan's captured release it does not sign): nothing to check a signature with, so its
  manifest, its statement when there is one, and each entry's bytes against its digests when read. It
  names why no signature is asked for; it is never what a command line's options give.

`require_signature` (keys or identity only): also fail when the signature that was read could not be
checked with what was given. `oms_signature`: a detached OpenSSF model signing signature, outside the folder.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from kvgraft.errors import InputError
from kvgraft.signing.sigstore import SigstoreTrust


class VerifyPolicy:
    """What every policy answers (the defaults are those of a policy that checks no signature)."""

    keys: tuple[Path, ...] = ()
    identity: str | None = None
    issuer: str | None = None
    trust: SigstoreTrust | None = None
    require_signature: bool = False
    oms_signature: Path | None = None

    @property
    def checks_signature(self) -> bool:
        return bool(self.keys) or self.identity is not None


@dataclass(frozen=True)
class SignatureNotChecked(VerifyPolicy):
    """No key and no identity: the statement is compared with the files; the signature is not checked."""

    oms_signature: Path | None = None


@dataclass(frozen=True)
class SignedWithKeys(VerifyPolicy):
    """Signed with these public keys (PEM files): every signature must verify with one, every key verify one."""

    keys: tuple[Path, ...]
    require_signature: bool = False
    oms_signature: Path | None = None

    def __post_init__(self) -> None:
        if not self.keys:
            raise InputError("a key policy needs at least one --key")


@dataclass(frozen=True)
class SignedByIdentity(VerifyPolicy):
    """Signed keylessly through Sigstore by this certificate identity (SAN) and OIDC issuer."""

    identity: str
    issuer: str
    trust: SigstoreTrust | None = None
    require_signature: bool = False
    oms_signature: Path | None = None


@dataclass(frozen=True)
class OwnOutput(VerifyPolicy):
    """A release kvgraft wrote in this process (`made_by` says what wrote it) and reads back: digests only.

    Checked as `SignatureNotChecked` checks (the manifest, a statement when present, every entry's bytes
    when read); a class of its own so that the `VerifiedRelease` says why no signature was asked for."""

    made_by: str


def verify_policy(*, key: Path | None = None, more_keys: tuple[Path, ...] = (), identity: str | None = None,
                  issuer: str | None = None, trust: SigstoreTrust | None = None, require_signature: bool = False,
                  oms_signature: Path | None = None) -> VerifyPolicy:
    """The policy the options ask for (`kvgraft verify`, `run`, `audit recompute`, the library's `key=`);
    InputError (exit 2) for a combination that means nothing."""
    if (identity is None) != (issuer is None):
        raise InputError("--certificate-identity and --certificate-oidc-issuer must be given together")
    if more_keys and key is None:
        raise InputError("more keys given without a first one")
    if key is not None and identity is not None:
        raise InputError("give --key or --certificate-identity/--certificate-oidc-issuer, not both")
    if key is not None:
        return SignedWithKeys((key, *more_keys), require_signature=require_signature, oms_signature=oms_signature)
    if identity is not None and issuer is not None:
        return SignedByIdentity(identity, issuer, trust, require_signature=require_signature, oms_signature=oms_signature)
    if require_signature:
        raise InputError("--require-signature needs --key or --certificate-identity/--certificate-oidc-issuer "
                         "to check the signature with")
    return SignatureNotChecked(oms_signature=oms_signature)


def keys_policy(keys: Sequence[Path] | None, **options: Any) -> VerifyPolicy:
    """`verify_policy` for the keys a command line gave (--key, repeatable): one rule for every command that
    verifies (`verify`, `run`, `audit recompute`): each key must verify one of the release's signatures."""
    given = list(keys or [])
    return verify_policy(key=given[0] if given else None, more_keys=tuple(given[1:]), **options)


# ------------------------------------------------------------------------------------------------ scopes
# What a verification reads of a release, beside its signatures (kvgraft.signing.verify.verify).


ScopeName = Literal["open", "all", "entries", "sample"]


class Scope:
    """How much of a release a verification reads; `name` is what `verify --json` states."""

    name: ClassVar[ScopeName] = "open"


@dataclass(frozen=True)
class Opening(Scope):
    """The signatures, the statement and the manifest (format 2: its index's commitments); no entry byte."""

    name = "open"


@dataclass(frozen=True)
class Everything(Scope):
    """Every file of the folder: sizes, digests, headers; `deep`: every tensor's digest too."""

    deep: bool = False
    name = "all"


@dataclass(frozen=True)
class Entries(Scope):
    """What opening checks, then these entries' files only (size, SHA-256, header; `deep`: every tensor)."""

    ids: tuple[str, ...]
    deep: bool = False
    name = "entries"


@dataclass(frozen=True)
class Sample(Scope):
    """What opening checks, every index record, then the files of `size` entries drawn from the root digest and
    `nonce` (a fresh one when None), as a sampled audit draws them, every tensor re-hashed."""

    size: int
    nonce: str | None = None
    name = "sample"


OPEN = Opening()
ALL = Everything()


def scope_of(*, deep: bool = False, entries: Sequence[str] | None = None, sample: int | None = None,
             nonce: str | None = None) -> Scope:
    """The scope `kvgraft verify`'s options ask for (--deep, --entry, --sample, --nonce)."""
    if sample is not None:
        if entries is not None:
            raise InputError("--sample and --entry exclude each other: a chosen subset bounds nothing")
        return Sample(sample, nonce)
    if nonce is not None:
        raise InputError("--nonce draws a sample: pass --sample N too")
    if entries is not None:
        return Entries(tuple(entries), deep)
    return Everything(deep)
