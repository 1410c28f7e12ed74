"""Sign a release: check its bytes as verify does, then write its attestation (key or keyless) and OMS signature.

Above kvgraft.release.integrity (it refuses to sign a damaged release) and kvgraft.signing (the formats it
writes), so neither imports this one. Nothing here imports torch.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from kvgraft._internal import jsonio
from kvgraft._internal.digest import sha256_hex
from kvgraft.errors import Error, InputError
from kvgraft.release.format import ENTRIES_DIR, REPOSITORY_METADATA
from kvgraft.release.hashing import hash_file
from kvgraft.release.index import INDEX_DIR
from kvgraft.release.integrity import Beside, check_release
from kvgraft.release.records import MANIFEST, check_relpath, safe_path
from kvgraft.signing import oms
from kvgraft.signing.attest import (
    BUNDLE_NAME,
    OMS_NAME,
    PAYLOAD_TYPE,
    Statement,
    key_bundle,
    pae,
    statement,
    statement_bytes,
    write_bundle,
)
from kvgraft.signing.keys import PrivateKey, algorithm_of, key_id
from kvgraft.signing.keys import sign as key_sign


@dataclass(frozen=True)
class Signed:
    """What `sign_release*` wrote."""

    bundle: Path
    statement: Statement
    signer: str  # key id, or the certificate identity for keyless signing
    oms: Path | None = None  # the OpenSSF model signing signature, when the key could make one
    files: int = 0  # the release's files checked before signing (what `kvgraft verify` counts), manifest.json included
    beside: tuple[str, ...] = ()  # files outside the manifest (a Hub card) that model.sig alone signs


def release_statement(root: Path) -> Statement:
    """Check the release's bytes (verify without a signature) and build its statement.

    A release whose files do not match its manifest is refused: signing it would attest damage.
    """
    return _checked_statement(root)[0]


def _checked_statement(root: Path) -> tuple[Statement, dict[str, str]]:
    """The statement, and every file's digest (manifest.json included), of a release whose bytes were checked."""
    checked = check_release(Path(root), keep_files=True)
    return statement(checked.manifest, checked.manifest_sha256, checked.manifest_size), checked.files


def _checked_folder(root: Path) -> tuple[Statement, dict[str, str], dict[str, str]]:
    """`_checked_statement`, and the files of the folder outside the manifest (a Hub card) with their digests.

    model_signing signs every file of a folder, and so does model.sig: a README.md beside manifest.json is
    signed, not refused. check_release refuses a file outside the manifest unless told to leave its path
    out, so the top-level paths that are not the release's own (manifest.json, entries/, index/) are left
    out: what the manifest lists is still required and checked, a stray file among the entries or the index
    is still refused, and the files check_release names as left out are hashed here, once.
    """
    root = Path(root)
    own = {MANIFEST, ENTRIES_DIR, INDEX_DIR, BUNDLE_NAME, OMS_NAME, *REPOSITORY_METADATA}
    tops = sorted(set(os.listdir(root)) - own) if jsonio.stat_or_none(root, follow=True) is not None else []
    checked = check_release(root, beside=Beside(f"OMS signature ({OMS_NAME})", excused=tuple(tops)), keep_files=True)
    beside = {name: _beside_digest(root, name) for name in checked.ignored}
    return statement(checked.manifest, checked.manifest_sha256, checked.manifest_size), checked.files, beside


def _beside_digest(root: Path, name: str) -> str:
    check_relpath(name, f"{root}: a file beside the release")  # model.sig lists it: verify reads the name back
    return hash_file(safe_path(root, name, "file beside the release"))[0]


def _refuse_unsigned_beside(root: Path, beside: dict[str, str], why: str) -> None:
    """A file beside the release that no signature would cover is refused before anything is written:
    `kvgraft verify` with the signer's key or identity refuses a file that no verified signature lists."""
    if beside:
        names = sorted(beside)
        more = f" (+{len(names) - 1} more)" if len(names) > 1 else ""
        raise InputError(f"{Path(root) / names[0]}{more}: beside the release, outside its manifest; {why}, and "
                         f"`kvgraft verify` refuses a file no verified signature lists: sign with an ECDSA key "
                         f"(kvgraft keygen --algorithm ecdsa-p256), or move the file out of the folder")


def sign_release(root: Path, key: PrivateKey) -> Signed:
    """Sign a release offline with a private key; write RELEASE/release.sigstore.json."""
    root = Path(root)
    # The release's own lock, as a capture of it holds: one writer of the release at a time, a second
    # `sign` (or a capture) refused at once; the signature files' temp files lie beside the release, never in it.
    with jsonio.OutputLock(root):
        return _sign_locked(root, key)


