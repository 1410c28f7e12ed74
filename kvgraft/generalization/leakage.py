"""Does a grafted library entry leak the query's answer, problem or solution?

Text overlap follows the lm-evaluation-harness decontamination janitor: lowercase, delete
punctuation, split on whitespace, and call any shared 13-gram contamination. A problem (or solution)
shorter than 13 tokens is matched as one n-gram of its own length, so a short problem embedded
verbatim is still caught.

The answer check looks for the gold answer as a standalone token: for a number, any number in the
entry with the same value ('1,000' == '1000' == '1000.00'), never a digit run inside a longer number
('18' is not in '2018' or '18.5'); for anything else, the whitespace-free answer bounded by non-word
characters. A small integer answer appears by chance in most worked solutions, so `answer_in_entry`
alone is weak evidence; `text_overlap` is the strong signal.
"""

from __future__ import annotations

import re
import string
import unicodedata
from dataclasses import dataclass
from fractions import Fraction
from typing import TypedDict

from kvgraft.errors import InputError
from kvgraft.generalization.problems import Problem

NGRAM = 13

_PUNCT = {ord(ch): None for ch in string.punctuation}


def _is_punct(ch: str) -> bool:
    return unicodedata.category(ch).startswith("P") or ch in string.punctuation


def normalize_tokens(text: str) -> list[str]:
    """Janitor-style tokens: NFKC, lowercase, punctuation deleted (ASCII and Unicode), whitespace split."""
    s = unicodedata.normalize("NFKC", text).lower().translate(_PUNCT)
    s = "".join(ch for ch in s if not _is_punct(ch))
    return s.split()


def ngrams(tokens: list[str], n: int) -> set[tuple[str, ...]]:
    if n <= 0 or len(tokens) < n:
        return set()
    return {tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)}


def shared_ngrams(query: str, entry_tokens: list[str], n: int = NGRAM) -> tuple[int, int]:
    """(number of distinct query n-grams found in the entry, the n used: min(n, query length))."""
    q = normalize_tokens(query)
    if not q:
        return 0, 0
    m = min(n, len(q))
    return len(ngrams(q, m) & ngrams(entry_tokens, m)), m


# ---------------------------------------------------------------- answers

_NUM = re.compile(r"(?<![\d.])(?:\d{1,3}(?:,\d{3})+(?![\d,])|\d+)(?:\.\d+)?(?![\d])(?!\.\d)")
_SLASH = re.compile(r"(?<![\d./])(\d+)\s*/\s*(\d+)(?![\d/])")
_TEXFRAC = re.compile(r"\\[dt]?frac\s*\{\s*(\d+)\s*\}\s*\{\s*(\d+)\s*\}")
_MINUS = ("-", "−", "–")


def _gold_value(answer: str) -> Fraction | None:
    s = answer.strip().replace("$", "").replace("\\$", "")
    s = re.sub(r"\^\s*\{?\s*\\circ\s*\}?|°|\\?%", "", s).strip().rstrip(".")
    s = re.sub(r"(?<=\d),(?=\d{3}(?:\D|$))", "", s).replace(" ", "")
    m = _TEXFRAC.fullmatch(s.lstrip("-"))
    if m and int(m.group(2)):
        return Fraction(int(m.group(1)), int(m.group(2))) * (-1 if s.startswith("-") else 1)
    m = re.fullmatch(r"(-?\d+)/(\d+)", s)
    if m and int(m.group(2)):
        return Fraction(int(m.group(1)), int(m.group(2)))
    if re.fullmatch(r"-?(?:\d+\.?\d*|\.\d+)", s):
        return Fraction(s)
    return None


