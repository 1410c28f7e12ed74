from __future__ import annotations

import math

import pytest

from kvgraft.errors import InputError
from kvgraft.generalization.stats import (
    mcnemar,
    mcnemar_exact,
    mcnemar_midp,
    min_attainable_p,
    paired_bootstrap,
    pass_at_k,
    wilson,
)


def test_wilson_by_hand() -> None:
    # k = 24, n = 30, z = 1.96:  (k + z²/2 ± z·sqrt(k(n-k)/n + z²/4)) / (n + z²)
    #   = (25.9208 ± 1.96·sqrt(4.8 + 0.9604)) / 33.8416 = (25.9208 ± 4.704163) / 33.8416
    lo, hi = wilson(24, 30)
    assert lo == pytest.approx(21.216637 / 33.8416, abs=1e-6)  # 0.626945
    assert hi == pytest.approx(30.624963 / 33.8416, abs=1e-6)  # 0.904950
    # 28/30: (29.9208 ± 1.96·sqrt(1.8667 + 0.9604)) / 33.8416
    lo28, hi28 = wilson(28, 30)
    half = 1.96 * math.sqrt(28 * 2 / 30 + 1.96**2 / 4)
    assert (lo28, hi28) == pytest.approx(((29.9208 - half) / 33.8416, (29.9208 + half) / 33.8416), abs=1e-6)
    assert lo < lo28 and hi < hi28


def test_wilson_edges() -> None:
    lo, hi = wilson(0, 10)
    assert lo == 0.0 and hi == pytest.approx(1.96**2 / (10 + 1.96**2))  # 3.8416 / 13.8416
    lo, hi = wilson(10, 10)
    assert hi == 1.0 and lo == pytest.approx(10 / (10 + 1.96**2))
    assert wilson(0, 0) == (0.0, 1.0)
    for bad in [(5, 3), (-1, 3)]:
        with pytest.raises(InputError):
            wilson(*bad)


def test_mcnemar_24_vs_28_of_30() -> None:
    a = [True] * 24 + [False] * 6
    b = [True] * 28 + [False] * 2  # every item A got, B got too; B also got 4 more
    r = mcnemar(a, b)
    assert (r.b, r.c, r.correct_a, r.correct_b, r.n) == (0, 4, 24, 28, 30)
    assert r.p_exact == pytest.approx(0.125)  # 2 · (1/2)^4
    assert r.p_midp == pytest.approx(0.0625)  # 0.125 - (1/2)^4
    assert not r.significant
    assert "not significant at 0.05" in r.verdict
    assert "no outcome could be significant" in r.verdict  # 4 discordant pairs can never reach p < 0.05
    assert r.difference == pytest.approx(4 / 30)
    assert r.as_dict()["difference"] == pytest.approx(4 / 30)


def test_mcnemar_exact_values() -> None:
    assert mcnemar_exact(0, 4) == pytest.approx(0.125)
    assert mcnemar_exact(4, 0) == pytest.approx(0.125)
    assert mcnemar_exact(0, 0) == 1.0 and mcnemar_midp(0, 0) == 1.0
    assert mcnemar_exact(3, 3) == 1.0 and mcnemar_midp(3, 3) == pytest.approx(1.0)
    # b=2, c=9: n=11, P(X<=2) = (1 + 11 + 55) / 2048 = 67/2048
    assert mcnemar_exact(2, 9) == pytest.approx(134 / 2048)
    assert mcnemar_midp(2, 9) == pytest.approx((134 - 55) / 2048)
    assert min_attainable_p(4) == 0.125 and min_attainable_p(6) == pytest.approx(1 / 32)
    with pytest.raises(InputError):
        mcnemar_exact(-1, 2)


def test_mcnemar_significant_verdict() -> None:
    a = [True] * 50 + [False] * 50
    b = [True] * 50 + [True] * 12 + [False] * 38
    r = mcnemar(a, b, labels=("baseline", "graft"))
    assert (r.b, r.c) == (0, 12)
    assert r.p_exact == pytest.approx(2 * 0.5**12)
    assert r.significant and "significant at 0.05, graft is better" in r.verdict and "not significant" not in r.verdict


def test_mcnemar_no_discordant_and_bad_input() -> None:
    r = mcnemar([True, False], [True, False])
    assert r.p_exact == 1.0 and "not significant" in r.verdict and "no discordant pairs" in r.verdict
    with pytest.raises(InputError, match="length"):
        mcnemar([True], [True, False])
    with pytest.raises(InputError, match="bool"):
        mcnemar([1], [0])  # type: ignore[list-item]


def test_paired_bootstrap() -> None:
    a = [True] * 24 + [False] * 6
    b = [True] * 28 + [False] * 2
    r1 = paired_bootstrap(a, b, n_boot=2000, seed=7)
    r2 = paired_bootstrap(a, b, n_boot=2000, seed=7)
    assert r1 == r2
    assert r1.difference == pytest.approx(4 / 30)
    assert r1.lo <= r1.difference <= r1.hi
    assert r1.discordant == 4 and "anti-conservative" in r1.note  # honest about a too-narrow CI
    same = paired_bootstrap(a, a, n_boot=500, seed=1)
    assert same.lo == same.hi == 0.0 and not same.excludes_zero
    mixed = paired_bootstrap([True, False] * 50, [False, True] * 50, n_boot=3000, seed=2)
    assert mixed.difference == 0.0 and mixed.lo < 0.0 < mixed.hi and mixed.note == ""
    with pytest.raises(InputError):
        paired_bootstrap([True], [True, False], n_boot=10, seed=0)


def test_pass_at_k() -> None:
    assert pass_at_k(5, 0, 1) == 0.0
    assert pass_at_k(5, 5, 3) == 1.0
    assert pass_at_k(5, 2, 1) == pytest.approx(2 / 5)  # pass@1 = c / n
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(10, 3, 8) == 1.0  # n - c < k
    assert pass_at_k(200, 13, 10) == pytest.approx(1 - math.comb(187, 10) / math.comb(200, 10))
    for bad in [(5, 6, 1), (5, 1, 0), (5, 1, 6)]:
        with pytest.raises(InputError):
            pass_at_k(*bad)


def test_detectable_effect_is_the_power_of_the_exact_mcnemar_test() -> None:
    from scipy.stats import binom

    from kvgraft.generalization.stats import detectable_effect

    d = detectable_effect(20)
    # 6 one-way flips is the fewest that reach p < 0.05 (2/2**6 = 0.031; 2/2**5 = 0.0625)
    assert d["min_discordant"] == 6 and d["min_significant"] == pytest.approx(0.3)
    assert binom.sf(5, 20, d["effect"]) == pytest.approx(0.8, abs=1e-6)  # P(at least 6 flips) at the effect
    assert 0.36 < d["effect"] < 0.37
    assert detectable_effect(5)["effect"] is None and detectable_effect(5)["min_discordant"] is None
    effects = [detectable_effect(n)["effect"] for n in (6, 8, 12, 20, 30, 100)]
    assert effects == sorted(effects, reverse=True) and effects[-1] < 0.1
    with pytest.raises(InputError):
        detectable_effect(10, power=1.0)
