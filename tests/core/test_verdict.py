"""One verdict per check: each result's own status, its schema, and one exit code for the single-audit command
and for `audit run`."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvgraft import errors, verdict
from kvgraft.audit import checks as registry
from kvgraft.claims import checker as claims
from kvgraft.cli import app
from kvgraft.errors import InputError, SchemaError
from kvgraft.generalization import audit as gen

from sample_problems import PROBLEMS

runner = CliRunner()


def test_exit_codes_of_statuses() -> None:
    assert {s: verdict.exit_code(s) for s in verdict.STATUSES} == {
        "passed": errors.EXIT_OK, "failed": errors.EXIT_NOT_EXACT, "incomplete": errors.EXIT_INCOMPLETE}
    assert len({errors.EXIT_OK, errors.EXIT_FAILED, errors.EXIT_INPUT, errors.EXIT_MODEL, errors.EXIT_NOT_EXACT,
                errors.EXIT_EXISTS, errors.EXIT_INCOMPLETE}) == 7
    with pytest.raises(InputError):
        verdict.exit_code("skipped")


def test_recompute_status() -> None:
    def status(result: dict[str, Any]) -> str:
        return registry.status("recompute", result)

    # The requirement decides: a consistent release passes `--require consistent`, fails `exact`.
    assert status({"verdict": "byte-exact", "require": "exact", "passed": True}) == "passed"
    assert status({"verdict": "consistent", "require": "exact", "passed": False}) == "failed"
    assert status({"verdict": "consistent", "require": "consistent", "passed": True}) == "passed"


def test_seal_refuses_a_result_its_schema_does_not_allow() -> None:
    with pytest.raises(SchemaError):
        registry.seal("recompute", {"all_byte_exact": True, "passed": True})


def test_claims_status_incomplete_when_nothing_could_be_judged(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text('format = "kvgraft-claims"\nformat_version = 1\n[source]\ntitle = "t"\n[[claims]]\nid = "e"\n'
                 'kind = "exactness"\ntext = "exact"\nmeasure = { byte_identical = "restore_byte_identical" }\n')
    r = registry.seal("claims", claims.check_files(p).as_json())
    assert r["status"] == "incomplete"
    res = runner.invoke(app, ["audit", "claims", str(p)])
    assert res.exit_code == errors.EXIT_INCOMPLETE, res.output
    m = tmp_path / "m.json"
    m.write_text(json.dumps({"restore_byte_identical": False}))
    assert registry.seal("claims", claims.check_files(p, m).as_json())["status"] == "failed"
    assert runner.invoke(app, ["audit", "claims", str(p), "--measured", str(m)]).exit_code == errors.EXIT_NOT_EXACT


def _plan(tmp_path: Path, model: Path, problems: Path, claims_file: Path | None = None) -> Path:
    plan = tmp_path / "plan.toml"
    claims_table = f'[checks.claims]\nfile = "{claims_file}"\n' if claims_file else ""
    plan.write_text(f"""
format = "kvgraft-audit-plan"
format_version = 1
name = "verdict"
out = "{tmp_path / 'out'}"
[model]
spec = "{model}"
[release.library]
source = "{problems}"
library_fraction = 0.5
salt = "v"
[checks.generalization]
max_new_tokens = 4
{claims_table}""")
    return plan


@pytest.fixture()
def problems_file(tmp_path: Path) -> Path:
    p = tmp_path / "problems.jsonl"
    p.write_text("".join(json.dumps({"id": q.id, "problem": q.problem, "answer": q.answer, "solution": q.solution,
                                     "source": q.source}) + "\n" for q in PROBLEMS))
    return p


def test_d_differing_from_the_graft_fails_both_commands_alike(tiny_dir: Callable[[str], Path], tmp_path: Path,
                                                               problems_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_dir("llama")
    plan = _plan(tmp_path, model, problems_file)
    # First as it is: (d) reproduces the graft, both commands pass.
    res = runner.invoke(app, ["audit", "run", str(plan), "--quiet"])
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    (check,) = report["checks"]
    assert check["status"] == "passed" and check["data"]["result"]["status"] == "passed"
    lib = tmp_path / "out" / "release"
    res = runner.invoke(app, ["audit", "generalization", "--library", str(lib), "--max-new-tokens", "4", "--model",
                              str(model), "--quiet"])
    assert res.exit_code == 0, res.output

    # Then with the prompt-text condition decoding one other token than its graft.
    real = gen.run_query

    def text_differs(*args: Any, **kwargs: Any) -> dict[str, Any]:
        out = real(*args, **kwargs)
        if out["condition"] in gen.AS_TEXT.values():
            first = out["samples"][0]
            first["token_ids"] = [first["token_ids"][0] + 1, *first["token_ids"][1:]]
        return out

    monkeypatch.setattr(gen, "run_query", text_differs)
    res = runner.invoke(app, ["audit", "generalization", "--library", str(lib), "--max-new-tokens", "4", "--model",
                              str(model), "--quiet", "--out", str(tmp_path / "g.json")])
    single = res.exit_code
    g = json.loads((tmp_path / "g.json").read_text())
    assert g["status"] == "failed" and any(eq["equal"] < eq["n"] for eq in g["equality"].values())
    res = runner.invoke(app, ["audit", "run", str(plan), "--quiet"])
    assert single == res.exit_code == errors.EXIT_NOT_EXACT, res.output
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["verdict"]["status"] == "failed" and report["checks"][0]["status"] == "failed"


def test_failing_claims_fail_both_commands_alike(tiny_dir: Callable[[str], Path], tmp_path: Path,
                                                 problems_file: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('format = "kvgraft-claims"\nformat_version = 1\n[source]\ntitle = "t"\n[benchmarks.b]\nsize = 30\n'
                   'samples_per_problem = 1\n[[claims]]\nid = "a"\nkind = "accuracy"\ntext = "77.5%"\nbenchmark = "b"\n'
                   "percent = 77.5\n")
    single = runner.invoke(app, ["audit", "claims", str(bad)]).exit_code
    res = runner.invoke(app, ["audit", "run", str(_plan(tmp_path, tiny_dir("llama"), problems_file, bad)), "--quiet"])
    assert single == res.exit_code == errors.EXIT_NOT_EXACT, res.output
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert {c["name"]: c["status"] for c in report["checks"]} == {"generalization": "passed", "claims": "failed"}
