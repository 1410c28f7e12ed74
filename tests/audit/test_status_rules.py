"""Each check kind's status rule, branch by branch: the rule that turns a sealed result into passed, failed or
incomplete (and so into the audit's exit code). Written for mutation testing (docs/mutation.md, group
`verdict`): every edge of every rule is pinned, each with its neighbour on the other side."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kvgraft.audit import checks
from kvgraft.audit.checks import claims, controls, determinism, generalization, recompute, verify
from kvgraft.errors import InputError


def test_claims_fail_on_any_failed_claim_and_are_incomplete_when_none_was_judged() -> None:
    assert claims.status({"failed": 1, "counts": {"supported": 3}}) == "failed"
    assert claims.status({"failed": 0, "counts": {"supported": 1}}) == "passed"
    assert claims.status({"failed": 0, "counts": {"not-testable": 4}}) == "incomplete"
    assert claims.status({"failed": 0, "counts": {"not-testable": 4, "supported": 0}}) == "incomplete"
    # one judged claim beside many untestable ones is enough to pass
    assert claims.status({"failed": 0, "counts": {"not-testable": 4, "contradicted": 0, "supported": 1}}) == "passed"
    assert claims.status({"failed": 0, "counts": {}}) == "incomplete"


def test_controls_pass_only_when_every_control_shows_its_effect() -> None:
    assert controls.status({"controls": [{"shows": True}, {"shows": True}]}) == "passed"
    assert controls.status({"controls": [{"shows": True}, {"shows": False}]}) == "incomplete"
    assert controls.status({"controls": [{"shows": False}, {"shows": True}]}) == "incomplete"


def test_determinism_needs_two_conditions_to_compare() -> None:
    assert determinism.status({"conditions": [{}]}) == "incomplete"
    assert determinism.status({"conditions": []}) == "incomplete"
    assert determinism.status({"conditions": [{}, {}]}) == "passed"
    assert determinism.status({"conditions": [{}, {}, {}]}) == "passed"


def _gen(equality: dict[str, tuple[int, int]], runs: int) -> dict[str, Any]:
    return {"equality": {k: {"equal": e, "n": n} for k, (e, n) in equality.items()}, "runs": [{}] * runs}


def test_generalization_fails_when_a_text_condition_did_not_reproduce_its_graft() -> None:
    assert generalization.status(_gen({"d": (5, 5)}, 3)) == "passed"
    assert generalization.status(_gen({"d": (4, 5)}, 3)) == "failed"
    assert generalization.status(_gen({"a": (5, 5), "d": (5, 6)}, 3)) == "failed"
    assert generalization.status(_gen({"d": (4, 5)}, 0)) == "failed"
    assert generalization.status(_gen({"d": (0, 0)}, 0)) == "incomplete"
    assert generalization.status(_gen({}, 1)) == "passed"
    assert generalization.status(_gen({}, 0)) == "incomplete"


def test_recompute_and_verify_follow_their_result() -> None:
    assert recompute.status({"passed": True}) == "passed"
    assert recompute.status({"passed": False}) == "failed"
    assert verify.status({"ok": True}) == "passed"
    assert verify.status({"ok": False}) == "failed"


def test_the_registry_status_is_the_kinds_rule_and_refuses_an_unknown_kind_or_status(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert checks.status("verify", {"ok": False}) == "failed"
    assert checks.status("determinism", {"conditions": [{}, {}]}) == "passed"
    with pytest.raises(InputError) as info:
        checks.status("other", {})
    assert str(info.value) == ("no check kind 'other' is registered (one of verify, recompute, determinism, "
                               "generalization, controls, claims; a third-party kind registers through the "
                               "entry-point group kvgraft.check_kinds)")
    # a rule that answered outside the statuses is a bug, not a verdict
    odd = dataclasses.replace(checks.KINDS["verify"], status=lambda result: "fine")
    monkeypatch.setitem(checks.KINDS, "verify", odd)
    with pytest.raises(AssertionError, match="'fine'"):
        checks.status("verify", {"ok": True})


def test_seal_names_the_result_whose_schema_it_refuses() -> None:
    from kvgraft.errors import SchemaError

    with pytest.raises(SchemaError) as info:
        checks.seal("determinism", {"conditions": "not a list"})
    assert str(info.value).startswith("determinism result")
    with pytest.raises(SchemaError) as info:
        checks.seal("determinism", {"conditions": "not a list"}, where="plan.toml [checks.determinism]")
    assert str(info.value).startswith("plan.toml [checks.determinism]")
