"""Release attestations: an in-toto Statement v1 in a DSSE envelope, stored as a Sigstore bundle v0.3.

The statement's subjects are `manifest.json` and every file the manifest lists (name: the path in
the release, digest: SHA-256 of its bytes); its predicate (`PREDICATE_TYPE`, JSON Schema in
schemas/release-attestation-predicate.v1.json) repeats the manifest digest and names the release
root digest and the model identity. The statement bytes are RFC 8785 canonical JSON. The DSSE
signature is over the pre-authentication encoding PAE(payloadType, payload) of the DSSE v1 spec.

The bundle lives at RELEASE/release.sigstore.json and is not itself a subject. Two kinds:

* key-signed (`kvgraft.signing.sign.sign_release`): `verificationMaterial.publicKey.hint` is the key id
  (`kvgraft.signing.keys.key_id`: hex SHA-256 of the public key PEM) and `tlogEntries` is empty; offline, no
  Sigstore services.
* keyless (`kvgraft.signing.sign.sign_release_sigstore`): Sigstore's Fulcio certificate and Rekor entry, made by
  sigstore-python's `Signer.sign_dsse`; needs the network and an OIDC identity.

Nothing here imports torch.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict, cast

from kvgraft import __version__
from kvgraft._internal import jsonio
from kvgraft.errors import InputError, VerificationError
from kvgraft.release.format import FORMAT
from kvgraft.release.models import Identity, Manifest
from kvgraft.release.records import MANIFEST, check_relpath
from kvgraft.results.base import JsonObject
from kvgraft.schema import validate
from kvgraft.signing.keys import PublicKey, der_fingerprint, key_id
from kvgraft.signing.keys import verify as key_verify

# The release's two signature files: kvgraft's bundle, and an OpenSSF model signing v1.0 signature of the
# folder (kvgraft.signing.oms). The folder layout keeps them beside the manifest, no part of the release
# (release.format.SIDE_FILES, which every reader of a folder skips).
BUNDLE_NAME = "release.sigstore.json"
OMS_NAME = "model.sig"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://kvgraft.dev/attestation/cache-release/v1"
PREDICATE_SCHEMA = "release-attestation-predicate.v1.json"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
BUNDLE_MEDIA_TYPES = (
    "application/vnd.dev.sigstore.bundle.v0.3+json",
    "application/vnd.dev.sigstore.bundle+json;version=0.3",
    "application/vnd.dev.sigstore.bundle+json;version=0.2",
    "application/vnd.dev.sigstore.bundle+json;version=0.1",
)
MAX_BUNDLE_BYTES = 64 * 1024 * 1024
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding: "DSSEv1" SP len(type) SP type SP len(body) SP body."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


# ---------------------------------------------------------------------------------------- statement
# Typed dicts, not models: the statement's bytes are signed, and a dict is what is canonicalized (RFC 8785) and read
# back, member for member.


class Digest(TypedDict):
    sha256: str


class Subject(TypedDict):
    name: str
    digest: Digest


class ManifestFile(TypedDict):
    name: str
    sha256: str
    size: int


class PredicateModel(TypedDict):
    spec: str
    architecture: str
    model_type: str
    identity: Identity  # the manifest's model.identity, copied verbatim


class Predicate(TypedDict):
    """schemas/release-attestation-predicate.v1.json"""

    release_format: str
    format_version: int
    manifest: ManifestFile
    root_digest: str
    model: PredicateModel
    num_entries: int
    num_files: int
    kvgraft_version: str


class Statement(TypedDict):
    """An in-toto Statement v1 whose predicate is kvgraft's."""

    _type: str
    subject: list[Subject]
    predicateType: str
    predicate: Predicate


def statement(manifest: Manifest, manifest_sha256: str, manifest_size: int) -> Statement:
    """The in-toto Statement v1 of a release whose manifest file has this digest and size."""
    subjects = [Subject(name=MANIFEST, digest=Digest(sha256=manifest_sha256))]
    subjects += [Subject(name=name, digest=Digest(sha256=sha)) for name, sha in sorted(subject_files(manifest).items())]
    model = manifest["model"]
    predicate: Predicate = {
        "release_format": FORMAT,
        "format_version": manifest["format_version"],
        "manifest": {"name": MANIFEST, "sha256": manifest_sha256, "size": manifest_size},
        "root_digest": manifest["root_digest"],
        "model": {"spec": model["spec"], "architecture": model["architecture"], "model_type": model["model_type"],
                  "identity": model["identity"].copy()},
        "num_entries": len(manifest["entries"]) if manifest["format_version"] == 1 else manifest["index"]["entries"],
        "num_files": len(subjects),
        "kvgraft_version": __version__,
    }
    return {"_type": STATEMENT_TYPE, "subject": subjects, "predicateType": PREDICATE_TYPE, "predicate": predicate}


