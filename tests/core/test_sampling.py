"""Audit samples and their bounds (kvgraft.sampling): pure arithmetic, so fixed vectors hold on any machine.

The draw is checked against a fixed test vector and against an independent implementation written from
the documented algorithm; the bound and the sample size against scipy's hypergeometric distribution.
"""

from __future__ import annotations

import hashlib
import random

import pytest
from scipy.stats import hypergeom

from kvgraft import errors, sampling

ROOT = "ab" * 32


def documented_draw(root: str, nonce: str, population: int, size: int) -> list[int]:
    """The algorithm as README and the schema state it, written out without kvgraft."""
    def k(i: int) -> bytes:
        return hashlib.sha256(b"kvgraft-sample-v1\0" + root.encode() + b"\0" + nonce.encode() + b"\0"
                              + str(i).encode()).digest()
    return sorted(range(population), key=lambda i: (int.from_bytes(k(i), "big"), i))[:size]


def test_same_root_and_nonce_give_the_same_sample_on_any_machine() -> None:
    # A fixed vector: SHA-256 of ASCII bytes, ranked; nothing here depends on the CPU or on floats.
    assert sampling.key(ROOT, "nonce-1", 0).hex() == "534f32fb6afcb99a48a60f0044e58878d157aa7a9ff0296d30cc6a65746f128a"
    assert sampling.draw(ROOT, "nonce-1", 20, 5) == [15, 8, 14, 10, 5]
    assert sampling.draw(ROOT, "nonce-2", 20, 5) == [5, 1, 10, 2, 9]
    assert sampling.draw("cd" * 32, "nonce-1", 20, 5) == [16, 1, 12, 11, 19]
    for nonce, n, size in (("x", 1, 1), ("nonce-1", 1000, 37), ("~!@#", 257, 257)):
        assert sampling.draw(ROOT, nonce, n, size) == documented_draw(ROOT, nonce, n, size)
    assert sampling.order(ROOT, "nonce-1", 300) == documented_draw(ROOT, "nonce-1", 300, 300)


def test_a_sample_is_without_replacement_and_a_prefix_of_any_larger_one() -> None:
    big = sampling.draw(ROOT, "n", 500, 200)
    assert len(set(big)) == 200 and all(0 <= i < 500 for i in big)
    assert sampling.draw(ROOT, "n", 500, 50) == big[:50]


def test_another_nonce_or_root_gives_another_sample() -> None:
    base = sampling.draw(ROOT, "nonce-1", 1000, 20)
    others = [sampling.draw(ROOT, f"nonce-{i}", 1000, 20) for i in range(2, 12)]
    assert all(set(o) != set(base) for o in others)
    assert set(sampling.draw("ab" * 31 + "ac", "nonce-1", 1000, 20)) != set(base)  # one root digit changed


def test_the_draw_is_uniform_over_entries() -> None:
    # Each of 10 entries lands in a sample of 3 with probability 0.3: over 3,000 nonces, every count within 5 sd.
    counts = [0] * 10
    for i in range(3000):
        for j in sampling.draw(ROOT, f"u{i}", 10, 3):
            counts[j] += 1
    sd = (3000 * 0.3 * 0.7) ** 0.5
    assert all(abs(c - 900) < 5 * sd for c in counts), counts


def test_nonce_and_size_are_checked() -> None:
    for bad in ("", "has space", "x" * 257, "ünï"):
        with pytest.raises(errors.InputError, match="--nonce"):
            sampling.check_nonce(bad)
    with pytest.raises(errors.InputError, match="--sample 0"):
        sampling.draw(ROOT, "n", 10, 0)
    with pytest.raises(errors.InputError, match="--sample 11"):
        sampling.draw(ROOT, "n", 10, 11)
    assert len(sampling.new_nonce()) == 32 and sampling.new_nonce() != sampling.new_nonce()


