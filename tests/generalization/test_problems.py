from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvgraft.errors import InputError
from kvgraft.generalization import problems as P


def test_gsm8k_fields_and_answers() -> None:
    rows = P.gsm8k()
    assert len(rows) == 1319
    first = rows[0]
    assert first.id == "gsm8k-test-0000"
    assert first.problem.startswith("Janet")
    assert first.answer == "18"
    assert first.solution is not None and "####" not in first.solution and "<<" not in first.solution
    assert "9 * 2 = $18" in first.solution
    assert len({p.id for p in rows}) == 1319
    # thousands separators removed, raw kept
    with_commas = [p for p in rows if "," in p.meta["raw_answer"]]
    assert with_commas and all(re.fullmatch(r"-?\d+(\.\d+)?", p.answer) for p in with_commas)
    assert all(re.fullmatch(r"-?\d+(\.\d+)?", p.answer) for p in rows)


def test_gsm8k_limit_and_calculator() -> None:
    rows = P.gsm8k(limit=3, keep_calculator=True)
    assert [p.id for p in rows] == ["gsm8k-test-0000", "gsm8k-test-0001", "gsm8k-test-0002"]
    assert rows[0].solution is not None and "<<16-3-4=9>>" in rows[0].solution
    assert P.gsm8k(limit=0) == []
    with pytest.raises(InputError):
        P.gsm8k(limit=-1)


def test_aime2025() -> None:
    rows = P.aime2025()
    assert len(rows) == 30
    assert all(p.solution is None for p in rows)
    assert rows[0].id == "aime2025-I-01" and rows[0].answer == "70"
    degrees = next(p for p in rows if p.id == "aime2025-II-05")
    assert degrees.answer == "336" and degrees.meta["raw_answer"] == "336^\\circ"
    assert all(p.meta["answer_is_integer"] for p in rows)


def test_champ() -> None:
    rows = P.champ()
    assert len(rows) == 270
    assert len({p.id for p in rows}) == 270
    first = next(p for p in rows if p.id == "P_Combinatorics_1")
    assert first.answer == "239"
    assert first.solution is not None and first.solution.count("\n") >= 3
    assert "@@" not in first.problem and "@@" not in first.solution
    assert {p.meta["category"] for p in rows} == {"Combinatorics", "Inequality", "Number-Theory", "Polynomial", "Sequence"}
    assert 0 < sum(p.meta["answer_is_integer"] for p in rows) < 270


_EQ = re.compile(r"(\d+) ([-+*/]) (\d+) = (\d+)")


