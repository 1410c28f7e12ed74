"""The audit report: building, verdict logic, loading and validation.

A report is a JSON object valid against schemas/audit-report.v1.json, read as its model
(kvgraft.results.report.Report) and written from it. Its `verdict` is derived from its checks and claim verdicts
(see `compute_verdict`); a report whose stored verdict or binding disagrees with its own content is refused
(`consistent`), so a renderer never shows a verdict the data does not carry.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, JsonValue, ValidationError

from kvgraft import __version__
from kvgraft._internal.digest import sha256_hex
from kvgraft._internal.jsonio import canonical, load_file, write_json
from kvgraft.claims.checker import CLAIM_VERDICTS, FAILING_CLAIM_VERDICTS
from kvgraft.errors import InputError
from kvgraft.release.format import now_utc
from kvgraft.results import report as report_model
from kvgraft.results.base import JsonObject
from kvgraft.results.determinism import DeterminismData
from kvgraft.results.generalization import GeneralizationData
from kvgraft.results.report import Check, Claim, Model, Report, Verdict
from kvgraft.results.verify import ReleaseSignature
from kvgraft.schema import validate
from kvgraft.verdict import CHECK_STATUSES

REPORT_SCHEMA = report_model.FILE
GENERALIZATION_SCHEMA = "generalization-result.v1.json"
REPORT_FORMAT = report_model.FORMAT
REPORT_FORMAT_VERSION = report_model.FORMAT_VERSION

T = TypeVar("T", bound=BaseModel)


# --- building --------------------------------------------------------------------------------------------------


def compute_verdict(checks: list[Check], claims: list[Claim]) -> Verdict:
    """Overall verdict: failed if a check failed or a claim is contradicted/inconsistent; incomplete if a check
    was skipped or incomplete, or there is nothing to judge; passed otherwise."""
    counts = {s: 0 for s in CHECK_STATUSES}
    for c in checks:
        counts[c.status] += 1
    by_verdict = {v: 0 for v in CLAIM_VERDICTS}
    for claim in claims:
        by_verdict[claim.verdict] += 1
    failed, skipped, incomplete = counts["failed"], counts["skipped"], counts["incomplete"]
    failing_claims = sum(by_verdict[v] for v in FAILING_CLAIM_VERDICTS)
    if failed or failing_claims:
        status = "failed"
    elif skipped or incomplete or not (counts["passed"] or any(by_verdict.values())):
        status = "incomplete"
    else:
        status = "passed"
    parts = []
    if failed:
        parts.append(f"{failed} check(s) failed")
    if failing_claims:
        parts.append(f"{failing_claims} claim(s) contradicted or inconsistent")
    if incomplete:
        parts.append(f"{incomplete} check(s) incomplete")
    if skipped:
        parts.append(f"{skipped} check(s) skipped")
    if not parts:
        parts.append("all checks passed" if counts["passed"] else "nothing was checked")
    if not incomplete:
        del counts["incomplete"]  # reports written before checks could be incomplete carry no such count
    return Verdict.model_validate({"status": status, "headline": "; ".join(parts), "checks": counts,
                                   "claims": by_verdict})


def plan_digest(content: JsonValue) -> str:
    """SHA-256 of the plan: of its text if a string, else of its RFC 8785 canonical JSON."""
    return sha256_hex(content.encode() if isinstance(content, str) else canonical(content))


def typed(model: type[T], raw: object, where: str) -> T:
    """A part of a report (a check entry, a claim, the model's identity) as its model; InputError naming what is
    wrong, as the schema would when the report is validated."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        said = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'the object'}: {e['msg']}" for e in exc.errors())
        raise InputError(f"{where}: {said}") from None


