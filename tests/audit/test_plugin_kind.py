"""A check kind from outside kvgraft: defined here, registered (by `register`, and by an entry point of the group
kvgraft.check_kinds), run by `audit run` from a plan that names it, and found in the face, the details, the
HTML page and a schema-valid JSON report; a plan naming a kind nobody registered is refused."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console, RenderableType
from rich.text import Text
from typer.testing import CliRunner

from kvgraft import errors
from kvgraft.audit import checks as registry
from kvgraft.audit.checks.kind import CheckKind, Ran
from kvgraft.audit.context import Context
from kvgraft.cli import app
from kvgraft.errors import InputError, SchemaError
from kvgraft.render.figures import Face

from release_factory import records_plan

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]


def _run(ctx: Context, settings: dict[str, Any]) -> Ran:
    n = ctx.release.release.num_entries  # a VerifiedRelease: the release, what was checked
    assert "recompute" not in ctx.results  # the plan names no other check: nothing ran before
    return Ran({"kind": "toy", "entries": n, "word": settings.get("word", "toy")}, f"the toy counted {n} entries",
               ledger={"toy": f"{n} entries counted"})


def _status(result: dict[str, Any]) -> str:
    return "passed" if result["entries"] > 0 else "incomplete"


def _face(data: dict[str, Any]) -> Face:
    return Face(f"TOY FACE: {data['entries']} entries counted", [f"toy figure: the word is {data['word']}"])


def _details(data: dict[str, Any], console: Console) -> list[RenderableType]:
    return [Text(f"TOY DETAILS: {data['entries']} entries")]


def _html(data: dict[str, Any]) -> str:
    return f"<p>TOY HTML: {data['entries']} entries</p>"


# The kind's own result schema, carried as a document: no file under schemas/.
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["kind", "entries", "word", "status"],
          "properties": {"kind": {"const": "toy"}, "entries": {"type": "integer", "minimum": 0},
                         "word": {"type": "string"}, "status": {"enum": ["passed", "failed", "incomplete"]}}}
TOY = CheckKind(name="toy", schema=SCHEMA, status=_status, stamps_status=True, run=_run, face=_face, details=_details,
                html=_html, known_data=("kind", "entries", "word", "status"))


@pytest.fixture
def fresh_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The built-in kinds only, the entry points not yet read; restored afterwards."""
    monkeypatch.setattr(registry, "KINDS", {k.name: k for k in registry.BUILTIN})
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    yield


def _entry_point(site: Path, monkeypatch: pytest.MonkeyPatch, value: str, name: str = "toy") -> None:
    """An installed distribution with one entry point of the group kvgraft.check_kinds, on sys.path."""
    info = site / "kvgraft_toy_plugin-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kvgraft-toy-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{registry.ENTRY_POINTS}]\n{name} = {value}\n")
    monkeypatch.syspath_prepend(str(site))


def _plan(tmp_path: Path, tiny_dir: Callable[[str], Path], checks: str) -> Path:
    plan = records_plan(tmp_path, "toy", tiny_dir("gemma3"), [f"Problem {i}: {i} + 2 = {i + 2}" for i in range(2)], checks + "\n")
    return plan