def predicate_check(root: Path, stmt: Statement, source: str) -> Callable[[Manifest, str, int], None]:
    """What a statement says beyond its subjects, as a check of the parsed manifest (manifest, its sha256, its
    size; kvgraft.release.integrity.ManifestCheck): every member its predicate states must be what the manifest
    implies; only the version of the kvgraft that signed is the signer's own. `source` names the statement."""

    def check(manifest: Manifest, msha: str, msize: int) -> None:
        claimed = stmt["predicate"]
        implied = statement(manifest, msha, msize)["predicate"]
        for what in sorted((set(claimed) | set(implied)) - {"kvgraft_version"}):
            if claimed.get(what) != implied.get(what):
                raise VerificationError(f"{root / MANIFEST}: the {source} predicate's {what} {_brief(claimed.get(what))} "
                                        f"does not match the manifest ({_brief(implied.get(what))})")

    return check


def _brief(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=True)
    return text if len(text) <= 200 else text[:200] + "..."


def subject_files(manifest: Manifest) -> dict[str, str]:
    """name -> sha256 of the files a statement lists beside manifest.json: every file of a format-1
    release; the index files (shards, prefix index) of a format-2 one, whose records bind the entry files."""
    if manifest["format_version"] == 1:
        return {name: f["sha256"] for name, f in manifest["files"].items()}
    index = manifest["index"]
    files = {s["file"]: s["sha256"] for s in index["shards"]}
    if "prefix" in index:
        files[index["prefix"]["file"]] = index["prefix"]["sha256"]
    return files


def statement_bytes(stmt: Statement | JsonObject) -> bytes:
    """The DSSE payload: RFC 8785 canonical JSON of the statement (a release's, or another in-toto statement: a
    report's)."""
    return jsonio.canonical(stmt)


def parse_statement(payload_type: str, payload: bytes, where: str) -> Statement:
    """Parse and check a release statement (strict JSON, safe subject names, our predicate)."""
    if payload_type != PAYLOAD_TYPE:
        raise VerificationError(f"{where}: DSSE payloadType {payload_type!r} is not {PAYLOAD_TYPE!r}")
    doc = jsonio.loads_strict(payload, f"{where}: statement")
    if not isinstance(doc, dict):
        raise InputError(f"{where}: statement is not a JSON object")
    if doc.get("_type") != STATEMENT_TYPE:
        raise VerificationError(f"{where}: statement _type {doc.get('_type')!r} is not {STATEMENT_TYPE!r}")
    if doc.get("predicateType") != PREDICATE_TYPE:
        raise VerificationError(f"{where}: predicateType {doc.get('predicateType')!r} is not a kvgraft release "
                                f"attestation ({PREDICATE_TYPE})")
    subject = doc.get("subject")
    if not isinstance(subject, list) or not subject:
        raise InputError(f"{where}: statement has no subjects")
    seen: set[str] = set()
    for i, s in enumerate(subject):
        at = f"{where}: statement subject {i}"
        if not isinstance(s, dict) or not isinstance(s.get("digest"), dict):
            raise InputError(f"{at}: expected an object with name and digest")
        name = check_relpath(s.get("name"), at)
        if name in seen:
            raise InputError(f"{at}: {name!r} is listed twice")
        seen.add(name)
        sha = s["digest"].get("sha256")
        if not isinstance(sha, str) or not _SHA256.fullmatch(sha):
            raise InputError(f"{at}: {name!r} has no lowercase hex sha256 digest")
    validate(doc.get("predicate"), PREDICATE_SCHEMA, f"{where}: statement predicate")
    return cast(Statement, doc)  # its type, subjects and predicate checked above


def subjects(stmt: Statement) -> dict[str, str]:
    """name -> sha256 of a parsed statement."""
    return {s["name"]: s["digest"]["sha256"] for s in stmt["subject"]}


# ------------------------------------------------------------------------------------------- bundle


@dataclass(frozen=True)
class Bundle:
    """The parts of a release bundle kvgraft reads itself (Sigstore checks use the raw bytes)."""

    where: str
    raw: bytes
    material: JsonObject  # its verificationMaterial (members checked; a certificate's read where it is shown)
    media_type: str
    payload_type: str
    payload: bytes
    signature: bytes
    keyid: str | None  # the DSSE signature's keyid, if any
    key_hint: str | None  # verificationMaterial.publicKey.hint: a key-signed bundle
    has_certificate: bool  # a Sigstore (keyless) bundle


