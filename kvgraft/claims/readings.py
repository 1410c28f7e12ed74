"""Readings of accuracy figures: how many samples (and runs) per problem make every figure an exact fraction.

A percentage on N problems is read as k/(s*r*N) for s samples per problem and r runs. One figure alone says
little; all the figures of one benchmark together pin the reading down: the smallest s (with the stated r)
under which every figure is an exact fraction at its stated precision. Dependent claims (a gain, a count of
problems) are then judged under that reading, with the test and the definitions that reading allows.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from fractions import Fraction

from kvgraft.generalization.stats import mcnemar_exact
from kvgraft.results import claims as results
from kvgraft.results.base import JsonObject

MAX_SAMPLES = 16  # the most samples per problem tried when a benchmark does not state its reading


@dataclass(frozen=True)
class Reading:
    samples: int = 1
    runs: int = 1

    @property
    def per_problem(self) -> int:
        return self.samples * self.runs

    @property
    def name(self) -> str:
        base = "single sample" if self.samples == 1 else f"avg@{self.samples}"
        return base if self.runs == 1 else f"{base}, mean of {self.runs} runs"

    def as_json(self) -> JsonObject:
        return {"name": self.name, "samples_per_problem": self.samples, "runs": self.runs}

    def result(self) -> results.Reading:
        return results.Reading(name=self.name, samples_per_problem=self.samples, runs=self.runs)


@dataclass(frozen=True)
class Figure:
    """One stated percentage, `decimals` as stated."""

    claim: str
    percent: Fraction
    decimals: int

    @property
    def shown(self) -> str:
        return f"{float(self.percent):.{self.decimals}f}%"


def ks_within(fig: Figure, total: int) -> list[int]:
    """Every k for which 100*k/total rounds to the stated figure."""
    tol = Fraction(1, 2 * 10**fig.decimals)
    centre = fig.percent * total / 100
    lo, hi = math.floor(centre - total * tol / 100) - 1, math.ceil(centre + total * tol / 100) + 1
    return [k for k in range(max(0, lo), min(total, hi) + 1) if abs(Fraction(100 * k, total) - fig.percent) <= tol]


def fraction_text(fig: Figure, k: int, total: int) -> str:
    """'93.3% = 112/120' when exact, '89.2% ≈ 107/120' when equal only after rounding."""
    sign = "=" if Fraction(100 * k, total) == fig.percent else "≈"
    return f"{fig.shown} {sign} {k}/{total}"


def fit(figures: list[Figure], n: int, reading: Reading) -> dict[str, int] | None:
    """{claim: k} when every figure is k/(per_problem*n) at its precision under `reading`, else None."""
    total = reading.per_problem * n
    out: dict[str, int] = {}
    for f in figures:
        ks = ks_within(f, total)
        if not ks:
            return None
        out[f.claim] = ks[0]
    return out


@dataclass
class BenchmarkReading:
    """The readings of one benchmark's figures: which fit, the one used for verdicts, and the single-sample one."""

    benchmark: str
    name: str
    n: int
    figures: list[Figure]
    stated: Reading | None
    fits: list[Reading]

    @property
    def chosen(self) -> Reading | None:
        return self.fits[0] if self.fits else None

    def considered(self) -> list[Reading]:
        """The readings dependent claims are judged under: the chosen one, and single sample beside it unless
        the file states its reading (a larger multiple of the chosen one has no support in the figures)."""
        if self.stated is not None:
            return [self.stated]
        out = [self.chosen] if self.chosen else []
        return out + ([Reading()] if Reading() not in out else [])

    def fits_all(self, reading: Reading) -> bool:
        return reading in self.fits

    def misfits(self, reading: Reading) -> list[Figure]:
        total = reading.per_problem * self.n
        return sorted((f for f in self.figures if not ks_within(f, total)), key=lambda f: f.percent)

    def k(self, claim: str, reading: Reading) -> tuple[int, bool]:
        """(k, exact) of a figure under a reading: the nearest k when it is not a fraction there."""
        f = next(x for x in self.figures if x.claim == claim)
        total = reading.per_problem * self.n
        ks = ks_within(f, total)
        if ks:
            return ks[0], True
        return min(range(total + 1), key=lambda k: (abs(Fraction(100 * k, total) - f.percent), k)), False

    def describe(self, reading: Reading) -> str:
        """The figures that fit `reading`, as fractions, smallest first."""
        total = reading.per_problem * self.n
        bad = self.misfits(reading)
        return ", ".join(fraction_text(f, self.k(f.claim, reading)[0], total)
                         for f in sorted(self.figures, key=lambda x: x.percent) if f not in bad)

    def summary(self) -> str:
        n_fig = len(self.figures)
        what = f"{self.name} ({self.n} problems, {n_fig} figure{'s' if n_fig != 1 else ''})"
        if self.stated is not None:
            if self.fits:
                return f"{what}: the stated reading {self.stated.name} fits every figure ({self.describe(self.stated)})"
            bad = ", ".join(f.shown for f in self.misfits(self.stated))
            return f"{what}: the stated reading {self.stated.name} does not fit {bad}"
        chosen = self.chosen
        if chosen is None:
            return (f"{what}: no reading up to avg@{MAX_SAMPLES} makes every figure an exact fraction; "
                    "the figures are judged one at a time")
        if chosen == Reading(runs=chosen.runs):
            return f"{what}: every figure is an exact fraction under {chosen.name} ({self.describe(chosen)})"
        text = f"{what}: {chosen.name} is the smallest reading that fits every figure ({self.describe(chosen)})"
        bad = ", ".join(f.shown for f in self.misfits(Reading(runs=chosen.runs)))
        text += f"; single sample does not fit ({bad} {'is' if ',' not in bad else 'are'} not k/{self.n * chosen.runs})"
        more = [r.name for r in self.fits[1:]]
        if more:
            text += f"; {', '.join(more)} also fit (multiples add nothing the figures show)"
        return text

    def result(self) -> results.BenchmarkReading:
        considered = []
        for r in self.considered():
            total = r.per_problem * self.n
            considered.append(results.Considered(
                name=r.name, samples_per_problem=r.samples, runs=r.runs, fits_all=self.fits_all(r),
                fractions={f.claim: {"k": self.k(f.claim, r)[0], "n": total, "fits": self.k(f.claim, r)[1]}
                           for f in self.figures}))
        return results.BenchmarkReading(
            benchmark=self.benchmark, name=self.name, size=self.n,
            figures={f.claim: float(f.percent) for f in self.figures},
            stated=None if self.stated is None else self.stated.result(), fits=[r.result() for r in self.fits],
            chosen=None if self.chosen is None else self.chosen.result(), considered=considered,
            summary=self.summary())