def _audit_and_read(tmp_path: Path, tiny_dir: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """`audit run` on a plan naming the toy kind, and everything a reader sees of it."""
    from jsonschema import Draft202012Validator
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT202012

    from kvgraft.cli import _base
    from kvgraft.report.document import load_report

    plan = _plan(tmp_path, tiny_dir, '[checks.verify]\n[checks.toy]\nword = "hello"')
    res = runner.invoke(app, ["audit", "run", str(plan), "--quiet"])
    assert res.exit_code == errors.EXIT_OK, res.output
    out = tmp_path / "out"
    report = json.loads((out / "report.json").read_text())
    # the JSON report is valid against the report schema, its kinds' `data` resolved in the schema files beside it
    files = [json.loads(p.read_text()) for p in sorted((ROOT / "schemas").glob("*.json"))]
    registry_ = Registry().with_resources((s["$id"], Resource.from_contents(s, default_specification=DRAFT202012))
                                          for s in files)
    schema = json.loads((ROOT / "schemas" / "audit-report.v1.json").read_text())
    Draft202012Validator(schema, registry=registry_).validate(report)
    assert load_report(out / "report.json").as_json() == report  # and against what the schema cannot say
    toy = next(c for c in report["checks"] if c["kind"] == "toy")
    assert toy == {"name": "toy", "kind": "toy", "status": "passed", "summary": "the toy counted 2 entries",
                   "data": {"kind": "toy", "entries": 2, "word": "hello", "status": "passed"}}
    assert [c["name"] for c in report["checks"]] == ["verify", "toy"]  # the registry's order: plugins after built-ins
    assert report["ledger"]["toy"] == "2 entries counted"
    monkeypatch.setattr(_base.out, "_width", 200)
    shown = runner.invoke(app, ["report", "show", str(out / "report.json")])
    assert shown.exit_code == 0, shown.output
    assert "✓ toy passed" in shown.stdout and "TOY FACE: 2 entries counted" in shown.stdout
    assert "toy figure: the word is hello" in shown.stdout
    detail = runner.invoke(app, ["report", "show", str(out / "report.json"), "--detail", "toy"])
    assert detail.exit_code == 0, detail.output
    assert "TOY DETAILS: 2 entries" in detail.stdout and "other data" not in detail.stdout
    page = (out / "report.html").read_text()
    assert "TOY FACE: 2 entries counted" in page
    section = next(part for part in page.split('<div class="check">') if "<h3>toy " in part)
    assert "<p>TOY HTML: 2 entries</p>" in section and "more data" not in section


def test_a_kind_registered_by_register_runs_in_audit_run_and_shows_everywhere(
        fresh_registry: None, tmp_path: Path, tiny_dir: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch) -> None:
    registry.register(TOY)
    _audit_and_read(tmp_path, tiny_dir, monkeypatch)
    # A reader whose registry lacks the kind shows the check by its summary, as a check of kind "other".
    from kvgraft.audit import face
    from kvgraft.report.document import load_report

    toy = next(c for c in load_report(tmp_path / "out" / "report.json").checks if c.kind == "toy")
    assert face.face(toy).verdict.startswith("TOY FACE")
    del registry.KINDS["toy"]
    assert face.face(toy) == Face("the toy counted 2 entries")


TOY_FROM_ENTRY_POINT = TOY


def test_a_kind_registered_by_an_entry_point_runs_in_audit_run(
        fresh_registry: None, tmp_path: Path, tiny_dir: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch) -> None:
    _entry_point(tmp_path / "site", monkeypatch, f"{__name__}:TOY_FROM_ENTRY_POINT")
    assert "toy" not in registry.KINDS
    assert list(registry.kinds())[-1] == "toy"
    _audit_and_read(tmp_path, tiny_dir, monkeypatch)


def test_an_unregistered_kind_in_a_plan_is_refused_before_anything_loads(
        fresh_registry: None, tmp_path: Path, tiny_dir: Callable[[str], Path]) -> None:
    plan = _plan(tmp_path, tiny_dir, "[checks.verify]\n[checks.toy]")
    res = runner.invoke(app, ["audit", "run", str(plan), "--quiet"])
    assert res.exit_code == errors.EXIT_INPUT, res.output
    assert "no check kind 'toy' is registered" in res.stderr and "entry-point group kvgraft.check_kinds" in res.stderr
    assert not (tmp_path / "out").exists()  # refused before the model loaded or a release was captured


def test_register_refuses_a_taken_name_a_bad_name_and_not_a_kind(fresh_registry: None) -> None:
    import dataclasses

    registry.register(TOY)
    with pytest.raises(InputError, match="'toy' is registered already"):
        registry.register(TOY)
    with pytest.raises(InputError, match="'recompute' is registered already"):
        registry.register(dataclasses.replace(TOY, name="recompute"))
    with pytest.raises(InputError, match="'other' is registered already"):
        registry.register(dataclasses.replace(TOY, name="other"))
    with pytest.raises(InputError, match="a name is a lower-case letter"):
        registry.register(dataclasses.replace(TOY, name="Toy Kind"))
    with pytest.raises(InputError, match="not dict"):
        registry.register({"name": "x"})  # type: ignore[arg-type]


@pytest.mark.parametrize(("value", "name", "message"), [
    (f"{__name__}:TOY_FROM_ENTRY_POINT", "other-name", "names kind 'toy', not 'other-name'"),
    (f"{__name__}:SCHEMA", "toy", "is a dict, not a CheckKind"),
    ("kvgraft_no_such_module:KIND", "toy", "does not load: ModuleNotFoundError"),
])
def test_a_bad_entry_point_is_refused_naming_it(fresh_registry: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                value: str, name: str, message: str) -> None:
    _entry_point(tmp_path / "site", monkeypatch, value, name)
    with pytest.raises(InputError, match=message) as info:
        registry.kinds()
    assert f"entry point {name} = {value}" in str(info.value)


def test_a_plugin_result_is_sealed_against_the_kinds_own_schema(fresh_registry: None) -> None:
    registry.register(TOY)
    assert registry.seal("toy", {"kind": "toy", "entries": 0, "word": "w"})["status"] == "incomplete"
    with pytest.raises(SchemaError):
        registry.seal("toy", {"kind": "toy", "entries": 1, "word": "w", "extra": 1})


def _kvgraft_metadata(site: Path, monkeypatch: pytest.MonkeyPatch, lines: str) -> None:
    """kvgraft's own distribution metadata on sys.path ahead of any other, with `lines` as its check kinds."""
    info = site / "kvgraft-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kvgraft\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[{registry.ENTRY_POINTS}]\n{lines}")
    monkeypatch.syspath_prepend(str(site))


