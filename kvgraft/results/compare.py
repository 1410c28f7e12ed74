"""Replications read together (`kvgraft report compare`), typed: the one source of schemas/report-compare.v1.json.

Where a member's shape comes from a report the compare only copies (a release signature, an environment, an
executor, a generalization condition, where an entry differs), the schema says no more than it did: the member is
open, and its model names only what the renderers draw.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, JsonValue, WithJsonSchema
from pydantic.json_schema import JsonSchemaValue

from kvgraft.results.base import Closed, JsonObject, Open, document_schema
from kvgraft.results.stats import Count

FILE = "report-compare.v1.json"
TITLE = "kvgraft report compare result, format version 1"
AnyValue = Annotated[JsonValue, WithJsonSchema({})]


class Unverified(Closed):
    source: str
    reason: str


class Signer(Closed):
    method: Literal["key", "sigstore"]
    key_id: str | None
    identity: str | None
    issuer: str | None


class ShownCheck(Closed):
    name: str
    kind: str
    status: str
    summary: list[str] = Field(description="The check's summary, a line an item.")


class Condition(Open):
    """A generalization condition as the report holds it: k of n, and its interval when it has one."""

    name: AnyValue
    k: AnyValue
    n: AnyValue
    interval: AnyValue = None


class Recomputed(Closed):
    require: str | None
    verdict: str | None
    population: Count
    sampled: Count
    nonce: str | None
    byte_exact: Count
    inconsistent: Count
    stated_bound: int | None = Field(description="The bound the report states (its own fail_means).")
    bound: Count = Field(description="This replication's own bound on inconsistent entries, computed here as the "
                         "combined one is.")


class Replication(Closed):
    index: int = Field(ge=1)
    source: str
    signer: Signer
    created: str
    plan: str
    verdict: str
    release_signature: JsonObject | None = Field(description="The report's own statement (audit-report.v1.json "
                                                 "$defs/release_signature); null in reports written before reports "
                                                 "stated it.")
    environment: JsonObject
    executor: AnyValue
    checks: list[ShownCheck]
    claims: dict[str, str]
    generalization: list[Condition]
    recompute: Recomputed | None


class Location(Open):
    """Where a replication found an entry's fresh bytes differ from the stored ones."""

    replication: AnyValue
    layers: AnyValue
    layer: AnyValue
    tensor: AnyValue
    element: AnyValue
    differing_elements: AnyValue = None
    elements: AnyValue = None


class Entry(Closed):
    id: str
    verdicts: dict[str, str] = Field(description="By replication index.")
    status: Literal["agree", "explained", "unexplained"]
    why: str | None
    location: Location | None


class Bound(Closed):
    confidence: float
    population: Count
    sampled: Count
    failing: Count
    fail_means: str
    max_failing_entries: Count
    max_failing_fraction: float
    method: str
    replications: list[int]


class Disagreements(Closed):
    explained: Count
    unexplained: Count


class CheckTally(Closed):
    name: str
    passed: Count
    of: Count


class ClaimTally(Closed):
    id: str
    supported: Count
    of: Count
    verdicts: dict[str, str]


class Group(Closed):
    release_root_digest: str
    model_identity: str
    model: str | None
    replications: list[Replication] = Field(min_length=1)
    entries: list[Entry]
    disagreements: Disagreements
    checks: list[CheckTally]
    claims: list[ClaimTally]
    combined_bound: Bound | None
    pooled_generalization: None = Field(description="A pooled estimate where a stated method allows one; none does "
                                        "yet.")
    pooling: str


class ReportCompare(Closed):
    """Signed audit reports read together (`kvgraft report compare`, kvgraft.report.compare): the trusted ones grouped by release root digest and model identity, each group's replications side by side, the entries two or more recomputed with their verdicts and any disagreement located and labelled, each check and claim as k of N, and the combined sampled bound (docs/replications.md)."""  # noqa: E501

    format: Literal["kvgraft-report-compare"]
    format_version: Literal[1]
    kvgraft_version: str
    status: Literal["agree", "disagree"] = Field(description="disagree: some entry's verdicts differ in a way no "
                                                 "recorded condition explains (exit 9).")
    trusted: Count
    unverified: list[Unverified] = Field(description="Reports listed unverified (--allow-unverified), with why; left "
                                         "out of every comparison.")
    groups: list[Group]

    def as_json(self) -> dict[str, JsonValue]:
        """The result as `report compare --json` prints it (members a location does not hold, absent)."""
        return self.model_dump(mode="json", exclude_unset=True)


def schema() -> JsonSchemaValue:
    return document_schema(FILE, TITLE, ReportCompare)
