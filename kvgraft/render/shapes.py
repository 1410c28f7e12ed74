"""The shapes the renderers' parts read of the results not yet typed by a model (recompute; the others are
kvgraft.results' models), as TypedDicts: dicts at runtime, checked member by member by mypy.

Each mirrors the part of schemas/audit-report.v1.json (and of the kind's result schema, which is stricter) that
guarantees it: `Required` where the schema requires the member, `NotRequired` where a report may lack it, and a
renderer reads a `NotRequired` member with `.get`. A report is validated against its schema when it is loaded
(kvgraft.report.document.load_report) or built, and a result when it is sealed (kvgraft.audit.checks.seal); that
is what makes a report check's `data` one of these shapes. The check kinds (kvgraft.audit.checks.<kind>) extend
them with the members only their faces read.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

# --- recompute: entries, layers, tensor diffs ------------------------------------------------------------------------


class TensorDiff(TypedDict):
    """$defs/tensor_diff, the members the heat map and the rows read."""

    equal: bool
    differing: int
    max_abs: NotRequired[float | str]  # "Infinity" for a non-finite difference
    max_rel: NotRequired[float]
    max_ulp: NotRequired[int | None]
    ulp_pairs: NotRequired[int]
    shape_mismatch: NotRequired[str | None]


class Layer(TypedDict):
    index: int
    kind: NotRequired[str]
    keys: NotRequired[TensorDiff]
    values: NotRequired[TensorDiff]
    layout_mismatch: NotRequired[str]


class FirstDifference(TypedDict, total=False):
    layer: int
    tensor: str | None
    location: list[int] | None
    detail: str | None


class Dist(TypedDict, total=False):
    kl_max: float


class RecomputeEntry(TypedDict):
    id: str
    byte_exact: bool
    layers: list[Layer]
    num_tokens: NotRequired[int]
    verdict: NotRequired[str]
    max_excess: NotRequired[float | str]
    first_difference: NotRequired[FirstDifference | None]
    matched: NotRequired[Dist]
    natural: NotRequired[Dist]


class Entries(TypedDict):
    """What the per-entry rows and the heat map read of a recompute result."""

    entries: list[RecomputeEntry]