def _sign_locked(root: Path, key: PrivateKey) -> Signed:
    oms_path = root / OMS_NAME
    for name in (BUNDLE_NAME, OMS_NAME):
        jsonio.clear_leftovers(root / name)  # temp files an older kvgraft's killed sign left in the folder
    stmt, files, beside = _checked_folder(root)
    if not oms.can_sign(key):
        _refuse_unsigned_beside(root, beside, f"an {algorithm_of(key)} key writes no OpenSSF model signing "
                                              f"signature ({OMS_NAME}) to sign it")
    payload = statement_bytes(stmt)
    signature = key_sign(key, pae(PAYLOAD_TYPE, payload))
    kid = key_id(key)
    data = (json.dumps(key_bundle(payload, signature, kid), indent=2) + "\n").encode()
    # model.sig names the bundle's digest: beside another bundle it verifies with no key. Removed before the
    # bundle is replaced, every state a kill leaves verifies with the old key or the new one; when a write
    # is refused, the previous bundle and model.sig are put back (best effort: the disk may still refuse).
    bundle_path = root / BUNDLE_NAME
    before = {path: jsonio.read_bounded(path, jsonio.MAX_JSON_BYTES, "a signature") if path.is_file() else None
              for path in (oms_path, bundle_path)}
    with jsonio.writing(oms_path):
        oms_path.unlink(missing_ok=True)
    try:
        bundle = write_bundle(root, data, locked=True)
        # The OMS signature covers release.sigstore.json too, so it is written last (none for a key OMS
        # cannot use). It lists every file of the folder (format 2: the entry files too, which the statement
        # binds through the index shards), and those beside the release, which only it signs.
        written = oms.sign(root, key, {**beside, **files, BUNDLE_NAME: sha256_hex(data)}, locked=True)
    except BaseException:
        for path in (bundle_path, oms_path):
            with contextlib.suppress(OSError, Error):
                old = before[path]
                if old is None:
                    path.unlink(missing_ok=True)
                else:
                    jsonio.write_atomic(path, old, owner=root)
        raise
    return Signed(bundle, stmt, kid, written, len(files), tuple(sorted(beside)))


def sign_release_sigstore(root: Path, *, staging: bool = False, identity_token: str | None = None) -> Signed:
    """Sign a release keyless with Sigstore (Fulcio certificate + Rekor entry); needs the network.

    The OIDC identity is, in order: `identity_token` when given (a raw JWT); the ambient credential
    of a CI system (`sigstore.oidc.detect_credential`: GitHub Actions with `permissions: id-token:
    write`, GitLab, Buildkite, Google Cloud...); else an interactive browser flow with Sigstore's
    OAuth issuer (`sigstore.oidc.Issuer`). The statement is signed as a DSSE envelope by
    `Signer.sign_dsse`, logged in Rekor, and the returned bundle v0.3 is written to
    RELEASE/release.sigstore.json. Verify with `kvgraft verify RELEASE --certificate-identity ID
    --certificate-oidc-issuer URL` (see docs/ci-signing.md). `staging` uses Sigstore's staging
    instance (for tests; verify with --staging).
    """
    with jsonio.OutputLock(Path(root)):  # as sign_release: the whole sign, the signer's flow included
        return _sign_sigstore_locked(Path(root), staging, identity_token)


def _sign_sigstore_locked(root: Path, staging: bool, identity_token: str | None) -> Signed:
    from sigstore.dsse import Statement
    from sigstore.errors import Error as SigstoreError
    from sigstore.models import ClientTrustConfig
    from sigstore.oidc import IdentityToken, Issuer, detect_credential
    from sigstore.sign import SigningContext

    stmt, files, beside = _checked_folder(root)
    _refuse_unsigned_beside(root, beside, f"keyless signing writes no OpenSSF model signing signature "
                                          f"({OMS_NAME}) to sign it")
    payload = statement_bytes(stmt)
    try:
        config = ClientTrustConfig.staging() if staging else ClientTrustConfig.production()
        context = SigningContext.from_trust_config(config)
        raw_token = identity_token or detect_credential()
        token = (IdentityToken(raw_token) if raw_token
                 else Issuer(config.signing_config.get_oidc_url()).identity_token())
        with context.signer(token, cache=False) as signer:
            bundle = signer.sign_dsse(Statement(payload))
    except SigstoreError as exc:
        raise InputError(f"{root}: Sigstore signing failed: {' '.join(exc.diagnostics().split())}") from None
    except Exception as exc:  # network and OIDC errors of the underlying clients
        raise InputError(f"{root}: Sigstore signing failed: {type(exc).__name__}: {' '.join(str(exc).split())}") from None
    oms_path = root / OMS_NAME
    with jsonio.writing(oms_path):  # first: beside the new bundle it would verify with no key
        oms_path.unlink(missing_ok=True)
    written = write_bundle(root, bundle.to_json().encode(), locked=True)
    return Signed(written, stmt, str(token.identity), files=len(files))
