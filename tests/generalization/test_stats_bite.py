"""generalization.stats against independent references and its exact boundaries (`make mutate`).

Each assertion here was added for a mutant mutmut left alive in tests/generalization/test_stats.py's run: messages that
name the argument, the exact edges of every range check, the bootstrap against a direct resampling,
and McNemar at a p exactly equal to alpha. The references are computed here (scipy, Fractions, a
plain loop), not copied from a run.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy.stats import binomtest, norm

from kvgraft.errors import InputError
from kvgraft.generalization import stats


@pytest.mark.parametrize(("call", "message"), [
    (lambda: stats.wilson(-1, 5), "k must be a non-negative integer, got -1"),
    (lambda: stats.wilson(1, -1), "n must be a non-negative integer, got -1"),
    (lambda: stats.wilson(True, 3), "k must be a non-negative integer, got True"),
    (lambda: stats.wilson("3", 5), "k must be a non-negative integer, got '3'"),  # type: ignore[arg-type]
    (lambda: stats.wilson(6, 5), "k (6) exceeds n (5)"),
    (lambda: stats.wilson(1, 5, z=0), "z must be positive, got 0"),
    (lambda: stats.mcnemar_exact(-1, 0), "b must be a non-negative integer"),
    (lambda: stats.mcnemar_exact(0, -2), "c must be a non-negative integer"),
    (lambda: stats.mcnemar_midp(-1, 0), "b must be a non-negative integer"),
    (lambda: stats.mcnemar_midp(0, -2), "c must be a non-negative integer"),
    (lambda: stats.min_attainable_p(-1), "discordant must be a non-negative integer"),
    (lambda: stats.detectable_effect(-1), "n must be a non-negative integer"),
    (lambda: stats.detectable_effect(10, alpha=0.0), "alpha and power must be within (0, 1), got 0.0, 0.8"),
    (lambda: stats.detectable_effect(10, alpha=1.0), "alpha and power must be within (0, 1), got 1.0, 0.8"),
    (lambda: stats.detectable_effect(10, alpha=1.5), "alpha and power must be within (0, 1)"),
    (lambda: stats.detectable_effect(10, power=0.0), "alpha and power must be within (0, 1), got 0.05, 0.0"),
    (lambda: stats.detectable_effect(10, power=1.0), "alpha and power must be within (0, 1), got 0.05, 1.0"),
    (lambda: stats.mcnemar([1], [True]), "pairs_a[0] must be a bool, got 1"),  # type: ignore[list-item]
    (lambda: stats.mcnemar([True], [0]), "pairs_b[0] must be a bool, got 0"),  # type: ignore[list-item]
    (lambda: stats.mcnemar([True], [True, False]), "paired results differ in length: 1 vs 2"),
    (lambda: stats.mcnemar([True], [True], alpha=0.0), "alpha must be within (0, 1), got 0.0"),
    (lambda: stats.mcnemar([True], [True], alpha=1.0), "alpha must be within (0, 1), got 1.0"),
    (lambda: stats.mcnemar([True], [True], alpha=1.5), "alpha must be within (0, 1), got 1.5"),
    (lambda: stats.paired_bootstrap([1, 0], [1, 0, 1]),
     "paired results must be two 1-D sequences of equal length, got (2,) and (3,)"),
    (lambda: stats.paired_bootstrap([], []), "paired_bootstrap needs at least one pair"),
    (lambda: stats.paired_bootstrap([1], [0], n_boot=0), "n_boot must be >= 1, got 0"),
    (lambda: stats.paired_bootstrap([1], [0], confidence=0.0), "confidence must be within (0, 1), got 0.0"),
    (lambda: stats.paired_bootstrap([1], [0], confidence=1.0), "confidence must be within (0, 1), got 1.0"),
    (lambda: stats.paired_bootstrap([1], [0], confidence=1.5), "confidence must be within (0, 1), got 1.5"),
    (lambda: stats.pass_at_k(-1, 0, 1), "n must be a non-negative integer"),
    (lambda: stats.pass_at_k(3, -1, 1), "c must be a non-negative integer"),
    (lambda: stats.pass_at_k(3, 1, -1), "k must be a non-negative integer"),
    (lambda: stats.pass_at_k(3, 4, 1), "c (4) exceeds n (3)"),
    (lambda: stats.pass_at_k(3, 1, 4), "k must be within [1, n=3], got 4"),
    (lambda: stats.pass_at_k(3, 1, 0), "k must be within [1, n=3], got 0"),
])
def test_bad_arguments_are_named(call: object, message: str) -> None:
    with pytest.raises(InputError) as info:
        call()  # type: ignore[operator]
    assert str(info.value).startswith(message), str(info.value)


def test_edges_that_are_inside_the_ranges_are_accepted() -> None:
    assert stats.wilson(np.int64(2), np.int64(5)) == stats.wilson(2, 5)
    narrow, wide = stats.wilson(3, 10, z=0.5), stats.wilson(3, 10)
    assert wide[0] < narrow[0] < 0.3 < narrow[1] < wide[1]
    assert stats.paired_bootstrap([True], [False], n_boot=1).n_boot == 1
    assert stats.pass_at_k(3, 1, 3) == 1.0


def test_wilson_matches_scipy_and_is_exact_at_the_ends() -> None:
    for n in range(1, 21):
        for k in range(n + 1):
            ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
            lo, hi = stats.wilson(k, n, z=float(norm.ppf(0.975)))
            assert lo == pytest.approx(ci.low, abs=1e-12) and hi == pytest.approx(ci.high, abs=1e-12), (k, n)
        assert stats.wilson(0, n)[0] == 0.0 and stats.wilson(n, n)[1] == 1.0
        assert stats.wilson(1, n)[0] > 0.0 and (n == 1 or stats.wilson(n - 1, n)[1] < 1.0)
    assert stats.wilson(0, 0) == (0.0, 1.0)


def test_exact_mcnemar_mid_p_and_floor_against_a_direct_sum() -> None:
    for b in range(8):
        for c in range(8):
            n, k = b + c, min(b, c)
            tail = sum(Fraction(math.comb(n, i), 2**n) for i in range(k + 1))
            exact = min(Fraction(1), 2 * tail) if n else Fraction(1)
            assert stats.mcnemar_exact(b, c) == pytest.approx(float(exact), rel=1e-12), (b, c)
            mid = min(Fraction(1), 2 * tail - Fraction(math.comb(n, k), 2**n)) if n else Fraction(1)
            assert stats.mcnemar_midp(b, c) == float(mid), (b, c)
    assert stats.min_attainable_p(0) == 1.0 and stats.min_attainable_p(1) == 1.0
    assert stats.min_attainable_p(5) == 2 / 32


def test_detectable_effect_document_and_strict_alpha() -> None:
    d = stats.detectable_effect(20, alpha=0.0625, power=0.8)
    # 2 / 2**5 == 0.0625 is not < alpha: six discordant items are needed.
    assert d["min_discordant"] == 6 and d["min_significant"] == 6 / 20
    assert set(d) == {"n", "alpha", "power", "min_discordant", "min_significant", "effect", "method"}
    assert (d["n"], d["alpha"], d["power"]) == (20, 0.0625, 0.8)
    assert d["method"] == "exact McNemar, one-directional flips, binomial power"
    from scipy.stats import binom

    assert float(binom.sf(5, 20, d["effect"])) == pytest.approx(0.8, abs=1e-9)
    assert stats.detectable_effect(3)["effect"] is None


def test_mcnemar_counts_verdict_and_p_equal_to_alpha() -> None:
    a = [True, True, False, False, True]
    b = [False, True, True, True, True]
    r = stats.mcnemar(a, b)
    assert (r.n, r.correct_a, r.correct_b, r.b, r.c, r.alpha) == (5, 3, 4, 1, 2, 0.05)
    assert r.verdict == ("B 4/5 vs A 3/5 (+20.0% for B); discordant pairs: 1 A-only, 2 B-only; exact McNemar p = 1 "
                         "(mid-p 0.625): not significant at 0.05; with only 3 discordant pairs no outcome could be "
                         "significant (smallest possible p = 0.25)")
    # p exactly alpha (0/5 against 5/5: p = 2/32) is not significant, and the floor equal to alpha is named.
    r = stats.mcnemar([False] * 5, [True] * 5, alpha=0.0625)
    assert r.p_exact == 0.0625 and not r.significant
    assert "with only 5 discordant pairs no outcome could be significant" in r.verdict
    r = stats.mcnemar([True] * 6, [False] * 6, labels=("graft", "base"))
    assert r.significant and r.verdict.endswith("significant at 0.05, graft is better")
    assert stats.mcnemar([], []).verdict.startswith("no paired items to compare A and B")
    # As many discordant pairs each way (b = c = 1): a p is computed and stated, not "no discordant pairs".
    assert "exact McNemar p = 1 (mid-p 1)" in stats.mcnemar([True, False], [False, True]).verdict


def test_paired_bootstrap_is_a_direct_resampling_and_reports_its_settings() -> None:
    rng = np.random.default_rng(3)
    n = 4000  # more items than one chunk of draws holds for this n_boot: the chunked loop is exercised
    a = rng.random(n)  # scores, not bools: no ties between resampled means, so every draw shows in a quantile
    b = rng.random(n) + 0.1
    got = stats.paired_bootstrap(list(a), list(b), n_boot=2500, seed=11, confidence=0.9)
    diff = b - a
    draw = np.random.default_rng(11).integers(0, n, size=(2500, n))
    lo, hi = np.quantile(diff[draw].mean(axis=1), [0.05, 0.95])
    assert (got.lo, got.hi) == (pytest.approx(float(lo), abs=1e-12), pytest.approx(float(hi), abs=1e-12))
    assert got.difference == pytest.approx(float(diff.mean()))
    d = got.model()
    assert (d.confidence, d.n_boot, d.seed, d.n, d.discordant) == (0.9, 2500, 11, n, int(np.count_nonzero(diff)))
    assert d.excludes_zero == (got.lo > 0 or got.hi < 0) and d.method == "paired percentile bootstrap over items"
    again = stats.paired_bootstrap(list(a), list(b), n_boot=2500, seed=11, confidence=0.9)
    assert (again.lo, again.hi) == (got.lo, got.hi)
    default = stats.paired_bootstrap([True, False, True], [True, True, True])
    assert (default.n_boot, default.seed, default.confidence) == (10_000, 0, 0.95)
    assert default == stats.paired_bootstrap([True, False, True], [True, True, True], 10_000, 0, confidence=0.95)


def test_paired_bootstrap_one_draw_per_chunk_fills_every_mean() -> None:
    """4,000,000 items: one resample per chunk; each of the three means must come from its own draw."""
    n = 4_000_000
    diff = np.random.default_rng(5).random(n)
    got = stats.paired_bootstrap(np.zeros(n), diff, n_boot=3, seed=2, confidence=0.5)
    draw = np.random.default_rng(2).integers(0, n, size=(3, n))
    lo, hi = np.quantile(diff[draw].mean(axis=1), [0.25, 0.75])
    assert (got.lo, got.hi) == (pytest.approx(float(lo), abs=1e-15), pytest.approx(float(hi), abs=1e-15))


def test_bootstrap_note_below_twenty_discordant_items() -> None:
    base = [False] * 30
    twenty = stats.paired_bootstrap(base, [True] * 20 + [False] * 10, n_boot=50)
    nineteen = stats.paired_bootstrap(base, [True] * 19 + [False] * 11, n_boot=50)
    assert twenty.discordant == 20 and twenty.note == ""
    assert nineteen.discordant == 19 and nineteen.note.startswith("only 19 discordant items")


def test_pass_at_k_against_the_definition() -> None:
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                want = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
                assert stats.pass_at_k(n, c, k) == float(want), (n, c, k)
