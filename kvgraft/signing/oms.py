"""OpenSSF model signing (OMS) v1.0 signatures of a release folder, beside kvgraft's own attestation.

A release is a folder of files, which is what OMS signs: an in-toto Statement v1 whose predicate
(`https://model_signing/signature/v1.0`) lists every file of the folder with its SHA-256 ("resources",
sorted by name) and whose one subject, named after the folder, carries the SHA-256 over those digests'
raw bytes in that order; DSSE-signed and stored as a Sigstore bundle v0.3 at RELEASE/model.sig, the
name the `model_signing` CLI uses by default and leaves out of what it hashes.

kvgraft writes this file in addition to release.sigstore.json rather than making its own bundle
OMS-shaped: the kvgraft statement's predicate (root digest, model identity, entry and file counts) is
what kvgraft consumers check, and OMS verifiers reject predicates other than theirs. The OMS resources
include release.sigstore.json, so `model_signing verify` checks every byte of the folder.

Keys: OMS signs with ECDSA keys only, on P-256, P-384 or P-521 (the hash follows the curve: SHA-256,
SHA-384, SHA-512; kvgraft.signing.keys.CURVES); its
`publicKey.hint` is the SHA-256 of the public key's SubjectPublicKeyInfo PEM, which is kvgraft's key id
(`keys.key_id`), so a signer has one id in both signature files. An Ed25519 kvgraft key
writes no OMS signature. Nothing here imports torch or model_signing.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple, TypedDict

from cryptography.hazmat.primitives.asymmetric import ec

from kvgraft._internal import jsonio
from kvgraft._internal.digest import sha256_hex
from kvgraft.errors import InputError, VerificationError
from kvgraft.release.records import check_relpath
from kvgraft.signing import attest, keys

OMS_NAME = attest.OMS_NAME
PREDICATE_TYPE = "https://model_signing/signature/v1.0"
# What the model_signing CLI records when the signature lies inside the folder (its defaults).
IGNORE_PATHS = [".git", ".gitignore", ".github", OMS_NAME, ".gitattributes"]
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _root_digest(resources: list[tuple[str, str]]) -> str:
    return sha256_hex(b"".join(bytes.fromhex(digest) for _, digest in resources))


class Serialization(TypedDict):
    method: str
    hash_type: str
    allow_symlinks: bool
    ignore_paths: list[str]


class Resource(TypedDict):
    name: str
    algorithm: str
    digest: str


class Predicate(TypedDict):
    serialization: Serialization
    resources: list[Resource]


class Statement(TypedDict):
    """An in-toto Statement v1 with OpenSSF model signing v1.0's predicate."""

    _type: str
    subject: list[attest.Subject]
    predicateType: str
    predicate: Predicate


