"""Final-answer extraction and equivalence checking.

`extract_answer` takes the last \\boxed{...}, else the last 'Answer:' line, else the text after the
last '####', else the last number. `check` compares an extracted answer with the gold answer: two
plain numbers by exact rational value; anything else by equality of the normalized strings or, failing
that, by math-verify (symbolic, imported lazily).

math-verify guards parsing with `signal.alarm`, which only works on the main thread: `check` passes
its timeout there and `None` on any other thread (where math-verify would otherwise raise), and
bounds the length of what it hands over instead.
"""

from __future__ import annotations

import re
import threading
from fractions import Fraction
from functools import lru_cache
from typing import Any

MATH_VERIFY_TIMEOUT_S = 5  # main thread only; signal-based
MAX_VERIFY_CHARS = 400  # longer answers skip math-verify (no timeout is possible off the main thread)

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER_LINE = re.compile(r"(?im)^[^\n]*?\b(?:final[ \t]+answer|answer)[ \t]*(?:is)?[ \t]*[:：][ \t]*(\S[^\n]*?)[ \t]*$")
# a '-' counts as a sign only where it cannot be a minus between two operands ("10-4")
_NUMBER = re.compile(r"(?:(?<![\w)\]}])-)?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?(?:[ \t]*/[ \t]*\d+)?")


def _boxed_contents(text: str) -> list[str]:
    out: list[str] = []
    for m in _BOXED.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
            i += 1
        if depth == 0:
            out.append(text[m.end() : i - 1].strip())
    return out


def extract_answer(text: str) -> str | None:
    """The final answer in a model's output, or None when there is nothing to take."""
    boxed = _boxed_contents(text)
    if boxed:
        return boxed[-1]
    lines = [s for s in (str(x).strip().strip("*_ ").strip() for x in _ANSWER_LINE.findall(text)) if s]
    if lines:
        return lines[-1]  # markdown emphasis around it ('**Answer:** 42') removed
    if "####" in text:
        tail = text.rsplit("####", 1)[1].strip()
        if tail:
            return tail.splitlines()[0].strip()
    numbers = _NUMBER.findall(text)
    return numbers[-1].strip() if numbers else None


# ---------------------------------------------------------------- normalization

_UNIT_WORDS = (
    "dollars?|cents?|euros?|pounds?|usd|units?|degrees?|percent|meters?|metres?|km|kilometers?|kilometres?|miles?|"
    "hours?|minutes?|seconds?|days?|weeks?|months?|years?|feet|foot|inches?|cm|mm|kg|grams?|g|liters?|litres?|"
    "points?|people|students?|apples?|eggs?|pages?|items?|cookies?|marbles?|times"
)
_TEXT_UNITS = re.compile(r"\\(?:text|mbox|mathrm)\{\s*(?:" + _UNIT_WORDS + r")\s*\}", re.I)
_TRAILING_UNITS = re.compile(r"(?<=[\d}])\s*(?:" + _UNIT_WORDS + r")\.?$", re.I)
_TEXT_WRAP = re.compile(r"\\(?:text|textbf|mathrm|mathbf|mbox)\{([^{}]*)\}")
_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*(-?\d+)\s*\}\s*\{\s*(-?\d+)\s*\}|\\[dt]?frac(\d)(\d)")
_THOUSANDS = re.compile(r"(?<![\d.])(\d{1,3}(?:,\d{3})+)(?![\d,])")


def normalize(answer: str) -> str:
    """Strip the decoration around an answer: $, \\$, degrees, %, \\text{units}, unit words, thousands commas, trailing '.'."""
    s = answer.strip()
    s = s.replace("\\!", "").replace("\\,", "").replace("\\;", "").replace("\\ ", " ")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("\\$", "").replace("$", "")
    s = re.sub(r"\^\s*\{?\s*\\circ\s*\}?", "", s)
    s = s.replace("°", "").replace("\\%", "").replace("%", "")
    s = _TEXT_UNITS.sub("", s)
    s = _TEXT_WRAP.sub(r"\1", s).strip()
    s = re.sub(r"\\dfrac|\\tfrac", r"\\frac", s)
    s = _THOUSANDS.sub(lambda m: m.group(1).replace(",", ""), s)
    s = s.strip().rstrip(".").strip()
    s = _TRAILING_UNITS.sub("", s).strip().rstrip(".").strip()
    if s.count("=") == 1:
        s = re.sub(r"^[a-zA-Z]\s*=\s*(?=[-\d.\\])", "", s)  # 'x = 5' -> '5'
    return " ".join(s.split())


