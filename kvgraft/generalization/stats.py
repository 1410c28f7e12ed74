"""Small-sample statistics for paired accuracy comparisons, stated honestly.

- `wilson`: Wilson score interval for a binomial proportion.
- `mcnemar_exact` / `mcnemar_midp`: exact two-sided McNemar test on the discordant pairs, and its mid-p.
- `mcnemar`: the whole paired comparison with a plain-language verdict that says "not significant"
  when it is not, and says so up front when too few discordant pairs exist to ever reach significance.
- `paired_bootstrap`: percentile CI of the accuracy difference (B - A) over resampled items.
- `pass_at_k`: the unbiased pass@k estimator of Chen et al. (2021).
- `detectable_effect`: the smallest paired difference the exact McNemar test finds at a sample size (power),
  so that a null result reads "no effect larger than X", never "no effect".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from statistics import NormalDist
from typing import TypedDict

import numpy as np
from scipy.stats import binom, binomtest

from kvgraft.errors import InputError
from kvgraft.results.generalization import Bootstrap

ALPHA = 0.05
FEW_DISCORDANT = 20  # below this many discordant items the bootstrap result carries a warning note


def _check_count(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise InputError(f"{name} must be a non-negative integer, got {value!r}")


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval (lo, hi) for k successes in n trials; (0, 1) when n == 0."""
    _check_count("k", k)
    _check_count("n", n)
    if k > n:
        raise InputError(f"k ({k}) exceeds n ({n})")
    if z <= 0:
        raise InputError(f"z must be positive, got {z}")
    if n == 0:
        return 0.0, 1.0
    p = k / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    # At k = 0 and k = n the bound is exactly 0 or 1; rounding would otherwise leave ~1e-17.
    lo = 0.0 if k == 0 else max(0.0, centre - half)
    hi = 1.0 if k == n else min(1.0, centre + half)
    return lo, hi


