"""The audit report, typed: its top-level members, its checks, claims, verdict and binding
(schemas/audit-report.v1.json; kvgraft.report.document builds, loads and validates it).

A check's `data` stays the JSON object its kind wrote: the check registry's `view` reads it as the kind's own
data model (kvgraft.results.<kind>). `environment` and `ledger` are open records. The model's other parts say what
the schema says, and a document the schema accepts builds (tests/report/test_report_model.py holds the two to
agreeing); a report is written from `as_json()`, which holds exactly the members the document held.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, JsonValue

from kvgraft.results.base import Closed, Count, JsonObject, Open, Sha256
from kvgraft.results.verify import ReleaseSignature

FORMAT = "kvgraft-audit-report"
FORMAT_VERSION = 1
CREATED = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?(Z|[+-][0-9]{2}:[0-9]{2})$"
KIND = r"^[a-z][a-z0-9_-]{0,63}$"

CheckStatus = Literal["passed", "failed", "incomplete", "skipped"]
ClaimVerdict = Literal["supported", "contradicted", "not-testable", "inconsistent", "unsupported", "consistent"]
Status = Literal["passed", "failed", "incomplete"]


class _Closed(Closed):
    # Patterns matched as the schema validator matches them (Python's `re`, where `$` also matches before a final
    # newline): the model accepts what the schema accepts.
    model_config = ConfigDict(regex_engine="python-re")


class _Open(Open):
    """An open part of the report: members beyond those named are kept as written."""

    model_config = ConfigDict(regex_engine="python-re", extra="allow")


class Plan(_Closed):
    name: Annotated[str, Field(min_length=1, max_length=256)]
    sha256: Sha256 | None = None  # absent in reports written before the plan's digest was stated
    content: JsonObject | str


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


class Check(_Closed):
    """One entry of `checks`: `data` is the kind's, read through the registry's `view`."""

    name: Annotated[str, Field(min_length=1, max_length=256)]
    kind: Annotated[str, Field(pattern=KIND)]
    status: CheckStatus
    summary: Annotated[str, Field(max_length=4000)]
    data: JsonObject
    reason: Annotated[str, Field(min_length=1, max_length=4000)] | None = None


class Claim(_Closed):
    """A claim's verdict as the report's `claims` hold it."""

    id: Annotated[str, Field(min_length=1, max_length=128)]
    text: Annotated[str, Field(max_length=4000)]
    kind: Annotated[str, Field(max_length=64)] | None = None
    claimed: Annotated[str, Field(max_length=1000)] | None = None
    verdict: ClaimVerdict
    reason: Annotated[str, Field(min_length=1, max_length=4000)]


class CheckCounts(_Closed):
    passed: Count
    failed: Count
    incomplete: Count | None = None  # absent when none (and in reports written before checks could be incomplete)
    skipped: Count


class ClaimCounts(_Closed):
    contradicted: Count
    inconsistent: Count
    unsupported: Count
    supported: Count
    consistent: Count
    not_testable: Count = Field(alias="not-testable")


class Verdict(_Closed):
    status: Status
    headline: Annotated[str, Field(max_length=1000)]
    checks: CheckCounts
    claims: ClaimCounts


class Binding(_Closed):
    release_attestation_digest: Sha256 | None
    release_root_digest: Sha256 | None


class Report(_Closed):
    """An audit report (schemas/audit-report.v1.json)."""

    format: Literal["kvgraft-audit-report"]
    format_version: Literal[1]
    kvgraft_version: Annotated[str, Field(min_length=1, max_length=64)]
    created: Annotated[str, Field(pattern=CREATED)]
    plan: Plan
    environment: JsonObject
    model: Model | None
    release_root_digest: Sha256 | None
    release_signature: ReleaseSignature | None = None  # absent in reports written before reports stated it
    checks: Annotated[list[Check], Field(max_length=1000)]
    ledger: JsonObject | None
    claims: Annotated[list[Claim], Field(max_length=1000)]
    binding: Binding
    note: Annotated[str, Field(max_length=4000)] | None = None
    verdict: Verdict

    def as_json(self) -> dict[str, JsonValue]:
        """The document as written: the members it was built or read with (none added as null), values as they
        were (a float stays the float it was: write_json decides how a non-finite one is written)."""
        return self.model_dump(by_alias=True, exclude_unset=True)