def new_report(*, plan_name: str, plan_content: JsonObject | str, environment: JsonObject, model: Model | None,
               release_root_digest: str | None, checks: list[Check], ledger: JsonObject | None = None,
               claims: list[Claim] | None = None, release_attestation_digest: str | None = None,
               created: str | None = None, note: str | None = None,
               release_signature: ReleaseSignature | None = None) -> Report:
    """Assemble a report, derive its verdict and validate it. `release_signature`: what was checked of the
    release's signature (kvgraft.signing.verify.signature_statement)."""
    claims = claims or []
    optional = {**({"release_signature": release_signature} if release_signature is not None else {}),
                **({"note": note} if note else {})}
    report = typed(Report, {
        "format": REPORT_FORMAT,
        "format_version": REPORT_FORMAT_VERSION,
        "kvgraft_version": __version__,
        "created": created or now_utc(),
        "plan": {"name": plan_name, "sha256": plan_digest(plan_content), "content": plan_content},
        "environment": environment,
        "model": model,
        "release_root_digest": release_root_digest,
        "checks": checks,
        "ledger": ledger,
        "claims": claims,
        "binding": {"release_attestation_digest": release_attestation_digest,
                    "release_root_digest": release_root_digest},
        "verdict": compute_verdict(checks, claims),
        **optional,
    }, "report")
    validate_report(report, "report")
    return report


# --- reading ---------------------------------------------------------------------------------------------------


def validate_report(report: Report, where: str) -> None:
    """The report as written passes the schema, and what a schema cannot say holds (see `consistent`)."""
    validate(report.as_json(), REPORT_SCHEMA, where)
    consistent(report, where)


def consistent(report: Report, where: str) -> None:
    """What a schema cannot say: the verdict, binding and plan digest agree with the content, a generalization
    check's whole result passes its own schema and no k exceeds its n, a determinism row has a class per
    condition, no two checks share a name."""
    expected = compute_verdict(report.checks, report.claims)
    stored = report.verdict
    if stored.status != expected.status or stored.checks != expected.checks or stored.claims != expected.claims:
        def counts(v: Verdict) -> str:
            return f"{v.checks.model_dump(exclude_none=True)} {v.claims.model_dump(by_alias=True)}"
        raise InputError(f"{where}: stored verdict {stored.status!r} {counts(stored)} does not follow from the checks "
                         f"and claims ({expected.status!r} {counts(expected)})")
    if report.binding.release_root_digest != report.release_root_digest:
        raise InputError(f"{where}: binding.release_root_digest {report.binding.release_root_digest} differs from "
                         f"release_root_digest {report.release_root_digest}")
    plan = report.plan
    if plan.sha256 is not None and plan.sha256 != plan_digest(plan.content):
        raise InputError(f"{where}: plan.sha256 does not match the plan content")
    for i, c in enumerate(report.checks):
        if c.kind == "generalization":
            if "result" in c.data:
                # The whole result its face draws: the report schema names its kind, its own schema its members.
                validate(c.data["result"], GENERALIZATION_SCHEMA, f"{where}: checks[{i}].data.result")
            g = GeneralizationData.model_validate(c.data)
            clean = (g.split.clean if g.split else None) or []
            contaminated = (g.split.contaminated if g.split else None) or []
            for part, accs in (("conditions", g.conditions), ("split.clean", clean),
                               ("split.contaminated", contaminated)):
                for j, a in enumerate(accs):
                    if a.k > a.n:
                        raise InputError(f"{where}: checks[{i}].data.{part}[{j}]: k = {a.k} exceeds n = {a.n}")
        if c.kind == "determinism":
            d = DeterminismData.model_validate(c.data)
            n = len(d.conditions)
            for row in d.rows or []:
                if len(row.classes) != n:
                    raise InputError(f"{where}: check {c.name!r}: entry {row.entry!r} has {len(row.classes)} "
                                     f"classes for {n} conditions")
    names = [c.name for c in report.checks]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise InputError(f"{where}: duplicate check names: {', '.join(dupes)}")


def read_report(doc: JsonValue, where: str) -> Report:
    """A report from its parsed JSON: the schema first, then the model, then what a schema cannot say."""
    validate(doc, REPORT_SCHEMA, where)
    report = Report.model_validate(doc)  # the schema accepted it: the model, which says the same, builds
    consistent(report, where)
    return report


def load_report(path: Path) -> Report:
    """A report file: strict, bounded JSON, then the schema, the model, and what a schema cannot say."""
    return read_report(load_file(path), str(path))


def write_report(path: Path, report: Report) -> None:
    validate_report(report, str(path))
    write_json(path, report.as_json())