def wilson_interval(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of k/n at `confidence`; over `wilson`."""
    if n <= 0 or not 0 <= k <= n:
        raise InputError(f"wilson_interval: need 0 <= k <= n and n > 0, got k={k}, n={n}")
    if not 0 < confidence < 1:
        raise InputError(f"wilson_interval: confidence must be in (0, 1), got {confidence}")
    return wilson(k, n, z=NormalDist().inv_cdf(1 - (1 - confidence) / 2))


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p: binomial test of min(b, c) among b + c discordant pairs at p = 1/2."""
    _check_count("b", b)
    _check_count("c", c)
    if b + c == 0:
        return 1.0
    return float(min(1.0, binomtest(min(b, c), b + c, 0.5, alternative="two-sided").pvalue))


def mcnemar_midp(b: int, c: int) -> float:
    """Mid-p McNemar: the exact two-sided p less the probability of the observed count (less conservative)."""
    _check_count("b", b)
    _check_count("c", c)
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    cdf = sum(math.comb(n, i) for i in range(k + 1))
    return float(min(Fraction(1), Fraction(2 * cdf - math.comb(n, k), 2**n)))  # exact rational, then rounded once


def min_attainable_p(discordant: int) -> float:
    """The smallest exact two-sided McNemar p any split of `discordant` pairs can give: 2 / 2**n."""
    _check_count("discordant", discordant)
    return 1.0 if discordant == 0 else min(1.0, 2.0 * 0.5**discordant)


class McNemarRecord(TypedDict):
    """`McNemarResult.as_dict`: its fields and `difference`."""

    n: int
    correct_a: int
    correct_b: int
    b: int
    c: int
    p_exact: float
    p_midp: float
    alpha: float
    significant: bool
    verdict: str
    difference: float


class Detectable(TypedDict):
    """`detectable_effect`'s record (results.generalization.Power is its published shape)."""

    n: int
    alpha: float
    power: float
    min_discordant: int | None
    min_significant: float | None
    effect: float | None
    method: str


@dataclass(frozen=True)
class McNemarResult:
    n: int
    correct_a: int
    correct_b: int
    b: int  # A right, B wrong
    c: int  # A wrong, B right
    p_exact: float
    p_midp: float
    alpha: float
    significant: bool  # on the exact p
    verdict: str

    @property
    def difference(self) -> float:
        """Accuracy of B minus accuracy of A."""
        return (self.correct_b - self.correct_a) / self.n if self.n else 0.0

    def as_dict(self) -> McNemarRecord:
        return McNemarRecord(n=self.n, correct_a=self.correct_a, correct_b=self.correct_b, b=self.b, c=self.c,
                             p_exact=self.p_exact, p_midp=self.p_midp, alpha=self.alpha, significant=self.significant,
                             verdict=self.verdict, difference=self.difference)


POWER = 0.8


def detectable_effect(n: int, *, alpha: float = ALPHA, power: float = POWER) -> Detectable:
    """The smallest difference in accuracy between two paired conditions on n items that the two-sided exact
    McNemar test detects with probability `power` at `alpha`, in the most favourable case (items flip one way
    only): significance needs m discordant items (2 / 2**m < alpha), and the effect is the flip rate d at which
    Binomial(n, d) reaches m with probability `power`. Any real effect is at least this hard to detect, so a
    non-significant result says only that no effect this large is likely to have been missed.

    `min_significant` is m / n: the smallest observed difference that could have been significant at all.
    `effect` is None when no outcome on n items can be significant.
    """
    _check_count("n", n)
    if not 0.0 < alpha < 1.0 or not 0.0 < power < 1.0:
        raise InputError(f"alpha and power must be within (0, 1), got {alpha}, {power}")
    m = next((k for k in range(1, n + 1) if min_attainable_p(k) < alpha), None)
    out = Detectable(n=n, alpha=alpha, power=power, min_discordant=m, min_significant=None if m is None else m / n,
                     effect=None, method="exact McNemar, one-directional flips, binomial power")
    if m is None:
        return out
    lo, hi = 0.0, 1.0
    for _ in range(60):  # bisection on the flip rate; binom.sf(m - 1, n, d) = P(at least m flips) rises with d
        mid = (lo + hi) / 2
        if float(binom.sf(m - 1, n, mid)) >= power:
            hi = mid
        else:
            lo = mid
    out["effect"] = hi
    return out


def _bools(name: str, values: Sequence[bool]) -> list[bool]:
    out: list[bool] = []
    for i, v in enumerate(values):
        if not isinstance(v, (bool, np.bool_)):
            raise InputError(f"{name}[{i}] must be a bool, got {v!r}")
        out.append(bool(v))
    return out


def mcnemar(
    pairs_a: Sequence[bool], pairs_b: Sequence[bool], *, alpha: float = ALPHA, labels: tuple[str, str] = ("A", "B")
) -> McNemarResult:
    """Paired comparison of per-item correctness of A and B on the same items, in the same order."""
    a, bb = _bools("pairs_a", pairs_a), _bools("pairs_b", pairs_b)
    if len(a) != len(bb):
        raise InputError(f"paired results differ in length: {len(a)} vs {len(bb)}")
    if not 0.0 < alpha < 1.0:
        raise InputError(f"alpha must be within (0, 1), got {alpha}")
    n = len(a)
    b = sum(1 for x, y in zip(a, bb, strict=True) if x and not y)
    c = sum(1 for x, y in zip(a, bb, strict=True) if y and not x)
    ka, kb = sum(a), sum(bb)
    p = mcnemar_exact(b, c)
    mid = mcnemar_midp(b, c)
    significant = p < alpha
    la, lb = labels
    head = f"{lb} {kb}/{n} vs {la} {ka}/{n} ({(kb - ka) / n:+.1%} for {lb})" if n else f"no paired items to compare {la} and {lb}"
    disc = f"discordant pairs: {b} {la}-only, {c} {lb}-only"
    if b + c == 0:
        tail = f"no discordant pairs, so no evidence of a difference; not significant at {alpha:g}"
    elif significant:
        better = lb if c > b else la
        tail = f"exact McNemar p = {p:.4g} (mid-p {mid:.4g}): significant at {alpha:g}, {better} is better"
    else:
        tail = f"exact McNemar p = {p:.4g} (mid-p {mid:.4g}): not significant at {alpha:g}"
        floor = min_attainable_p(b + c)
        if floor >= alpha:
            tail += f"; with only {b + c} discordant pairs no outcome could be significant (smallest possible p = {floor:.4g})"
    return McNemarResult(
        n=n,
        correct_a=ka,
        correct_b=kb,
        b=b,
        c=c,
        p_exact=p,
        p_midp=mid,
        alpha=alpha,
        significant=significant,
        verdict=f"{head}; {disc}; {tail}",
    )


@dataclass(frozen=True)
class BootstrapResult:
    difference: float  # mean(b) - mean(a) on the observed items
    lo: float
    hi: float
    confidence: float
    n_boot: int
    seed: int
    n: int
    discordant: int  # items where a and b differ
    note: str
    method: str = "paired percentile bootstrap over items"

    @property
    def excludes_zero(self) -> bool:
        return self.lo > 0.0 or self.hi < 0.0

    def model(self) -> Bootstrap:
        """As a result records it: its fields and `excludes_zero`."""
        return Bootstrap(**dataclasses.asdict(self), excludes_zero=self.excludes_zero)


def paired_bootstrap(
    a: Sequence[bool | float], b: Sequence[bool | float], n_boot: int = 10_000, seed: int = 0, *, confidence: float = 0.95
) -> BootstrapResult:
    """Percentile CI of mean(b) - mean(a), resampling items (pairs) with replacement; deterministic for a seed.

    With few discordant items the percentile interval is too narrow (all-one-sided discordant pairs
    give an interval that excludes 0 however few they are): the result's `note` says so, and the
    exact McNemar test is the one to read for significance.
    """
    xa = np.asarray(a, dtype=np.float64)
    xb = np.asarray(b, dtype=np.float64)
    if xa.ndim != 1 or xa.shape != xb.shape:
        raise InputError(f"paired results must be two 1-D sequences of equal length, got {xa.shape} and {xb.shape}")
    if xa.size == 0:
        raise InputError("paired_bootstrap needs at least one pair")
    if n_boot < 1:
        raise InputError(f"n_boot must be >= 1, got {n_boot}")
    if not 0.0 < confidence < 1.0:
        raise InputError(f"confidence must be within (0, 1), got {confidence}")
    diff = xb - xa
    n = diff.size
    rng = np.random.default_rng(seed)
    means = np.empty(n_boot, dtype=np.float64)
    chunk = max(1, 4_000_000 // n)
    for start in range(0, n_boot, chunk):
        stop = min(n_boot, start + chunk)
        idx = rng.integers(0, n, size=(stop - start, n))
        means[start:stop] = diff[idx].mean(axis=1)
    tail = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(means, [tail, 1.0 - tail])
    discordant = int(np.count_nonzero(diff))
    note = (
        f"only {discordant} discordant items: the percentile bootstrap is anti-conservative here; read the exact McNemar p"
        if discordant < FEW_DISCORDANT
        else ""
    )
    return BootstrapResult(
        difference=float(diff.mean()),
        lo=float(lo),
        hi=float(hi),
        confidence=confidence,
        n_boot=n_boot,
        seed=seed,
        n=n,
        discordant=discordant,
        note=note,
    )


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021): 1 - C(n-c, k) / C(n, k), computed exactly."""
    _check_count("n", n)
    _check_count("c", c)
    _check_count("k", k)
    if c > n:
        raise InputError(f"c ({c}) exceeds n ({n})")
    if not 1 <= k <= n:
        raise InputError(f"k must be within [1, n={n}], got {k}")
    if n - c < k:
        return 1.0
    return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))
