"""A release's verification: what `kvgraft verify --json` prints and the verify check records."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field
from pydantic.config import JsonDict

from kvgraft.results.base import Closed, Count, Fraction, Open, Sha256, Typed, nullable
from kvgraft.results.stats import Draw

Checked = Literal["verified", "not checked"]


class SignatureFile(Closed):
    file: str
    kind: Literal["kvgraft", "oms"]
    sha256: str | None
    status: Checked
    key_id: str | None = Field(description="Key id (hex SHA-256 of the public key PEM) of the key that verified this "
                               "signature; null when it was not checked.")


class Signature(Closed):
    status: Checked
    method: Literal["key", "sigstore"] | None
    bundle: str | None = Field(description="Path of release.sigstore.json; null when the release has none.")
    bundle_sha256: str | None = Field(description="SHA-256 of the exact bundle bytes that were read and accepted; null "
                                      "when the release has none.")
    oms_signature: str | None = nullable(description="Path of an OpenSSF model signing v1.0 signature of the folder "
                                         "(model.sig), if present.")
    oms_sha256: str | None = nullable(description="SHA-256 of that signature file's bytes.")
    oms_verified: bool | None = Field(default=None, description="The OpenSSF model signing signature was checked with the key "
                                      "(else only its file list was compared with the files).")
    key_id: str | None = Field(description="Key id of the key that verified the signature: hex SHA-256 of its "
                               "SubjectPublicKeyInfo PEM (OpenSSF model signing's key hint).")
    identity: str | None = Field(description="Sigstore certificate identity required and found.")
    issuer: str | None = Field(description="OIDC issuer required and found.")
    signed_time: str | None = nullable(description="Sigstore: the UTC time the transparency log integrated the "
                                       "signature (ISO 8601), verified with it; null for a key signature, which "
                                       "states no time.")
    signatures: list[SignatureFile] | None = Field(default=None, description="Each signature file read (the kvgraft bundle, "
                                                   "an OpenSSF model signing signature): whether it was verified, and "
                                                   "with which key.")
    oms_beside_release: list[str] | None = Field(default=None, description="Files outside the manifest (a Hub card such as "
                                                 "README.md) that the OpenSSF model signing signature lists: hashed "
                                                 "and compared, signed by it only.")
    oms_ignored: list[str] | None = Field(default=None, description="Files outside the manifest in paths the OpenSSF model "
                                          "signing signature says it ignores (its ignore_paths): accepted, covered by "
                                          "no signature.")


class Sample(Draw):
    """verify --sample: the draw (kvgraft.sampling, method sha256-rank-v1), as a sampled recompute audit records it;
    `kvgraft audit sample RELEASE --nonce NONCE --size N` prints the same entries."""

    nonce_source: Literal["given", "drawn"]


class Bound(Open):
    """verify --sample: what the sample, none of it damaged, says of the release: the exact one-sided upper bound on
    damaged entries at `confidence`, and the exact probability that the sample would have held a damaged entry had
    `if_damaged_fraction` of the entries (if_damaged_entries, rounded up) been damaged (detection_at_least: that
    probability rounded down, as printed)."""

    confidence: float
    damaged: Literal[0]
    sampled: int = Field(ge=1)
    population: int = Field(ge=1)
    max_damaged_entries: Count
    max_damaged_fraction: Fraction
    method: str
    if_damaged_fraction: float
    if_damaged_entries: int = Field(ge=1)
    detection_probability: Fraction
    detection_at_least: str


class Model(Open):
    spec: str
    identity_sha256: Sha256


_OK_OR_NOT: JsonDict = {
    "if": {"properties": {"ok": {"const": True}}},
    "then": {"required": ["root_digest", "manifest_sha256", "model", "entries", "files", "tensors", "bytes_hashed",
                          "seconds", "deep", "statement", "signature"],
             "properties": {"exit_code": {"const": 0}, "error": {"const": None}}},
    "else": {"properties": {"exit_code": {"enum": [1, 2, 70]}, "error": {"type": "string"}}},
}


class VerifyResult(Open):
    """What `kvgraft verify RELEASE --json` prints on stdout. ok is true only when every check asked for passed (exit
    code 0). On failure, error is the one-line reason (the same line printed on stderr) and exit_code is 1
    (verification failed) or 2 (unusable input); the other members are then absent."""

    model_config = ConfigDict(json_schema_extra=_OK_OR_NOT)

    scope: Literal["all", "open", "entries", "sample"] | None = Field(
        default=None, description="all: every file; entries: the signature, statement, manifest and only the files of "
        "checked_entries; sample: the signature, statement, manifest, every index record, and the files of the drawn "
        "sample (checked_entries), every tensor re-hashed.")
    checked_entries: list[str] | None = Field(default=None, description="The entries whose files were checked (verify --entry, "
                                              "or the sample of verify --sample, in draw order).")
    sample: Sample | None = None
    bound: Bound | None = None
    format: Literal["kvgraft-verify-result"]
    format_version: Literal[1]
    kvgraft_version: str
    ok: bool
    exit_code: Literal[0, 1, 2, 70] = Field(description="The process exit status: 0 verified, 1 failed, 2 unusable "
                                            "input, 70 internal error.")
    error: str | None
    release: str = Field(description="The release folder as given.")
    root_digest: Sha256 | None = None
    manifest_sha256: Sha256 | None = None
    model: Model | None = None
    entries: Count | None = None
    files: int | None = Field(default=None, ge=1, description="Files checked, manifest.json included.")
    tensors: Count | None = None
    bytes_hashed: Count | None = None
    seconds: float | None = Field(default=None, ge=0)
    throughput_bytes_per_s: float | None = Field(default=None, ge=0)
    deep: bool | None = Field(default=None, description="Every tensor byte range was also re-hashed against its manifest "
                              "sha256.")
    warnings: list[str] | None = Field(default=None, description="What passed but deserves a look, e.g. an unsigned release.")
    statement: bool | None = Field(default=None, description="An in-toto statement was read from release.sigstore.json and "
                                   "compared with the files.")
    signature: Signature | None = None


_CHECKED_OR_NOT: JsonDict = {
    "if": {"properties": {"checked": {"const": True}}},
    "then": {"properties": {"method": {"enum": ["key", "sigstore"]}, "reason": {"type": "null"}}},
    "else": {"properties": {"method": {"type": "null"}, "reason": {"type": "string"}, "key_ids": {"maxItems": 0}}},
}


class ReleaseSignature(Closed):
    """What was checked of a release's signature before it was read (kvgraft.signing.verify.signature_statement): an
    audit report's release_signature, and a recompute or generalization result's."""

    model_config = ConfigDict(json_schema_extra=_CHECKED_OR_NOT)

    checked: bool
    method: Literal["key", "sigstore"] | None
    key_ids: list[Sha256]
    identity: str | None
    issuer: str | None
    signed_time: str | None
    reason: str | None = Field(description="Why the signature was not checked; null when it was.")


class ShownSignature(Open):
    status: str | None = None
    method: str | None = nullable()
    key_id: str | None = nullable()
    identity: str | None = nullable()
    issuer: str | None = nullable()
    bundle: str | None = nullable()


class VerifyData(Open):
    """A verify result as a report's check holds it, or any object with `ok`."""

    ok: bool
    error: str | None = nullable()
    root_digest: Sha256 | None = None
    details: list[str] | None = None
    entries: Count | None = None
    files: Count | None = None
    tensors: Count | None = None
    bytes_hashed: Count | None = None
    deep: bool | None = None
    warnings: list[str] | None = None
    signature: ShownSignature | None = None


TYPED = Typed("verify-result.v1.json", "kvgraft verify --json result, version 1", VerifyResult, VerifyData)