def test_synthetic_deterministic_and_correct() -> None:
    a = P.synthetic(60, seed=11)
    b = P.synthetic(60, seed=11)
    c = P.synthetic(60, seed=12)
    assert [p.as_dict() for p in a] == [p.as_dict() for p in b]
    assert [p.problem for p in a] != [p.problem for p in c]
    assert len({P.problem_hash(p.problem) for p in a}) == 60
    assert {p.meta["template"] for p in a} == {"change", "collection", "travel", "bakery", "savings", "garden"}
    for p in a:
        assert p.solution is not None
        steps = _EQ.findall(p.solution)
        assert len(steps) >= 3, p.solution  # multi-step
        for x, op, y, z in steps:
            x_, y_, z_ = int(x), int(y), int(z)
            got = {"+": x_ + y_, "-": x_ - y_, "*": x_ * y_, "/": x_ // y_ if y_ and x_ % y_ == 0 else None}[op]
            assert got == z_, (p.id, x, op, y, z)
        assert int(p.answer) >= 0
        assert steps[-1][3] == p.answer  # the last step computes the answer
    assert P.synthetic(0, 1) == []


def test_arithmetic_deterministic_distinct_and_checked() -> None:
    """The short family: one or two steps on numbers under 50, every step's arithmetic right, the last step the
    answer, texts distinct; a seed gives the same problems every time and another seed others."""
    a = P.arithmetic(120, seed=4)
    assert [p.as_dict() for p in a] == [p.as_dict() for p in P.arithmetic(120, seed=4)]
    assert [p.problem for p in a] != [p.problem for p in P.arithmetic(120, seed=5)]
    assert len({P.problem_hash(p.problem) for p in a}) == len({p.id for p in a}) == 120
    # "groups" has 640 texts: 100 draws of it repeat some, which the draw must skip
    assert len({P.problem_hash(p.problem) for p in P.arithmetic(600, seed=4)}) == 600
    assert {p.meta["template"] for p in a} == {"more", "left", "groups", "share", "more_then_less", "packs"}
    for p in a:
        assert p.source == "arithmetic/v1" and p.id.startswith("arithmetic-4-")
        steps = _EQ.findall(p.solution or "")
        assert 1 <= len(steps) <= 2, p.solution
        for x, op, y, z in steps:
            x_, y_, z_ = int(x), int(y), int(z)
            assert max(x_, y_) < 50, p.problem
            got = {"+": x_ + y_, "-": x_ - y_, "*": x_ * y_, "/": x_ // y_ if y_ and x_ % y_ == 0 else None}[op]
            assert got == z_, (p.id, x, op, y, z)
        assert steps[-1][3] == p.answer and int(p.answer) >= 0
    assert P.arithmetic(0, 1) == []
    with pytest.raises(InputError, match="arithmetic: n must be >= 0"):
        P.arithmetic(-1, 0)


def test_arithmetic_reference_traces_pass_the_answer_check() -> None:
    """A library built from the family keeps reference traces only when `answers.check` accepts them: all do."""
    from kvgraft.generalization import answers
    from kvgraft.generalization.library import reference_trace

    assert all(answers.check(reference_trace(p), p.answer) for p in P.arithmetic(60, seed=0))


def test_problem_hash_normalizes() -> None:
    assert P.problem_hash("Janet’s  ducks\nlay 16 eggs.") == P.problem_hash("janet's ducks lay 16 EGGS.")
    assert P.problem_hash("lay 16 eggs") != P.problem_hash("lay 17 eggs")


def test_split_deterministic_and_order_free() -> None:
    items = P.synthetic(200, seed=3)
    lib, held, rec = P.split(items, 0.25, salt="s1")
    assert len(lib) == 50 and len(held) == 150
    assert {p.id for p in lib}.isdisjoint({p.id for p in held})
    lib2, _, rec2 = P.split(list(reversed(items)), 0.25, salt="s1")
    assert {p.id for p in lib2} == {p.id for p in lib}
    assert rec2["problems_digest"] == rec["problems_digest"]
    lib3, _, _ = P.split(items, 0.25, salt="s2")
    assert {p.id for p in lib3} != {p.id for p in lib}
    assert rec["salt"] == "s1" and rec["library_fraction"] == 0.25 and rec["library_ids"] == [p.id for p in lib]
    assert rec["held_out_ids"] == [p.id for p in held]
    assert rec["duplicates_across_split"] == []
    assert P.split(items, 0.0, "x")[0] == [] and P.split(items, 1.0, "x")[1] == []


def test_split_reports_duplicate_texts_and_rejects_bad_input() -> None:
    items = [P.Problem(f"p{i}", f"What is {i} plus {i}?", str(2 * i)) for i in range(20)]
    items.append(P.Problem("copy", "what is 3 PLUS 3?", "6"))
    lib, _, rec = P.split(items, 0.5, "dup")
    ids = {p.id for p in lib}
    if ("p3" in ids) != ("copy" in ids):
        pair = ["p3", "copy"] if "p3" in ids else ["copy", "p3"]
        assert rec["duplicates_across_split"] == [pair]
    else:
        assert rec["duplicates_across_split"] == []
    with pytest.raises(InputError, match="duplicate"):
        P.split([items[0], items[0]], 0.5, "x")
    with pytest.raises(InputError, match="library_fraction"):
        P.split(items, 1.5, "x")


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_from_jsonl_reads_and_reports_lines(tmp_path: Path) -> None:
    good = _write(
        tmp_path / "p.jsonl",
        [
            json.dumps({"id": "a", "problem": "1+1?", "answer": 2}),
            "",
            json.dumps({"id": "b", "problem": "2+2?", "answer": "4", "solution": "2+2=4", "meta": {"k": 1}}),
        ],
    )
    rows = P.from_jsonl(good)
    assert [(p.id, p.answer, p.solution) for p in rows] == [("a", "2", None), ("b", "4", "2+2=4")]
    assert rows[1].meta == {"k": 1, "line": 3} and rows[0].source == "jsonl:p.jsonl"

    cases = {
        "dup": ([json.dumps({"id": "a", "problem": "x", "answer": "1"})] * 2, r"dup\.jsonl:2: duplicate id 'a' \(first on l"),
        "noans": ([json.dumps({"id": "a", "problem": "x"})], r"noans\.jsonl:1: field 'answer'"),
        "typo": ([json.dumps({"id": "a", "problem": "x", "answer": "1", "solutoin": "y"})], r"typo\.jsonl:1: unknown key"),
        "badjson": (["{not json"], r"badjson\.jsonl:1: invalid JSON"),
        "float": ([json.dumps({"id": "a", "problem": "x", "answer": 1.5})], r"float\.jsonl:1: field 'answer'"),
        "sol": ([json.dumps({"id": "a", "problem": "x", "answer": "1", "solution": 3})], r"sol\.jsonl:1: field 'solution'"),
    }
    for name, (lines, pattern) in cases.items():
        with pytest.raises(InputError, match=pattern):
            P.from_jsonl(_write(tmp_path / f"{name}.jsonl", lines))
    with pytest.raises(InputError, match="cannot read"):
        P.from_jsonl(tmp_path / "missing.jsonl")
