"""The shapes the renderers' parts read of the results not yet typed by a model (generalization; the others are
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

# --- shared --------------------------------------------------------------------------------------------------------


class KN(TypedDict):
    """k of n (solved of asked)."""

    k: int
    n: int


class Accuracy(TypedDict):
    """$defs/accuracy: k of n under a named condition, with its Wilson interval when the producer wrote it."""

    name: str
    k: int
    n: int  # at least 1
    interval: NotRequired[list[float]]  # [lo, hi]
    confidence: NotRequired[float]


class Detectable(TypedDict):
    """kvgraft.generalization.stats.detectable_effect: the smallest difference a test at n could find."""

    n: int
    effect: float | None
    power: NotRequired[float]
