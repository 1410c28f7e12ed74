"""Audit samples nobody can choose, and the bound a sample gives: draw, re-derive, hypergeometric bounds.

The draw (`draw`, method `sha256-rank-v1`): every entry of the release, at position i (0-based) of its
entry list, gets the key

    SHA-256( "kvgraft-sample-v1" 0x00 ROOT 0x00 NONCE 0x00 DECIMAL(i) )

(ROOT: the release's signed root digest as 64 lowercase hex characters; NONCE: the auditor's nonce, 1 to
256 printable ASCII characters without spaces; all as ASCII bytes). The sample of size n is the n entries
with the smallest keys (compared as 32-byte big-endian numbers; ties broken by position), listed in key
order. So it is drawn without replacement, uniformly over entries (each entry is equally likely; not
weighted by tokens), it is a function of the root and the nonce alone, a publisher who signs the root
before the nonce is drawn cannot choose it, and a sample of n is the first n of any larger one.

The bound (`upper_bound`): from k failing of n sampled out of N, the largest number of failing entries D
that the sample does not reject at level alpha: the largest D with P(X <= k) > alpha for X hypergeometric
(N, D, n). The CDF is evaluated in exact integer arithmetic (no floating point), so the bound is exact.
For tokens (`token_bound`): the failing tokens are at most those of the failing sampled entries plus the
D - k longest unsampled entries (the worst case of which entries fail), at the same confidence.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from math import comb
from typing import Any

from kvgraft.errors import InputError, short_repr
from kvgraft.results.base import JsonObject
from kvgraft.results.verify import Bound as VerifyBound

METHOD = "sha256-rank-v1"
TAG = b"kvgraft-sample-v1"
NONCE_RE = re.compile(r"[\x21-\x7e]{1,256}")
CONFIDENCE = 0.95
WEIGHTING = "uniform over entries (each entry equally likely; not weighted by tokens)"
BOUND_METHOD = "exact hypergeometric: largest D with P(X <= k | N, D, n) > 1 - confidence, in integer arithmetic"
TOKEN_METHOD = ("failing sampled entries' tokens plus the D - k longest unsampled entries' tokens "
                "(the worst case of which entries fail, at the entry bound's confidence)")


def new_nonce() -> str:
    """A fresh random nonce (128 bits, hex): what an audit uses when the auditor gives none."""
    return secrets.token_hex(16)


def check_nonce(nonce: Any, what: str = "--nonce") -> str:
    if not isinstance(nonce, str) or not NONCE_RE.fullmatch(nonce):
        raise InputError(f"{what} {short_repr(nonce)}: expected 1 to 256 printable ASCII characters without spaces")
    return nonce


def nonce_origin(sample: Mapping[str, Any], journal: str | None) -> str:
    """Where a result's nonce came from, in words: given (by the auditor), drawn (here, at random), or read
    from the journal an earlier run left (whoever wrote that file chose it)."""
    if sample.get("nonce_source") == "journal":
        return f"from the journal {journal}"
    return str(sample.get("nonce_source"))


def _check_root(root: str) -> str:
    if not isinstance(root, str) or not re.fullmatch(r"[0-9a-f]{64}", root):
        raise InputError(f"root digest {root!r}: expected 64 lowercase hex characters")
    return root


def key(root: str, nonce: str, index: int) -> bytes:
    """The ranking key of the entry at `index`: see the module docstring."""
    return hashlib.sha256(b"\0".join((TAG, root.encode(), nonce.encode(), str(index).encode()))).digest()


def _ranking(root: str, nonce: str) -> Callable[[int], tuple[bytes, int]]:
    """(key(root, nonce, i), i) for each i, the common prefix hashed once (tests compare it with `key`)."""
    _check_root(root)
    check_nonce(nonce)
    base = hashlib.sha256(b"\0".join((TAG, root.encode(), nonce.encode(), b"")))

    def rank(i: int) -> tuple[bytes, int]:
        h = base.copy()
        h.update(str(i).encode())
        return h.digest(), i

    return rank


def order(root: str, nonce: str, population: int) -> list[int]:
    """Every position 0..population-1, in sample order (smallest key first)."""
    return sorted(range(population), key=_ranking(root, nonce))


def draw(root: str, nonce: str, population: int, size: int, option: str = "--sample") -> list[int]:
    """The positions of a sample of `size` entries out of `population`, in sample order (`option`: what
    an error names the size by): the first `size` of `order`, without sorting the rest."""
    if not 1 <= size <= population:
        raise InputError(f"{option} {size}: expected 1 to {population} (the release's entries)")
    return heapq.nsmallest(size, range(population), key=_ranking(root, nonce))


def drawn_ids(root: str, nonce: str, ids: Sequence[str], size: int, option: str = "--sample") -> list[str]:
    """The ids of the `size` entries `draw` picks, in the order drawn: what `audit sample` lists and `pull --sample` pulls."""
    return [str(ids[i]) for i in draw(root, nonce, len(ids), size, option)]


def sample_record(root: str, nonce: str, ids: Sequence[str], tokens: Sequence[int], size: int, *,
                  nonce_source: str) -> dict[str, Any]:
    """What a result records of its sample: enough for anyone with the release to re-derive it. `ids` and
    `tokens`: every entry's id and num_tokens in release order (Release.entry_ids, Release.token_counts)."""
    picked = draw(root, nonce, len(ids), size)
    return {"method": METHOD, "weighting": WEIGHTING, "root_digest": root, "nonce": nonce, "nonce_source": nonce_source,
            "population": len(ids), "population_tokens": sum(tokens),
            "size": size, "positions": picked, "entries": [str(ids[i]) for i in picked]}


