"""Controls: the generated facts, the result and its status; on the default model (slow) the planted effects."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvgraft.audit import checks as registry
from kvgraft.errors import InputError
from kvgraft.generalization import controls
from kvgraft.generalization.leakage import leakage_for
from kvgraft.generalization.library import reference_trace
from kvgraft.schema import validate
from kvgraft.signing.policy import OwnOutput
from kvgraft.signing.verify import verified


def test_generated_facts_are_deterministic_and_planted_where_expected() -> None:
    cs = controls.problems(12, 0)
    assert cs == controls.problems(12, 0) and cs != controls.problems(12, 1)
    assert len({p.problem for p in cs.facts}) == 12 and len({p.answer for p in cs.facts}) == 12
    for fact, rel in zip(cs.facts, cs.related, strict=True):
        # the answer sits only in the fact's solution, never in either question
        assert fact.answer in (fact.solution or "") and fact.answer not in fact.problem and fact.answer not in rel.problem
        assert rel.answer == fact.answer and rel.meta["fact"] == fact.id
        assert leakage_for(reference_trace(fact), rel).contaminated  # the answer is in the entry
    for q in cs.unrelated:
        assert q.answer in q.problem  # the null question states its own fact: a baseline that can be right
        assert not any(leakage_for(reference_trace(f), q).contaminated for f in cs.facts)
    with pytest.raises(InputError):
        controls.problems(0, 0)


def _control(name: str, **kw: Any) -> dict[str, Any]:
    return {"name": name, "shows": True, **kw}


def test_status_is_incomplete_when_a_control_misses() -> None:
    assert registry.status("controls", {"controls": [_control("replay"), _control("related"), _control("null")]}) == "passed"
    assert registry.status("controls", {"controls": [_control("replay"), _control("related", shows=False),
                                         _control("null")]}) == "incomplete"


def test_controls_on_a_tiny_model_are_schema_valid(tiny_lm: Callable[[str], Any], tmp_path: Path) -> None:
    lm = tiny_lm("llama")
    controls.build(lm, tmp_path / "rel", n=6, seed=0)
    built = verified(tmp_path / "rel", OwnOutput("the controls test"))  # read back where it was written
    r = registry.seal("controls", controls.run(lm, built, n=6, seed=0, max_new_tokens=3).model_dump(
        mode="json", exclude_unset=True))
    validate(r, controls.SCHEMA, "controls")
    assert [c["name"] for c in r["controls"]] == ["replay", "related", "null"]
    assert all(c["n"] == 6 for c in r["controls"])
    replay, related, null = r["controls"]
    assert replay["split"]["contaminated"]["n"] == 6  # every own entry holds its answer
    assert null["split"]["clean"]["n"] == 6
    # a random tiny model copies nothing: the positive controls cannot show their effect, so the check is incomplete
    assert r["status"] == ("passed" if all(c["shows"] for c in r["controls"]) else "incomplete")
    assert any(not c["shows"] for c in (replay, related)) and r["status"] == "incomplete"
    assert all("detectable" in c and c["detectable"]["n"] == 6 for c in r["controls"])
    from kvgraft.audit.checks import KINDS, view

    # what a report shows of it: each control, and that one does NOT show its effect
    face = KINDS["controls"].face(view(KINDS["controls"], r))
    lines = [f for f in face.figures if f.split(":")[0] in ("replay", "related", "null")]
    assert len(lines) == 3 and "does NOT show it" in " ".join(face.figures)


@pytest.mark.slow
def test_controls_show_their_planted_effects_on_the_default_model(smollm2: Any, tmp_path: Path) -> None:
    controls.build(smollm2, tmp_path / "rel", n=20, seed=0)
    built = verified(tmp_path / "rel", OwnOutput("the controls test"))  # read back where it was written
    r = registry.seal("controls", controls.run(smollm2, built, n=20, seed=0).model_dump(mode="json", exclude_unset=True))
    replay, related, null = r["controls"]
    assert replay["shows"] and replay["significant"] and replay["graft"]["k"] > replay["baseline"]["k"]
    assert related["shows"] and related["significant"] and related["graft"]["k"] > related["baseline"]["k"]
    assert null["shows"] and not null["significant"] and null["detectable"]["effect"] is not None
    assert r["status"] == "passed"