def _b64(value: Any, where: str) -> bytes:
    """Canonical standard base64 only (RFC 4648 section 4, padded, no line breaks, zero pad bits):
    anything else decodes to the same bytes from more than one text, making the bundle malleable."""
    if not isinstance(value, str):
        raise InputError(f"{where}: expected a base64 string")
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise VerificationError(f"{where}: is not valid base64") from None
    if base64.b64encode(data).decode() != value:
        raise VerificationError(f"{where}: is not canonical base64 (padding, pad bits or alphabet)")
    return data


# Members of a Sigstore bundle v0.3 (protobuf-specs, JSON mapping) on the path kvgraft reads; protobuf
# JSON parsing refuses any other member, and so does kvgraft. Certificate and transparency-log members
# are left to sigstore-python, which parses them with its own models.
_BUNDLE_MEMBERS = {"mediaType", "verificationMaterial", "dsseEnvelope", "messageSignature"}
_MATERIAL_MEMBERS = {"publicKey", "x509CertificateChain", "certificate", "tlogEntries", "timestampVerificationData"}
_ENVELOPE_MEMBERS = {"payload", "payloadType", "signatures"}
_SIGNATURE_MEMBERS = {"sig", "keyid"}


def _members(names: Iterable[str], allowed: set[str], where: str) -> None:
    """Refuse a JSON object (its member `names`) with a member outside `allowed`."""
    unknown = sorted(set(names) - allowed)
    if unknown:
        raise InputError(f"{where}: unknown member {unknown[0]!r} (a Sigstore bundle v0.3 has none)")


def parse_bundle(raw: bytes, where: str) -> Bundle:
    """Strictly parse a release bundle: Sigstore bundle JSON carrying a DSSE envelope."""
    if len(raw) > MAX_BUNDLE_BYTES:
        raise InputError(f"{where}: {len(raw)} bytes exceeds the {MAX_BUNDLE_BYTES}-byte limit for a bundle")
    doc = jsonio.loads_strict(raw, where)
    if not isinstance(doc, dict):
        raise InputError(f"{where}: not a Sigstore bundle (not a JSON object)")
    _members(doc, _BUNDLE_MEMBERS, where)
    media_type = doc.get("mediaType")
    if media_type not in BUNDLE_MEDIA_TYPES:
        raise InputError(f"{where}: not a Sigstore bundle (mediaType {media_type!r})")
    material = doc.get("verificationMaterial")
    if not isinstance(material, dict):
        raise InputError(f"{where}: bundle has no verificationMaterial")
    _members(material, _MATERIAL_MEMBERS, f"{where}: verificationMaterial")
    envelope = doc.get("dsseEnvelope")
    if not isinstance(envelope, dict) or "messageSignature" in doc:
        raise InputError(f"{where}: bundle has no dsseEnvelope; a release attestation is a DSSE-signed statement")
    _members(envelope, _ENVELOPE_MEMBERS, f"{where}: dsseEnvelope")
    payload_type = envelope.get("payloadType")
    if not isinstance(payload_type, str):
        raise InputError(f"{where}: dsseEnvelope.payloadType is missing")
    sigs = envelope.get("signatures")
    if not isinstance(sigs, list) or len(sigs) != 1 or not isinstance(sigs[0], dict):
        count = len(sigs) if isinstance(sigs, list) else 0
        raise VerificationError(f"{where}: dsseEnvelope must carry exactly one signature (found {count})")
    _members(sigs[0], _SIGNATURE_MEMBERS, f"{where}: dsseEnvelope.signatures[0]")
    signature = _b64(sigs[0].get("sig"), f"{where}: dsseEnvelope.signatures[0].sig")
    if not signature:
        raise VerificationError(f"{where}: dsseEnvelope.signatures[0].sig is empty")
    keyid = sigs[0].get("keyid")
    if keyid is not None and not isinstance(keyid, str):
        raise InputError(f"{where}: dsseEnvelope.signatures[0].keyid is not a string")
    public_key = material.get("publicKey")
    hint = public_key.get("hint") if isinstance(public_key, dict) else None
    has_certificate = "certificate" in material or "x509CertificateChain" in material
    if has_certificate == (public_key is not None):
        raise InputError(f"{where}: verificationMaterial needs exactly one of publicKey or a certificate")
    if public_key is not None:
        if not isinstance(public_key, dict) or not isinstance(hint, str):
            raise InputError(f"{where}: verificationMaterial.publicKey must be an object with a string hint")
        _members(public_key, {"hint"}, f"{where}: verificationMaterial.publicKey")
        # kvgraft checks no log entry or timestamp for a key-signed bundle: unverified bytes are refused
        # rather than carried along as if they meant something.
        if material.get("tlogEntries") or material.get("timestampVerificationData"):
            raise InputError(f"{where}: a key-signed bundle carries transparency-log entries or timestamps "
                             f"that kvgraft does not verify")
    return Bundle(where=where, raw=raw, material=material, media_type=media_type, payload_type=payload_type,
                  payload=_b64(envelope.get("payload"), f"{where}: dsseEnvelope.payload"), signature=signature,
                  keyid=keyid, key_hint=hint, has_certificate=has_certificate)