def read_benchmark(benchmark: str, spec: results.Benchmark, figures: list[Figure]) -> BenchmarkReading:
    """Every reading that fits all `figures`, smallest first: the stated one only, when the file states one."""
    n = spec.size
    runs = spec.runs if spec.runs is not None else 1
    stated = None
    if spec.samples_per_problem is not None:
        stated = Reading(spec.samples_per_problem, runs)
        candidates = [stated]
    else:
        candidates = [Reading(s, runs) for s in range(1, MAX_SAMPLES + 1)]
    fits = [r for r in candidates if fit(figures, n, r) is not None] if figures else candidates[:1]
    return BenchmarkReading(benchmark, spec.name if spec.name is not None else benchmark, n, figures, stated, fits)


# --- dependent claims under one reading ------------------------------------------------------------------------


def majority(per_problem: int) -> int:
    """Fewest samples that are a strict majority of `per_problem`."""
    return per_problem // 2 + 1


@dataclass(frozen=True)
class Limit:
    """The most problems a count can reach under one definition of unsolved (or solved)."""

    definition: str
    samples_needed: int
    limit: int

    def as_json(self, count: int) -> JsonObject:
        return {**asdict(self), "possible": count <= self.limit}


def count_limits(relation: str, k: int, n: int, reading: Reading) -> list[Limit]:
    """The most problems that can be unsolved (or solved) when k of n*per_problem samples are right, under each
    definition the reading allows: with one sample per problem there is one definition."""
    per = reading.per_problem
    total = per * n
    pool = total - k if relation == "unsolved-by" else k
    word = "wrong" if relation == "unsolved-by" else "right"
    if per == 1:
        return [Limit(f"{word} (one sample per problem)", 1, min(n, pool))]
    defs = [(f"{word} in all {per} samples", per), (f"{word} in a majority ({majority(per)} or more) of the {per} samples",
                                                     majority(per))]
    return [Limit(d, need, min(n, pool // need)) for d, need in defs]


@dataclass(frozen=True)
class SignTest:
    """What the aggregates alone say about a paired sign test on per-problem pass rates."""

    extra_right_samples: int
    fewest_problems: int
    most_problems: int
    p_concentrated: float
    p_spread: float
    problems_needed: int | None

    def as_json(self) -> JsonObject:
        return asdict(self)


def sign_test_bounds(kb: int, kt: int, n: int, reading: Reading, alpha: float) -> SignTest:
    """What the aggregates alone say about a paired sign test on per-problem pass rates: the extra right samples
    d = kt - kb fall on at least ceil(d/per_problem) problems and at most min(d, n, wrong baseline samples)."""
    per = reading.per_problem
    d = kt - kb
    fewest = -(-d // per)
    most = min(d, n, per * n - kb)
    needed = next((m for m in range(1, n + 1) if mcnemar_exact(0, m) < alpha), None)
    return SignTest(d, fewest, most, mcnemar_exact(0, fewest), mcnemar_exact(0, most), needed)
