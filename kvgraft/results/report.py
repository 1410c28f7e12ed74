"""The audit report, typed: the one source of schemas/audit-report.v1.json but for the parts the check registry
generates (kvgraft.audit.checks.schemas: the kind list, and each built-in kind's `data` by `$ref` to its own schema
file). kvgraft.report.document builds, loads and validates reports.

A check's `data` stays the JSON object its kind wrote: the check registry's `view` reads it as the kind's own
data model (kvgraft.results.<kind>). `environment` and `ledger` are open records. A report is written from
`as_json()`, which holds exactly the members the document was built or read with.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, JsonValue, field_validator, model_validator
from pydantic.config import JsonDict
from pydantic.json_schema import JsonSchemaValue

from kvgraft.results.base import Closed, Count, JsonObject, Open, Sha256, document_schema
from kvgraft.results.claims import Counts
from kvgraft.results.verify import ReleaseSignature

FILE = "audit-report.v1.json"
TITLE = "kvgraft audit report, format version 1"
FORMAT = "kvgraft-audit-report"
FORMAT_VERSION = 1
CREATED = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?(Z|[+-][0-9]{2}:[0-9]{2})$"
KIND = r"^[a-z][a-z0-9_-]{0,63}$"

CheckStatus = Literal["passed", "failed", "incomplete", "skipped"]
ClaimStatus = Literal["supported", "contradicted", "not-testable", "inconsistent", "unsupported", "consistent"]
Status = Literal["passed", "failed", "incomplete"]


def _absent_not_null(model: type[Open], data: object) -> object:
    """A member that may be absent is never null (the schema says absent-or-T): refuse a null one."""
    if isinstance(data, dict):
        nulls = [key for name, f in model.model_fields.items() if not f.is_required()
                 for key in {f.alias or name, name} if key in data and data[key] is None]
        if nulls:
            raise ValueError(f"{', '.join(sorted(nulls))}: may be absent, never null")
    return data


class _Closed(Closed):
    # Patterns matched as the reference schema validator matches them (Python's `re`, where `$` also matches before
    # a final newline), since kvgraft.schema accepts what either validator accepts: the model accepts it too.
    model_config = ConfigDict(regex_engine="python-re")

    @model_validator(mode="before")
    @classmethod
    def _not_null(cls, data: object) -> object:
        return _absent_not_null(cls, data)


class _Open(Open):
    """An open part of the report: members beyond those named are kept as written."""

    model_config = ConfigDict(regex_engine="python-re", extra="allow")  # see _Closed

    @model_validator(mode="before")
    @classmethod
    def _not_null(cls, data: object) -> object:
        return _absent_not_null(cls, data)


class Plan(_Closed):
    name: Annotated[str, Field(min_length=1, max_length=256)]
    sha256: Sha256 | None = Field(None, description="SHA-256 of the content: of its UTF-8 text if a string, else of "
                                  "its RFC 8785 canonical JSON.")
    content: JsonObject | str = Field(description="The plan as run: its text or its parsed form.")


class Identity(_Open):
    """What identifies the model's weights."""

    sha256: Sha256 | None = None


class Model(_Open):
    """The model audited."""

    spec: Annotated[str, Field(min_length=1)]
    architecture: str | None = None
    model_type: str | None = None
    num_hidden_layers: Annotated[int, Field(ge=1)] | None = None
    identity: Identity | None = None


_SKIPPED_SAYS_WHY: JsonDict = {"allOf": [{"if": {"properties": {"status": {"const": "skipped"}}},
                                          "then": {"required": ["reason"]}}]}


class Check(_Closed):
    """A check of the audit: its verdict, a one-line summary, and its kind's data (a skipped check says why)."""

    model_config = ConfigDict(json_schema_extra=_SKIPPED_SAYS_WHY)

    name: Annotated[str, Field(min_length=1, max_length=256)]
    kind: Annotated[str, Field(pattern=KIND)] = Field(description=(
        "The check's kind: a kind of the check registry (kvgraft.audit.checks): a built-in one (`examples`, the "
        "registry's order), or one a plugin registers through the entry-point group kvgraft.check_kinds, whose "
        "result is validated against that kind's schema when it is sealed; \"other\" for checks written by other "
        "tools. A reader shows a kind it has not registered by its summary."))
    status: CheckStatus
    summary: Annotated[str, Field(max_length=4000)]
    data: JsonObject
    reason: Annotated[str, Field(min_length=1, max_length=4000)] | None = None

    @model_validator(mode="after")
    def _says_why(self) -> Check:
        if self.status == "skipped" and self.reason is None:
            raise ValueError("a skipped check says why (reason)")
        return self


