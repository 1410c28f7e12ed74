"""The kinds of claim, one table entry each (KINDS): measure roles, references, checks, measurement verdicts, summary.

Every check here is driven by the fields of a claim, never by the paper it came from:

- accuracy  `percent` on a `benchmark` of N problems must be k/(s*r*N) within the stated rounding, for one reading
            of all the benchmark's figures together: s samples per problem (avg@s) and r runs. The benchmark may
            state `samples_per_problem` (and `runs`); else the smallest s up to 16 that fits every figure is used
            (kvgraft.claims.readings). A figure no reading fits is inconsistent.
- gain      from a `baseline` accuracy claim to a `treated` one, under each reading considered: with one sample per
            problem the exact McNemar test in the most favourable case; with s > 1 a sign test on problems, bounded
            by how the extra right samples can spread (significance needs per-problem data).
- count     `count` problems, bounded by `bounds` (`unsolved-by` an accuracy claim: the problems it can leave wrong;
            `solved-by`: right) under each definition the reading allows (wrong in all samples, or in a majority),
            and by the benchmark size.
- ratio     `stated` ratio; with `numerator` and `denominator` the quotient must round to it.
- context   `from_tokens` -> `to_tokens` without more memory: needs measurement (tokens attended at once vs stored).
- exactness byte-identical restore / zero KL: only a measurement can test it.

A claims file's tables are the models of kvgraft.results.claims (the one source of schemas/claims.v1.json); the
file as the checks read it (ClaimsFile) and the findings they give (Finding) are defined here, so that
kvgraft.claims.checker, which loads files and runs the check, sits above the kinds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from functools import cached_property
from typing import NoReturn

from pydantic import JsonValue

from kvgraft.claims.readings import (
    MAX_SAMPLES,
    BenchmarkReading,
    Figure,
    Reading,
    count_limits,
    fraction_text,
    read_benchmark,
    sign_test_bounds,
)
from kvgraft.errors import InputError
from kvgraft.generalization.stats import mcnemar_exact, wilson_interval
from kvgraft.results import claims as results
from kvgraft.results.base import JsonObject
from kvgraft.results.claims import Benchmark, Claim, stated_decimals

__all__ = ["KINDS", "Claim", "ClaimKind", "ClaimsFile", "Finding", "References", "ValueType", "k_of_n",
           "stated_decimals"]


@dataclass(frozen=True)
class Finding:
    check: str
    verdict: str
    detail: str
    data: JsonObject = field(default_factory=dict)

    def result(self) -> results.Finding:
        return results.Finding.model_validate({"check": self.check, "verdict": self.verdict, "detail": self.detail,
                                               "data": self.data})


@dataclass
class ClaimsFile:
    """A claims file as the checks read it: where it was read from, its digest, and its tables."""

    path: str
    sha256: str | None
    doc: results.ClaimsFile
    source: JsonObject  # the [source] table in the file's order, which a check's result repeats

    @property
    def claims(self) -> list[Claim]:
        return self.doc.claims

    @property
    def benchmarks(self) -> dict[str, Benchmark]:
        return self.doc.benchmarks or {}

    def claim(self, claim_id: str) -> Claim:
        for c in self.claims:
            if c.id == claim_id:
                return c
        raise KeyError(claim_id)

    def on(self, c: Claim) -> str:
        """The benchmark an accuracy claim is on (the schema requires it of every accuracy claim)."""
        if c.benchmark is None:
            raise InputError(f"{self.path}: claim {c.id!r} names no benchmark")
        return c.benchmark

    @cached_property
    def readings(self) -> dict[str, BenchmarkReading]:
        """Per benchmark, the readings (samples per problem, runs) that fit all its accuracy figures jointly."""
        out = {}
        for bid, spec in self.benchmarks.items():
            figures = [Figure(c.id, Fraction(str(c.percent)), c.places("percent"))
                       for c in self.claims if c.kind == "accuracy" and c.benchmark == bid]
            out[bid] = read_benchmark(bid, spec, figures)
        return out


# --- numbers ---------------------------------------------------------------------------------------------------


def fmt(x: float | int | Fraction, decimals: int = 1) -> str:
    """1234567 -> '1,234,567'; 6574.19 -> '6,574.2'."""
    if isinstance(x, int) or (isinstance(x, float) and x.is_integer() and decimals == 0):
        return f"{int(x):,}"
    return f"{float(x):,.{decimals}f}"


def _half_unit(decimals: int) -> Fraction:
    return Fraction(1, 2 * 10**decimals)


@dataclass(frozen=True)
class MultiRun:
    """The fewest runs r such that some k/(r*n) rounds to a stated percentage."""

    runs: int
    k: int
    n: int
    percent: float


@dataclass(frozen=True)
class KOfN:
    """Which k/n a stated percentage can be."""

    n: int
    ks: list[int]
    nearest_k: int
    nearest_percent: float
    multi_run: MultiRun | None

    def as_json(self) -> JsonObject:
        return asdict(self)


def k_of_n(percent: float | int, n: int, decimals: int) -> KOfN:
    """Which k/n a stated percentage can be: the ks within rounding, the nearest k, and the fewest runs r
    such that some k/(r*n) rounds to it."""
    p = Fraction(str(percent)) if isinstance(percent, float) else Fraction(percent)
    tol = _half_unit(decimals)
    ks = [k for k in range(n + 1) if abs(Fraction(100 * k, n) - p) <= tol]
    nearest = min(range(n + 1), key=lambda k: (abs(Fraction(100 * k, n) - p), k))
    runs = None
    if not ks:
        for r in range(2, MAX_SAMPLES + 1):
            total = r * n
            k = round(p * total / 100)
            if 0 <= k <= total and abs(Fraction(100 * k, total) - p) <= tol:
                runs = MultiRun(r, k, total, float(Fraction(100 * k, total)))
                break
    return KOfN(n, ks, nearest, float(Fraction(100 * nearest, n)), runs)


def _percent(c: Claim) -> float | int:
    if c.percent is None:
        raise InputError(f"claim {c.id!r} states no percent")
    return c.percent


def _stated(c: Claim) -> float | int:
    if c.stated is None:
        raise InputError(f"claim {c.id!r} states no ratio")
    return c.stated


def _percent_str(claim: Claim) -> str:
    return f"{_percent(claim):.{claim.places('percent')}f}%"


# --- what a kind is made of ------------------------------------------------------------------------------------


def _is_int(x: JsonValue) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _int(x: JsonValue) -> int:
    """A value a role's ValueType accepted as an integer."""
    if isinstance(x, int):
        return int(x)
    raise InputError(f"measurement {x!r} is not an integer")