def scipy_bound(k: int, n: int, population: int, confidence: float = 0.95) -> int:
    """The largest D with P(X <= k) > 1 - confidence, by scanning D with scipy."""
    alpha = 1 - confidence
    d = k
    while d + 1 <= population - (n - k) and hypergeom.cdf(k, population, d + 1, n) > alpha:
        d += 1
    return d


@pytest.mark.parametrize(("k", "n", "population"), [
    (0, 200, 100_000), (0, 20, 1000), (1, 20, 1000), (3, 50, 400), (5, 100, 1000), (0, 1, 2), (2, 50, 60),
    (10, 10, 30), (0, 299, 300), (7, 300, 5000),
])
def test_the_bound_equals_scipys(k: int, n: int, population: int) -> None:
    d = sampling.upper_bound(k, n, population)
    if population <= 5000:
        assert d == scipy_bound(k, n, population)
    # The defining property, at the bound and one past it (scipy's float CDF; margins far above its error here).
    assert hypergeom.cdf(k, population, d, n) > 0.05
    if d < population - (n - k):
        assert hypergeom.cdf(k, population, d + 1, n) <= 0.05


def test_the_bound_equals_scipys_at_random_points() -> None:
    rng = random.Random(0)
    for _ in range(40):
        population = rng.randint(2, 400)
        n = rng.randint(1, population)
        k = rng.randint(0, n)
        conf = rng.choice([0.9, 0.95, 0.99])
        assert sampling.upper_bound(k, n, population, conf) == scipy_bound(k, n, population, conf), (k, n, population)


def test_0_of_200_sampled_of_100000_and_a_full_audit() -> None:
    # "0 of 200 sampled: at most 1.5% of 100,000 entries fail, 95%"
    d = sampling.upper_bound(0, 200, 100_000)
    assert sampling.pct(d / 100_000) == "1.5%"
    assert sampling.upper_bound(3, 1000, 1000) == 3  # everything judged: the count itself
    # An exact tie, which float arithmetic cannot decide: 0 of 1 out of 20 with D = 19 has P(X = 0) = 1/20
    # exactly, which is not above 5%, so D = 19 is rejected and the bound is 18.
    assert sampling.upper_bound(0, 1, 20) == 18 and sampling.not_rejected(0, 20, 18, 1)
    assert not sampling.not_rejected(0, 20, 19, 1)
    with pytest.raises(errors.InputError, match="k <= n <= N"):
        sampling.upper_bound(3, 2, 10)


@pytest.mark.parametrize(("fraction", "population"), [(0.015, 100_000), (0.01, 100_000), (0.05, 1000), (0.2, 50)])
def test_target_fraction_gives_the_smallest_sample_that_reaches_it(fraction: float, population: int) -> None:
    n = sampling.sample_size(fraction, population)
    allowed = int(fraction * population)
    assert sampling.upper_bound(0, n, population) <= allowed < sampling.upper_bound(0, n - 1, population)
    # scipy: with allowed + 1 failing entries, a sample of n misses all of them with probability <= 5%
    assert hypergeom.pmf(0, population, allowed + 1, n) <= 0.05 < hypergeom.pmf(0, population, allowed + 1, n - 1)


def test_token_bound_takes_the_longest_unsampled_entries() -> None:
    b = sampling.bound([False, True, False], [10, 20, 30], [5, 50, 7, 40, 1, 2, 3, 4, 6, 8])
    assert (b.failing, b.sampled, b.population) == (1, 3, 13)
    extra = b.max_failing - b.failing
    assert b.max_failing == sampling.upper_bound(1, 3, 13)
    assert b.max_failing_tokens == 20 + sum(sorted([5, 50, 7, 40, 1, 2, 3, 4, 6, 8], reverse=True)[:extra])
    d = b.as_dict("not byte-exact")
    assert d["max_failing_token_fraction"] == b.max_failing_tokens / (60 + 126)
    assert sampling.sentence(d).startswith("1 of 3 sampled fail (not byte-exact): at most")
