"""The audit report: building, verdict logic, loading and validation.

A report is a JSON object valid against schemas/audit-report.v1.json. Its `verdict` is derived from its
checks and claim verdicts (see `compute_verdict`); `validate_report` refuses a report whose stored verdict
or binding disagrees with its own content, so a renderer never shows a verdict the data does not carry.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvgraft import __version__
from kvgraft._internal.digest import sha256_hex
from kvgraft._internal.jsonio import canonical, load_file, write_json
from kvgraft.claims.checker import CLAIM_VERDICTS, FAILING_CLAIM_VERDICTS
from kvgraft.errors import InputError
from kvgraft.release.format import now_utc
from kvgraft.schema import validate
from kvgraft.verdict import CHECK_STATUSES

REPORT_SCHEMA = "audit-report.v1.json"
GENERALIZATION_SCHEMA = "generalization-result.v1.json"
REPORT_FORMAT = "kvgraft-audit-report"
REPORT_FORMAT_VERSION = 1


# --- building --------------------------------------------------------------------------------------------------


def compute_verdict(report: dict[str, Any]) -> dict[str, Any]:
    """Overall verdict: failed if a check failed or a claim is contradicted/inconsistent; incomplete if a check
    was skipped or incomplete, or there is nothing to judge; passed otherwise."""
    checks = {s: 0 for s in CHECK_STATUSES}
    for c in report.get("checks", []):
        checks[c["status"]] += 1
    if not checks["incomplete"]:
        del checks["incomplete"]  # reports written before checks could be incomplete carry no such count
    claims = {v: 0 for v in CLAIM_VERDICTS}
    for c in report.get("claims", []):
        claims[c["verdict"]] += 1
    failing_claims = sum(claims[v] for v in FAILING_CLAIM_VERDICTS)
    if checks["failed"] or failing_claims:
        status = "failed"
    elif checks["skipped"] or checks.get("incomplete") or not (checks["passed"] or any(claims.values())):
        status = "incomplete"
    else:
        status = "passed"
    parts = []
    if checks["failed"]:
        parts.append(f"{checks['failed']} check(s) failed")
    if failing_claims:
        parts.append(f"{failing_claims} claim(s) contradicted or inconsistent")
    if checks.get("incomplete"):
        parts.append(f"{checks['incomplete']} check(s) incomplete")
    if checks["skipped"]:
        parts.append(f"{checks['skipped']} check(s) skipped")
    if not parts:
        parts.append("all checks passed" if checks["passed"] else "nothing was checked")
    return {"status": status, "headline": "; ".join(parts), "checks": checks, "claims": claims}


def plan_digest(content: Any) -> str:
    """SHA-256 of the plan: of its text if a string, else of its RFC 8785 canonical JSON."""
    return sha256_hex(content.encode() if isinstance(content, str) else canonical(content))


def new_report(*, plan_name: str, plan_content: Any, environment: dict[str, Any], model: dict[str, Any] | None,
               release_root_digest: str | None, checks: list[dict[str, Any]], ledger: dict[str, Any] | None = None,
               claims: list[dict[str, Any]] | None = None, release_attestation_digest: str | None = None,
               created: str | None = None, note: str | None = None,
               release_signature: dict[str, Any] | None = None) -> dict[str, Any]:
    """Assemble a report, derive its verdict and validate it. `release_signature`: what was checked of the
    release's signature (kvgraft.signing.verify.signature_statement)."""
    report: dict[str, Any] = {
        "format": REPORT_FORMAT,
        "format_version": REPORT_FORMAT_VERSION,
        "kvgraft_version": __version__,
        "created": created or now_utc(),
        "plan": {"name": plan_name, "sha256": plan_digest(plan_content), "content": plan_content},
        "environment": environment,
        "model": model,
        "release_root_digest": release_root_digest,
        **({"release_signature": release_signature} if release_signature is not None else {}),
        "checks": checks,
        "ledger": ledger,
        "claims": claims or [],
        "binding": {"release_attestation_digest": release_attestation_digest, "release_root_digest": release_root_digest},
    }
    if note:
        report["note"] = note
    report["verdict"] = compute_verdict(report)
    validate_report(report, "report")
    return report


# --- reading ---------------------------------------------------------------------------------------------------


def validate_report(doc: Any, where: str) -> None:
    """Schema, then what a schema cannot say: the verdict, binding and plan digest agree with the content."""
    validate(doc, REPORT_SCHEMA, where)
    expected = compute_verdict(doc)
    stored = doc["verdict"]
    if stored["status"] != expected["status"] or stored["checks"] != expected["checks"] or stored["claims"] != expected["claims"]:
        raise InputError(f"{where}: stored verdict {stored['status']!r} {stored['checks']} {stored['claims']} does not "
                         f"follow from the checks and claims ({expected['status']!r} {expected['checks']} {expected['claims']})")
    if doc["binding"]["release_root_digest"] != doc["release_root_digest"]:
        raise InputError(f"{where}: binding.release_root_digest {doc['binding']['release_root_digest']} differs from "
                         f"release_root_digest {doc['release_root_digest']}")
    digest = doc["plan"].get("sha256")
    if digest is not None and digest != plan_digest(doc["plan"]["content"]):
        raise InputError(f"{where}: plan.sha256 does not match the plan content")
    for i, c in enumerate(doc["checks"]):
        if c["kind"] == "generalization":
            if "result" in c["data"]:
                # The whole result its face draws: the report schema names its kind, its own schema its members.
                validate(c["data"]["result"], GENERALIZATION_SCHEMA, f"{where}: checks[{i}].data.result")
            split = c["data"].get("split", {})
            for part, accs in (("conditions", c["data"]["conditions"]), ("split.clean", split.get("clean", [])),
                               ("split.contaminated", split.get("contaminated", []))):
                for j, a in enumerate(accs):
                    if a["k"] > a["n"]:
                        raise InputError(f"{where}: checks[{i}].data.{part}[{j}]: k = {a['k']} exceeds n = {a['n']}")
        if c["kind"] == "determinism":
            n = len(c["data"]["conditions"])
            for row in c["data"].get("rows", []):
                if len(row["classes"]) != n:
                    raise InputError(f"{where}: check {c['name']!r}: entry {row['entry']!r} has {len(row['classes'])} "
                                     f"classes for {n} conditions")
    names = [c["name"] for c in doc["checks"]]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise InputError(f"{where}: duplicate check names: {', '.join(dupes)}")


def load_report(path: Path) -> dict[str, Any]:
    doc = load_file(path)
    validate_report(doc, str(path))
    report: dict[str, Any] = doc
    return report


def write_report(path: Path, report: dict[str, Any]) -> None:
    validate_report(report, str(path))
    write_json(path, report)
