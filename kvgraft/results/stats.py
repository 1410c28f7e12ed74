"""The statistics several kinds' results share: k of n, and the smallest difference a test at n could find."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from kvgraft.results.base import Open

Count = Annotated[int, Field(ge=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]


class KN(Open):
    """k of n (solved of asked)."""

    k: Count
    n: Count


class Detectable(Open):
    """kvgraft.generalization.stats.detectable_effect: the smallest difference a test at n could find."""

    n: Count
    effect: float | None
    power: float | None = None