def check_sample(recorded: JsonObject, root: str, ids: Sequence[str], tokens: Sequence[int]) -> list[str]:
    """Re-derive a recorded sample from the release (its root, entry ids and token counts): the differences, [] if none.

    Values are compared as JSON (`true` is not 1), and each is quoted cut to 120 characters (it came from a file)."""
    problems = []
    if recorded.get("method") != METHOD:
        return [f"method {short_repr(recorded.get('method'))} is not {METHOD!r}"]
    if not _same(recorded.get("root_digest"), root):
        problems.append(f"recorded root digest {short_repr(recorded.get('root_digest'))} is not the release's {root}")
    if not _same(recorded.get("population"), len(ids)):
        problems.append(f"recorded population {short_repr(recorded.get('population'))} is not the release's "
                        f"{len(ids)} entries")
    size, nonce = recorded.get("size"), recorded.get("nonce")
    if type(size) is not int or not 1 <= size <= len(ids):
        return [*problems, f"recorded size {short_repr(size)} is not 1 to {len(ids)}"]
    if not isinstance(nonce, str) or not NONCE_RE.fullmatch(nonce):
        return [*problems, f"recorded nonce {short_repr(nonce)} is not 1 to 256 printable ASCII characters without "
                           f"spaces"]
    again = sample_record(root, nonce, ids, tokens, size, nonce_source="re-derived")
    for k in ("positions", "entries"):
        if not _same(recorded.get(k), again[k]):
            problems.append(f"recorded {k} differ from the re-derived ones (first re-derived: {again[k][:5]})")
    return problems


def _same(recorded: Any, expected: Any) -> bool:
    """Equal as JSON values: Python's == takes true for 1 and 1.0 for 1, which a JSON document states differently."""
    return json.dumps(recorded, sort_keys=True) == json.dumps(expected, sort_keys=True)


# ---------------------------------------------------------------- the bound


def _alpha(confidence: float) -> Fraction:
    if not 0 < confidence < 1:
        raise InputError(f"confidence {confidence}: expected a number between 0 and 1")
    return 1 - Fraction(str(confidence))


