"""Signed audit reports: an in-toto statement over report.json and the release attestation it audited.

The statement's subjects are the report file (its name and SHA-256) and the release's
`release.sigstore.json` (so the report is bound to exactly what it audited); its predicate
(`REPORT_PREDICATE_TYPE`) repeats the report digest, the verdict, the release root digest and the
plan digest. Signed like releases: DSSE in a Sigstore bundle v0.3, offline key or Sigstore keyless.
Nothing here imports torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, JsonValue

from kvgraft import __version__
from kvgraft._internal import jsonio
from kvgraft._internal.digest import sha256_hex
from kvgraft.errors import InputError, VerificationError
from kvgraft.release.hashing import hash_file
from kvgraft.results.base import Closed
from kvgraft.results.report import Binding, Report
from kvgraft.results.verify import ReleaseSignature
from kvgraft.signing import attest
from kvgraft.signing.keys import PrivateKey, key_id, load_public_key
from kvgraft.signing.keys import sign as key_sign

REPORT_PREDICATE_TYPE = "https://kvgraft.dev/attestation/audit-report/v1"
RELEASE_ATTESTATION = "release.sigstore.json"


def bundle_path(report: Path) -> Path:
    return report.with_name(report.name.removesuffix(".json") + ".sigstore.json")


class Digest(Closed):
    sha256: str


class Subject(Closed):
    name: str
    digest: Digest


class ReportFile(Closed):
    name: str
    sha256: str
    size: int


class PlanRef(Closed):
    name: str
    sha256: str | None


class ReportPredicate(Closed):
    """What a report's signature says beside the digests: the verdict, what was audited, under which plan."""

    report: ReportFile
    verdict: str
    release_root_digest: str | None
    release_attestation_digest: str | None
    plan: PlanRef
    kvgraft_version: str


class ReportStatement(Closed):
    """The in-toto statement a report's signature is over."""

    type: str = Field(alias="_type")
    subject: list[Subject]
    predicate_type: str = Field(alias="predicateType")
    predicate: ReportPredicate

    def as_json(self) -> dict[str, JsonValue]:
        return self.model_dump(mode="json", by_alias=True)


def report_statement(report_path: Path, report: Report, data: bytes | None = None) -> ReportStatement:
    """The statement over the report at `report_path`, or over `data`, the bytes about to be written there."""
    sha, size = hash_file(report_path) if data is None else (sha256_hex(data), len(data))
    binding = report.binding
    attested = binding.release_attestation_digest
    subjects = [Subject(name=report_path.name, digest=Digest(sha256=sha))]
    if attested:
        subjects.append(Subject(name=RELEASE_ATTESTATION, digest=Digest(sha256=attested)))
    predicate = ReportPredicate(
        report=ReportFile(name=report_path.name, sha256=sha, size=size), verdict=report.verdict.status,
        release_root_digest=binding.release_root_digest, release_attestation_digest=attested,
        plan=PlanRef(name=report.plan.name, sha256=report.plan.sha256), kvgraft_version=__version__)
    return ReportStatement.model_validate({"_type": attest.STATEMENT_TYPE, "subject": subjects,
                                           "predicateType": REPORT_PREDICATE_TYPE, "predicate": predicate})


def sign_report(report_path: Path, key: PrivateKey) -> Path:
    """Sign a written report offline; write REPORT.sigstore.json beside it."""
    from kvgraft.report.document import load_report

    return _write_bundle(report_path, report_statement(report_path, load_report(report_path)), key)


def write_signed_report(report_path: Path, report: Report, key: PrivateKey) -> Path:
    """Write a report and its signature, the signature first: a writer killed between the two leaves a
    signature without a report (nothing at the report's path), never a report nobody signed."""
    from kvgraft.report.document import validate_report

    validate_report(report, str(report_path))
    data = jsonio.json_bytes(report.as_json())
    out = _write_bundle(report_path, report_statement(report_path, report, data), key)
    try:
        jsonio.write_atomic(report_path, data)
    except BaseException:
        out.unlink(missing_ok=True)  # a refused report write leaves no signature of it either
        raise
    return out


def _write_bundle(report_path: Path, statement: ReportStatement, key: PrivateKey) -> Path:
    payload = attest.statement_bytes(statement.as_json())
    signature = key_sign(key, attest.pae(attest.PAYLOAD_TYPE, payload))
    out = bundle_path(report_path)
    bundle = attest.key_bundle(payload, signature, key_id(key))
    jsonio.write_atomic(out, (json.dumps(bundle, indent=2) + "\n").encode())
    return out