def as_number(answer: str) -> Fraction | None:
    """The exact rational value of a normalized numeric answer ('12', '-0.5', '3/4', '\\frac{3}{4}'), else None."""
    s = normalize(answer)
    m = re.fullmatch(r"(-?\d+(?:\.\d+)?)\s+[A-Za-z][A-Za-z\s'-]*", s)  # '16 duck eggs' -> 16
    if m:
        return Fraction(m.group(1))
    s = s.replace(" ", "")
    m = _FRAC.fullmatch(s)
    if m:
        num, den = (m.group(1), m.group(2)) if m.group(1) is not None else (m.group(3), m.group(4))
        return None if int(den) == 0 else Fraction(int(num), int(den))
    m = re.fullmatch(r"(-?)\\frac\{(\d+)\}\{(\d+)\}", s)
    if m and int(m.group(3)):
        return Fraction(int(m.group(2)), int(m.group(3))) * (-1 if m.group(1) else 1)
    m = re.fullmatch(r"(-?\d+)/(\d+)", s)
    if m:
        return None if int(m.group(2)) == 0 else Fraction(int(m.group(1)), int(m.group(2)))
    if re.fullmatch(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?", s):
        return Fraction(s)
    return None


# ---------------------------------------------------------------- math-verify


@lru_cache(maxsize=1)
def _math_verify() -> tuple[Any, Any] | None:
    try:
        from math_verify import parse, verify
    except ImportError:
        return None
    return parse, verify


def _wrap(s: str) -> str:
    return s if "$" in s or "\\(" in s or "\\[" in s else f"${s}$"


def math_verify_equal(predicted: str, gold: str) -> bool | None:
    """math-verify's verdict on two answer strings; None when it is not installed, cannot parse, or fails."""
    mv = _math_verify()
    if mv is None or len(predicted) > MAX_VERIFY_CHARS or len(gold) > MAX_VERIFY_CHARS:
        return None
    parse, verify = mv
    timeout = MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    try:
        g = parse(_wrap(gold), parsing_timeout=timeout)
        p = parse(_wrap(predicted), parsing_timeout=timeout)
        if not g or not p:
            return None
        return bool(verify(g, p, timeout_seconds=timeout))
    except Exception:  # math-verify's own TimeoutException included: fall back to the other checks
        return None


def check(predicted_text: str, gold: str, *, use_math_verify: bool = True) -> bool:
    """True when the final answer in `predicted_text` equals `gold`.

    When both sides are plain numbers their exact rational values decide ('1,000' == '1000',
    '\\frac{1}{2}' == '0.5', '336^\\circ' == '336', but 0.333 != 1/3). Otherwise it accepts when the
    normalized strings are equal ignoring case and spaces ('No' == 'no') or math-verify says equal
    ('x=2, y=1' == 'y=1, x=2', '1/(n+1)' == '\\frac{1}{n+1}').
    """
    predicted = extract_answer(predicted_text)
    if predicted is None or not gold.strip():
        return False
    p_num, g_num = as_number(predicted), as_number(gold)
    if p_num is not None and g_num is not None:
        return p_num == g_num  # two plain numbers: the exact rational comparison decides
    p_norm = normalize(predicted).replace(" ", "").casefold()
    g_norm = normalize(gold).replace(" ", "").casefold()
    if p_norm and p_norm == g_norm:
        return True
    if use_math_verify:
        verdict = math_verify_equal(normalize(predicted), normalize(gold))
        if verdict:
            return True
    return False
