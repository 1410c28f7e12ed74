"""Readings of accuracy figures: how many samples (and runs) per problem make every figure an exact fraction.

A percentage on N problems is read as k/(s*r*N) for s samples per problem and r runs. One figure alone says
little; all the figures of one benchmark together pin the reading down: the smallest s (with the stated r)
under which every figure is an exact fraction at its stated precision. Dependent claims (a gain, a count of
problems) are then judged under that reading, with the test and the definitions that reading allows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from kvgraft.generalization.stats import mcnemar_exact

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

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "samples_per_problem": self.samples, "runs": self.runs}


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

    def as_dict(self) -> dict[str, Any]:
        considered = []
        for r in self.considered():
            total = r.per_problem * self.n
            considered.append({**r.as_dict(), "fits_all": self.fits_all(r),
                               "fractions": {f.claim: {"k": self.k(f.claim, r)[0], "n": total, "fits": self.k(f.claim, r)[1]}
                                             for f in self.figures}})
        return {"benchmark": self.benchmark, "name": self.name, "size": self.n,
                "figures": {f.claim: float(f.percent) for f in self.figures},
                "stated": None if self.stated is None else self.stated.as_dict(),
                "fits": [r.as_dict() for r in self.fits],
                "chosen": None if self.chosen is None else self.chosen.as_dict(),
                "considered": considered, "summary": self.summary()}


def read_benchmark(benchmark: str, spec: dict[str, Any], figures: list[Figure]) -> BenchmarkReading:
    """Every reading that fits all `figures`, smallest first: the stated one only, when the file states one."""
    n = int(spec["size"])
    runs = int(spec.get("runs", 1))
    stated = None
    if "samples_per_problem" in spec:
        stated = Reading(int(spec["samples_per_problem"]), runs)
        candidates = [stated]
    else:
        candidates = [Reading(s, runs) for s in range(1, MAX_SAMPLES + 1)]
    fits = [r for r in candidates if fit(figures, n, r) is not None] if figures else candidates[:1]
    return BenchmarkReading(benchmark, spec.get("name", benchmark), n, figures, stated, fits)


# --- dependent claims under one reading ------------------------------------------------------------------------


def majority(per_problem: int) -> int:
    """Fewest samples that are a strict majority of `per_problem`."""
    return per_problem // 2 + 1


def count_limits(relation: str, k: int, n: int, reading: Reading) -> list[dict[str, Any]]:
    """The most problems that can be unsolved (or solved) when k of n*per_problem samples are right, under each
    definition the reading allows: with one sample per problem there is one definition."""
    per = reading.per_problem
    total = per * n
    pool = total - k if relation == "unsolved-by" else k
    word = "wrong" if relation == "unsolved-by" else "right"
    if per == 1:
        return [{"definition": f"{word} (one sample per problem)", "samples_needed": 1, "limit": min(n, pool)}]
    defs = [(f"{word} in all {per} samples", per), (f"{word} in a majority ({majority(per)} or more) of the {per} samples",
                                                     majority(per))]
    return [{"definition": d, "samples_needed": need, "limit": min(n, pool // need)} for d, need in defs]


def sign_test_bounds(kb: int, kt: int, n: int, reading: Reading, alpha: float) -> dict[str, Any]:
    """What the aggregates alone say about a paired sign test on per-problem pass rates: the extra right samples
    d = kt - kb fall on at least ceil(d/per_problem) problems and at most min(d, n, wrong baseline samples)."""
    per = reading.per_problem
    d = kt - kb
    fewest = -(-d // per)
    most = min(d, n, per * n - kb)
    needed = next((m for m in range(1, n + 1) if mcnemar_exact(0, m) < alpha), None)
    return {"extra_right_samples": d, "fewest_problems": fewest, "most_problems": most,
            "p_concentrated": mcnemar_exact(0, fewest), "p_spread": mcnemar_exact(0, most),
            "problems_needed": needed}
