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


def test_pull_sample_draws_what_audit_sample_draws_from_many(tmp_path: Path) -> None:
    """10 of 40 entries: a draw from another nonce or root matches this one about once in 8.5e8 (1/C(40, 10))."""
    from kvgraft.signing import keys, sign

    from release_factory import make_release
    from remote_servers import folder_server

    rel = tmp_path / "rel"
    make_release(rel, entries=40, format_version=2, shard_entries=8, tokens=8)
    private, public = keys.write_keypair(tmp_path / "signer")
    sign.sign_release(rel, keys.load_private_key(private))
    out = tmp_path / "sample"
    with folder_server(rel=rel) as server:
        res = runner.invoke(app, ["pull", server.url("rel"), "--sample", "10", "--nonce", "auditor-9", "--out", str(out),
                                  "--key", str(public)])
    assert res.exit_code == 0, res.output
    drawn = runner.invoke(app, ["audit", "sample", str(rel), "--nonce", "auditor-9", "--size", "10"]).stdout.split()
    doc = json.loads((out / "kvgraft-subset.json").read_text())
    assert len(drawn) == 10 and sorted(drawn) == doc["entries"]
    assert sorted(drawn) != sorted(runner.invoke(app, ["audit", "sample", str(rel), "--nonce", "auditor-8", "--size",
                                                       "10"]).stdout.split())


def test_pull_from_a_local_folder_checks_each_entry_and_leaves_nothing(rel: Path, pub: Path, tmp_path: Path) -> None:
    path = rel / Release.open(rel).entry("rec-001")["file"]
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01
    path.write_bytes(bytes(data))
    out = tmp_path / "subset"
    res = runner.invoke(app, ["pull", str(rel), "--entry", "rec-001", "--out", str(out), "--key", str(pub)])
    assert res.exit_code == 1 and "entry 'rec-001'" in res.stderr, res.output
    assert not out.exists() and not list(tmp_path.glob(".subset.*"))


def test_verify_of_a_subset_with_a_damaged_entry_names_the_entry(http: FolderServer, rel: Path, pub: Path,
                                                                 tmp_path: Path) -> None:
    out = tmp_path / "subset"
    assert runner.invoke(app, ["pull", http.url("rel"), "--entry", "rec-002", "--out", str(out)]).exit_code == 0
    path = out / Release.open(rel).entry("rec-002")["file"]
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01
    path.write_bytes(bytes(data))
    res = runner.invoke(app, ["verify", str(out), "--key", str(pub)])
    assert res.exit_code == 1 and res.stderr.count("\n") == 1
    assert "entry 'rec-002'" in res.stderr and "index shard" not in res.stderr, res.stderr


def test_verify_sample_checks_every_drawn_entry(rel: Path, pub: Path, tmp_path: Path) -> None:
    """Each of the drawn entries damaged in turn: each run fails naming it (checking all but one would pass one)."""
    import shutil

    doc = json.loads(runner.invoke(app, ["verify", str(rel), "--sample", "3", "--nonce", "n-3", "--json",
                                         "--key", str(pub)]).stdout)
    drawn = doc["checked_entries"]
    r = Release.open(rel)
    assert r.index is not None
    assert len(drawn) == 3 and doc["tensors"] == sum(len(r.entry(e)["tensors"]) for e in drawn)
    # every drawn file hashed whole, every tensor of it hashed again, every index file, the manifest
    files = sum(int(r.file_meta(r.entry(e))["size"]) for e in drawn)
    tensors = sum(b - a for e in drawn for a, b in (t["byte_range"] for t in r.entry(e)["tensors"].values()))
    index = sum(int(m["size"]) for m in r.index.index_files().values())
    assert doc["bytes_hashed"] == files + tensors + index + (rel / "manifest.json").stat().st_size
    for eid in drawn:
        copy = Path(shutil.copytree(rel, tmp_path / f"copy-{eid}"))
        path = copy / Release.open(copy).entry(eid)["file"]
        data = bytearray(path.read_bytes())
        data[-3] ^= 0x01
        path.write_bytes(bytes(data))
        res = runner.invoke(app, ["verify", str(copy), "--sample", "3", "--nonce", "n-3", "--key", str(pub)])
        assert res.exit_code == 1 and f"entry '{eid}'" in res.stderr, (eid, res.output)
