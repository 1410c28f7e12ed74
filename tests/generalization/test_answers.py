from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction

import pytest

from kvgraft.generalization.answers import as_number, check, extract_answer, normalize


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("We get \\boxed{12} first, then \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
        ("nested \\boxed{\\frac{a}{b+{c}}}", "\\frac{a}{b+{c}}"),
        ("Work...\nAnswer: 42\nMore text", "42"),
        ("Answer: 1\nFinal answer: 7", "7"),
        ("**Final Answer:** 42", "42"),
        ("She makes 9 * 2 = 18 dollars.\n#### 18", "18"),
        ("16 - 3 - 4 = 9 eggs, 9 * 2 = 18", "18"),
        ("The total is $1,000.", "1,000"),
        ("after 10-4 we have", "4"),
        ("no digits at all", None),
    ],
)
def test_extract_answer(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


def test_extract_answer_needs_content_after_colon() -> None:
    # "Answer:" with nothing after it on the line falls through to the last number
    assert extract_answer("3 + 4 = 7\nAnswer:") == "7"


@pytest.mark.parametrize(
    ("predicted", "gold"),
    [
        ("\\boxed{336^\\circ}", "336"),
        ("so the angle is \\boxed{336^{\\circ}}", "336^\\circ"),
        ("It costs $1,000.", "1000"),
        ("Answer: \\$1,000", "1,000"),
        ("Answer: \\frac{1}{2}", "0.5"),
        ("Answer: 0.5", "\\dfrac{1}{2}"),
        ("Answer: 18.", "18"),
        ("Answer: 18 dollars", "18"),
        ("Answer: 16 duck eggs", "16"),
        ("\\boxed{18 \\text{ apples}}", "18"),
        ("Answer: 50\\%", "50"),
        ("\\boxed{x = 5}", "5"),
        ("\\boxed{No}", "No"),
        ("Answer: y=1, x=2", "x=2, y=1"),  # math-verify: equal sets of equations
        ("\\boxed{\\frac{1}{n+1}}", "1/(n+1)"),  # math-verify: symbolic
        ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}"),
        ("#### -3", "-3"),
    ],
)
def test_check_equivalent(predicted: str, gold: str) -> None:
    assert check(predicted, gold)


@pytest.mark.parametrize(
    ("predicted", "gold"),
    [
        ("Answer: 17", "18"),
        ("Answer: 180", "18"),
        ("Answer: 0.333", "1/3"),  # plain numbers are compared exactly
        ("Answer: -18", "18"),
        ("\\boxed{Yes}", "No"),
        ("I cannot tell.", "18"),
        ("Answer: 18", ""),
        ("\\boxed{\\frac{1}{n}}", "1/(n+1)"),
    ],
)
def test_check_different(predicted: str, gold: str) -> None:
    assert not check(predicted, gold)


def test_normalize_and_number() -> None:
    assert normalize("$1,234,567.$") == "1234567"
    assert normalize("\\text{45 minutes}") == "45"
    assert as_number("\\frac{3}{4}") == Fraction(3, 4)
    assert as_number("-\\frac{3}{4}") == Fraction(-3, 4)
    assert as_number("\\dfrac34") == Fraction(3, 4)
    assert as_number("2.50") == Fraction(5, 2)
    assert as_number("x=2, y=1") is None
    assert as_number("1/0") is None


def test_check_without_math_verify_still_handles_numbers() -> None:
    assert check("Answer: \\$1,000", "1000", use_math_verify=False)
    assert not check("\\boxed{\\frac{1}{n+1}}", "1/(n+1)", use_math_verify=False)


def test_check_works_in_worker_threads() -> None:
    cases = [("\\boxed{\\frac{1}{n+1}}", "1/(n+1)", True), ("Answer: y=1, x=2", "x=2, y=1", True), ("\\boxed{3}", "4", False)]
    with ThreadPoolExecutor(max_workers=2) as ex:
        got = list(ex.map(lambda c: check(c[0], c[1]), cases * 4))
    assert got == [c[2] for c in cases] * 4
