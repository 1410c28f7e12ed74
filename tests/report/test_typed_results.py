"""Typed results at the boundary between checks and renderers: what a face reads, the report schema requires.

A report that lacks a member a renderer draws (one from an older version, or edited) is refused when it is
loaded, with the schema's error naming the member's path (exit 2); no renderer catches a shape error.
"""

from __future__ import annotations

import ast
import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvgraft.cli import app
from kvgraft.errors import EXIT_INPUT
from kvgraft.generalization import stats

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "report-example.json"
COST = {"entries_recomputed": 2, "entries_resumed": 0, "resumed_from": None, "tokens_recomputed": 40, "tokens_resumed": 0,
        "wall_seconds": 1.5, "tokens_per_second": 26.7, "library_entries": 4, "library_tokens": 80,
        "projected_library_seconds": 3.0, "executor": "local", "workers": 1}


def _check(report: dict[str, Any], kind: str) -> dict[str, Any]:
    check: dict[str, Any] = next(c for c in report["checks"] if c["kind"] == kind)
    return check


def _control() -> dict[str, Any]:
    return {"name": "replay", "expect": "x", "condition": "own", "n": 4, "graft": {"k": 4, "n": 4},
            "baseline": {"k": 0, "n": 4}, "mcnemar": {"p_exact": 0.125}, "significant": False, "shows": True,
            "detectable": stats.detectable_effect(4), "split": {"clean": {"k": 0, "n": 0}, "contaminated": {"k": 4, "n": 4}}}


def _with_controls(report: dict[str, Any], control: dict[str, Any]) -> None:
    report["checks"].append({"name": "controls", "kind": "controls", "status": "passed", "summary": "controls",
                             "data": {"controls": [control], "statements": []}})
    report["verdict"]["checks"]["passed"] += 1


def _no_wall_seconds(r: dict[str, Any]) -> None:
    _check(r, "recompute")["data"]["cost"] = {k: v for k, v in COST.items() if k != "wall_seconds"}


def _no_tokens_per_second(r: dict[str, Any]) -> None:
    _check(r, "recompute")["data"]["cost"] = {k: v for k, v in COST.items() if k != "tokens_per_second"}


def _sample_without_nonce(r: dict[str, Any]) -> None:
    _check(r, "recompute")["data"]["sample"] = {
        "method": "sha256-rank-v1", "weighting": "uniform over entries", "root_digest": "0" * 64,
        "nonce_source": "given", "population": 4, "population_tokens": 80, "size": 2, "positions": [0, 1],
        "entries": ["a", "b"]}


def _control_without_split(r: dict[str, Any]) -> None:
    control = _control()
    del control["split"]
    _with_controls(r, control)


def _signature_not_an_object(r: dict[str, Any]) -> None:
    _check(r, "verify")["data"]["signature"] = "verified"


def _reading_without_figures(r: dict[str, Any]) -> None:
    r["checks"].append({"name": "claims", "kind": "claims", "status": "skipped", "summary": "claims", "reason": "r",
                        "data": {"readings": [{"summary": "avg@4"}]}})
    r["verdict"]["checks"]["skipped"] += 1


def _result_without_leakage(r: dict[str, Any]) -> None:
    _check(r, "generalization")["data"]["result"] = {"kind": "kvgraft-generalization-result"}


# (how the report is broken, the path the refusal names, the words it says)
BROKEN: list[tuple[Callable[[dict[str, Any]], None], str, str]] = [
    (_no_wall_seconds, "$.checks[1].data.cost", "'wall_seconds' is a required property"),
    (_no_tokens_per_second, "$.checks[1].data.cost", "'tokens_per_second' is a required property"),
    (_sample_without_nonce, "$.checks[1].data.sample", "'nonce' is a required property"),
    (_control_without_split, "$.checks[5].data.controls[0]", "'split' is a required property"),
    (_signature_not_an_object, "$.checks[0].data.signature", "is not of type 'object'"),
    (_reading_without_figures, "$.checks[5].data.readings[0]", "'figures' is a required property"),
    (_result_without_leakage, "checks[3].data.result: schema error at $", "is a required property"),
]


@pytest.mark.parametrize(("breaks", "path", "words"), BROKEN, ids=[b[0].__name__.strip("_") for b in BROKEN])
def test_a_report_lacking_a_member_a_renderer_draws_is_refused_naming_it(
        breaks: Callable[[dict[str, Any]], None], path: str, words: str, tmp_path: Path) -> None:
    report: dict[str, Any] = copy.deepcopy(json.loads(FIXTURE.read_text()))
    breaks(report)
    bad = tmp_path / "report.json"
    bad.write_text(json.dumps(report))
    for args in ([], ["--detail", "all"], ["--html", str(tmp_path / "r.html")]):
        res = CliRunner().invoke(app, ["report", "show", str(bad), *args])
        assert res.exit_code == EXIT_INPUT, res.output
        assert path in res.stderr and words in res.stderr, res.stderr
        assert "Traceback" not in res.output


