"""The statistics several kinds' results share: k of n, and the smallest difference a test at n could find."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from kvgraft.results.base import Count, Fraction, Open, Sha256

__all__ = ["KN", "Count", "Detectable", "Draw", "Fraction"]


class KN(Open):
    """k of n (solved of asked)."""

    k: Count
    n: Count


class Detectable(Open):
    """kvgraft.generalization.stats.detectable_effect: the smallest difference a test at n could find."""

    n: Count
    effect: float | None
    power: float | None = None


class Draw(Open):
    """A sample's draw (kvgraft.sampling, method sha256-rank-v1): the entries at `positions` of the release's entry
    list, `size` of `population`; `kvgraft audit sample RELEASE --nonce NONCE --size N` prints the same entries."""

    method: Literal["sha256-rank-v1"]
    weighting: str
    root_digest: Sha256
    nonce: str
    nonce_source: str  # each result says which sources it takes
    population: int = Field(ge=1)
    population_tokens: Count
    size: int = Field(ge=1)
    positions: list[Count]
    entries: list[str]