def _cdf_scaled(k: int, population: int, bad: int, n: int) -> int:
    """sum_{x=0..k} C(bad, x) C(population - bad, n - x): P(X <= k) times C(population, n), exactly."""
    good = population - bad
    total = 0
    lo = max(0, n - good)
    if k < lo:
        return 0
    a, b = comb(bad, lo), comb(good, n - lo)  # C(bad, x), C(good, n - x) at x = lo, then stepped exactly
    for x in range(lo, min(k, n, bad) + 1):
        total += a * b
        # C(bad, x+1) = C(bad, x) (bad - x) / (x + 1); C(good, n-x-1) = C(good, n-x) (n - x) / (good - n + x + 1)
        a = a * (bad - x) // (x + 1)
        b = b * (n - x) // (good - n + x + 1) if good - n + x + 1 > 0 else 0
    return total


def not_rejected(k: int, population: int, bad: int, n: int, confidence: float = CONFIDENCE) -> bool:
    """Whether `bad` failing entries out of `population` are compatible with k of n: P(X <= k) > alpha."""
    alpha = _alpha(confidence)
    return _cdf_scaled(k, population, bad, n) * alpha.denominator > alpha.numerator * comb(population, n)


def upper_bound(k: int, n: int, population: int, confidence: float = CONFIDENCE) -> int:
    """The one-sided `confidence` upper bound on failing entries of `population` from k failing of n sampled."""
    if not 0 <= k <= n <= population:
        raise InputError(f"bound: expected 0 <= k <= n <= N, got k={k}, n={n}, N={population}")
    if n == population:
        return k  # everything was judged: nothing to bound
    lo, hi = k, population - (n - k)  # bad = lo is never rejected (P(X <= k) = 1 there); hi is the most possible
    while lo < hi:  # P(X <= k) falls as bad grows: find the last bad it does not reject
        mid = (lo + hi + 1) // 2
        if not_rejected(k, population, mid, n, confidence):
            lo = mid
        else:
            hi = mid - 1
    return lo


def detection(damaged: int, n: int, population: int) -> Fraction:
    """P(a sample of n out of `population` holds at least one of `damaged` entries), exactly:
    1 - C(population - damaged, n) / C(population, n)."""
    if not 0 <= damaged <= population or not 0 <= n <= population:
        raise InputError(f"detection: expected 0 <= damaged, n <= N, got damaged={damaged}, n={n}, N={population}")
    return 1 - Fraction(_cdf_scaled(0, population, damaged, n), comb(population, n))


def sample_size(fraction: float, population: int, confidence: float = CONFIDENCE) -> int:
    """The smallest n for which 0 failing of n bounds the failing entries by `fraction` of `population`."""
    if not 0 < fraction < 1:
        raise InputError(f"--target-fraction {fraction}: expected a number between 0 and 1")
    if population < 1:
        raise InputError("the release has no entries")
    allowed = int(Fraction(str(fraction)) * population)  # at most this many failing entries may remain possible
    if allowed >= population:
        return 1
    lo, hi = 1, population  # n = population always meets it (the bound is then 0)
    while lo < hi:
        mid = (lo + hi) // 2
        if not not_rejected(0, population, allowed + 1, mid, confidence):  # the bound of 0 of mid is <= allowed
            hi = mid
        else:
            lo = mid + 1
    return lo


@dataclass(frozen=True)
class Bound:
    failing: int  # k
    sampled: int  # n
    population: int  # N
    max_failing: int  # D, the upper bound on failing entries
    population_tokens: int
    failing_tokens: int  # tokens of the failing sampled entries
    max_failing_tokens: int
    confidence: float

    def as_dict(self, fail_means: str) -> dict[str, Any]:
        return {"confidence": self.confidence, "failing": self.failing, "sampled": self.sampled,
                "population": self.population, "fail_means": fail_means, "max_failing_entries": self.max_failing,
                "max_failing_fraction": self.max_failing / self.population, "method": BOUND_METHOD,
                "population_tokens": self.population_tokens, "failing_sampled_tokens": self.failing_tokens,
                "max_failing_tokens": self.max_failing_tokens,
                "max_failing_token_fraction": self.max_failing_tokens / self.population_tokens
                if self.population_tokens else 0.0, "token_method": TOKEN_METHOD}