class VerifiedJson(Closed):
    """What `report verify --json` prints."""

    ok: bool
    signer: str
    report_sha256: str
    verdict: str
    release_checked: bool
    binding: Binding
    release_signature: ReleaseSignature | None


@dataclass(frozen=True)
class ReportVerified:
    report: Report
    signer: str
    report_sha256: str
    release_checked: bool

    def as_json(self) -> dict[str, JsonValue]:
        return VerifiedJson(ok=True, signer=self.signer, report_sha256=self.report_sha256,
                            verdict=self.report.verdict.status, release_checked=self.release_checked,
                            binding=self.report.binding,
                            release_signature=self.report.release_signature).model_dump(mode="json")


def verify_report(report_path: Path, *, key: Path | None = None, identity: str | None = None,
                  issuer: str | None = None, trust: Any = None, release: Path | str | None = None) -> ReportVerified:
    """Check the report's signature, that the signed digest is the report's, and its binding.

    With `release`, also check that the release's attestation and root digest are those the report
    names (a folder, or a location kvgraft.remote reads). Raises VerificationError (exit 1) on any mismatch,
    InputError (exit 2) on unusable input.
    """
    from kvgraft.report.document import load_report

    report_path = Path(report_path)
    bpath = bundle_path(report_path)
    if jsonio.stat_or_none(bpath) is None:
        raise VerificationError(f"{report_path}: report is unsigned (no {bpath.name})")
    if key is None and identity is None:
        raise InputError("report verify needs --key PUB.pem or --certificate-identity/--certificate-oidc-issuer")
    bundle = attest.read_bundle(bpath)
    if key is not None:
        signer = attest.verify_with_key(bundle, load_public_key(key))
        payload = bundle.payload
    else:
        from kvgraft.signing.sigstore import verify_sigstore_bundle

        if issuer is None:
            raise InputError("--certificate-identity needs --certificate-oidc-issuer")
        checked = verify_sigstore_bundle(None, bundle.raw, identity=identity or "", issuer=issuer, trust=trust,
                                         where=str(bpath))
        signer, payload = identity or "", checked.payload or b""
    stmt = jsonio.loads_strict(payload, f"{bpath} (statement)")
    if not isinstance(stmt, dict) or stmt.get("predicateType") != REPORT_PREDICATE_TYPE:
        raise VerificationError(f"{bpath}: not an audit-report attestation (predicateType "
                                f"{stmt.get('predicateType') if isinstance(stmt, dict) else None!r})")
    subjects = {s.get("name"): s.get("digest", {}).get("sha256") for s in stmt.get("subject", []) if isinstance(s, dict)}
    sha, _ = hash_file(report_path)
    signed = subjects.get(report_path.name)
    if signed != sha:
        raise VerificationError(f"{report_path}: sha256 {sha} differs from the signed {signed}: the report was edited "
                                "after signing (or is not the signed file)")
    report = load_report(report_path)
    binding = report.binding
    if subjects.get(RELEASE_ATTESTATION) != binding.release_attestation_digest:
        raise VerificationError(f"{report_path}: binding.release_attestation_digest {binding.release_attestation_digest} "
                                f"is not the signed {subjects.get(RELEASE_ATTESTATION)}")
    if release is not None:
        from kvgraft.remote import open_source

        with open_source(release) as source:  # a release read from elsewhere: its folder, named by its URL
            _bound_release(source.root, release, binding.release_attestation_digest, binding.release_root_digest)
    return ReportVerified(report, signer, sha, release is not None)


def _bound_release(folder: Path, release: str | Path, attestation: str | None, root_digest: str | None) -> None:
    """The release a report is bound to: its attestation's digest and root digest are the ones the report audited."""
    from kvgraft.release.format import load_manifest

    rb = folder / RELEASE_ATTESTATION
    if jsonio.stat_or_none(rb) is None:
        raise VerificationError(f"{release}: no {RELEASE_ATTESTATION}; the report is bound to a signed release")
    rsha, _ = hash_file(rb)
    if rsha != attestation:
        raise VerificationError(f"{rb}: sha256 {rsha} is not the attestation the report audited ({attestation})")
    root = load_manifest(folder)["root_digest"]
    if root != root_digest:
        raise VerificationError(f"{release}: root digest {root} is not the audited {root_digest}")