def _entry_values(entry: str) -> list[tuple[Fraction, bool]]:
    """Every number in the entry as (value, preceded by a minus sign)."""
    out: list[tuple[Fraction, bool]] = []

    def signed(start: int) -> bool:
        j = start - 1
        while j >= 0 and entry[j] in " \t":
            j -= 1
        return j >= 0 and entry[j] in _MINUS

    for m in _NUM.finditer(entry):
        out.append((Fraction(m.group(0).replace(",", "")), signed(m.start())))
    for rx in (_SLASH, _TEXFRAC):
        for m in rx.finditer(entry):
            if int(m.group(2)):
                out.append((Fraction(int(m.group(1)), int(m.group(2))), signed(m.start())))
    return out


def answer_in_text(answer: str, text: str) -> bool:
    """Whether `text` contains `answer` as a standalone number (by value) or expression token."""
    if not answer.strip():
        return False
    value = _gold_value(answer)
    if value is not None:
        magnitude, negative = abs(value), value < 0
        # a positive gold also matches '-18' (the digits are there); a negative one needs its sign
        return any(v == magnitude and (sign or not negative) for v, sign in _entry_values(text))
    needle = "".join(answer.replace("$", "").split())
    if not needle:
        return False
    spaced = r"\s*".join(re.escape(ch) for ch in needle)  # 'x=2,y=1' matches 'x = 2, y = 1'
    pattern = r"(?<![A-Za-z0-9_])" + spaced + r"(?![A-Za-z0-9_])"
    return re.search(pattern, text.replace("$", "")) is not None


# ---------------------------------------------------------------- the audit


class LeakageRecord(TypedDict):
    """`Leakage.as_dict`: its fields and `text_overlap`."""

    answer_in_entry: bool
    problem_in_entry: bool
    solution_in_entry: bool
    problem_ngrams: int
    solution_ngrams: int
    problem_n: int
    solution_n: int
    contaminated: bool
    text_overlap: bool


@dataclass(frozen=True)
class Leakage:
    answer_in_entry: bool
    problem_in_entry: bool  # a shared n-gram with the problem text
    solution_in_entry: bool  # a shared n-gram with the reference solution (False when there is none)
    problem_ngrams: int  # distinct problem n-grams found in the entry
    solution_ngrams: int
    problem_n: int  # the n used for the problem: min(13, problem tokens)
    solution_n: int
    contaminated: bool  # any of the three flags

    @property
    def text_overlap(self) -> bool:
        return self.problem_in_entry or self.solution_in_entry

    def as_dict(self) -> LeakageRecord:
        return LeakageRecord(answer_in_entry=self.answer_in_entry, problem_in_entry=self.problem_in_entry,
                             solution_in_entry=self.solution_in_entry, problem_ngrams=self.problem_ngrams,
                             solution_ngrams=self.solution_ngrams, problem_n=self.problem_n, solution_n=self.solution_n,
                             contaminated=self.contaminated, text_overlap=self.text_overlap)


def leakage(entry_text: str, *, problem: str, answer: str | None, solution: str | None = None, n: int = NGRAM) -> Leakage:
    """Audit one grafted entry's text against one query (its problem, gold answer, reference solution)."""
    if n < 1:
        raise InputError(f"n-gram size must be >= 1, got {n}")
    entry_tokens = normalize_tokens(entry_text)
    p_count, p_n = shared_ngrams(problem, entry_tokens, n)
    s_count, s_n = shared_ngrams(solution, entry_tokens, n) if solution else (0, 0)
    ans = bool(answer) and answer_in_text(answer or "", entry_text)
    return Leakage(
        answer_in_entry=ans,
        problem_in_entry=p_count > 0,
        solution_in_entry=s_count > 0,
        problem_ngrams=p_count,
        solution_ngrams=s_count,
        problem_n=p_n,
        solution_n=s_n,
        contaminated=ans or p_count > 0 or s_count > 0,
    )


def leakage_for(entry_text: str, query: Problem, *, n: int = NGRAM) -> Leakage:
    """`leakage` with the query's fields taken from a Problem."""
    return leakage(entry_text, problem=query.problem, answer=query.answer, solution=query.solution, n=n)
