"""The determinism matrix: one prefix prefilled under varied conditions, each condition's KV byte class."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from kvgraft.results.base import Closed, JsonObject, Open, Typed, nullable
from kvgraft.results.recompute import Measure

SHA256 = r"^[0-9a-f]{64}$"
Status = Literal["passed", "failed", "incomplete"]


class Condition(Open):
    """A condition with its KV byte class (same class = byte-identical states)."""

    name: str
    class_: str | None = Field(None, alias="class")
    condition: JsonObject | None = None
    kv_digest: str | None = Field(None, pattern=SHA256)
    identical_to_baseline: bool | None = None
    max_ulp: int | None = nullable(ge=0)
    max_abs: Annotated[float, Field(ge=0)] | Literal["Infinity", "NaN"] | None = Field(
        None, description="A non-finite value is written as the string Infinity or NaN (JSON has neither).")
    kl: Measure | None = None


class ClassRow(Open):
    """One entry, with its class under each condition."""

    entry: str
    classes: list[str | int]


class Environment(Open):
    device_name: str | None = nullable()


class DeterminismData(Open):
    """A determinism matrix as a report's check holds it: its conditions with their KV byte class; optionally
    `rows`, one per entry, with a class per condition."""

    baseline: str | None = None
    length: int | None = Field(None, ge=1)
    conditions: list[Condition]
    rows: list[ClassRow] | None = None
    notes: list[str] | None = None
    environment: Environment | None = None


class MatrixCondition(Closed):
    name: str
    condition: JsonObject
    kv_digest: str = Field(pattern=SHA256)
    class_: str = Field(alias="class")
    identical_to_baseline: bool
    max_ulp: int | None
    max_abs: Annotated[float, Field(ge=0)] | Literal["Infinity", "NaN"] = Field(
        description="A non-finite value is written as the string Infinity or NaN (JSON has neither).")
    kl: Measure


class DeterminismResult(Closed):
    """One prefix prefilled under varied conditions. Each condition's KV digest is SHA-256 over the canonical JSON
    of the list of per-tensor SHA-256s in layer order; conditions with the same digest share a class letter (A =
    baseline). max_ulp is the largest ULP distance among elements whose values are finite, normal and of the same
    sign in both (across zero a ULP count is no useful figure), null when dtypes differ from the baseline. kl is
    KL(baseline || condition) of the next-token distribution, float64, not clamped."""

    status: Status | None = Field(default=None, description="This result's own verdict (kvgraft.verdict): it decides the exit "
                                  "code of the single-audit command and the check's status in `audit run`.")
    kind: Literal["kvgraft-determinism-result"]
    format_version: Literal[1]
    model: str
    length: int = Field(ge=1)
    baseline: str
    environment: JsonObject
    conditions: list[MatrixCondition]
    notes: list[str]


TYPED = Typed("determinism-result.v1.json", "kvgraft determinism matrix, version 1", DeterminismResult, DeterminismData)
