"""A paper's claims as data (a claims file) and the result of checking them, typed."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, JsonValue, WithJsonSchema
from pydantic.config import JsonDict

from kvgraft.results.base import Closed, Count, JsonObject, Open, Sha256, Typed

Id = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,127}$")]
NonNeg = Annotated[float, Field(ge=0)]
Verdict = Literal["contradicted", "inconsistent", "unsupported", "supported", "consistent", "not-testable"]
FindingVerdict = Literal["contradicted", "inconsistent", "unsupported", "supported", "consistent", "not-testable",
                         "needs-measurement"]
Status = Literal["passed", "failed", "incomplete"]
# A number the checker shows as written: an int stays an int (80 is stated to 0 decimals, 80.0 to 1), so these
# members are int or float, and the schema says number, with the bounds it always said.
Percent = Annotated[int | float, Field(ge=0, le=100), WithJsonSchema({"type": "number", "minimum": 0, "maximum": 100})]
Positive = Annotated[int | float, Field(gt=0), WithJsonSchema({"type": "number", "exclusiveMinimum": 0})]
Quantity = Annotated[int | float, Field(ge=0), WithJsonSchema({"type": "number", "minimum": 0})]


def stated_decimals(value: float | int) -> int:
    """Decimals a number was written with in the TOML (80.0 -> 1, 6574 -> 0)."""
    if isinstance(value, int):
        return 0
    exponent = Decimal(repr(value)).as_tuple().exponent
    return max(0, -exponent) if isinstance(exponent, int) else 0


# --- a claims file ----------------------------------------------------------------------------------------------------


class Table(Closed):
    """A table of a claims file. Its patterns are matched as the schema's are (Python's `re`, where `$` also
    matches before a final newline), so the model accepts what schemas/claims.v1.json accepts."""

    model_config = ConfigDict(regex_engine="python-re")


class Source(Table):
    title: str = Field(min_length=1)
    authors: str | None = None
    url: str | None = None
    version: str | None = None
    note: str | None = None


class Benchmark(Table):
    name: str | None = None
    size: int = Field(ge=1, le=10_000_000)
    unit: str | None = None
    samples_per_problem: int | None = Field(None, ge=1, le=1000, description="Samples per problem behind each accuracy "
                                            "figure (avg@k); when absent, the checker finds the smallest that fits "
                                            "every figure.")
    runs: int | None = Field(None, ge=1, le=1000, description="Independent runs each figure is the mean of; default 1.")
    note: str | None = None


class Bound(Table):
    relation: Literal["unsolved-by", "solved-by"]
    claim: Id


def _when(kind: str, required: list[str], **more: object) -> JsonDict:
    return {"if": {"properties": {"kind": {"const": kind}}}, "then": {"required": list(required), **more}}  # type: ignore[dict-item]


# What each kind of claim must state beside its id, kind and text.
_BY_KIND: JsonDict = {"allOf": [
    _when("accuracy", ["benchmark", "percent"]), _when("gain", ["baseline", "treated"]), _when("count", ["count"]),
    _when("ratio", ["stated"], dependentRequired={"numerator": ["denominator"], "denominator": ["numerator"]}),
    _when("context", ["from_tokens", "to_tokens"])]}


class Claim(Table):
    """One [[claims]] table of a claims file."""

    model_config = ConfigDict(json_schema_extra=_BY_KIND)

    id: Id
    kind: Literal["accuracy", "gain", "count", "ratio", "context", "exactness"]
    text: str = Field(min_length=1, description="The claim as the source states it.")
    model: str | None = None
    condition: str | None = None
    note: str | None = None
    benchmark: Id | None = None
    percent: Percent | None = None
    decimals: int | None = Field(None, ge=0, le=12, description="Decimals the number was stated with; default: as "
                                 "written.")
    baseline: Id | None = None
    treated: Id | None = None
    alpha: float | None = Field(None, gt=0, lt=1)
    count: Count | None = None
    unit: str | None = None
    bounds: list[Bound] | None = None
    stated: Positive | None = None
    numerator: Quantity | None = None
    numerator_label: str | None = None
    denominator: Quantity | None = None
    denominator_label: str | None = None
    tolerance: NonNeg | None = None
    measure_tolerance: float | None = Field(None, ge=0, le=1)
    from_tokens: int | None = Field(None, ge=1)
    to_tokens: int | None = Field(None, ge=1)
    memory: str | None = None
    criteria: list[str] | None = None
    measure: dict[Annotated[str, Field(pattern=r"^[a-z_]{1,64}$")],
                  Annotated[str, Field(min_length=1, max_length=256)]] | None = None
    untestable: str | None = Field(None, min_length=1, description="Why this toolkit cannot measure the claim.")

    def places(self, number: Literal["percent", "stated"]) -> int:
        """Decimals `number` is stated to: `decimals` when given, else as written."""
        value = self.percent if number == "percent" else self.stated
        if self.decimals is not None or value is None:
            return self.decimals or 0
        return stated_decimals(value)


class ClaimsFile(Table):
    format: Literal["kvgraft-claims"]
    format_version: Literal[1]
    source: Source
    benchmarks: dict[Id, Benchmark] | None = None
    claims: list[Claim] = Field(min_length=1, max_length=1000)


# --- the result of checking one -----------------------------------------------------------------------------------------


class Finding(Closed):
    check: str = Field(min_length=1)
    verdict: FindingVerdict
    detail: str
    data: JsonObject


class Reading(Closed):
    name: str
    samples_per_problem: int = Field(ge=1)
    runs: int = Field(ge=1)


class Considered(Open):
    name: object
    samples_per_problem: object
    runs: object
    fits_all: object
    fractions: object


class BenchmarkReading(Closed):
    benchmark: Id
    name: str
    size: int = Field(ge=1)
    figures: dict[str, float]
    stated: Reading | None
    fits: list[Reading]
    chosen: Reading | None
    considered: list[Considered]
    summary: str


class FileRef(Closed):
    path: str
    sha256: Sha256 | None


class CheckedClaim(Closed):
    id: Id
    kind: str
    text: str
    claimed: str
    verdict: Verdict
    reason: str = Field(min_length=1)
    findings: list[Finding] = Field(min_length=1)


class Counts(Closed):
    contradicted: Count
    inconsistent: Count
    unsupported: Count
    supported: Count
    consistent: Count
    not_testable: Count = Field(alias="not-testable")


class ClaimsCheck(Closed):
    format: Literal["kvgraft-claims-check"]
    format_version: Literal[1]
    kvgraft_version: str
    claims_file: FileRef
    source: JsonObject
    measured_file: FileRef | None
    readings: list[BenchmarkReading] | None = Field(None, description="Per benchmark, the readings (samples per "
                                                    "problem, runs) under which every accuracy figure is an exact "
                                                    "fraction at its stated precision; dependent claims are judged "
                                                    "under `considered`.")
    claims: list[CheckedClaim]
    counts: Counts
    unused_measurements: list[str]
    failed: bool = Field(description="true when a claim is contradicted or inconsistent.")
    status: Status | None = Field(default=None, description="failed when a claim is contradicted or inconsistent, incomplete "
                                  "when no claim could be judged (all not-testable), else passed; kvgraft.verdict maps "
                                  "it to the exit code.")

    def as_json(self) -> dict[str, JsonValue]:
        """The result as `audit claims --json` prints it: members never set (`status` before sealing) absent."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


