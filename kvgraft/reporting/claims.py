"""Claims as data, and a checker: internal consistency of the stated numbers, and claim vs measurement.

A claims file (TOML, `format = "kvgraft-claims"`) lists benchmarks and claims; every check here is driven by
the fields of a claim, never by the paper it came from:

- accuracy  `percent` on a `benchmark` of N problems must be k/(s*r*N) within the stated rounding, for one reading
            of all the benchmark's figures together: s samples per problem (avg@s) and r runs. The benchmark may
            state `samples_per_problem` (and `runs`); else the smallest s up to 16 that fits every figure is used
            (kvgraft.reporting.readings). A figure no reading fits is inconsistent.
- gain      from a `baseline` accuracy claim to a `treated` one, under each reading considered: with one sample per
            problem the exact McNemar test in the most favourable case; with s > 1 a sign test on problems, bounded
            by how the extra right samples can spread (significance needs per-problem data).
- count     `count` problems, bounded by `bounds` (`unsolved-by` an accuracy claim: the problems it can leave wrong;
            `solved-by`: right) under each definition the reading allows (wrong in all samples, or in a majority),
            and by the benchmark size.
- ratio     `stated` ratio; with `numerator` and `denominator` the quotient must round to it.
- context   `from_tokens` -> `to_tokens` without more memory: needs measurement (tokens attended at once vs stored).
- exactness byte-identical restore / zero KL: only a measurement can test it.

`measure` maps the roles of a claim's kind to keys of a measured-results JSON (a flat object), e.g.
`{"accuracy.12b.graft": {"k": 27, "n": 30}, "restore_byte_identical": true, "kl_max": 0.0}`.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from functools import cached_property
from pathlib import Path
from typing import Any

from kvgraft import __version__
from kvgraft._internal.jsonio import MAX_JSON_BYTES, loads_strict, read_bounded
from kvgraft.errors import InputError
from kvgraft.release.hashing import sha256_hex
from kvgraft.reporting.readings import (
    MAX_SAMPLES,
    BenchmarkReading,
    Figure,
    Reading,
    count_limits,
    fraction_text,
    read_benchmark,
    sign_test_bounds,
)
from kvgraft.reporting.report import CLAIM_VERDICTS, FAILING_CLAIM_VERDICTS, mcnemar_exact, wilson_interval
from kvgraft.schema import validate

CLAIMS_SCHEMA = "claims.v1.json"
CLAIMS_FORMAT = "kvgraft-claims"
CHECK_FORMAT = "kvgraft-claims-check"
MAX_CLAIMS_BYTES = 4 * 1024 * 1024
METADATA_KEYS = ("note", "source", "format", "format_version")

# Roles a claim kind can be measured by, and the JSON type each role's value must have.
MEASURE_ROLES: dict[str, dict[str, str]] = {
    "accuracy": {"accuracy": "k/n object"},
    "gain": {"discordant": "{baseline_only, treated_only} object"},
    "count": {"count": "integer"},
    "ratio": {"ratio": "number"},
    "context": {"attended_tokens": "integer", "peak_memory_ratio": "number"},
    "exactness": {"byte_identical": "boolean", "kl_max": "number"},
}
# Finding verdicts: internal checks give consistent/inconsistent/unsupported/needs-measurement; measurements give
# supported/contradicted/unsupported/not-testable. A claim's verdict is the first of its findings in this order: a
# contradiction or inconsistency always shows; a measurement that supports the claim outweighs the stated numbers
# being too few to support it (unsupported).
_PRECEDENCE = ("contradicted", "inconsistent", "supported", "unsupported", "consistent", "not-testable")
_RANK = {v: i for i, v in enumerate(_PRECEDENCE)}
assert set(_PRECEDENCE) == set(CLAIM_VERDICTS)


@dataclass
class Finding:
    check: str
    verdict: str
    detail: str
    data: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"check": self.check, "verdict": self.verdict, "detail": self.detail, "data": self.data}


@dataclass
class ClaimsFile:
    path: str
    sha256: str | None
    doc: dict[str, Any]

    @property
    def claims(self) -> list[dict[str, Any]]:
        claims: list[dict[str, Any]] = self.doc["claims"]
        return claims

    @property
    def benchmarks(self) -> dict[str, dict[str, Any]]:
        benchmarks: dict[str, dict[str, Any]] = self.doc.get("benchmarks", {})
        return benchmarks

    def claim(self, claim_id: str) -> dict[str, Any]:
        for c in self.claims:
            if c["id"] == claim_id:
                return c
        raise KeyError(claim_id)

    @cached_property
    def readings(self) -> dict[str, BenchmarkReading]:
        """Per benchmark, the readings (samples per problem, runs) that fit all its accuracy figures jointly."""
        out = {}
        for bid, spec in self.benchmarks.items():
            figures = [Figure(c["id"], Fraction(str(c["percent"])), _decimals(c, "percent"))
                       for c in self.claims if c["kind"] == "accuracy" and c["benchmark"] == bid]
            out[bid] = read_benchmark(bid, spec, figures)
        return out


# --- numbers ---------------------------------------------------------------------------------------------------


def fmt(x: float | int | Fraction, decimals: int = 1) -> str:
    """1234567 -> '1,234,567'; 6574.19 -> '6,574.2'."""
    if isinstance(x, int) or (isinstance(x, float) and x.is_integer() and decimals == 0):
        return f"{int(x):,}"
    return f"{float(x):,.{decimals}f}"


def stated_decimals(value: float | int) -> int:
    """Decimals a number was written with in the TOML (80.0 -> 1, 6574 -> 0)."""
    if isinstance(value, int):
        return 0
    exponent = Decimal(repr(value)).as_tuple().exponent
    return max(0, -exponent) if isinstance(exponent, int) else 0


def _half_unit(decimals: int) -> Fraction:
    return Fraction(1, 2 * 10**decimals)


def k_of_n(percent: float | int, n: int, decimals: int) -> dict[str, Any]:
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
                runs = {"runs": r, "k": k, "n": total, "percent": float(Fraction(100 * k, total))}
                break
    return {"n": n, "ks": ks, "nearest_k": nearest, "nearest_percent": float(Fraction(100 * nearest, n)), "multi_run": runs}


def _percent_str(claim: dict[str, Any]) -> str:
    return f"{claim['percent']:.{_decimals(claim, 'percent')}f}%"


def _decimals(claim: dict[str, Any], key: str) -> int:
    return int(claim["decimals"]) if "decimals" in claim else stated_decimals(claim[key])


# --- loading ---------------------------------------------------------------------------------------------------


def load(path: Path) -> ClaimsFile:
    """Parse and validate a claims TOML file; errors name the file (and the line for TOML syntax)."""
    data = read_bounded(path, MAX_CLAIMS_BYTES, "a claims file")
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path}: invalid TOML: {exc}") from None
    return parse(doc, str(path), sha256_hex(data))


def parse(doc: dict[str, Any], where: str, sha256: str | None = None) -> ClaimsFile:
    """Validate a parsed claims document: schema, then references between claims and benchmarks."""
    validate(doc, CLAIMS_SCHEMA, where)
    if doc.get("format") != CLAIMS_FORMAT:
        raise InputError(f"{where}: format is {doc.get('format')!r}, expected {CLAIMS_FORMAT!r}")
    cf = ClaimsFile(where, sha256, doc)
    seen: set[str] = set()
    for c in cf.claims:
        cid = c["id"]
        if cid in seen:
            raise InputError(f"{where}: claim id {cid!r} appears twice")
        seen.add(cid)
        bench = c.get("benchmark")
        if bench is not None and bench not in cf.benchmarks:
            raise InputError(f"{where}: claim {cid!r}: unknown benchmark {bench!r}")
        roles = MEASURE_ROLES[c["kind"]]
        for role in c.get("measure", {}):
            if role not in roles:
                raise InputError(f"{where}: claim {cid!r}: measure role {role!r} does not apply to a {c['kind']} claim "
                                 f"(roles: {', '.join(roles)})")
    ids = {c["id"]: c for c in cf.claims}

    def accuracy_ref(c: dict[str, Any], ref: str, what: str) -> None:
        target = ids.get(ref)
        if target is None:
            raise InputError(f"{where}: claim {c['id']!r}: {what} refers to unknown claim {ref!r}")
        if target["kind"] != "accuracy":
            raise InputError(f"{where}: claim {c['id']!r}: {what} {ref!r} is a {target['kind']} claim, not an accuracy claim")
        if c.get("benchmark") is not None and target["benchmark"] != c["benchmark"]:
            raise InputError(f"{where}: claim {c['id']!r}: {what} {ref!r} is on benchmark {target['benchmark']!r}, "
                             f"not {c['benchmark']!r}")

    for c in cf.claims:
        if c["kind"] == "gain":
            accuracy_ref(c, c["baseline"], "baseline")
            accuracy_ref(c, c["treated"], "treated")
            if ids[c["baseline"]]["benchmark"] != ids[c["treated"]]["benchmark"]:
                raise InputError(f"{where}: claim {c['id']!r}: baseline and treated are on different benchmarks")
        for b in c.get("bounds", []):
            accuracy_ref(c, b["claim"], f"bound {b['relation']}")
    return cf


def load_measured(path: Path) -> tuple[dict[str, Any], str]:
    """A measured-results JSON object and the SHA-256 of its bytes."""
    data = read_bounded(path, MAX_JSON_BYTES, "JSON")
    doc = loads_strict(data, str(path))
    if not isinstance(doc, dict):
        raise InputError(f"{path}: measured results must be a JSON object of measurement keys")
    return doc, sha256_hex(data)


# --- internal checks -------------------------------------------------------------------------------------------


def _figure(br: BenchmarkReading, claim_id: str) -> Figure:
    return next(f for f in br.figures if f.claim == claim_id)


def _check_accuracy(cf: ClaimsFile, c: dict[str, Any]) -> list[Finding]:
    br = cf.readings[c["benchmark"]]
    n = br.n
    fig = _figure(br, c["id"])
    single = k_of_n(c["percent"], n, _decimals(c, "percent"))
    chosen = br.chosen
    if chosen is not None:
        k, _ = br.k(c["id"], chosen)
        total = chosen.per_problem * n
        detail = f"{fraction_text(fig, k, total)} under {chosen.name}"
        if chosen.per_problem > 1:
            detail += f" ({chosen.per_problem} samples on each of {n} problems)"
            if single["ks"]:
                detail += f"; also {' or '.join(f'{x}/{n}' for x in single['ks'])} as a single sample"
            else:
                detail += f"; not k/{n}, so not a single-sample score"
        else:
            detail += f" on {br.name}"
        why = "the stated reading" if br.stated is not None else f"the smallest reading that fits all {len(br.figures)} figures"
        detail += f" ({chosen.name} is {why} of {br.name})" if len(br.figures) > 1 or br.stated is not None else ""
        return [Finding("reading", "consistent", detail, {**single, "reading": chosen.as_dict(), "k": k, "total": total})]
    if br.stated is not None:
        total = br.stated.per_problem * n
        k, exact = br.k(c["id"], br.stated)
        data = {**single, "reading": br.stated.as_dict(), "k": k, "total": total}
        if exact:
            return [Finding("reading", "consistent", f"{fraction_text(fig, k, total)} under the stated {br.stated.name}", data)]
        return [Finding("reading", "inconsistent", f"{fig.shown} is not k/{total} for any k under the stated "
                        f"{br.stated.name} (nearest {k}/{total} = {100 * k / total:.2f}%)", data)]
    if single["ks"]:
        fracs = " or ".join(f"{k}/{n}" for k in single["ks"])
        return [Finding("k-of-n", "consistent", f"{fig.shown} = {fracs} on {br.name}", single)]
    detail = (f"{fig.shown} is not k/{n} for any k (nearest {single['nearest_k']}/{n} = {single['nearest_percent']:.1f}%), "
              f"and no reading up to avg@{MAX_SAMPLES} fits it together with the other figures of {br.name}")
    runs = single["multi_run"]
    if runs:
        detail += f"; alone, {runs['k']}/{runs['n']} = {runs['percent']:.2f}% would be {runs['runs']} samples of {n}"
    return [Finding("k-of-n", "inconsistent", detail, single)]


# Verdicts of a dependent claim under one reading, most charitable first: the headline takes the first that a
# reading fitting every figure gives.
_CHARITY = ("consistent", "unsupported", "inconsistent")


def _judged(check_name: str, br: BenchmarkReading, per_reading: list[dict[str, Any]]) -> Finding:
    """One finding from a dependent claim's verdicts under each reading: the headline is the most charitable
    verdict of a reading that fits every figure, and says which reading; the other readings follow."""
    fitting = [r for r in per_reading if r["fits_all"]]
    if fitting:
        head = min(fitting, key=lambda r: _CHARITY.index(r["verdict"]))
        lead = f"under {head['reading']['name']} (fits every figure of {br.name})"
    else:
        head = next((r for r in per_reading if r["reading"]["samples_per_problem"] == 1), per_reading[0])
        lead = f"under {head['reading']['name']} (no reading fits every figure of {br.name}; nearest fractions)"
    parts = [f"{lead}: {head['detail']}"]
    for r in per_reading:
        if r is head:
            continue
        fits = "fits every figure" if r["fits_all"] else "does not fit " + ", ".join(r["misfits"])
        parts.append(f"under {r['reading']['name']} ({fits}): {r['verdict']}: {r['detail']}")
    return Finding(check_name, head["verdict"], "; ".join(parts),
                   {"headline_reading": head["reading"], "readings": per_reading})


def _under(br: BenchmarkReading, reading: Reading) -> dict[str, Any]:
    return {"reading": reading.as_dict(), "fits_all": br.fits_all(reading), "misfits": [f.shown for f in br.misfits(reading)]}


def _gain_under(br: BenchmarkReading, base: dict[str, Any], treat: dict[str, Any], reading: Reading,
                alpha: float) -> dict[str, Any]:
    kb, exact_b = br.k(base["id"], reading)
    kt, exact_t = br.k(treat["id"], reading)
    total = reading.per_problem * br.n
    approx = "" if exact_b and exact_t else " (nearest fractions)"
    row = _under(br, reading)
    row.update({"baseline_k": kb, "treated_k": kt, "total": total, "alpha": alpha})
    if kt <= kb:
        return {**row, "verdict": "inconsistent", "test": "none", "detail": f"{kb}/{total} -> {kt}/{total} is no gain{approx}"}
    if reading.per_problem == 1:
        d = kt - kb
        p = mcnemar_exact(0, d)
        head = (f"{kb}/{total} -> {kt}/{total} needs at least {d} discordant problems; even if all {d} favour the "
                f"treatment, exact McNemar p = {p:.4g}{approx}")
        verdict = "consistent" if p < alpha else "unsupported"
        tail = (f" < {alpha:g}: significant only if no problem regressed" if p < alpha
                else f" >= {alpha:g}: not significant at {alpha:g}")
        return {**row, "verdict": verdict, "test": "paired exact McNemar on problems", "min_discordant": d,
                "best_case_p": p, "detail": head + tail}
    s = sign_test_bounds(kb, kt, br.n, reading, alpha)
    test = "paired sign test on per-problem pass rates (problems whose pass rate rose vs fell)"
    head = (f"{kb}/{total} -> {kt}/{total}: {s['extra_right_samples']} more right samples, on {s['fewest_problems']} to "
            f"{s['most_problems']} problems; samples of one problem are not independent, so the unit is a problem: "
            f"sign test p = {s['p_concentrated']:.3g} if they sit on {s['fewest_problems']}, "
            f"{s['p_spread']:.3g} if spread over {s['most_problems']}, with no problem worse{approx}")
    if s["p_spread"] >= alpha:
        return {**row, **s, "verdict": "unsupported", "test": test,
                "detail": f"{head}; not significant at {alpha:g} however they spread"}
    return {**row, **s, "verdict": "consistent", "test": test,
            "detail": f"{head}; significant only if at least {s['problems_needed']} problems improved and none "
                      "got worse: not testable without per-problem data"}


def _check_gain(cf: ClaimsFile, c: dict[str, Any]) -> list[Finding]:
    base, treat = cf.claim(c["baseline"]), cf.claim(c["treated"])
    br = cf.readings[base["benchmark"]]
    alpha = float(c.get("alpha", 0.05))
    rows = [_gain_under(br, base, treat, r, alpha) for r in br.considered()]
    return [_judged("gain", br, rows)]


def _count_under(br: BenchmarkReading, ref: dict[str, Any], relation: str, count: int, reading: Reading) -> dict[str, Any]:
    k, exact = br.k(ref["id"], reading)
    total = reading.per_problem * br.n
    limits = count_limits(relation, k, br.n, reading)
    for d in limits:
        d["possible"] = count <= d["limit"]
    row = _under(br, reading)
    row.update({"count": count, "k": k, "total": total, "relation": relation, "claim": ref["id"], "definitions": limits})
    approx = "" if exact else ", nearest fraction"
    word = "unsolved" if relation == "unsolved-by" else "solved"
    basis = f"{ref['id']} at {_percent_str(ref)} = {k}/{total}{approx}"
    if reading.per_problem == 1:
        limit = limits[0]["limit"]
        what = "left unsolved by" if relation == "unsolved-by" else "solved by"
        ok = count <= limit
        detail = (f"{count} <= the {limit} problems {what} {basis}" if ok
                  else f"contradiction: {count} > the {limit} problems {what} {basis}")
        return {**row, "verdict": "consistent" if ok else "inconsistent", "detail": detail}
    wrong = total - k if relation == "unsolved-by" else k
    said = []
    for d in limits:
        verb = "possible" if d["possible"] else "impossible"
        said.append(f"{verb} if '{word}' means {d['definition']} (at most {d['limit']})")
    detail = (f"{basis} leaves {wrong} {'wrong' if relation == 'unsolved-by' else 'right'} samples: {count} {word} "
              f"problems is " + "; ".join(said))
    verdict = "consistent" if any(d["possible"] for d in limits) else "inconsistent"
    return {**row, "verdict": verdict, "detail": detail}


def _check_count(cf: ClaimsFile, c: dict[str, Any]) -> list[Finding]:
    count = int(c["count"])
    out: list[Finding] = []
    if "benchmark" in c:
        n = int(cf.benchmarks[c["benchmark"]]["size"])
        if count > n:
            out.append(Finding("benchmark-size", "inconsistent", f"{count} exceeds the {n} problems of the benchmark",
                               {"count": count, "n": n}))
    for b in c.get("bounds", []):
        ref = cf.claim(b["claim"])
        br = cf.readings[ref["benchmark"]]
        rows = [_count_under(br, ref, b["relation"], count, r) for r in br.considered()]
        out.append(_judged(f"bound:{b['relation']}", br, rows))
    return out


def _check_ratio(c: dict[str, Any]) -> list[Finding]:
    if "numerator" not in c or "denominator" not in c:
        return []
    num, den, stated = c["numerator"], c["denominator"], c["stated"]
    if den == 0:
        return [Finding("arithmetic", "inconsistent", "the denominator is 0", {})]
    computed = Fraction(str(num)) / Fraction(str(den))
    tol = Fraction(str(c["tolerance"])) if "tolerance" in c else _half_unit(_decimals(c, "stated"))
    stated_f = Fraction(str(stated))
    data = {"numerator": num, "denominator": den, "computed": float(computed), "stated": stated, "tolerance": float(tol)}
    text = f"{fmt(num)} / {fmt(den)} = {fmt(computed)}"
    shown = f"{fmt(stated, _decimals(c, 'stated'))}x"
    if abs(computed - stated_f) <= tol:
        return [Finding("arithmetic", "consistent", f"{text}, consistent with the stated {shown}", data)]
    return [Finding("arithmetic", "inconsistent", f"{text}, not the stated {shown}", data)]


def _check_context(c: dict[str, Any]) -> list[Finding]:
    f, t = int(c["from_tokens"]), int(c["to_tokens"])
    factor = t / f
    keys = ", ".join(c.get("measure", {}).values()) or "a measurement"
    memory = c.get("memory", "unchanged")
    detail = (f"{fmt(t)} / {fmt(f)} = {factor:.1f}x the context with GPU memory {memory}: tokens stored and tokens "
              f"attended at once are different quantities (KV memory grows with the tokens attended in one forward "
              f"pass); needs measurement of both and of peak memory ({keys})")
    return [Finding("context-stretch", "needs-measurement", detail, {"from_tokens": f, "to_tokens": t, "factor": factor})]


def internal_findings(cf: ClaimsFile, claim: dict[str, Any]) -> list[Finding]:
    kind = claim["kind"]
    if kind == "accuracy":
        return _check_accuracy(cf, claim)
    if kind == "gain":
        return _check_gain(cf, claim)
    if kind == "count":
        return _check_count(cf, claim)
    if kind == "ratio":
        return _check_ratio(claim)
    if kind == "context":
        return _check_context(claim)
    return []


# --- measurements ----------------------------------------------------------------------------------------------


def _typed(measured: dict[str, Any], key: str, role_type: str, where: str) -> Any:
    value = measured[key]
    bad = f"{where}: measurement {key!r} must be "
    if role_type == "k/n object":
        if not (isinstance(value, dict) and set(value) >= {"k", "n"} and all(_is_int(value[x]) for x in ("k", "n"))
                and 0 <= value["k"] <= value["n"] and value["n"] > 0):
            raise InputError(bad + 'an object {"k": int, "n": int} with 0 <= k <= n, n > 0')
    elif role_type.startswith("{baseline_only"):
        pair = ("baseline_only", "treated_only")
        if not (isinstance(value, dict) and all(_is_int(value.get(x)) and value[x] >= 0 for x in pair)):
            raise InputError(bad + 'an object {"baseline_only": int >= 0, "treated_only": int >= 0}')
    elif role_type == "integer":
        if not _is_int(value):
            raise InputError(bad + "an integer")
    elif role_type == "number":
        if not (isinstance(value, (int, float)) and not isinstance(value, bool)):
            raise InputError(bad + "a number")
    elif role_type == "boolean" and not isinstance(value, bool):
        raise InputError(bad + "true or false")
    return value


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def measured_findings(cf: ClaimsFile, c: dict[str, Any], measured: dict[str, Any], where: str) -> list[Finding]:
    roles = MEASURE_ROLES[c["kind"]]
    keys = {role: key for role, key in c.get("measure", {}).items() if key in measured}
    if not c.get("measure"):
        return [Finding("measurement", "not-testable", c.get("untestable", "the claim names no measurement"))]
    if not keys:
        wanted = ", ".join(c["measure"].values())
        reason = f"no measurement of {wanted} in {where}"
        if c.get("untestable"):
            reason += f"; {c['untestable']}"
        return [Finding("measurement", "not-testable", reason)]
    v = {role: _typed(measured, key, roles[role], where) for role, key in keys.items()}
    kind = c["kind"]
    if kind == "accuracy":
        k, n = int(v["accuracy"]["k"]), int(v["accuracy"]["n"])
        lo, hi = wilson_interval(k, n)
        claimed = float(c["percent"]) / 100
        data = {"k": k, "n": n, "interval": [lo, hi], "claimed": claimed}
        text = f"claimed {_percent_str(c)}; measured {k}/{n} = {100 * k / n:.1f}% (95% Wilson {100 * lo:.1f}-{100 * hi:.1f}%)"
        if lo <= claimed <= hi:
            return [Finding("measurement", "supported", f"{text}: the claim lies inside the interval", data)]
        return [Finding("measurement", "contradicted", f"{text}: the claim lies outside the interval", data)]
    if kind == "gain":
        b, t = int(v["discordant"]["baseline_only"]), int(v["discordant"]["treated_only"])
        p = mcnemar_exact(b, t)
        alpha = float(c.get("alpha", 0.05))
        data = {"baseline_only": b, "treated_only": t, "p_value": p, "alpha": alpha}
        text = f"measured discordant pairs: {t} solved only with the treatment, {b} only without; exact McNemar p = {p:.4g}"
        if t <= b:
            return [Finding("measurement", "contradicted", f"{text}: no gain", data)]
        if p < alpha:
            return [Finding("measurement", "supported", f"{text} < {alpha:g}", data)]
        return [Finding("measurement", "unsupported", f"{text} >= {alpha:g}: not significant", data)]
    if kind == "count":
        got = int(v["count"])
        data = {"claimed": c["count"], "measured": got}
        if got >= int(c["count"]):
            return [Finding("measurement", "supported", f"claimed {c['count']}; measured {got}", data)]
        return [Finding("measurement", "contradicted", f"claimed {c['count']}; measured only {got}", data)]
    if kind == "ratio":
        m = float(v["ratio"])
        tol = float(c.get("measure_tolerance", 0.05))
        data = {"claimed": c["stated"], "measured": m, "relative_tolerance": tol}
        text = f"claimed {fmt(c['stated'], _decimals(c, 'stated'))}x; measured {fmt(m)}x"
        if m >= float(c["stated"]) * (1 - tol):
            return [Finding("measurement", "supported", text, data)]
        return [Finding("measurement", "contradicted", f"{text} (more than {tol:.0%} below)", data)]
    if kind == "context":
        out: list[Finding] = []
        data = {role: v[role] for role in v}
        if "attended_tokens" in v:
            a = int(v["attended_tokens"])
            ok = a >= int(c["to_tokens"])
            out.append(Finding("measurement", "supported" if ok else "contradicted",
                               f"claimed {fmt(int(c['to_tokens']))} tokens; measured {fmt(a)} attended at once", data))
        if "peak_memory_ratio" in v:
            r = float(v["peak_memory_ratio"])
            tol = float(c.get("measure_tolerance", 0.05))
            ok = r <= 1 + tol
            out.append(Finding("measurement", "supported" if ok else "contradicted",
                               f"claimed no more GPU memory; measured peak memory {r:.2f}x the baseline's", data))
        if len(out) == 1 and out[0].verdict == "supported":
            missing = "peak_memory_ratio" if "attended_tokens" in v else "attended_tokens"
            out.append(Finding("measurement", "not-testable", f"{missing} was not measured ({c['measure'].get(missing, '-')})"))
        return out
    # exactness
    out = []
    data = {role: v[role] for role in v}
    if "byte_identical" in v:
        # Exactness is a fact about one machine and its conditions: say which, and what held otherwise.
        held = f" ({measured['restore_conditions']})" if isinstance(measured.get("restore_conditions"), str) else ""
        out.append(Finding("measurement", "supported" if v["byte_identical"] else "contradicted",
                           ("restored states byte-identical to a fresh compute" if v["byte_identical"]
                            else "restored states differ from a fresh compute") + held, data))
    if "kl_max" in v:
        kl = float(v["kl_max"])
        out.append(Finding("measurement", "supported" if kl == 0.0 else "contradicted",
                           f"measured max KL divergence {kl:.3g}", data))
    return out


def measured_from_recompute(result: dict[str, Any]) -> dict[str, Any]:
    """Measurements an exactness claim names, from a recompute result (schemas/recompute-result.v1.json):
    `restore_byte_identical` (every entry byte-exact) and `kl_max` (largest matched-schedule KL)."""
    entries = result.get("entries", [])
    if not entries:
        raise InputError("recompute result: no entries, nothing was measured")
    out: dict[str, Any] = {"restore_byte_identical": all(bool(e["byte_exact"]) for e in entries),
                           "kl_max": max(float(e["matched"]["kl_max"]) for e in entries)}
    if "verdict" in result:
        env = result["environment"]["current"]
        where = f"on {env.get('device_name')}, {env.get('dtype')}, {env.get('attn_implementation')}, {env.get('threads')} threads"
        not_replayed = sorted(result["conditions"]["not_replayed"])
        out["restore_verdict"] = result["verdict"]
        out["restore_conditions"] = (
            f"{result['verdict']} {where}"
            + (f"; not byte-exact because {', '.join(not_replayed)} differ from the recording"
               if result["verdict"] == "consistent" and not_replayed else "")
            + ("; recorded conditions overridden: " + ", ".join(sorted(result["conditions"]["overridden"]))
               if result["conditions"]["overridden"] else ""))
    return out


# --- the check -------------------------------------------------------------------------------------------------


def claimed_summary(cf: ClaimsFile, c: dict[str, Any]) -> str:
    kind = c["kind"]
    if kind == "accuracy":
        bench = cf.benchmarks[c["benchmark"]]
        return f"{_percent_str(c)} on {bench.get('name', c['benchmark'])} ({bench['size']})"
    if kind == "gain":
        return f"{_percent_str(cf.claim(c['baseline']))} -> {_percent_str(cf.claim(c['treated']))}"
    if kind == "count":
        return f"{c['count']} {c.get('unit', 'problems')}"
    if kind == "ratio":
        s = f"≈{fmt(c['stated'], _decimals(c, 'stated'))}x"
        if "numerator" in c and "denominator" in c:
            s += f" ({fmt(c['numerator'])} / {fmt(c['denominator'])})"
        return s
    if kind == "context":
        return f"{fmt(int(c['from_tokens']))} -> {fmt(int(c['to_tokens']))} tokens, memory {c.get('memory', 'unchanged')}"
    return ", ".join(c.get("criteria", [])) or "exact"


def claim_verdict(c: dict[str, Any], findings: list[Finding]) -> tuple[str, str]:
    """(verdict, reason): the first finding in _PRECEDENCE order decides; needs-measurement counts as not-testable."""
    if not findings:
        return "not-testable", c.get("untestable") or "no internal check applies and no measurement was given"
    ranked = sorted(findings, key=lambda f: _RANK["not-testable" if f.verdict == "needs-measurement" else f.verdict])
    top = ranked[0]
    verdict = "not-testable" if top.verdict == "needs-measurement" else top.verdict
    reason = "; ".join(dict.fromkeys(f.detail for f in ranked if f.verdict == top.verdict))
    if verdict == "not-testable" and c.get("untestable") and c["untestable"] not in reason:
        reason = f"{reason}; {c['untestable']}"
    return verdict, reason


def check(cf: ClaimsFile, measured: dict[str, Any] | None = None, measured_where: str = "measured results",
          measured_sha256: str | None = None) -> dict[str, Any]:
    """Check every claim; the result is valid against schemas/claims.v1.json."""
    results = []
    used: set[str] = set()
    for c in cf.claims:
        findings = internal_findings(cf, c)
        if measured is not None:
            findings += measured_findings(cf, c, measured, measured_where)
            used.update(k for k in c.get("measure", {}).values() if k in measured)
        elif not findings:
            keys = ", ".join(c.get("measure", {}).values())
            reason = c.get("untestable") or (f"needs measurement: {keys} (pass --measured)" if keys else "names no measurement")
            findings.append(Finding("measurement", "not-testable", reason))
        verdict, reason = claim_verdict(c, findings)
        results.append({"id": c["id"], "kind": c["kind"], "text": c["text"], "claimed": claimed_summary(cf, c),
                        "verdict": verdict, "reason": reason, "findings": [f.as_dict() for f in findings]})
    counts = {v: 0 for v in CLAIM_VERDICTS}
    for r in results:
        counts[r["verdict"]] += 1
    result: dict[str, Any] = {
        "format": CHECK_FORMAT,
        "format_version": 1,
        "kvgraft_version": __version__,
        "claims_file": {"path": cf.path, "sha256": cf.sha256},
        "source": cf.doc.get("source", {}),
        "measured_file": None if measured is None else {"path": measured_where, "sha256": measured_sha256},
        "readings": [br.as_dict() for br in cf.readings.values()],
        "claims": results,
        "counts": counts,
        "unused_measurements": sorted(k for k in (measured or {}) if k not in used and k not in METADATA_KEYS),
        "failed": any(counts[v] for v in FAILING_CLAIM_VERDICTS),
    }
    from kvgraft.verdict import seal

    return seal("claims", result, "claims check result")


def check_files(claims_path: Path, measured_path: Path | None = None) -> dict[str, Any]:
    cf = load(claims_path)
    if measured_path is None:
        return check(cf)
    measured, digest = load_measured(measured_path)
    return check(cf, measured, str(measured_path), digest)
