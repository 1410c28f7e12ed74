"""Claims as data, and a checker: internal consistency of the stated numbers, and claim vs measurement.

A claims file (TOML, `format = "kvgraft-claims"`) lists benchmarks and claims. What is checked for each kind of
claim, the roles it can be measured by and how a measurement judges it are one entry per kind in
kvgraft.claims.kinds.KINDS; this module loads and validates claims files and measurements, and runs
the check.

`measure` maps the roles of a claim's kind to keys of a measured-results JSON (a flat object), e.g.
`{"accuracy.12b.graft": {"k": 27, "n": 30}, "restore_byte_identical": true, "kl_max": 0.0}`.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Final

from pydantic import JsonValue, ValidationError

from kvgraft import __version__
from kvgraft._internal.digest import sha256_hex
from kvgraft._internal.jsonio import MAX_JSON_BYTES, loads_strict, read_bounded
from kvgraft.claims.kinds import KINDS, Claim, ClaimsFile, Finding, References, ValueType
from kvgraft.errors import InputError
from kvgraft.results import claims as results
from kvgraft.results.base import JsonObject
from kvgraft.schema import validate

CLAIMS_SCHEMA = "claims.v1.json"
CLAIMS_FORMAT = "kvgraft-claims"
CHECK_FORMAT: Final = "kvgraft-claims-check"
MAX_CLAIMS_BYTES = 4 * 1024 * 1024
METADATA_KEYS = ("note", "source", "format", "format_version")
# Claim verdicts, most severe first; the report (kvgraft.report.document) counts claims by the same words.
CLAIM_VERDICTS = ("contradicted", "inconsistent", "unsupported", "supported", "consistent", "not-testable")
FAILING_CLAIM_VERDICTS = ("contradicted", "inconsistent")

# Finding verdicts: internal checks give consistent/inconsistent/unsupported/needs-measurement; measurements give
# supported/contradicted/unsupported/not-testable. A claim's verdict is the first of its findings in this order: a
# contradiction or inconsistency always shows; a measurement that supports the claim outweighs the stated numbers
# being too few to support it (unsupported).
_PRECEDENCE = ("contradicted", "inconsistent", "supported", "unsupported", "consistent", "not-testable")
_RANK = {v: i for i, v in enumerate(_PRECEDENCE)}
assert set(_PRECEDENCE) == set(CLAIM_VERDICTS)


# --- loading ---------------------------------------------------------------------------------------------------


def load(path: Path) -> ClaimsFile:
    """Parse and validate a claims TOML file; errors name the file (and the line for TOML syntax)."""
    data = read_bounded(path, MAX_CLAIMS_BYTES, "a claims file")
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path}: invalid TOML: {exc}") from None
    return parse(doc, str(path), sha256_hex(data))


def parse(doc: object, where: str, sha256: str | None = None) -> ClaimsFile:
    """Validate a parsed claims document: schema, then references between claims and benchmarks."""
    validate(doc, CLAIMS_SCHEMA, where)
    if not isinstance(doc, dict) or doc.get("format") != CLAIMS_FORMAT:
        fmt = doc.get("format") if isinstance(doc, dict) else None
        raise InputError(f"{where}: format is {fmt!r}, expected {CLAIMS_FORMAT!r}")
    try:
        cf = ClaimsFile(where, sha256, results.ClaimsFile.model_validate(doc), dict(doc["source"]))
    except ValidationError as exc:  # the schema is generated from the model: a document one accepts, both do
        raise InputError(f"{where}: {exc}") from None
    refs = References(where, {c.id: c for c in cf.claims})
    seen: set[str] = set()
    for c in cf.claims:
        if c.id in seen:
            raise InputError(f"{where}: claim id {c.id!r} appears twice")
        seen.add(c.id)
        if c.benchmark is not None and c.benchmark not in cf.benchmarks:
            refs.fail(c, f"unknown benchmark {c.benchmark!r}")
        roles = KINDS[c.kind].roles
        for role in c.measure or {}:
            if role not in roles:
                refs.fail(c, f"measure role {role!r} does not apply to a {c.kind} claim (roles: {', '.join(roles)})")
    for c in cf.claims:
        KINDS[c.kind].references(c, refs)
        for b in c.bounds or []:  # the schema allows bounds on any kind, so every kind's are checked
            refs.accuracy(c, b.claim, f"bound {b.relation}")
    return cf


def load_measured(path: Path) -> tuple[JsonObject, str]:
    """A measured-results JSON object and the SHA-256 of its bytes."""
    data = read_bounded(path, MAX_JSON_BYTES, "JSON")
    doc = loads_strict(data, str(path))
    if not isinstance(doc, dict):
        raise InputError(f"{path}: measured results must be a JSON object of measurement keys")
    return doc, sha256_hex(data)


# --- measurements ----------------------------------------------------------------------------------------------


def _typed(measured: JsonObject, key: str, value_type: ValueType, where: str) -> JsonValue:
    value = measured[key]
    if not value_type.accepts(value):
        raise InputError(f"{where}: measurement {key!r} must be {value_type.must_be}")
    return value


def measured_findings(cf: ClaimsFile, c: Claim, measured: JsonObject, where: str) -> list[Finding]:
    kind = KINDS[c.kind]
    if not c.measure:
        return [Finding("measurement", "not-testable",
                        c.untestable if c.untestable is not None else "the claim names no measurement")]
    keys = {role: key for role, key in c.measure.items() if key in measured}
    if not keys:
        wanted = ", ".join(c.measure.values())
        reason = f"no measurement of {wanted} in {where}"
        if c.untestable:
            reason += f"; {c.untestable}"
        return [Finding("measurement", "not-testable", reason)]
    values = {role: _typed(measured, key, kind.roles[role], where) for role, key in keys.items()}
    return kind.measured(c, values, measured)


def measured_from_recompute(result: dict[str, Any]) -> JsonObject:
    """Measurements an exactness claim names, from a recompute result (schemas/recompute-result.v1.json):
    `restore_byte_identical` (every entry byte-exact) and `kl_max` (largest matched-schedule KL)."""
    entries = result.get("entries", [])
    if not entries:
        raise InputError("recompute result: no entries, nothing was measured")
    out: JsonObject = {"restore_byte_identical": all(bool(e["byte_exact"]) for e in entries),
                           "kl_max": max(float(e["matched"]["kl_max"]) for e in entries)}
    if "verdict" in result:
        env = result["environment"]["current"]
        where = f"on {env.get('device_name')}, {env.get('dtype')}, {env.get('attn_implementation')}, {env.get('threads')} threads"
        not_replayed = sorted(result["conditions"]["not_replayed"])
        out["restore_verdict"] = result["verdict"]
        out["restore_conditions"] = (
            f"{result['verdict']} {where}"
            + (f"; not byte-exact because {', '.join(not_replayed)} differ from the recording"
               if result["verdict"] == "consistent" and not_replayed else "")
            + ("; recorded conditions overridden: " + ", ".join(sorted(result["conditions"]["overridden"]))
               if result["conditions"]["overridden"] else ""))
    if isinstance(result.get("sample"), dict) and isinstance(result.get("bound"), dict):
        from kvgraft import sampling

        out["restore_bound"] = sampling.sentence(result["bound"])  # a sample: what it says of the whole release
    return out


# --- the check -------------------------------------------------------------------------------------------------


def internal_findings(cf: ClaimsFile, claim: Claim) -> list[Finding]:
    return KINDS[claim.kind].internal(cf, claim)


def claimed_summary(cf: ClaimsFile, c: Claim) -> str:
    return KINDS[c.kind].claimed(cf, c)


def claim_verdict(c: Claim, findings: list[Finding]) -> tuple[str, str]:
    """(verdict, reason): the first finding in _PRECEDENCE order decides; needs-measurement counts as not-testable."""
    if not findings:
        return "not-testable", c.untestable or "no internal check applies and no measurement was given"
    ranked = sorted(findings, key=lambda f: _RANK["not-testable" if f.verdict == "needs-measurement" else f.verdict])
    top = ranked[0]
    verdict = "not-testable" if top.verdict == "needs-measurement" else top.verdict
    reason = "; ".join(dict.fromkeys(f.detail for f in ranked if f.verdict == top.verdict))
    if verdict == "not-testable" and c.untestable and c.untestable not in reason:
        reason = f"{reason}; {c.untestable}"
    return verdict, reason


def check(cf: ClaimsFile, measured: JsonObject | None = None, measured_where: str = "measured results",
          measured_sha256: str | None = None) -> results.ClaimsCheck:
    """Check every claim; the result's `as_json()` is valid against schemas/claims.v1.json."""
    checked = []
    used: set[str] = set()
    for c in cf.claims:
        findings = internal_findings(cf, c)
        measure = c.measure or {}
        if measured is not None:
            findings += measured_findings(cf, c, measured, measured_where)
            used.update(k for k in measure.values() if k in measured)
        elif not findings:
            keys = ", ".join(measure.values())
            reason = c.untestable or (f"needs measurement: {keys} (pass --measured)" if keys else "names no measurement")
            findings.append(Finding("measurement", "not-testable", reason))
        verdict, reason = claim_verdict(c, findings)
        checked.append(results.CheckedClaim.model_validate({
            "id": c.id, "kind": c.kind, "text": c.text, "claimed": claimed_summary(cf, c), "verdict": verdict,
            "reason": reason, "findings": [f.result() for f in findings]}))
    counts = {v: 0 for v in CLAIM_VERDICTS}
    for r in checked:
        counts[r.verdict] += 1
    return results.ClaimsCheck(
        format=CHECK_FORMAT, format_version=1, kvgraft_version=__version__,
        claims_file=results.FileRef(path=cf.path, sha256=cf.sha256),
        source=cf.source,
        measured_file=None if measured is None else results.FileRef(path=measured_where, sha256=measured_sha256),
        readings=[br.result() for br in cf.readings.values()],
        claims=checked,
        counts=results.Counts.model_validate(counts),
        unused_measurements=sorted(k for k in (measured or {}) if k not in used and k not in METADATA_KEYS),
        failed=any(counts[v] for v in FAILING_CLAIM_VERDICTS))


def check_files(claims_path: Path, measured_path: Path | None = None) -> results.ClaimsCheck:
    cf = load(claims_path)
    if measured_path is None:
        return check(cf)
    measured, digest = load_measured(measured_path)
    return check(cf, measured, str(measured_path), digest)