# --- what a report's check holds --------------------------------------------------------------------------------------


class ShownFinding(Open):
    check: str
    verdict: str
    detail: str


class ClaimVerdict(Open):
    """A claim's verdict, as a claims check and a report's `claims` hold it."""

    id: str
    verdict: str
    claimed: str | None = None
    reason: str | None = None
    findings: list[ShownFinding] | None = None


class ShownReading(Open):
    summary: str
    figures: JsonObject


class ClaimsData(Open):
    """A claims-check result as a report's check holds it, or a subset of its members: the counts, each claim's
    verdict and findings, and the readings its face and details draw."""

    counts: dict[str, Count] | None = None
    claims: list[ClaimVerdict] | None = None
    readings: list[ShownReading] | None = None


ROOT: JsonDict = {
    "description": "Two documents share this schema, told apart by `format`: a claims file (`kvgraft-claims`, written in "
    "TOML, e.g. audit/claims/*.toml) that states a paper's claims as data, and a claims-check result "
    "(`kvgraft-claims-check`, what `kvgraft audit claims --json` prints). In a claims file, `measure` maps the roles "
    "of a claim's kind to keys of a measured-results JSON object: accuracy {accuracy: {k, n}}, gain {discordant: "
    "{baseline_only, treated_only}}, count {count: int}, ratio {ratio: number}, context {attended_tokens: int, "
    "peak_memory_ratio: number}, exactness {byte_identical: bool, kl_max: number}.",
    "if": {"type": "object", "properties": {"format": {"const": "kvgraft-claims-check"}}, "required": ["format"]},
    "then": {"$ref": "#/$defs/ClaimsCheck"},
    "else": {"$ref": "#/$defs/ClaimsFile"},
}

TYPED = Typed("claims.v1.json", "kvgraft claims, format version 1: a claims file and the result of checking it",
              ClaimsCheck, ClaimsData, root=ROOT, also=(ClaimsFile,))
