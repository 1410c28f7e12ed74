"""`kvgraft report compare`: replications of one release, each verified, read together; the combined sampled bound.

Real audits of a tiny release signed by key A, each replication's report signed by its own key, published as
`replications/<name>/report.json` beside its signature (docs/replications.md)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvgraft import errors
from kvgraft.cli import app
from kvgraft.results.compare import ReportCompare
from kvgraft.results.report import Report
from kvgraft.signing import keys

from release_factory import captured_release, replication_plan
from remote_servers import folder_server

runner = CliRunner()
TEXTS = [f"Problem {i}: Mia has {i + 3} apples and buys {i}. Answer: {2 * i + 3}" for i in range(12)]
OTHER = [f"Note {i}: the train left at {i} o'clock." for i in range(4)]
SAMPLE = 4


def _replicate(base: Path, name: str, model: Path, release: Path, author: Path, nonce: str) -> Path:
    """One replicator's audit of `release` (signed by `author`), its report signed by its own key; published
    under base/replications/<name>/ (report.json, report.sigstore.json); returns that folder."""
    work = base / "work" / name
    work.mkdir(parents=True)
    private, _ = keys.write_keypair(base / "keys" / name)
    tables = f'[checks.recompute]\nsample = {SAMPLE}\nnonce = "{nonce}"\n[signing]\nkey = "{private}"\n'
    plan = replication_plan(work, name, model, release, tables, signer_pub=author)
    res = runner.invoke(app, ["audit", "run", str(plan), "--quiet"])
    assert res.exit_code == 0, res.output
    published = base / "replications" / name
    published.mkdir(parents=True)
    for f in ("report.json", "report.sigstore.json"):
        shutil.copy(work / "out" / f, published / f)
    return published


@pytest.fixture(scope="module")
def published(tiny_lm: Callable[[str], Any], tiny_dir: Callable[[str], Path],
              tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("compare")
    (base / "keys").mkdir()
    a_key, a_pub = keys.write_keypair(base / "keys" / "author")
    lm, model = tiny_lm("llama"), tiny_dir("llama")
    release = captured_release(lm, base / "release", TEXTS, signer=a_key)
    other = captured_release(lm, base / "other-release", OTHER, signer=a_key)
    reps = [_replicate(base, f"lab-{i}", model, release, a_pub, f"nonce-{i}") for i in (1, 2, 3)]
    about_other = _replicate(base, "other", model, other, a_pub, "nonce-o")
    return {"base": base, "reps": reps, "other": about_other, "release": release,
            "trusted": [base / "keys" / f"{n}.pub.pem" for n in ("lab-1", "lab-2", "lab-3", "other")]}


def _keys(paths: list[Path]) -> list[str]:
    return [a for p in paths for a in ("--key", str(p))]


def _compare(*args: str) -> Any:
    return runner.invoke(app, ["report", "compare", *args], env={"COLUMNS": "80"})


def _report(folder: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((folder / "report.json").read_text())
    return doc


def test_three_replications_agree_and_their_union_bounds_tighter(published: dict[str, Any], tmp_path: Path) -> None:
    from scipy.stats import hypergeom

    reps = published["reps"]
    res = _compare(*[str(r) for r in reps], *_keys(published["trusted"][:3]), "--out", str(tmp_path / "c.json"),
                   "--html", str(tmp_path / "c.html"))
    assert res.exit_code == 0, res.output
    assert all(len(line) <= 80 for line in res.stdout.splitlines()), res.stdout
    result = json.loads((tmp_path / "c.json").read_text())
    assert ReportCompare.model_validate(result).as_json() == result  # the model reads back what it wrote
    assert result["status"] == "agree" and len(result["groups"]) == 1
    group = result["groups"][0]
    signers = [r["signer"]["key_id"] for r in group["replications"]]
    assert signers == [keys.key_id(keys.load_public_key(p)) for p in published["trusted"][:3]]  # each its own key
    # The union, from the reports' samples read here (each re-derived by compare from its nonce and the root).
    samples = [next(c for c in _report(r)["checks"] if c["kind"] == "recompute")["data"]["sample"] for r in reps]
    assert len({s["nonce"] for s in samples}) == 3
    union = set().union(*(s["entries"] for s in samples))
    n, population = len(union), len(TEXTS)
    assert SAMPLE < n < population or n == population  # the three samples differ
    alpha = 0.05
    # scipy: the largest number of inconsistent entries D that 0 of the n distinct entries does not reject.
    scipy_bound = max(d for d in range(population + 1) if hypergeom.cdf(0, population, d, n) > alpha)
    b = group["combined_bound"]
    assert (b["sampled"], b["failing"], b["population"]) == (n, 0, population)
    assert b["max_failing_entries"] == scipy_bound
    for r in group["replications"]:
        own = max(d for d in range(population + 1) if hypergeom.cdf(0, population, d, SAMPLE) > alpha)
        assert r["recompute"]["bound"] == own == r["recompute"]["stated_bound"]
        assert b["max_failing_entries"] < own  # tighter than each replication's own
    assert group["checks"] == [{"name": "recompute", "passed": 3, "of": 3}]
    assert "combined" in res.stdout and "recompute 3 of 3 passed" in " ".join(res.stdout.split())
    page = (tmp_path / "c.html").read_text()
    assert "<svg" in page and "<script" not in page and "combined" in page


def test_a_report_altered_after_signing_is_refused_and_named(published: dict[str, Any], tmp_path: Path) -> None:
    altered = tmp_path / "altered"
    shutil.copytree(published["reps"][1], altered)
    doc = _report(altered)
    doc["created"] = "2020-01-01T00:00:00Z"  # valid, but not what the replicator signed
    (altered / "report.json").write_text(json.dumps(doc))
    args = [str(published["reps"][0]), str(altered), *_keys(published["trusted"][:3])]
    res = _compare(*args)
    assert res.exit_code == errors.EXIT_FAILED, res.output
    assert str(altered / "report.json") in " ".join(res.output.split()) and "edited after signing" in res.output
    listed = _compare(*args, "--allow-unverified", "--json")
    assert listed.exit_code == 0, listed.output
    result = json.loads(listed.stdout)
    assert result["trusted"] == 1 and [u["source"] for u in result["unverified"]] == [str(altered / "report.json")]
    # Signed by a key nobody trusts: refused too, naming whose key signed it.
    stranger = _compare(str(published["reps"][0]), *_keys(published["trusted"][1:3]))
    assert stranger.exit_code == errors.EXIT_FAILED and "none of the trusted keys" in stranger.output


def test_a_replication_of_another_release_is_grouped_apart(published: dict[str, Any]) -> None:
    res = _compare(*[str(r) for r in published["reps"][:2]], str(published["other"]), *_keys(published["trusted"]),
                   "--json")
    assert res.exit_code == 0, res.output
    groups = json.loads(res.stdout)["groups"]
    assert [len(g["replications"]) for g in groups] == [2, 1]
    assert groups[1]["release_root_digest"] == _report(published["other"])["release_root_digest"]
    assert groups[0]["release_root_digest"] != groups[1]["release_root_digest"]
    assert groups[1]["combined_bound"]["population"] == len(OTHER)


def _plant(source: Path, out: Path, signer: Path, *, device_name: str | None = None, verdict: str = "inconsistent") -> str:
    """A copy of `source`'s report whose first recomputed entry is judged `verdict` (its first layer's keys
    differing), verdicts re-derived, signed with `signer`: a replication that found what `source`'s did not."""
    from kvgraft.report.document import compute_verdict
    from kvgraft.report.signing import write_signed_report

    doc = _report(source)
    check = next(c for c in doc["checks"] if c["kind"] == "recompute")
    data = check["data"]
    entry = data["entries"][0]
    entry.update(byte_exact=False, verdict=verdict)
    keys_diff = entry["layers"][0]["keys"]
    keys_diff.update(equal=False, differing=3, first=[0, 1, 2, 3], fraction=3 / keys_diff["elements"])
    entry["first_difference"] = {"layer": entry["layers"][0]["index"], "tensor": "keys", "location": [0, 1, 2, 3],
                                 "named": {"batch": 0, "head": 1, "position": 2, "dim": 3}, "max_ulp": 9,
                                 "max_abs": 1e-3, "detail": None}
    if device_name is not None:
        for e in data["entries"]:
            e["placement"]["environment"]["device_name"] = device_name
    if verdict == "inconsistent":
        data.update(all_byte_exact=False, verdict="inconsistent", passed=False, status="failed")
        check["status"] = "failed"
    report = Report.model_validate(doc)
    report = report.model_copy(update={"verdict": compute_verdict(report.checks, report.claims)})
    out.mkdir()
    write_signed_report(out / "report.json", report, keys.load_private_key(signer))
    return str(entry["id"])


