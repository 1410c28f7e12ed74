"""The registry of check kinds: every kind implements every part of the one protocol, in its own module, and
verdict, face and both renderers dispatch through it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from kvgraft.audit import checks as registry
from kvgraft.audit import face, render_html, render_report
from kvgraft.audit.checks.kind import CheckKind
from kvgraft.errors import InputError, SchemaError
from kvgraft.render.figures import Face
from kvgraft.report.document import load_report
from kvgraft.results.report import Report

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "tests" / "fixtures" / "report-example.json"
PARTS = [f.name for f in dataclasses.fields(CheckKind)]


def test_the_protocol_has_every_part_of_a_check_kind() -> None:
    assert PARTS == ["name", "schema", "status", "stamps_status", "run", "face", "details", "html", "known_data", "typed"]


@pytest.mark.parametrize("name", list(registry.KINDS))
@pytest.mark.parametrize("part", PARTS)
def test_every_kind_implements_every_part_in_its_own_module(name: str, part: str) -> None:
    kind = registry.KINDS[name]
    value = getattr(kind, part)
    if part == "name":
        assert value == name
    elif part == "schema":
        assert isinstance(value, str) and (ROOT / "schemas" / value).is_file(), value
    elif part == "stamps_status":
        assert isinstance(value, bool)
    elif part == "known_data":
        assert isinstance(value, tuple) and value and all(isinstance(k, str) for k in value)
    elif part == "typed":
        # its models in kvgraft.results.<kind>, generating the kind's own schema file (None: not typed yet)
        assert value is None or (value.file == kind.schema and value.data.__module__ == f"kvgraft.results.{name}"
                                 and value.result.__module__ == f"kvgraft.results.{name}"), value
    else:
        # a callable of the kind's own module: one place per kind, not a shared default or a placeholder
        assert callable(value), f"{name}.{part} is not implemented"
        assert value.__module__ == f"kvgraft.audit.checks.{name}", f"{name}.{part} lives in {value.__module__}"


def test_the_schemas_list_the_registrys_built_in_kinds() -> None:
    """The report schema's `kind` accepts any registered name (a plugin's too) and lists the built-in kinds in
    the registry's order; the plan schema has a table for each built-in kind and accepts a plugin's."""
    report = json.loads((ROOT / "schemas" / "audit-report.v1.json").read_text())
    kind = report["$defs"]["check"]["properties"]["kind"]
    builtins = [k.name for k in registry.BUILTIN]
    assert kind["examples"] == [*builtins, registry.OTHER]
    assert kind["pattern"] == f"^{registry.NAME.pattern}$"
    plan = json.loads((ROOT / "schemas" / "audit-plan.v1.json").read_text())
    checks = plan["properties"]["checks"]
    assert list(checks["properties"]) == builtins
    assert checks["propertyNames"]["pattern"] == kind["pattern"]
    assert builtins[-1] == "claims"  # it reads what the checks before it measured


def test_the_schemas_registry_parts_are_generated_from_the_registry(capsys: pytest.CaptureFixture[str]) -> None:
    """schemas/audit-report.v1.json's kind list and per-kind rules, and audit-plan.v1.json's checks tables, are
    what kvgraft.audit.checks.schemas generates from the registry."""
    from kvgraft.audit.checks import schemas

    assert schemas.main(["--check"]) == 0, capsys.readouterr().out
    report = schemas.report_schema()
    rules = [r["if"]["properties"]["kind"]["const"] for r in report["$defs"]["check"]["allOf"][1:]]
    assert rules == [k.name for k in registry.BUILTIN]


def test_seal_stamps_the_status_by_the_kinds_rule_and_validates_by_its_schema() -> None:
    with pytest.raises(InputError, match="no check kind 'magic' is registered"):
        registry.seal("magic", {})
    with pytest.raises(SchemaError):
        registry.seal("determinism", {"conditions": [{}, {}]})  # the rule says passed; the schema refuses the rest
    assert registry.status("determinism", {"conditions": [{}]}) == "incomplete"
    assert registry.status("controls", {"controls": [{"shows": True}, {"shows": False}]}) == "incomplete"


def _example() -> Report:
    return load_report(EXAMPLE)


def test_face_details_and_html_dispatch_through_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Replace one kind's parts in the registry: the face, `report show --detail` and the HTML page show the
    replacement, and the data members the replacement knows leave the 'other data' block."""
    from rich.text import Text

    report = _example()
    check = next(c for c in report.checks if c.kind == "determinism")
    real = registry.KINDS["determinism"]
    fake = dataclasses.replace(real, face=lambda d: Face("FAKE FACE", ["fake figure"]),
                               details=lambda d, c: [Text("FAKE DETAILS")], html=lambda d: "<p>FAKE HTML</p>",
                               known_data=tuple(check.data))
    assert face.face(check).verdict != "FAKE FACE"
    monkeypatch.setitem(registry.KINDS, "determinism", fake)
    assert face.face(check) == Face("FAKE FACE", ["fake figure"])
    console = Console(width=80, record=True, color_system=None)
    for r in render_report.detail_renderables(report, check.name, console):
        console.print(r)
    text = console.export_text()
    assert "FAKE DETAILS" in text and "other data" not in text
    page = render_html.to_html(report)
    assert "<p>FAKE HTML</p>" in page and "FAKE FACE" in page