def test_the_built_in_kinds_are_the_entry_points_pyproject_declares() -> None:
    """The declared list the registry loads is pyproject's entry-point table, in the order an audit runs them."""
    import tomllib

    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"][registry.ENTRY_POINTS]
    assert list(table.items()) == list(registry.BUILTIN_ENTRY_POINTS)
    assert [k.name for k in registry.BUILTIN] == ["verify", "recompute", "determinism", "generalization", "controls",
                                                  "claims"]


@pytest.mark.parametrize("installed", [
    "".join(f"{n} = {v}\n" for n, v in registry.BUILTIN_ENTRY_POINTS),  # installed metadata of this source
    "verify = kvgraft.audit.checks.verify:KIND\n",  # an older install's: stale
    "",  # none declared
])
def test_kvgrafts_own_entry_points_are_registered_once_whatever_its_metadata_says(
        fresh_registry: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, installed: str) -> None:
    _kvgraft_metadata(tmp_path / "kvgraft-site", monkeypatch, installed)
    _entry_point(tmp_path / "site", monkeypatch, f"{__name__}:TOY_FROM_ENTRY_POINT")
    assert list(registry.kinds()) == [*(n for n, _ in registry.BUILTIN_ENTRY_POINTS), "toy"]
    assert all(registry.KINDS[k.name] is k for k in registry.BUILTIN)


def test_another_package_cannot_take_a_built_in_kinds_name(fresh_registry: None, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    _entry_point(tmp_path / "site", monkeypatch, "kvgraft.audit.checks.verify:KIND", "verify")
    with pytest.raises(InputError, match="'verify' is registered already"):
        registry.kinds()


def test_audit_kinds_lists_each_kind_its_package_and_version(fresh_registry: None, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from kvgraft import __version__

    _entry_point(tmp_path / "site", monkeypatch, f"{__name__}:TOY_FROM_ENTRY_POINT")
    res = runner.invoke(app, ["audit", "kinds", "--json"])
    assert res.exit_code == errors.EXIT_OK, res.output
    listed = json.loads(res.stdout)["kinds"]
    assert listed == [*({"name": n, "package": "kvgraft", "version": __version__} for n, _ in registry.BUILTIN_ENTRY_POINTS),
                      {"name": "toy", "package": "kvgraft-toy-plugin", "version": "0.1"}]
    shown = runner.invoke(app, ["audit", "kinds"])
    assert shown.exit_code == errors.EXIT_OK, shown.output
    lines = shown.stdout.splitlines()
    assert [line.split() for line in lines] == [[k["name"], k["package"], k["version"]] for k in listed]


def test_audit_kinds_names_the_package_of_a_kind_a_program_registered(fresh_registry: None) -> None:
    import dataclasses

    registry.register(dataclasses.replace(TOY, name="toy2"))
    found = {k.name: k for k in registry.installed()}
    # defined in this test module: no installed distribution provides it
    assert (found["toy2"].package, found["toy2"].version) == (__name__.split(".")[0], None)