class Claim(_Closed):
    """A claim's verdict as the report's `claims` hold it."""

    id: Annotated[str, Field(min_length=1, max_length=128)]
    text: Annotated[str, Field(max_length=4000)]
    kind: Annotated[str, Field(max_length=64)] | None = None
    claimed: Annotated[str, Field(max_length=1000)] | None = None
    verdict: ClaimStatus
    reason: Annotated[str, Field(min_length=1, max_length=4000)]


class CheckCounts(_Closed):
    passed: Count
    failed: Count
    incomplete: Count | None = Field(None, description="Checks that ran but reached no verdict; absent when none.")
    skipped: Count


class ClaimCounts(Counts):
    """The report's claims by verdict: the claims check's own counts."""


class Verdict(_Closed):
    status: Status
    headline: Annotated[str, Field(max_length=1000)]
    checks: CheckCounts
    claims: ClaimCounts


class Binding(_Closed):
    release_attestation_digest: Sha256 | None
    release_root_digest: Sha256 | None


class Report(_Closed):
    """The result of an audit: what was run (plan), where (environment), on what (model identity, release root digest), the checks with their data, the token ledger and the verdict on each claim. The top level is closed; each check's `data` is open beyond the members listed for its kind, so that audits may add measurements without a new format version. `verdict` must follow from `checks` and `claims` (kvgraft.report.document.compute_verdict) and `binding.release_root_digest` must equal `release_root_digest`; kvgraft checks both when it reads a report. Digests are lowercase hex SHA-256."""  # noqa: E501

    format: Literal["kvgraft-audit-report"]
    format_version: Literal[1]
    kvgraft_version: Annotated[str, Field(min_length=1, max_length=64)]
    created: Annotated[str, Field(pattern=CREATED)]
    plan: Plan
    environment: JsonObject = Field(description="kvgraft.inference.environment.record() of the run, or one such "
                                    "record per condition under named keys.")
    model: Model | None = Field(description="Identity of the model audited; null for audits that load no model (a "
                                "claims-only audit).")
    release_root_digest: Sha256 | None
    release_signature: ReleaseSignature | None = Field(None, description=(
        "What was checked of the audited release's signature (kvgraft.signing.verify.signature_statement): checked, "
        "with the key ids (hex SHA-256 of each public key PEM) that verified it or the Sigstore identity and issuer "
        "(and the transparency log's time), or not checked and why. Absent in reports written before reports stated "
        "it."))
    checks: Annotated[list[Check], Field(max_length=1000)]
    ledger: JsonObject | None = Field(description="Token and byte accounting of the audit (for example graft.run "
                                      "ledgers summed), or null.")
    claims: Annotated[list[Claim], Field(max_length=1000)]
    binding: Binding = Field(description="What the report is bound to: the release's attestation (digest of the "
                             "attestation/bundle file, null if the release is unsigned) and its root digest. A report "
                             "signature covers these.")
    note: Annotated[str, Field(max_length=4000)] | None = None
    verdict: Verdict

    @field_validator("release_signature")
    @classmethod
    def _checked_or_why(cls, value: ReleaseSignature | None) -> ReleaseSignature | None:
        """The statement's own rule (its schema's if/then/else): checked, by a method and with no reason; or not
        checked, by no method and no key, and why."""
        if value is not None and (
                (value.method is None or value.reason is not None) if value.checked
                else (value.method is not None or value.reason is None or value.key_ids)):
            raise ValueError("release_signature: checked with a method and no reason, or not checked and why")
        return value

    @field_validator("format_version", mode="before")
    @classmethod
    def _not_true(cls, value: object) -> object:
        if isinstance(value, bool):  # True == 1 in Python; the schema's const 1 is no boolean
            raise ValueError("format_version is the number 1")
        return value

    def as_json(self) -> dict[str, JsonValue]:
        """The document as written: the members it was built or read with (none added as null), values as they
        were (a float stays the float it was: write_json decides how a non-finite one is written)."""
        return self.model_dump(by_alias=True, exclude_unset=True)


# The parts other files and the registry's generator name keep the names they had when the file was written by hand.
_NAMES = {"Check": "check", "Claim": "claim", "ReleaseSignature": "release_signature"}


def _renamed(node: JsonValue, names: dict[str, str]) -> JsonValue:
    if isinstance(node, dict):
        return {k: (names.get(v, v) if k == "$ref" and isinstance(v, str) else _renamed(v, names)) for k, v in node.items()}
    if isinstance(node, list):
        return [_renamed(v, names) for v in node]
    return node


def schema() -> JsonSchemaValue:
    """The report schema as the models say it (kvgraft.audit.checks.schemas adds what the registry decides)."""
    doc = document_schema(FILE, TITLE, Report)
    doc["$defs"] = {_NAMES.get(name, name): d for name, d in doc["$defs"].items()}
    out = _renamed(doc, {f"#/$defs/{old}": f"#/$defs/{new}" for old, new in _NAMES.items()})
    assert isinstance(out, dict)
    return out