def test_a_planted_disagreement_under_the_same_conditions_is_located_and_fails(published: dict[str, Any],
                                                                                tmp_path: Path) -> None:
    lab1 = published["reps"][0]
    private, pub = keys.write_keypair(tmp_path / "planter")
    planted = tmp_path / "planted"
    eid = _plant(lab1, planted, private)
    res = _compare(str(lab1), str(planted), *_keys([published["trusted"][0], pub]), "--out", str(tmp_path / "c.json"))
    assert res.exit_code == errors.EXIT_DISAGREE, res.output
    group = json.loads((tmp_path / "c.json").read_text())["groups"][0]
    row = next(e for e in group["entries"] if e["id"] == eid)
    assert row["status"] == "unexplained" and "same recorded conditions" in row["why"]
    assert row["location"]["replication"] == 2 and row["location"]["layer"] == 0 and row["location"]["tensor"] == "keys"
    assert row["location"]["element"] == {"batch": 0, "head": 1, "position": 2, "dim": 3}
    assert all(e["status"] == "agree" for e in group["entries"] if e["id"] != eid)
    assert group["combined_bound"]["failing"] == 1  # the inconsistent entry counts against the release
    flat = " ".join(res.stdout.split())
    assert eid in flat and "not explained" in flat and "DISAGREE" in flat
    # Positive control of the rule: byte-exact against consistent on another recorded CPU is explained (exit 0).
    other_cpu = tmp_path / "other-cpu"
    _plant(lab1, other_cpu, private, device_name="Another CPU", verdict="consistent")
    explained = _compare(str(lab1), str(other_cpu), *_keys([published["trusted"][0], pub]), "--json")
    assert explained.exit_code == 0, explained.output
    row = next(e for e in json.loads(explained.stdout)["groups"][0]["entries"] if e["id"] == eid)
    assert row["status"] == "explained" and "device_name" in row["why"]


