"""The controls: effects planted on a generated fact library, and whether the audit finds each."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from kvgraft.results.base import Closed, JsonObject, Open, Typed, nullable
from kvgraft.results.generalization import McNemar, Power
from kvgraft.results.stats import KN, Count, Detectable, Fraction

Status = Literal["passed", "failed", "incomplete"]


class PValue(Open):
    p_exact: Fraction


class Split(Open):
    clean: KN
    contaminated: KN


class Control(Open):
    """One planted effect and what the audit found of it."""

    name: str
    expect: str
    condition: str
    n: Count
    baseline: KN
    graft: KN
    mcnemar: PValue
    significant: bool | None = None
    detectable: Detectable
    split: Split
    shows: bool


class ControlsData(Open):
    """A controls result as a report's check holds it, or a subset of its members: each control with the members
    its face and tables draw."""

    controls: list[Control]
    statements: list[str] | None = None


class Library(Open):
    path: str
    root_digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    entries: Count


class Generator(Open):
    source: str
    n: Count
    seed: int


class SplitPart(Open):
    k: Count
    n: Count
    baseline_k: Count


class SplitParts(Open):
    clean: SplitPart
    contaminated: SplitPart


class Row(Open):
    query_id: str
    entry_id: str | None
    entry_problem_id: str | None = nullable()
    baseline_correct: bool
    graft_correct: bool
    contaminated: bool


class PlantedControl(Open):
    name: Literal["replay", "related", "null"]
    expect: str
    condition: Literal["own", "other"]
    n: Count
    baseline: KN
    graft: KN
    mcnemar: McNemar
    significant: bool
    detectable: Power
    split: SplitParts
    shows: bool
    verdict: str
    fact_entry_selected: Count | None = None
    rows: list[Row]


class ControlsResult(Closed):
    """Planted effects on a generated fact library (kvgraft.generalization.controls): replay (own entry grafted, b vs
    a), related (held-out question whose fact sits in another entry, c vs a) and null (unrelated entry grafted, c vs
    a). `shows` says whether a control shows what it expects; `detectable` is the smallest difference the exact
    McNemar test detects at its n (kvgraft.generalization.stats.detectable_effect)."""

    kind: Literal["kvgraft-controls-result"]
    format_version: Literal[1]
    kvgraft_version: str
    status: Status | None = Field(None, description="passed when every control shows what it expects, else incomplete "
                                  "(kvgraft.audit.checks.controls.status).")
    model: str
    library: Library
    generator: Generator
    settings: JsonObject
    controls: list[PlantedControl]
    statements: list[str]
    seconds: float = Field(ge=0)
    decode_tokens: Count


TYPED = Typed("controls-result.v1.json", "kvgraft generalization controls, version 1", ControlsResult, ControlsData)