def read_bundle(path: Path) -> Bundle:
    """Read RELEASE/release.sigstore.json with its size bounded before reading."""
    return parse_bundle(jsonio.read_bounded(path, MAX_BUNDLE_BYTES, "a bundle"), str(path))


class _PublicKey(TypedDict):
    hint: str


class _Material(TypedDict):
    publicKey: _PublicKey
    tlogEntries: list[JsonObject]


class _DsseSignature(TypedDict):
    sig: str
    keyid: str


class _Envelope(TypedDict):
    payload: str
    payloadType: str
    signatures: list[_DsseSignature]


class KeyBundle(TypedDict):
    """A key-signed Sigstore bundle v0.3 as kvgraft writes it (protobuf-specs' JSON mapping)."""

    mediaType: str
    verificationMaterial: _Material
    dsseEnvelope: _Envelope


def key_bundle(payload: bytes, signature: bytes, hint: str) -> KeyBundle:
    """A Sigstore bundle v0.3 for a key-signed DSSE envelope (no certificate, no transparency log)."""
    return {
        "mediaType": BUNDLE_MEDIA_TYPE,
        "verificationMaterial": {"publicKey": {"hint": hint}, "tlogEntries": []},
        "dsseEnvelope": {
            "payload": base64.b64encode(payload).decode(),
            "payloadType": PAYLOAD_TYPE,
            "signatures": [{"sig": base64.b64encode(signature).decode(), "keyid": hint}],
        },
    }


def write_bundle(root: Path, data: bytes, *, locked: bool = False) -> Path:
    """Write RELEASE/release.sigstore.json atomically (`locked`: the caller holds the release's lock; the temp
    file lies beside the release)."""
    path = Path(root) / BUNDLE_NAME
    if path.is_symlink():
        raise InputError(f"{path}: is a symlink; releases may not contain links")
    jsonio.write_atomic(path, data, owner=Path(root) if locked else None)  # 0644: published with the release
    return path


def verify_with_key(bundle: Bundle, key: PublicKey) -> str:
    """Check the DSSE signature of a key-signed bundle with `key`; return the key id. The bundle's hint
    may name the key by its key id or by the DER fingerprint older kvgraft bundles carry."""
    kid = key_id(key)
    if bundle.has_certificate:
        raise VerificationError(f"{bundle.where}: the release is signed keyless with a Sigstore certificate, not a key; "
                                f"verify it with --certificate-identity and --certificate-oidc-issuer")
    if not key_verify(key, bundle.signature, pae(bundle.payload_type, bundle.payload)):
        named = f" (the bundle names key {bundle.key_hint})" if bundle.key_hint and bundle.key_hint != kid else ""
        raise VerificationError(f"{bundle.where}: DSSE signature does not verify with key {kid}{named}")
    # The hint and keyid are outside what is signed: they must name the key that verified, or say nothing.
    for what, value in (("verificationMaterial.publicKey.hint", bundle.key_hint), ("dsseEnvelope keyid", bundle.keyid)):
        if value not in (None, "", kid, der_fingerprint(key)):
            raise VerificationError(f"{bundle.where}: {what} {value!r} names another key than {kid}, which verified it")
    return kid


def verify_with_any(bundle: Bundle, public_keys: Sequence[PublicKey], *, advice: str = "") -> str:
    """`verify_with_key` with the first of `public_keys` that verifies the bundle; return its key id.

    Signing keys are tried in turn (a verification costs well under a millisecond), not picked by the
    bundle's hint: the hint is outside what is signed. `advice` ends the message when none verifies.
    """
    if len(public_keys) == 1:
        try:
            return verify_with_key(bundle, public_keys[0])
        except VerificationError as exc:
            raise VerificationError(f"{exc}{advice}") from None
    for key in public_keys:
        try:
            return verify_with_key(bundle, key)
        except VerificationError:
            if bundle.has_certificate:
                raise
    ids = ", ".join(key_id(k) for k in public_keys)
    named = f" (the bundle names key {bundle.key_hint})" if bundle.key_hint else ""
    raise VerificationError(f"{bundle.where}: DSSE signature does not verify with any key given ({ids}){named}{advice}")