def statement(root: Path, digests: dict[str, str]) -> Statement:
    """The OMS v1.0 statement of a folder whose files (name -> sha256) are `digests` (a typed dict: its bytes, as
    json.dumps writes them, are what is signed)."""
    resources = sorted(digests.items())
    return {
        "_type": attest.STATEMENT_TYPE,
        "subject": [{"name": Path(root).resolve().name, "digest": {"sha256": _root_digest(resources)}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "serialization": {"method": "files", "hash_type": "sha256", "allow_symlinks": False,
                              "ignore_paths": IGNORE_PATHS},
            "resources": [{"name": n, "algorithm": "sha256", "digest": d} for n, d in resources],
        },
    }


def can_sign(key: keys.PrivateKey) -> bool:
    """Whether OMS v1.0 signs with this key (ECDSA only)."""
    return isinstance(key, ec.EllipticCurvePrivateKey)


def sign(root: Path, key: keys.PrivateKey, digests: dict[str, str], *, locked: bool = False) -> Path | None:
    """Write RELEASE/model.sig for files with these digests; None (nothing written) for a non-ECDSA key.
    `locked`: the caller holds the release's lock (the temp file lies beside the release)."""
    if not can_sign(key):
        return None
    payload = (json.dumps(statement(root, digests), indent=2) + "\n").encode()
    signature = keys.sign(key, attest.pae(attest.PAYLOAD_TYPE, payload))
    bundle = {
        "mediaType": attest.BUNDLE_MEDIA_TYPE,
        "verificationMaterial": {"publicKey": {"hint": keys.key_id(key)}, "tlogEntries": []},
        "dsseEnvelope": {"payload": base64.b64encode(payload).decode(), "payloadType": attest.PAYLOAD_TYPE,
                         "signatures": [{"sig": base64.b64encode(signature).decode()}]},
    }
    path = Path(root) / OMS_NAME
    jsonio.write_atomic(path, (json.dumps(bundle, indent=2) + "\n").encode(), owner=Path(root) if locked else None)
    return path


class OmsSignature(NamedTuple):
    """What `read` found in an OMS signature."""

    files: dict[str, str]  # its resources: name -> sha256
    verified_by: str | None  # the key id that verified it; None when no key was given
    sha256: str  # of the signature file's bytes
    ignored: tuple[str, ...]  # the paths its serialization says it leaves out (ignore_paths), release-relative


def read(path: Path, public_keys: Sequence[keys.PublicKey] | keys.PublicKey | None, advice: str = "",
         raw: bytes | None = None) -> OmsSignature:
    """Parse (strictly) and, with `public_keys`, verify an OMS signature with the first of them that does.
    `advice` ends the message when no key verifies it; `raw`: the file's bytes when already read.

    The statement's subject digest must be the one its resources imply, and the serialization must
    be the per-file SHA-256 one (the only one kvgraft can compare with a release's files).
    """
    where = str(path)
    if raw is None:  # `raw`: its bytes, already read (bounded) by the caller
        raw = jsonio.read_bounded(path, attest.MAX_BUNDLE_BYTES, "an OMS signature")
    bundle = attest.parse_bundle(raw, where)
    verified_by = None
    given = [] if public_keys is None else [public_keys] if not isinstance(public_keys, Sequence) else list(public_keys)
    if given:
        usable = [k for k in given if isinstance(k, ec.EllipticCurvePublicKey)]
        if not usable:
            raise VerificationError(f"{where}: an OMS signature is made with an ECDSA key; {keys.key_id(given[0])} "
                                    f"is not one")
        verified_by = attest.verify_with_any(bundle, usable, advice=advice)
    if bundle.payload_type != attest.PAYLOAD_TYPE:
        raise VerificationError(f"{where}: DSSE payloadType {bundle.payload_type!r} is not {attest.PAYLOAD_TYPE!r}")
    stmt = jsonio.loads_strict(bundle.payload, f"{where}: statement")
    if not isinstance(stmt, dict) or stmt.get("_type") != attest.STATEMENT_TYPE:
        raise VerificationError(f"{where}: not an in-toto Statement v1")
    if stmt.get("predicateType") != PREDICATE_TYPE:
        raise VerificationError(f"{where}: predicateType {stmt.get('predicateType')!r} is not {PREDICATE_TYPE!r}")
    predicate = stmt.get("predicate")
    subject = stmt.get("subject")
    if not isinstance(predicate, dict) or not isinstance(subject, list) or len(subject) != 1 or not isinstance(
            subject[0], dict) or not isinstance(subject[0].get("digest"), dict):
        raise InputError(f"{where}: an OMS statement has one subject and a predicate")
    serialization_ = predicate.get("serialization")
    if (not isinstance(serialization_, dict) or serialization_.get("method") != "files"
            or serialization_.get("hash_type") != "sha256"):
        raise VerificationError(f"{where}: only the OMS 'files' serialization with sha256 is read "
                                f"(found {serialization_!r:.200})")
    ignore_paths = serialization_.get("ignore_paths", [])
    if not isinstance(ignore_paths, list) or not all(isinstance(p, str) for p in ignore_paths):
        raise InputError(f"{where}: predicate.serialization.ignore_paths is not a list of strings")
    resources = predicate.get("resources")
    if not isinstance(resources, list):
        raise InputError(f"{where}: predicate.resources is not a list")
    listed: list[tuple[str, str]] = []
    for i, r in enumerate(resources):
        at = f"{where}: resource {i}"
        if not isinstance(r, dict) or r.get("algorithm") != "sha256" or not isinstance(r.get("digest"), str) \
                or not _SHA256.fullmatch(r["digest"]):
            raise InputError(f"{at}: expected a name, algorithm sha256 and a lowercase hex digest")
        listed.append((check_relpath(r.get("name"), at), r["digest"]))
    names = [n for n, _ in listed]
    if len(set(names)) != len(names):
        raise InputError(f"{where}: a resource is listed twice")
    if subject[0]["digest"].get("sha256") != _root_digest(listed):
        raise VerificationError(f"{where}: the subject digest does not match the digests of the listed resources")
    return OmsSignature(dict(listed), verified_by, sha256_hex(raw), _release_paths(ignore_paths))


def _release_paths(paths: list[str]) -> tuple[str, ...]:
    """The ignored paths that name something inside the folder; model_signing writes them relative to it. Any
    other ("." for the folder itself, an absolute path) excuses nothing: kvgraft only ever narrows what it accepts."""
    inside = []
    for p in paths:
        try:
            inside.append(check_relpath(p, "ignore_paths"))
        except InputError:
            continue
    return tuple(inside)