def test_a_sample_that_does_not_rederive_is_refused(published: dict[str, Any], tmp_path: Path) -> None:
    """A report whose recorded sample is not the one its nonce and the release root draw is refused, although
    validly signed: the union is re-derived, never taken on trust."""
    from kvgraft.report.signing import write_signed_report

    doc = _report(published["reps"][0])
    next(c for c in doc["checks"] if c["kind"] == "recompute")["data"]["sample"]["nonce"] = "chosen-afterwards"
    private, pub = keys.write_keypair(tmp_path / "chooser")
    (tmp_path / "chosen").mkdir()
    write_signed_report(tmp_path / "chosen" / "report.json", Report.model_validate(doc), keys.load_private_key(private))
    res = _compare(str(published["reps"][1]), str(tmp_path / "chosen"), *_keys([published["trusted"][1], pub]))
    assert res.exit_code == errors.EXIT_FAILED, res.output
    assert "sample not re-derived" in res.output and str(tmp_path / "chosen" / "report.json") in " ".join(res.output.split())


def test_reports_served_over_http_compare_like_local_ones(published: dict[str, Any]) -> None:
    reps = published["reps"]
    local = _compare(*[str(r) for r in reps], *_keys(published["trusted"][:3]), "--json")
    with folder_server(replications=published["base"] / "replications") as server:
        urls = [f"{server.url('replications')}/{r.name}/report.json" for r in reps]
        remote = _compare(*urls, *_keys(published["trusted"][:3]), "--json")
        unlisted = _compare(server.url("replications"), *_keys(published["trusted"][:3]))
    assert remote.exit_code == 0, remote.output
    a, b = json.loads(local.stdout), json.loads(remote.stdout)
    for g in (a, b):
        for r in g["groups"][0]["replications"]:
            r["source"] = r["source"].rsplit("/", 2)[-2]  # the folder's name, wherever it was read from
    assert a == b
    assert [r["source"] for r in json.loads(remote.stdout)["groups"][0]["replications"]] == urls
    assert unlisted.exit_code == errors.EXIT_INPUT and "cannot be listed" in unlisted.output


def test_the_renderers_read_the_models_attributes() -> None:
    """No `["member"]` and no `.get` in render_compare but on an environment (an open object a report holds): the
    model says what a compare result holds."""
    import ast
    import inspect

    from kvgraft.audit import render_compare

    tree = ast.parse(inspect.getsource(render_compare))
    found = [n.lineno for n in ast.walk(tree)
             if (isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant) and isinstance(n.slice.value, str))
             or (isinstance(n, ast.Attribute) and n.attr == "get"
                 and not (isinstance(n.value, ast.Attribute) and n.value.attr == "environment"))]
    assert not found, found