def token_bound(failing_sampled_tokens: int, unsampled_tokens: Sequence[int], extra_failing: int) -> int:
    """Failing tokens at most: the failing sampled ones plus the `extra_failing` longest unsampled entries."""
    return failing_sampled_tokens + sum(sorted(unsampled_tokens, reverse=True)[:max(0, extra_failing)])


def bound(failing: Sequence[bool], sampled_tokens: Sequence[int], unsampled_tokens: Sequence[int],
          confidence: float = CONFIDENCE) -> Bound:
    """The bound from per-sampled-entry failure flags and token counts, and the unsampled entries' tokens."""
    k, n = sum(failing), len(failing)
    population = n + len(unsampled_tokens)
    d = upper_bound(k, n, population, confidence)
    bad_tokens = sum(t for f, t in zip(failing, sampled_tokens, strict=True) if f)
    return Bound(k, n, population, d, sum(sampled_tokens) + sum(unsampled_tokens), bad_tokens,
                 token_bound(bad_tokens, unsampled_tokens, d - k), confidence)


DETECT_FRACTION = 0.01  # the damage a sampled verification states its chance of catching


def check_bound(n: int, population: int, confidence: float = CONFIDENCE,
                fraction: float = DETECT_FRACTION) -> VerifyBound:
    """What a sample of n of `population` entries with no damaged entry says of the release (`kvgraft
    verify --sample`): the exact one-sided upper bound on damaged entries, and the exact probability that
    such a sample holds at least one damaged entry had `fraction` of the entries (rounded up) been damaged."""
    most = upper_bound(0, n, population, confidence)
    damaged = max(1, -(-Fraction(str(fraction)) * population // 1))  # ceil, exactly
    caught = detection(int(damaged), n, population)
    return VerifyBound(confidence=confidence, damaged=0, sampled=n, population=population, max_damaged_entries=most,
                       max_damaged_fraction=most / population, method=BOUND_METHOD, if_damaged_fraction=fraction,
                       if_damaged_entries=int(damaged), detection_probability=float(caught),
                       detection_at_least=pct_floor(caught))


def check_sentence(b: VerifyBound) -> str:
    """'0 of 200 sampled entries damaged: at most 1.5% of 10,000 entries ...; if 1% ... probability ≥ 86.6%'."""
    conf = f"{100 * b.confidence:g}%"
    return (f"{b.damaged} of {b.sampled:,} sampled entries damaged: at most {pct(b.max_damaged_fraction)} "
            f"of {b.population:,} entries are damaged ({b.max_damaged_entries:,}), {conf} one-sided, exact "
            f"hypergeometric; if {100 * b.if_damaged_fraction:g}% of the entries ({b.if_damaged_entries:,}) "
            f"were damaged, this check would have caught one with probability ≥ {b.detection_at_least}")


def pct_floor(p: Fraction) -> str:
    """A probability as a percentage rounded down (a '>=' stays true), with the digits pct uses."""
    digits = 1 if p >= Fraction(1, 100) else 2 if p >= Fraction(1, 1000) else 3
    scale = 10 ** digits
    if p >= 1:
        return "100%"
    v = int(100 * scale * p)  # floor: p is not negative
    return f"{v // scale}.{v % scale:0{digits}d}%"


def pct(x: float) -> str:
    """A fraction as a percentage with the digits a bound needs (1.5%, 0.15%, 0.015%)."""
    if x == 0:
        return "0%"
    p = 100 * x
    digits = 1 if p >= 1 else 2 if p >= 0.1 else 3
    return f"{p:.{digits}f}%"


def sentence(b: Mapping[str, Any]) -> str:
    """'0 of 200 sampled fail: at most 1.5% of 100,000 entries fail (95%)' from a recorded bound."""
    conf = f"{100 * float(b['confidence']):g}%"
    return (f"{b['failing']} of {b['sampled']:,} sampled fail ({b['fail_means']}): at most "
            f"{pct(float(b['max_failing_fraction']))} of {b['population']:,} entries fail "
            f"({b['max_failing_entries']:,}), at most {pct(float(b['max_failing_token_fraction']))} of "
            f"{b['population_tokens']:,} tokens, {conf} one-sided")
