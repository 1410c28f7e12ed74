"""audit/gemma-generalization.toml is a valid plan whose library source loads without a model: the generated
arithmetic problems, each with a reference trace the answer checker accepts, and the controls beside the check."""

from __future__ import annotations

import re
from pathlib import Path

from kvgraft.audit import plan
from kvgraft.generalization import answers, library
from kvgraft.generalization.problems import normalize_text


def test_the_gemma_generalization_plan_builds_its_library_from_arithmetic_problems() -> None:
    p = plan.load(Path(__file__).resolve().parents[2] / "audit" / "gemma-generalization.toml")
    assert p.doc["model"]["spec"] == "gemma3-270m"
    assert p.check("generalization") is not None and p.check("controls") is not None
    lib = p.doc["release"]["library"]
    problems, record = library.load_problems(lib["source"], lib["limit"])
    assert record["source"] == "arithmetic" and len(problems) == lib["limit"] >= 20
    assert all(answers.check(library.reference_trace(q), q.answer) for q in problems)


def test_the_gemma_generalization_plan_s_preamble_is_worked_examples_of_other_problems() -> None:
    """The base model is shown three worked examples before every query: each correct, none a query's problem."""
    p = plan.load(Path(__file__).resolve().parents[2] / "audit" / "gemma-generalization.toml")
    pre = p.doc["checks"]["generalization"]["preamble"]
    shots = re.findall(r"Problem: (.+)\nSolution: (.+)\nAnswer: (.+)\n\n", pre)
    assert len(shots) == 3 and "".join(f"Problem: {q}\nSolution: {s}\nAnswer: {a}\n\n" for q, s, a in shots) == pre
    assert all(answers.check(s, a) for _, s, a in shots)
    lib = p.doc["release"]["library"]
    problems, _ = library.load_problems(lib["source"], lib["limit"])
    assert not [q.id for q in problems if normalize_text(q.problem) in normalize_text(pre)]