def test_the_same_report_with_the_member_renders(tmp_path: Path) -> None:
    """The refusals above are for the missing member alone: with it, the report shows, cost and control included."""
    report: dict[str, Any] = copy.deepcopy(json.loads(FIXTURE.read_text()))
    _check(report, "recompute")["data"]["cost"] = COST
    _with_controls(report, _control())
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    res = CliRunner().invoke(app, ["report", "show", str(path)])
    assert res.exit_code == 0, res.output
    assert "cost: 40 tokens recomputed in 1.5 s" in res.stdout and "replay: b 4/4 vs a 0/4" in res.stdout


def test_an_accuracy_above_its_n_is_refused(tmp_path: Path) -> None:
    """k > n is what the schema cannot say: validate_report says it, so no interval is computed from it."""
    report: dict[str, Any] = copy.deepcopy(json.loads(FIXTURE.read_text()))
    acc = _check(report, "generalization")["data"]["conditions"][0]
    acc["k"] = acc["n"] + 1
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    res = CliRunner().invoke(app, ["report", "show", str(path)])
    assert res.exit_code == EXIT_INPUT and "checks[3].data.conditions[0]: k = " in res.stderr, res.output


def test_report_recompute_members_are_the_recompute_results() -> None:
    """The report's recompute data holds a recompute result's members: the same shape in both (its data part)."""
    schema = json.loads((ROOT / "schemas" / "recompute-result.v1.json").read_text())
    report, result = schema["$defs"]["data"]["properties"], schema["properties"]
    for member in ("sample", "bound", "cost", "conditions", "verdict", "require", "passed"):
        assert report[member] == result[member], member


# --- no renderer catches a shape error ---------------------------------------------------------------------------

RENDERERS = [*sorted((ROOT / "kvgraft" / "render").glob("*.py")),
             *(ROOT / "kvgraft" / "audit" / name for name in ("face.py", "render_report.py", "render_html.py"))]
KIND_MODULES = sorted(p for p in (ROOT / "kvgraft" / "audit" / "checks").glob("*.py")
                      if p.name not in ("__init__.py", "kind.py", "schemas.py"))
DRAWING = ("face", "details", "html")


def _handlers(tree: ast.AST) -> list[int]:
    return [node.lineno for node in ast.walk(tree) if isinstance(node, (ast.Try, ast.TryStar))]


def drawing_functions(tree: ast.Module) -> list[ast.FunctionDef]:
    """A kind module's face, details and html, and every function of the module they call, transitively."""
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    seen: dict[str, ast.FunctionDef] = {}
    todo = [name for name in DRAWING if name in functions]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen[name] = functions[name]
        todo += [n.id for n in ast.walk(functions[name]) if isinstance(n, ast.Name) and n.id in functions]
    return list(seen.values())


def excepts(path: Path) -> list[str]:
    """Where a renderer (a whole module, or a kind module's drawing functions) has a try statement."""
    tree = ast.parse(path.read_text(), str(path))
    if path.parent.name != "checks":
        return [f"{path.name}:{line}" for line in _handlers(tree)]
    return [f"{path.name}:{line} ({f.name})" for f in drawing_functions(tree) for line in _handlers(f)]


def test_no_renderer_catches_an_exception() -> None:
    assert len(RENDERERS) >= 9 and len(KIND_MODULES) == 6
    for path in KIND_MODULES:
        assert {f.name for f in drawing_functions(ast.parse(path.read_text()))} >= set(DRAWING), path.name
    found = [where for path in RENDERERS + KIND_MODULES for where in excepts(path)]
    assert not found, f"renderers survive shapes by catching errors; the schema should guarantee them: {found}"


def test_the_scan_sees_a_planted_except(tmp_path: Path) -> None:
    """The scan reads what it should: a try planted in a renderer module, and one in a helper a face calls."""
    views = tmp_path / "views.py"
    views.write_text("def f(x):\n    try:\n        return x[0]\n    except KeyError:\n        return None\n")
    assert excepts(views) == ["views.py:2"]
    kind = tmp_path / "checks" / "recompute.py"
    kind.parent.mkdir()
    kind.write_text("def run(c):\n    try:\n        pass\n    except OSError:\n        pass\n\n"
                    "def _helper(d):\n    try:\n        return d['x']\n    except KeyError:\n        return None\n\n"
                    "def face(d):\n    return _helper(d)\n\ndef details(d, c):\n    return []\n\ndef html(d):\n    return ''\n")
    assert excepts(kind) == ["recompute.py:8 (_helper)"]  # run's try is a producer's, not a renderer's