def test_every_part_renders_the_example_report() -> None:
    """Each kind's face, details and HTML on a report's checks of that kind (the fixture holds four kinds)."""
    report = _example()
    console = Console(width=80, record=True, color_system=None)
    seen = set()
    for c in report.checks:
        kind = registry.KINDS.get(c.kind)
        if kind is None or not c.data:
            continue
        seen.add(c.kind)
        data = registry.view(kind, c.data)  # as the registry hands it over: a typed kind's model
        assert kind.face(data).verdict
        assert kind.details(data, console)
        assert isinstance(kind.html(data), str)
    assert seen == {"verify", "recompute", "determinism", "generalization"}


CLAIMS = ROOT / "audit" / "claims" / "kv-grafting-preprint.toml"


def _bare_context(kind: str, settings: dict[str, Any], tmp_path: Path) -> Any:
    """The Context of a one-check plan that provides no model, executor or release."""
    from kvgraft.audit import plan
    from kvgraft.audit.context import Context, absent

    return Context(plan.single(kind, settings), absent("model"), tmp_path, lambda _m: None, absent("executor"),
                   absent("release"))


def test_a_check_reads_earlier_results_through_a_read_only_view_not_context_slots(tmp_path: Path) -> None:
    """The claims check judges exactness from the recompute check's sealed result (ctx.results), and says which
    comparison it was measured for; the Context has no slot a kind fills for another."""
    ctx = _bare_context("claims", {"file": str(CLAIMS)}, tmp_path)
    for slot in ("measured", "natural_kl", "claims", "ledger"):
        assert not hasattr(ctx, slot), slot
    alone = registry.run_check(ctx, "claims", {"file": str(CLAIMS)})
    verdict = {c["id"]: c for c in alone.claims}["restore-exact"]
    assert verdict["verdict"] == "not-testable" and "one-shot prefill" not in verdict["reason"]
    assert ctx.results["claims"] is alone.result  # sealed, and left for the checks after it
    with pytest.raises(TypeError):
        ctx.results["recompute"] = {}  # type: ignore[index]

    ctx = _bare_context("claims", {"file": str(CLAIMS)}, tmp_path)
    entry = {"byte_exact": True, "matched": {"kl_max": 0.0}, "natural": {"kl_max": 2e-3}}
    ctx.sealed("recompute", {"entries": [entry, entry]})
    after = registry.run_check(ctx, "claims", {"file": str(CLAIMS)})
    verdict = {c["id"]: c for c in after.claims}["restore-exact"]
    assert verdict["verdict"] == "supported"
    assert "one-shot prefill of prefix + probe without any cache, max KL = 0.002, not 0" in verdict["reason"]
    assert after.summary.endswith("and this audit's measurements")


def test_the_single_check_commands_run_the_registrys_kind(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`audit claims` and `audit determinism` run the registered kind's run with their options as its settings,
    and report what the registry sealed: replace the kind's run, and the command runs the replacement."""
    from typer.testing import CliRunner

    from kvgraft.cli import app

    runner = CliRunner()
    seen: dict[str, dict[str, Any]] = {}
    real = registry.KINDS["claims"]

    def claims_run(ctx: Any, settings: dict[str, Any]) -> Any:
        seen["claims"] = settings
        return real.run(ctx, settings)

    monkeypatch.setitem(registry.KINDS, "claims", dataclasses.replace(real, run=claims_run))
    res = runner.invoke(app, ["audit", "claims", str(CLAIMS), "--json"])
    assert res.exit_code == 0, res.output
    assert seen["claims"] == {"file": str(CLAIMS), "measured": None}
    assert json.loads(res.stdout)["status"] == "passed"

    matrix = {"kind": "kvgraft-determinism-result", "format_version": 1, "model": "some-model", "length": 64,
              "baseline": "cpu", "environment": {}, "notes": [],
              "conditions": [{"name": "cpu", "condition": {}, "kv_digest": "0" * 64, "class": "A",
                              "identical_to_baseline": True, "max_ulp": 0, "max_abs": 0.0, "kl": 0.0}]}

    def determinism_run(ctx: Any, settings: dict[str, Any]) -> Any:
        seen["determinism"] = {k: v for k, v in settings.items() if k != "progress"}
        assert ctx.plan.doc["model"]["spec"] == "some-model"
        from kvgraft.audit.checks.kind import Ran

        return Ran(matrix, "one condition")

    monkeypatch.setitem(registry.KINDS, "determinism", dataclasses.replace(registry.KINDS["determinism"],
                                                                           run=determinism_run))
    res = runner.invoke(app, ["audit", "determinism", "--model", "some-model", "--length", "64", "--no-gpu", "--json"])
    assert seen["determinism"] == {"length": 64, "gpu": False}
    assert res.exit_code == 6, res.output  # the registry's status rule: fewer than two conditions is incomplete
    assert json.loads(res.stdout)["status"] == "incomplete"
