"""Typed results: each typed kind's schema file is what its models generate, the report schema refers to the kind's
data by `$ref` (no copy), the schema's nulls are the models' own, and the kind's renderers read attributes."""

from __future__ import annotations

import ast
import copy
import inspect
import json
from pathlib import Path
from typing import Any

import pytest

from kvgraft.audit import checks as registry
from kvgraft.errors import SchemaError
from kvgraft.schema import load_schema, validate

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "tests" / "fixtures" / "report-example.json"
TYPED = [k for k in registry.BUILTIN if k.typed is not None]


def test_the_small_kinds_are_typed() -> None:
    assert [k.name for k in TYPED] == ["verify", "recompute", "determinism", "generalization", "controls", "claims"]


@pytest.mark.parametrize("kind", TYPED, ids=lambda k: k.name)
def test_a_typed_kinds_schema_file_is_what_its_models_generate(kind: registry.CheckKind) -> None:
    assert kind.typed is not None
    assert json.loads((ROOT / "schemas" / kind.schema).read_text()) == kind.typed.schema(), (
        f"schemas/{kind.schema} differs from its models: python -m kvgraft.audit.checks.schemas --write")


@pytest.mark.parametrize("kind", TYPED, ids=lambda k: k.name)
def test_the_report_refers_to_a_typed_kinds_data_and_holds_no_copy(kind: registry.CheckKind) -> None:
    report = load_schema("audit-report.v1.json")
    rule = next(r for r in report["$defs"]["check"]["allOf"] if r["if"]["properties"].get("kind") == {"const": kind.name})
    assert rule["then"]["properties"]["data"] == {"$ref": f"{kind.schema}#/$defs/data"}
    assert kind.name not in report["$defs"]
    data = load_schema(kind.schema)["$defs"]["data"]
    assert all(d != data for d in report["$defs"].values())


def _example() -> dict[str, Any]:
    report: dict[str, Any] = json.loads(EXAMPLE.read_text())
    return report


def _data(report: dict[str, Any], kind: str) -> dict[str, Any]:
    data: dict[str, Any] = next(c for c in report["checks"] if c["kind"] == kind)["data"]
    return data


@pytest.mark.parametrize(("kind", "edit", "valid"), [
    ("determinism", lambda d: d["conditions"][0].update(max_ulp=None), True),  # nullable: null when dtypes differ
    ("determinism", lambda d: d.update(baseline=None), False),  # optional: absent, or a string
    ("determinism", lambda d: d["conditions"][0].update({"class": None}), False),
    ("determinism", lambda d: d["conditions"][0].update(max_abs="Infinity"), True),
    ("determinism", lambda d: d["conditions"][0].update(max_abs=-1.0), False),
    ("determinism", lambda d: d.pop("conditions"), False),
    ("verify", lambda d: d.update(error=None), True),
    ("verify", lambda d: d.update(files=None), False),
    ("verify", lambda d: d["signature"].update(method=None), True),
    ("verify", lambda d: d.pop("ok"), False),
    ("verify", lambda d: d.update(unknown_member=1), True),  # a reader ignores what it does not know
    ("recompute", lambda d: d["entries"][2]["layers"][0]["keys"].update(max_ulp=None), True),  # nullable in a report
    ("recompute", lambda d: d["entries"][2]["layers"][0]["keys"].update(max_abs=-1.0), False),
    ("recompute", lambda d: d["entries"][2]["layers"][0]["keys"].update(max_abs="Infinity"), True),
    ("recompute", lambda d: d["entries"][2]["layers"][0]["keys"].pop("differing"), False),
    ("recompute", lambda d: d["entries"][2].update(first_difference=None), True),
    ("recompute", lambda d: d["entries"][2].update(verdict=None), False),  # optional: absent, or a string
    ("recompute", lambda d: d["entries"][2].update(id=""), False),
    ("recompute", lambda d: d["entries"][2].pop("layers"), False),
    ("recompute", lambda d: d.update(verdict="close"), False),
    ("recompute", lambda d: d.update(environment={"current": {"threads": None, "device": None}}), True),
    ("recompute", lambda d: d.update(conditions={"replayed": [], "overridden": {}, "not_replayed": {}, "x": 1}), False),
    ("recompute", lambda d: d.update(conditions={"replayed": [], "overridden": {}, "not_replayed": {"t": [1]}}), False),
    ("recompute", lambda d: d.pop("entries"), False),
    ("generalization", lambda d: d["conditions"][0].pop("interval"), True),  # optional: drawn from k of n
    ("generalization", lambda d: d["conditions"][0].update(interval=None), False),
    ("generalization", lambda d: d["conditions"][0].update(n=0), False),
    ("generalization", lambda d: d["mcnemar"][0].update(p_value=1.5), False),
    ("generalization", lambda d: d.update(ledger=None), False),
    ("generalization", lambda d: d.pop("conditions"), False),
    ("generalization", lambda d: d.update(result={"kind": "kvgraft-controls-result"}), False),
])
def test_the_report_schema_takes_its_nulls_and_members_from_the_models(kind: str, edit: Any, valid: bool) -> None:
    report = _example()
    edit(_data(report, kind))
    if valid:
        validate(report, "audit-report.v1.json", "report")
        registry.view(registry.KINDS[kind], _data(report, kind))  # and the model reads it
    else:
        with pytest.raises(SchemaError):
            validate(report, "audit-report.v1.json", "report")


