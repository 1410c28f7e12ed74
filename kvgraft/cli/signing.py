"""The signing commands: `keygen`, `sign` and `verify` a release. None of them imports torch."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from kvgraft.cli._base import EXIT_INTERNAL, ReleaseArg, _state, app, echo_json, handled, say
from kvgraft.cli.trust import IdentityOpt, IssuerOpt, KeysOpt, OmsSignatureOpt, RequireSignatureOpt, Trust
from kvgraft.errors import Error, InputError

if TYPE_CHECKING:
    from kvgraft.signing.keys import PrivateKey
    from kvgraft.signing.sign import Signed
    from kvgraft.signing.verify import VerifyResult

PassphraseEnvOpt = Annotated[
    str | None, typer.Option("--passphrase-env", metavar="VAR", help="Read the key passphrase from environment variable VAR.")]


def _bytes(n: float) -> str:
    """A byte count with the unit that shows its digits (3.1 MiB, not 0.00 GiB)."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} bytes"


def _quiet_sigstore() -> None:
    """sigstore logs advisories (e.g. "TUF repository is loaded in offline mode") on stderr, where a
    failed verification must leave exactly one line; --verbose keeps them."""
    if not _state["verbose"]:
        logging.getLogger("sigstore").setLevel(logging.ERROR)


def _passphrase_from_env(var: str) -> bytes:
    value = os.environ.get(var)
    if value is None:
        raise InputError(f"--passphrase-env {var}: the environment variable is not set")
    return value.encode()


