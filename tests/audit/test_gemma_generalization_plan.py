"""audit/gemma-generalization.toml is a valid plan whose library source loads without a model: the generated
arithmetic problems, each with a reference trace the answer checker accepts, and the controls beside the check."""

from __future__ import annotations

from pathlib import Path

from kvgraft.audit import plan
from kvgraft.generalization import answers, library


def test_the_gemma_generalization_plan_builds_its_library_from_arithmetic_problems() -> None:
    p = plan.load(Path(__file__).resolve().parents[2] / "audit" / "gemma-generalization.toml")
    assert p.doc["model"]["spec"] == "gemma3-270m"
    assert p.check("generalization") is not None and p.check("controls") is not None
    lib = p.doc["release"]["library"]
    problems, record = library.load_problems(lib["source"], lib["limit"])
    assert record["source"] == "arithmetic" and len(problems) == lib["limit"] >= 20
    assert all(answers.check(library.reference_trace(q), q.answer) for q in problems)