def test_a_result_is_closed_and_its_rules_kept() -> None:
    """A verify result that says ok with a failing exit code, or that adds a member to its signature, is refused."""
    signature = {"status": "not checked", "method": None, "bundle": None, "bundle_sha256": None, "key_id": None,
                 "identity": None, "issuer": None}
    result = {"format": "kvgraft-verify-result", "format_version": 1, "kvgraft_version": "0.1.0", "ok": True,
              "exit_code": 0, "error": None, "release": "r/", "root_digest": "a" * 64, "manifest_sha256": "b" * 64,
              "model": {"spec": "m", "identity_sha256": "c" * 64}, "entries": 1, "files": 2, "tensors": 2,
              "bytes_hashed": 10, "seconds": 0.1, "deep": False, "statement": False, "signature": signature}
    validate(result, "verify-result.v1.json", "result")
    for edit in (lambda r: r.update(exit_code=1), lambda r: r["signature"].update(extra=1),
                 lambda r: r.update(ok=False), lambda r: r.pop("root_digest")):
        bad = copy.deepcopy(result)
        edit(bad)
        with pytest.raises(SchemaError):
            validate(bad, "verify-result.v1.json", "result")


def test_a_typed_kinds_model_reads_its_members() -> None:
    data = _data(_example(), "determinism")
    typed = registry.view(registry.KINDS["determinism"], data)
    assert [c.class_ for c in typed.conditions] == [c["class"] for c in data["conditions"]]
    assert typed.rows[0].entry == data["rows"][0]["entry"]


@pytest.mark.parametrize("kind", TYPED, ids=lambda k: k.name)
def test_a_typed_kinds_renderers_read_attributes(kind: registry.CheckKind) -> None:
    """No `.get` or `["member"]` on the data in its face, details and html: the model says what is there."""
    tree = ast.parse(inspect.getsource(inspect.getmodule(kind.face)))  # type: ignore[arg-type]
    drawing = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in ("face", "details", "html")]
    assert len(drawing) == 3
    found = [f"{f.name}:{n.lineno}" for f in drawing for n in ast.walk(f)
             if (isinstance(n, ast.Attribute) and n.attr == "get" and isinstance(n.value, ast.Name) and n.value.id == "data")
             or (isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and n.value.id == "data")]
    assert not found, found


def test_a_recompute_result_is_closed_and_its_signature_rule_kept() -> None:
    """A recompute result with a member it does not name, or whose release signature says checked without a method
    (or not checked with one), is refused; the same result without them is not."""
    unchecked = {"checked": False, "method": None, "key_ids": [], "identity": None, "issuer": None,
                 "signed_time": None, "reason": "no key given"}
    result = {"kind": "kvgraft-recompute-result", "format_version": 1, "kvgraft_version": "0.1.0",
              "release": {"path": "r/", "root_digest": "a" * 64},
              "model": {"spec": "m", "identity": {"sha256": "b" * 64}, "release_identity": "b" * 64, "forced": False},
              "schedule": {"chunk_tokens": None}, "environment": {"recorded": {}, "current": {}, "differences": {}},
              "conditions": {"replayed": [], "overridden": {}, "not_replayed": {}}, "require": "exact", "entries": [],
              "all_byte_exact": True, "verdict": "byte-exact", "passed": True, "statements": [],
              "release_signature": unchecked, "status": "passed"}
    validate(result, "recompute-result.v1.json", "result")
    checked = {**unchecked, "checked": True, "method": "key", "key_ids": ["c" * 64], "reason": None}
    validate({**result, "release_signature": checked}, "recompute-result.v1.json", "result")
    for edit in (lambda r: r.update(extra=1), lambda r: r["release_signature"].update(method=None, checked=True),
                 lambda r: r["release_signature"].update(method="key"), lambda r: r["release_signature"].update(x=1),
                 lambda r: r.update(status="done"), lambda r: r.pop("conditions")):
        bad = copy.deepcopy(result)
        edit(bad)
        with pytest.raises(SchemaError):
            validate(bad, "recompute-result.v1.json", "result")
