"""The report's model (kvgraft.results.report) and its schema (schemas/audit-report.v1.json, generated from it)
accept the same documents: every report these tests write, and every one-member edit of one.

Edits reach every member outside the open parts (a check's `data`, which its kind's schema decides and the kind's
own model reads; `environment`; `ledger`; the plan's content): each member removed, or replaced by a value of
another JSON type, an empty or overlong one, and each closed object given a member it does not name. The model
is asked strictly (no "1" read as 1); an integral float is a JSON Schema integer, and the model, as load_report
asks it, reads it as one.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from kvgraft import errors, schema
from kvgraft._internal.jsonio import json_bytes
from kvgraft.audit import checks as registry
from kvgraft.cli import app
from kvgraft.report import document as rp
from kvgraft.results.report import Check, Claim, Model, Report
from kvgraft.results.verify import ReleaseSignature

from release_factory import records_plan

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "report-example.json"
CLAIMS = ROOT / "audit" / "claims" / "kv-grafting-preprint.toml"
OPEN = {("environment",), ("ledger",), ("plan", "content")}  # open records: any member, any value
VALUES: list[Any] = [None, "x", "", "1", 1, -1, 2.0, 1.5, True, [], {}, "a" * 5000]


def _open(path: tuple[Any, ...]) -> bool:
    named = tuple(p for p in path if isinstance(p, str))
    return named in OPEN or (len(path) >= 3 and path[0] == "checks" and path[2] == "data")


def _members(node: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """Every object and array of the document outside its open parts, with its path."""
    if _open(path) or not isinstance(node, (dict, list)):
        return
    yield path, node
    for key, value in (node.items() if isinstance(node, dict) else enumerate(node)):
        yield from _members(value, (*path, key))


def _edited(doc: Any, path: tuple[Any, ...], edit: Callable[[Any], None]) -> Any:
    """A copy of `doc` with the container at `path` edited: only the containers on the path are copied."""
    if not path:
        node = copy.copy(doc)
        edit(node)
        return node
    node = copy.copy(doc)
    node[path[0]] = _edited(doc[path[0]], path[1:], edit)
    return node


def edits(doc: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any], bool]]:
    """(what was edited, the edited document, whether the edit is an integral float)."""
    for path, node in list(_members(doc)):
        if isinstance(node, dict):
            yield f"{path} + surprise", _edited(doc, path, lambda n: n.update(surprise=1)), False
        for key in (list(node) if isinstance(node, dict) else range(len(node))):
            if _open((*path, key)):
                continue
            if isinstance(node, dict):
                yield f"{(*path, key)} removed", _edited(doc, path, lambda n, k=key: n.pop(k)), False
            for value in VALUES:
                yield (f"{(*path, key)} = {value!r:.20}",
                       _edited(doc, path, lambda n, k=key, v=value: n.__setitem__(k, v)),
                       isinstance(value, float) and value.is_integer())


def _schema_accepts(doc: dict[str, Any]) -> bool:
    """As kvgraft.schema.validate decides: by the compiled validator (the reference one, which it asks only to
    name an error, also lets a pattern's `$` match before a final newline, which no edit writes)."""
    return bool(schema._fast(rp.REPORT_SCHEMA).is_valid(doc))


def _model_accepts(doc: dict[str, Any], *, strict: bool) -> bool:
    try:
        Report.model_validate(doc, strict=strict)
    except ValidationError:
        return False
    return True


def assert_agree(doc: dict[str, Any]) -> None:
    assert _schema_accepts(doc) and _model_accepts(doc, strict=True)
    assert json_bytes(Report.model_validate(doc).as_json()) == json_bytes(doc)  # read and written back, as it was
    differ = [what for what, edited, integral in edits(doc)
              if _schema_accepts(edited) != _model_accepts(edited, strict=not integral)]
    assert not differ, differ


def _built(**over: Any) -> Report:
    checks = [Check.model_validate(registry.make_check("verify", "verify", "passed", "ok", {"ok": True})),
              Check.model_validate(registry.make_check("energy", "other", "skipped", "no meter", reason="none here"))]
    given: dict[str, Any] = {
        "plan_name": "p", "plan_content": {"checks": ["verify"]}, "environment": {"device": "cpu"},
        "model": Model.model_validate({"spec": "smollm2-135m", "identity": {"sha256": "c" * 64, "num_tensors": 3}}),
        "release_root_digest": "a" * 64, "checks": checks, "release_attestation_digest": "b" * 64,
        "claims": [Claim(id="c", text="t", kind="accuracy", claimed="80%", verdict="supported", reason="r")],
        "ledger": {"wall time": "0.1 min"}, "note": "a note",
        "release_signature": ReleaseSignature(checked=True, method="key", key_ids=["d" * 64], identity=None, issuer=None,
                                              signed_time=None, reason=None)}
    return rp.new_report(**{**given, **over})


@pytest.mark.parametrize("over", [{}, {"note": None, "release_signature": None, "ledger": None, "claims": None},
                                  {"model": None, "release_attestation_digest": None, "plan_content": "text = 1\n"}],
                         ids=["every-member", "least", "no-model"])
def test_a_built_report_and_its_edits(over: dict[str, Any]) -> None:
    report = _built(**over)
    doc = json.loads(json_bytes(report.as_json()))
    assert all(k not in doc for k in over if k in ("note", "release_signature"))  # absent, never null
    assert_agree(doc)


def test_the_example_report_and_its_edits() -> None:
    assert_agree(json.loads(FIXTURE.read_text()))


def test_a_report_audit_run_writes_and_its_edits(tiny_dir: Callable[[str], Path], tmp_path: Path) -> None:
    texts = [f"Problem {i}: Mia has {i + 3} apples. Answer: {i + 3}" for i in range(2)]
    tables = f'[checks.verify]\n[checks.recompute]\n[checks.claims]\nfile = "{CLAIMS}"\n'
    plan = records_plan(tmp_path, "tiny", tiny_dir("llama"), texts, tables, probe_tokens=3)
    res = CliRunner().invoke(app, ["audit", "run", str(plan), "--quiet"])
    assert res.exit_code in (errors.EXIT_OK, errors.EXIT_NOT_EXACT, errors.EXIT_INCOMPLETE), res.output
    written = (tmp_path / "out" / "report.json").read_bytes()
    assert json_bytes(rp.load_report(tmp_path / "out" / "report.json").as_json()) == written
    assert_agree(json.loads(written))