def _number(x: JsonValue) -> float:
    """A value a role's ValueType accepted as a number."""
    if isinstance(x, (int, float)):
        return float(x)
    raise InputError(f"measurement {x!r} is not a number")


def _member(x: JsonValue, key: str) -> int:
    """An integer member of a value a role's ValueType accepted as an object of integers."""
    if isinstance(x, dict):
        return _int(x[key])
    raise InputError(f"measurement {x!r} is not an object")


@dataclass(frozen=True)
class ValueType:
    """The JSON value a measure role must have in a measured-results object."""

    must_be: str  # completes "measurement 'key' must be ..." in the error for a value it does not accept
    accepts: Callable[[JsonValue], bool]


def _k_of_n(v: JsonValue) -> bool:
    if not isinstance(v, dict) or not set(v) >= {"k", "n"}:
        return False
    k, n = v["k"], v["n"]
    return isinstance(k, int) and isinstance(n, int) and _is_int(k) and _is_int(n) and 0 <= k <= n and n > 0


def _discordant(v: JsonValue) -> bool:
    if not isinstance(v, dict):
        return False
    pair = (v.get("baseline_only"), v.get("treated_only"))
    return all(isinstance(x, int) and _is_int(x) and x >= 0 for x in pair)


K_OF_N = ValueType('an object {"k": int, "n": int} with 0 <= k <= n, n > 0', _k_of_n)
DISCORDANT = ValueType('an object {"baseline_only": int >= 0, "treated_only": int >= 0}', _discordant)
INTEGER = ValueType("an integer", _is_int)
NUMBER = ValueType("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool))
BOOLEAN = ValueType("true or false", lambda v: isinstance(v, bool))


@dataclass(frozen=True)
class References:
    """The claims of one file by id, for a kind's rule on the claims a claim refers to; errors name the file."""

    where: str
    ids: dict[str, Claim]

    def fail(self, c: Claim, message: str) -> NoReturn:
        raise InputError(f"{self.where}: claim {c.id!r}: {message}")

    def accuracy(self, c: Claim, ref: str | None, what: str) -> Claim:
        """The accuracy claim `ref` names, on `c`'s benchmark when `c` names one."""
        target = self.ids.get(ref) if ref is not None else None
        if target is None:
            self.fail(c, f"{what} refers to unknown claim {ref!r}")
        if target.kind != "accuracy":
            self.fail(c, f"{what} {ref!r} is a {target.kind} claim, not an accuracy claim")
        if c.benchmark is not None and target.benchmark != c.benchmark:
            self.fail(c, f"{what} {ref!r} is on benchmark {target.benchmark!r}, not {c.benchmark!r}")
        return target


def _no_references(_c: Claim, _refs: References) -> None:
    return None


# (claim, measured values by role, the whole measured-results object)
Measured = Callable[[Claim, JsonObject, JsonObject], list[Finding]]


@dataclass(frozen=True)
class ClaimKind:
    """One kind of claim: everything the checker does differently for it."""

    name: str
    roles: dict[str, ValueType]  # measure roles: what a measured-results key can measure for this kind
    internal: Callable[[ClaimsFile, Claim], list[Finding]]  # consistency of the stated numbers alone
    measured: Measured
    claimed: Callable[[ClaimsFile, Claim], str]  # what is claimed, in a few words
    references: Callable[[Claim, References], None] = _no_references  # checked when the file is parsed


# --- dependent claims (gain, count) under each reading ---------------------------------------------------------


# Verdicts of a dependent claim under one reading, most charitable first: the headline takes the first that a
# reading fitting every figure gives.
_CHARITY = ("consistent", "unsupported", "inconsistent")


@dataclass(frozen=True)
class Judged:
    """A dependent claim's verdict under one reading; its finding data holds `facts`, the verdict, `after` and
    the detail, in that order."""

    reading: Reading
    fits_all: bool
    verdict: str
    detail: str
    facts: JsonObject
    after: JsonObject = field(default_factory=dict)

    def as_json(self) -> JsonObject:
        return {**self.facts, "verdict": self.verdict, **self.after, "detail": self.detail}


def _judged(check_name: str, br: BenchmarkReading, per_reading: list[Judged]) -> Finding:
    """One finding from a dependent claim's verdicts under each reading: the headline is the most charitable
    verdict of a reading that fits every figure, and says which reading; the other readings follow."""
    fitting = [r for r in per_reading if r.fits_all]
    if fitting:
        head = min(fitting, key=lambda r: _CHARITY.index(r.verdict))
        lead = f"under {head.reading.name} (fits every figure of {br.name})"
    else:
        head = next((r for r in per_reading if r.reading.samples == 1), per_reading[0])
        lead = f"under {head.reading.name} (no reading fits every figure of {br.name}; nearest fractions)"
    parts = [f"{lead}: {head.detail}"]
    for r in per_reading:
        if r is head:
            continue
        fits = "fits every figure" if r.fits_all else "does not fit " + ", ".join(f.shown for f in br.misfits(r.reading))
        parts.append(f"under {r.reading.name} ({fits}): {r.verdict}: {r.detail}")
    return Finding(check_name, head.verdict, "; ".join(parts),
                   {"headline_reading": head.reading.as_json(), "readings": [r.as_json() for r in per_reading]})


def _under(br: BenchmarkReading, reading: Reading) -> JsonObject:
    return {"reading": reading.as_json(), "fits_all": br.fits_all(reading),
            "misfits": [f.shown for f in br.misfits(reading)]}


# --- accuracy --------------------------------------------------------------------------------------------------


def _figure(br: BenchmarkReading, claim_id: str) -> Figure:
    return next(f for f in br.figures if f.claim == claim_id)


def _check_accuracy(cf: ClaimsFile, c: Claim) -> list[Finding]:
    br = cf.readings[cf.on(c)]
    n = br.n
    fig = _figure(br, c.id)
    single = k_of_n(_percent(c), n, c.places("percent"))
    chosen = br.chosen
    if chosen is not None:
        k, _ = br.k(c.id, chosen)
        total = chosen.per_problem * n
        detail = f"{fraction_text(fig, k, total)} under {chosen.name}"
        if chosen.per_problem > 1:
            detail += f" ({chosen.per_problem} samples on each of {n} problems)"
            if single.ks:
                detail += f"; also {' or '.join(f'{x}/{n}' for x in single.ks)} as a single sample"
            else:
                detail += f"; not k/{n}, so not a single-sample score"
        else:
            detail += f" on {br.name}"
        why = "the stated reading" if br.stated is not None else f"the smallest reading that fits all {len(br.figures)} figures"
        detail += f" ({chosen.name} is {why} of {br.name})" if len(br.figures) > 1 or br.stated is not None else ""
        return [Finding("reading", "consistent", detail,
                        {**single.as_json(), "reading": chosen.as_json(), "k": k, "total": total})]
    if br.stated is not None:
        total = br.stated.per_problem * n
        k, exact = br.k(c.id, br.stated)
        data: JsonObject = {**single.as_json(), "reading": br.stated.as_json(), "k": k, "total": total}
        if exact:
            return [Finding("reading", "consistent", f"{fraction_text(fig, k, total)} under the stated {br.stated.name}", data)]
        return [Finding("reading", "inconsistent", f"{fig.shown} is not k/{total} for any k under the stated "
                        f"{br.stated.name} (nearest {k}/{total} = {100 * k / total:.2f}%)", data)]
    if single.ks:
        fracs = " or ".join(f"{k}/{n}" for k in single.ks)
        return [Finding("k-of-n", "consistent", f"{fig.shown} = {fracs} on {br.name}", single.as_json())]
    detail = (f"{fig.shown} is not k/{n} for any k (nearest {single.nearest_k}/{n} = {single.nearest_percent:.1f}%), "
              f"and no reading up to avg@{MAX_SAMPLES} fits it together with the other figures of {br.name}")
    runs = single.multi_run
    if runs:
        detail += f"; alone, {runs.k}/{runs.n} = {runs.percent:.2f}% would be {runs.runs} samples of {n}"
    return [Finding("k-of-n", "inconsistent", detail, single.as_json())]


def _measured_accuracy(c: Claim, v: JsonObject, measured: JsonObject) -> list[Finding]:
    k, n = _member(v["accuracy"], "k"), _member(v["accuracy"], "n")
    lo, hi = wilson_interval(k, n)
    claimed = float(_percent(c)) / 100
    data: JsonObject = {"k": k, "n": n, "interval": [lo, hi], "claimed": claimed}
    text = f"claimed {_percent_str(c)}; measured {k}/{n} = {100 * k / n:.1f}% (95% Wilson {100 * lo:.1f}-{100 * hi:.1f}%)"
    if lo <= claimed <= hi:
        return [Finding("measurement", "supported", f"{text}: the claim lies inside the interval", data)]
    return [Finding("measurement", "contradicted", f"{text}: the claim lies outside the interval", data)]


def _claimed_accuracy(cf: ClaimsFile, c: Claim) -> str:
    bid = cf.on(c)
    bench = cf.benchmarks[bid]
    return f"{_percent_str(c)} on {bench.name if bench.name is not None else bid} ({bench.size})"


# --- gain ------------------------------------------------------------------------------------------------------


def _gain_references(c: Claim, refs: References) -> None:
    base = refs.accuracy(c, c.baseline, "baseline")
    treated = refs.accuracy(c, c.treated, "treated")
    if base.benchmark != treated.benchmark:
        refs.fail(c, "baseline and treated are on different benchmarks")


def _alpha(c: Claim) -> float:
    return float(c.alpha) if c.alpha is not None else 0.05


def _gain_under(br: BenchmarkReading, base: Claim, treat: Claim, reading: Reading, alpha: float) -> Judged:
    kb, exact_b = br.k(base.id, reading)
    kt, exact_t = br.k(treat.id, reading)
    total = reading.per_problem * br.n
    approx = "" if exact_b and exact_t else " (nearest fractions)"
    facts: JsonObject = {**_under(br, reading), "baseline_k": kb, "treated_k": kt, "total": total, "alpha": alpha}
    fits = br.fits_all(reading)
    if kt <= kb:
        return Judged(reading, fits, "inconsistent", f"{kb}/{total} -> {kt}/{total} is no gain{approx}", facts,
                      {"test": "none"})
    if reading.per_problem == 1:
        d = kt - kb
        p = mcnemar_exact(0, d)
        head = (f"{kb}/{total} -> {kt}/{total} needs at least {d} discordant problems; even if all {d} favour the "
                f"treatment, exact McNemar p = {p:.4g}{approx}")
        verdict = "consistent" if p < alpha else "unsupported"
        tail = (f" < {alpha:g}: significant only if no problem regressed" if p < alpha
                else f" >= {alpha:g}: not significant at {alpha:g}")
        return Judged(reading, fits, verdict, head + tail, facts,
                      {"test": "paired exact McNemar on problems", "min_discordant": d, "best_case_p": p})
    s = sign_test_bounds(kb, kt, br.n, reading, alpha)
    test: JsonObject = {"test": "paired sign test on per-problem pass rates (problems whose pass rate rose vs fell)"}
    head = (f"{kb}/{total} -> {kt}/{total}: {s.extra_right_samples} more right samples, on {s.fewest_problems} to "
            f"{s.most_problems} problems; samples of one problem are not independent, so the unit is a problem: "
            f"sign test p = {s.p_concentrated:.3g} if they sit on {s.fewest_problems}, "
            f"{s.p_spread:.3g} if spread over {s.most_problems}, with no problem worse{approx}")
    facts = {**facts, **s.as_json()}
    if s.p_spread >= alpha:
        return Judged(reading, fits, "unsupported", f"{head}; not significant at {alpha:g} however they spread",
                      facts, test)
    return Judged(reading, fits, "consistent",
                  f"{head}; significant only if at least {s.problems_needed} problems improved and none "
                  "got worse: not testable without per-problem data", facts, test)


def _check_gain(cf: ClaimsFile, c: Claim) -> list[Finding]:
    base, treat = cf.claim(c.baseline or ""), cf.claim(c.treated or "")
    br = cf.readings[cf.on(base)]
    rows = [_gain_under(br, base, treat, r, _alpha(c)) for r in br.considered()]
    return [_judged("gain", br, rows)]


def _measured_gain(c: Claim, v: JsonObject, measured: JsonObject) -> list[Finding]:
    b, t = _member(v["discordant"], "baseline_only"), _member(v["discordant"], "treated_only")
    p = mcnemar_exact(b, t)
    alpha = _alpha(c)
    data: JsonObject = {"baseline_only": b, "treated_only": t, "p_value": p, "alpha": alpha}
    text = f"measured discordant pairs: {t} solved only with the treatment, {b} only without; exact McNemar p = {p:.4g}"
    if t <= b:
        return [Finding("measurement", "contradicted", f"{text}: no gain", data)]
    if p < alpha:
        return [Finding("measurement", "supported", f"{text} < {alpha:g}", data)]
    return [Finding("measurement", "unsupported", f"{text} >= {alpha:g}: not significant", data)]


def _claimed_gain(cf: ClaimsFile, c: Claim) -> str:
    return f"{_percent_str(cf.claim(c.baseline or ''))} -> {_percent_str(cf.claim(c.treated or ''))}"


# --- count -----------------------------------------------------------------------------------------------------


def _count(c: Claim) -> int:
    if c.count is None:
        raise InputError(f"claim {c.id!r} states no count")
    return c.count


def _count_under(br: BenchmarkReading, ref: Claim, relation: str, count: int, reading: Reading) -> Judged:
    k, exact = br.k(ref.id, reading)
    total = reading.per_problem * br.n
    limits = count_limits(relation, k, br.n, reading)
    facts: JsonObject = {**_under(br, reading), "count": count, "k": k, "total": total, "relation": relation,
                         "claim": ref.id, "definitions": [d.as_json(count) for d in limits]}
    fits = br.fits_all(reading)
    approx = "" if exact else ", nearest fraction"
    word = "unsolved" if relation == "unsolved-by" else "solved"
    basis = f"{ref.id} at {_percent_str(ref)} = {k}/{total}{approx}"
    if reading.per_problem == 1:
        limit = limits[0].limit
        what = "left unsolved by" if relation == "unsolved-by" else "solved by"
        ok = count <= limit
        detail = (f"{count} <= the {limit} problems {what} {basis}" if ok
                  else f"contradiction: {count} > the {limit} problems {what} {basis}")
        return Judged(reading, fits, "consistent" if ok else "inconsistent", detail, facts)
    wrong = total - k if relation == "unsolved-by" else k
    said = []
    for d in limits:
        verb = "possible" if count <= d.limit else "impossible"
        said.append(f"{verb} if '{word}' means {d.definition} (at most {d.limit})")
    detail = (f"{basis} leaves {wrong} {'wrong' if relation == 'unsolved-by' else 'right'} samples: {count} {word} "
              f"problems is " + "; ".join(said))
    verdict = "consistent" if any(count <= d.limit for d in limits) else "inconsistent"
    return Judged(reading, fits, verdict, detail, facts)


def _check_count(cf: ClaimsFile, c: Claim) -> list[Finding]:
    count = _count(c)
    out: list[Finding] = []
    if c.benchmark is not None:
        n = cf.benchmarks[c.benchmark].size
        if count > n:
            out.append(Finding("benchmark-size", "inconsistent", f"{count} exceeds the {n} problems of the benchmark",
                               {"count": count, "n": n}))
    for b in c.bounds or []:
        ref = cf.claim(b.claim)
        br = cf.readings[cf.on(ref)]
        rows = [_count_under(br, ref, b.relation, count, r) for r in br.considered()]
        out.append(_judged(f"bound:{b.relation}", br, rows))
    return out


def _measured_count(c: Claim, v: JsonObject, measured: JsonObject) -> list[Finding]:
    got = _int(v["count"])
    data: JsonObject = {"claimed": c.count, "measured": got}
    if got >= _count(c):
        return [Finding("measurement", "supported", f"claimed {c.count}; measured {got}", data)]
    return [Finding("measurement", "contradicted", f"claimed {c.count}; measured only {got}", data)]


def _claimed_count(cf: ClaimsFile, c: Claim) -> str:
    return f"{c.count} {c.unit if c.unit is not None else 'problems'}"


# --- ratio -----------------------------------------------------------------------------------------------------


def _check_ratio(_cf: ClaimsFile, c: Claim) -> list[Finding]:
    if c.numerator is None or c.denominator is None:
        return []
    num, den, stated = c.numerator, c.denominator, _stated(c)
    if den == 0:
        return [Finding("arithmetic", "inconsistent", "the denominator is 0", {})]
    computed = Fraction(str(num)) / Fraction(str(den))
    tol = Fraction(str(c.tolerance)) if c.tolerance is not None else _half_unit(c.places("stated"))
    stated_f = Fraction(str(stated))
    data: JsonObject = {"numerator": num, "denominator": den, "computed": float(computed), "stated": stated,
                        "tolerance": float(tol)}
    text = f"{fmt(num)} / {fmt(den)} = {fmt(computed)}"
    shown = f"{fmt(stated, c.places('stated'))}x"
    if abs(computed - stated_f) <= tol:
        return [Finding("arithmetic", "consistent", f"{text}, consistent with the stated {shown}", data)]
    return [Finding("arithmetic", "inconsistent", f"{text}, not the stated {shown}", data)]


def _tolerance(c: Claim) -> float:
    return float(c.measure_tolerance) if c.measure_tolerance is not None else 0.05


def _measured_ratio(c: Claim, v: JsonObject, measured: JsonObject) -> list[Finding]:
    m = _number(v["ratio"])
    tol = _tolerance(c)
    data: JsonObject = {"claimed": c.stated, "measured": m, "relative_tolerance": tol}
    text = f"claimed {fmt(_stated(c), c.places('stated'))}x; measured {fmt(m)}x"
    if m >= float(_stated(c)) * (1 - tol):
        return [Finding("measurement", "supported", text, data)]
    return [Finding("measurement", "contradicted", f"{text} (more than {tol:.0%} below)", data)]


def _claimed_ratio(cf: ClaimsFile, c: Claim) -> str:
    s = f"≈{fmt(_stated(c), c.places('stated'))}x"
    if c.numerator is not None and c.denominator is not None:
        s += f" ({fmt(c.numerator)} / {fmt(c.denominator)})"
    return s


# --- context ---------------------------------------------------------------------------------------------------


def _tokens(c: Claim) -> tuple[int, int]:
    if c.from_tokens is None or c.to_tokens is None:
        raise InputError(f"claim {c.id!r} states no from_tokens and to_tokens")
    return c.from_tokens, c.to_tokens


def _check_context(_cf: ClaimsFile, c: Claim) -> list[Finding]:
    f, t = _tokens(c)
    factor = t / f
    keys = ", ".join((c.measure or {}).values()) or "a measurement"
    memory = c.memory if c.memory is not None else "unchanged"
    detail = (f"{fmt(t)} / {fmt(f)} = {factor:.1f}x the context with GPU memory {memory}: tokens stored and tokens "
              f"attended at once are different quantities (KV memory grows with the tokens attended in one forward "
              f"pass); needs measurement of both and of peak memory ({keys})")
    return [Finding("context-stretch", "needs-measurement", detail, {"from_tokens": f, "to_tokens": t, "factor": factor})]


def _measured_context(c: Claim, v: JsonObject, measured: JsonObject) -> list[Finding]:
    out: list[Finding] = []
    data = dict(v)
    if "attended_tokens" in v:
        a = _int(v["attended_tokens"])
        ok = a >= _tokens(c)[1]
        out.append(Finding("measurement", "supported" if ok else "contradicted",
                           f"claimed {fmt(_tokens(c)[1])} tokens; measured {fmt(a)} attended at once", data))
    if "peak_memory_ratio" in v:
        r = _number(v["peak_memory_ratio"])
        ok = r <= 1 + _tolerance(c)
        out.append(Finding("measurement", "supported" if ok else "contradicted",
                           f"claimed no more GPU memory; measured peak memory {r:.2f}x the baseline's", data))
    if len(out) == 1 and out[0].verdict == "supported":
        missing = "peak_memory_ratio" if "attended_tokens" in v else "attended_tokens"
        out.append(Finding("measurement", "not-testable",
                           f"{missing} was not measured ({(c.measure or {}).get(missing, '-')})"))
    return out


def _claimed_context(cf: ClaimsFile, c: Claim) -> str:
    f, t = _tokens(c)
    return f"{fmt(f)} -> {fmt(t)} tokens, memory {c.memory if c.memory is not None else 'unchanged'}"


# --- exactness -------------------------------------------------------------------------------------------------


def _no_internal_check(_cf: ClaimsFile, _c: Claim) -> list[Finding]:
    return []


def _measured_exactness(c: Claim, v: JsonObject, measured: JsonObject) -> list[Finding]:
    out: list[Finding] = []
    data = dict(v)
    if "byte_identical" in v:
        # Exactness is a fact about one machine and its conditions: say which, and what held otherwise.
        conditions, bound = measured.get("restore_conditions"), measured.get("restore_bound")
        held = f" ({conditions})" if isinstance(conditions, str) else ""
        if isinstance(bound, str):  # a sampled audit: the bound on the whole release
            held += f"; {bound}"
        out.append(Finding("measurement", "supported" if v["byte_identical"] else "contradicted",
                           ("restored states byte-identical to a fresh compute" if v["byte_identical"]
                            else "restored states differ from a fresh compute") + held, data))
    if "kl_max" in v:
        kl = _number(v["kl_max"])
        out.append(Finding("measurement", "supported" if kl == 0.0 else "contradicted",
                           f"measured max KL divergence {kl:.3g}", data))
    return out


def _claimed_exactness(cf: ClaimsFile, c: Claim) -> str:
    return ", ".join(c.criteria or []) or "exact"


# --- the table -------------------------------------------------------------------------------------------------

KINDS: dict[str, ClaimKind] = {k.name: k for k in (
    ClaimKind("accuracy", roles={"accuracy": K_OF_N},
              internal=_check_accuracy, measured=_measured_accuracy, claimed=_claimed_accuracy),
    ClaimKind("gain", roles={"discordant": DISCORDANT}, references=_gain_references,
              internal=_check_gain, measured=_measured_gain, claimed=_claimed_gain),
    ClaimKind("count", roles={"count": INTEGER},
              internal=_check_count, measured=_measured_count, claimed=_claimed_count),
    ClaimKind("ratio", roles={"ratio": NUMBER},
              internal=_check_ratio, measured=_measured_ratio, claimed=_claimed_ratio),
    ClaimKind("context", roles={"attended_tokens": INTEGER, "peak_memory_ratio": NUMBER},
              internal=_check_context, measured=_measured_context, claimed=_claimed_context),
    ClaimKind("exactness", roles={"byte_identical": BOOLEAN, "kl_max": NUMBER},
              internal=_no_internal_check, measured=_measured_exactness, claimed=_claimed_exactness),
)}