@app.command()
@handled
def keygen(
    out_prefix: Annotated[Path, typer.Option("--out", "-o", help="Writes PREFIX.key.pem (private) and PREFIX.pub.pem.")],
    algorithm: Annotated[str, typer.Option("--algorithm", "-a", help="ecdsa-p256 (default) or ed25519.")] = "ecdsa-p256",
    passphrase_env: PassphraseEnvOpt = None,
    prompt: Annotated[bool, typer.Option("--passphrase", help="Prompt for a passphrase to encrypt the private key.")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace existing key files.")] = False,
) -> None:
    """Generate a signing key pair for `kvgraft sign --key` (PEM; encrypted when a passphrase is given)."""
    from kvgraft._internal.jsonio import check_writable
    from kvgraft.signing.keys import KEY_ID_IS, key_id, load_public_key, write_keypair

    check_writable(out_prefix)
    passphrase: bytes | None = None
    if passphrase_env is not None:
        passphrase = _passphrase_from_env(passphrase_env)
    elif prompt:
        passphrase = typer.prompt("passphrase", hide_input=True, confirmation_prompt=True, err=True).encode()
    private, public = write_keypair(out_prefix, algorithm=algorithm, passphrase=passphrase, overwrite=overwrite)
    state = "encrypted" if passphrase else "NOT encrypted"
    say(f"private key {private} ({algorithm}, {state}; keep it secret)")
    say(f"public key  {public} (key id {key_id(load_public_key(public))}: {KEY_ID_IS})")


SignKeyOpt = Annotated[Path | None, typer.Option("--key", "-k", help="PEM private key (offline signing).")]
SigstoreOpt = Annotated[bool, typer.Option("--sigstore", help="Keyless signing with Sigstore (online, OIDC).")]
SignStagingOpt = Annotated[bool, typer.Option("--staging", help="Use Sigstore's staging instance.")]
IdentityTokenOpt = Annotated[str | None, typer.Option(
    "--identity-token", envvar="SIGSTORE_IDENTITY_TOKEN",
    help="An OIDC token for keyless signing (default: the CI's ambient credential, else a browser flow).")]


@app.command()
@handled
def sign(
    release: Annotated[Path, typer.Argument(metavar="RELEASE", help="Cache release folder.")], key: SignKeyOpt = None,
    sigstore: SigstoreOpt = False, staging: SignStagingOpt = False, identity_token: IdentityTokenOpt = None,
    passphrase_env: PassphraseEnvOpt = None,
) -> None:
    """Attest a release: write RELEASE/release.sigstore.json (in-toto statement, DSSE, Sigstore bundle v0.3)."""
    from kvgraft._internal.jsonio import check_writable
    from kvgraft.signing import sign
    from kvgraft.signing.attest import BUNDLE_NAME

    _quiet_sigstore()
    if (key is None) == (not sigstore):
        raise InputError("give exactly one of --key KEY.pem or --sigstore")
    if staging and not sigstore:
        raise InputError("--staging goes with --sigstore")
    check_writable(release / BUNDLE_NAME)  # before the release is hashed
    check_writable(release)  # its lock and the signature files' temp files lie beside it
    if key is not None:
        signed = sign.sign_release(release, _private_key(key, passphrase_env))
    else:
        signed = sign.sign_release_sigstore(release, staging=staging, identity_token=identity_token)
    _say_signed(release, signed, by_key=key is not None)


def _private_key(key: Path, passphrase_env: str | None) -> PrivateKey:
    """The private key of `sign --key`: its passphrase from --passphrase-env, else asked for on a terminal."""
    from kvgraft.signing import keys

    passphrase = _passphrase_from_env(passphrase_env) if passphrase_env is not None else None
    try:
        return keys.load_private_key(key, passphrase)
    except keys.EncryptedKeyError:
        if not sys.stdin.isatty():
            raise InputError(f"{key}: the private key is encrypted; pass --passphrase-env VAR") from None
        return keys.load_private_key(key, typer.prompt("passphrase", hide_input=True, err=True).encode())


def _say_signed(release: Path, signed: Signed, *, by_key: bool) -> None:
    from kvgraft.signing.attest import OMS_NAME
    from kvgraft.signing.keys import KEY_ID_IS

    root_digest = signed.statement["predicate"]["root_digest"]
    # The files checked, as `kvgraft verify` counts them (the statement names fewer: format 2 binds the
    # entry files through the index files it names).
    say(f"signed {release} ({signed.files} files, root digest {root_digest})")
    say(f"signer {f'key {signed.signer} ({KEY_ID_IS})' if by_key else signed.signer}")
    say(f"bundle {signed.bundle}")
    if signed.oms is not None:
        say(f"oms    {signed.oms} (OpenSSF model signing v1.0: model_signing verify key --signature {signed.oms} "
            f"--public_key PUB.pem {release})")
    if signed.beside:  # every file of the folder is signed, as model_signing does: said, so a stray one is seen
        say(f"beside {', '.join(signed.beside[:5])}{' ...' if len(signed.beside) > 5 else ''} (outside the "
            f"manifest: signed by {OMS_NAME} only)")


TrustedRootOpt = Annotated[Path | None, typer.Option(
    "--trusted-root", help="Sigstore TrustedRoot or ClientTrustConfig JSON (instead of production/staging).")]
DeepOpt = Annotated[bool, typer.Option("--deep", help="Also read and hash every tensor again (the default pass checks each "
                                                      "tensor's sha256 as it reads its file).")]
VerifyEntriesOpt = Annotated[list[str] | None, typer.Option(
    "--entry", metavar="ID", help="Check the signature, the manifest and only this entry's file (repeatable).")]
VerifySampleOpt = Annotated[int | None, typer.Option(
    "--sample", metavar="N", help="Check the signature, the manifest and every index record, and the bytes of N entries "
                                  "drawn from the signed root digest and --nonce (the draw of `audit recompute --sample`); "
                                  "states the 95% bound on damaged entries.")]
VerifyNonceOpt = Annotated[str | None, typer.Option(
    "--nonce", metavar="X", help="The nonce the --sample draw uses, e.g. the commit id a CI job runs on (default: a fresh "
                                 "random one, printed).")]


@app.command()
@handled
def verify(
    release: ReleaseArg, key: KeysOpt = None, identity: IdentityOpt = None, issuer: IssuerOpt = None,
    trusted_root: TrustedRootOpt = None,
    staging: Annotated[bool, typer.Option("--staging", help="Sigstore staging trust root.")] = False,
    offline: Annotated[bool, typer.Option("--offline", help="No network: the embedded or cached trust root.")] = False,
    deep: DeepOpt = False, entry: VerifyEntriesOpt = None, sample: VerifySampleOpt = None, nonce: VerifyNonceOpt = None,
    require_signature: RequireSignatureOpt = False, oms_signature: OmsSignatureOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON (schemas/verify-result.v1.json).")] = False,
) -> None:
    """Verify a release's files, commitments and signature. Exit 0 verified, 1 failed, 2 unusable input."""
    from kvgraft.signing import verify as verification
    from kvgraft.signing.policy import scope_of

    _quiet_sigstore()
    trust = Trust(key, identity, issuer, offline, oms_signature, require_signature, staging, trusted_root)
    try:
        policy, scope = trust.policy(), scope_of(deep=deep, entries=entry or None, sample=sample, nonce=nonce)
        with verification.verify(release, policy, scope) as checked:
            result = checked.checked
    except Exception as exc:
        # The document and the exit status come from the same value: `handled` exits with this code.
        code, text = ((exc.exit_code, exc.diagnostics()) if isinstance(exc, Error)
                      else (EXIT_INTERNAL, f"internal error: {type(exc).__name__}: {exc}"))
        if as_json:
            echo_json(verification.failure(release, text, code).model_dump(mode="json", exclude_unset=True))
        raise
    if as_json:
        echo_json(result.document().model_dump(mode="json", exclude_unset=True))
        return
    _say_verified(release, result, deep=deep)


def _say_verified(release: str, result: VerifyResult, *, deep: bool) -> None:
    """`kvgraft verify`'s lines: what was checked, what no signature covers, the bytes hashed, the root digest."""
    say(f"verified {release}")
    say(f"  signature    {result.signature.describe()}")
    if result.sample is not None and result.bound is not None:
        from kvgraft.sampling import check_sentence

        s = result.sample
        say(f"  index        every index record of the {result.entries:,} entries checked against the manifest")
        say(f"  sample       {s.size:,} of {s.population:,} entries drawn from the root digest and nonce "
            f"{s.nonce!r} ({s.nonce_source}; {s.method}, the draw of `kvgraft audit sample RELEASE --nonce "
            f"{s.nonce} --size {s.size}`): every byte of their files checked, every tensor re-hashed "
            f"({', '.join(s.entries[:5])}{', ...' if s.size > 5 else ''})")
        say(f"  bound        {check_sentence(result.bound)}")
    elif result.scope == "entries":
        say(f"  entries      {len(result.checked_entries)} of {result.entries} checked ({', '.join(result.checked_entries[:5])}"
            f"{', ...' if len(result.checked_entries) > 5 else ''}), {result.tensors} tensors"
            f"{' (every tensor re-hashed)' if deep else ''}; the other entries' files were not read")
    else:
        say(f"  files        {result.files} files, {result.entries} entries, {result.tensors} tensors"
            f"{' (every tensor re-hashed)' if deep else ''}")
    ignored = result.signature.oms_ignored
    if ignored:  # accepted unhashed: what no signature covers is named where the result is read
        say(f"  ignored      {len(ignored):,} files the OMS signature says it ignores, not hashed, covered by no "
            f"signature: {', '.join(ignored[:5])}{', ...' if len(ignored) > 5 else ''}")
    say(f"  hashed       {_bytes(result.bytes_hashed)} in {result.seconds:.2f} s ({_bytes(result.throughput)}/s)")
    say(f"  root digest  {result.root_digest}")
    for warning in result.warnings:
        say(f"kvgraft: note: {warning}", error=True)
