"""`kvgraft pull`: a verified local subset that is itself a release anyone verifies, its absent entries said absent."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from kvgraft import sampling
from kvgraft.cli import app
from kvgraft.release.format import Release

from remote_servers import FolderServer

runner = CliRunner()


def test_pull_entries_makes_a_subset_that_verifies_with_the_same_key_and_root(http: FolderServer, rel: Path, pub: Path,
                                                                              tmp_path: Path) -> None:
    out = tmp_path / "subset"
    res = runner.invoke(app, ["pull", http.url("rel"), "--entry", "rec-004", "--entry", "rec-001", "--out", str(out),
                              "--key", str(pub)])
    assert res.exit_code == 0, res.output
    assert "pulled 2 of 5 entries" in res.stdout
    r = Release.open(rel)
    assert r.index is not None
    needed = {r.entry(e)["file"] for e in ("rec-001", "rec-004")}
    assert {p.split("/rel/", 1)[1] for p in http.paths() if "/entries/" in p} == needed
    doc = json.loads((out / "kvgraft-subset.json").read_text())
    assert doc["entries"] == ["rec-001", "rec-004"] and doc["origin"] == http.url("rel")
    check = runner.invoke(app, ["verify", str(out), "--key", str(pub), "--json"])
    assert check.exit_code == 0, check.output
    result = json.loads(check.stdout)
    assert result["root_digest"] == r.manifest["root_digest"] and result["checked_entries"] == ["rec-001", "rec-004"]
    assert result["signature"]["status"] == "verified"
    assert any("2 of 5 entries present and checked; the other 3 are absent by design" in w for w in result["warnings"])


def test_a_subset_with_a_file_missing_or_added_fails_naming_it(http: FolderServer, rel: Path, pub: Path,
                                                               tmp_path: Path) -> None:
    out = tmp_path / "subset"
    assert runner.invoke(app, ["pull", http.url("rel"), "--entry", "rec-002", "--out", str(out)]).exit_code == 0
    entry_file = Release.open(rel).entry("rec-002")["file"]
    (out / entry_file).rename(tmp_path / "kept")
    res = runner.invoke(app, ["verify", str(out), "--key", str(pub)])
    assert res.exit_code == 1 and entry_file in res.stderr and "missing" in res.stderr
    (tmp_path / "kept").rename(out / entry_file)
    assert runner.invoke(app, ["verify", str(out), "--key", str(pub)]).exit_code == 0  # the positive control
    (out / "entries" / "extra.safetensors").write_bytes(b"x")
    res = runner.invoke(app, ["verify", str(out), "--key", str(pub)])
    assert res.exit_code == 1 and "not part of the subset: entries/extra.safetensors" in res.stderr


def test_pull_sample_draws_what_audit_sample_draws(http: FolderServer, rel: Path, pub: Path, tmp_path: Path) -> None:
    out = tmp_path / "sample"
    res = runner.invoke(app, ["pull", http.url("rel"), "--sample", "2", "--nonce", "auditor-7", "--out", str(out),
                              "--key", str(pub)])
    assert res.exit_code == 0, res.output
    drawn = runner.invoke(app, ["audit", "sample", str(rel), "--nonce", "auditor-7", "--size", "2"])
    doc = json.loads((out / "kvgraft-subset.json").read_text())
    r = Release.open(rel)
    assert sorted(drawn.stdout.split()) == doc["entries"]
    assert doc["sample"] == {"method": sampling.METHOD, "nonce": "auditor-7", "size": 2}
    assert len(doc["entries"]) == 2 and set(doc["entries"]) <= set(r.entry_ids())


def test_pull_refuses_a_tampered_entry_and_writes_nothing(http: FolderServer, rel: Path, pub: Path,
                                                          tmp_path: Path) -> None:
    path = rel / Release.open(rel).entry("rec-003")["file"]
    data = bytearray(path.read_bytes())
    data[100] ^= 0x10
    path.write_bytes(bytes(data))
    out = tmp_path / "subset"
    res = runner.invoke(app, ["pull", http.url("rel"), "--entry", "rec-003", "--out", str(out), "--key", str(pub)])
    assert res.exit_code == 1 and "entry 'rec-003'" in res.stderr
    assert not out.exists() and not list(tmp_path.glob(".subset.*"))
