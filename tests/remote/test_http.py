"""A release read over HTTP: only the pieces used are fetched, each checked against the signed chain, then cached."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvgraft.cli import app
from kvgraft.release.format import Release

from remote_servers import FolderServer, folder_server, verified_pieces

runner = CliRunner()
OPENING = {"manifest.json", "release.sigstore.json", "model.sig", "kvgraft-subset.json"}


def pieces_of(rel: Path, eid: str) -> set[str]:
    """The files an entry's read needs: its index shard and its file."""
    r = Release.open(rel)
    assert r.index is not None
    return {r.index.shards[r.index.owner[eid]]["file"], r.entry(eid)["file"]}


def fetched(server: FolderServer) -> set[str]:
    return {p.split("/rel/", 1)[1] for p in server.paths()}


def test_verify_entry_fetches_only_that_entrys_pieces_and_caches_them(http: FolderServer, rel: Path, pub: Path,
                                                                      private_cache: Path) -> None:
    url = http.url("rel")
    res = runner.invoke(app, ["verify", url, "--entry", "rec-003", "--key", str(pub)])
    assert res.exit_code == 0, res.output
    assert f"verified {url}" in res.stdout and "1 of 5 checked (rec-003)" in res.stdout
    assert fetched(http) == OPENING | pieces_of(rel, "rec-003")
    assert len(verified_pieces(private_cache)) == 2
    http.log.clear()
    again = runner.invoke(app, ["verify", url, "--entry", "rec-003", "--key", str(pub), "--json"])
    assert again.exit_code == 0, again.output
    assert fetched(http) == OPENING  # the shard and the entry came from the cache
    assert json.loads(again.stdout)["release"] == url


def test_two_releases_sharing_an_entry_share_its_bytes(rel: Path, pub: Path, tmp_path: Path) -> None:
    other = Path(shutil.copytree(rel, tmp_path / "other"))
    with folder_server(rel=rel, other=other) as server:
        assert runner.invoke(app, ["verify", server.url("rel"), "--entry", "rec-001", "--key", str(pub)]).exit_code == 0
        server.log.clear()
        res = runner.invoke(app, ["verify", server.url("other"), "--entry", "rec-001", "--key", str(pub)])
        assert res.exit_code == 0, res.output
        assert sorted(p.rsplit("/", 1)[1] for p in server.paths()) == sorted(OPENING)


def test_inspect_reads_index_shards_and_no_entry_file(http: FolderServer) -> None:
    res = runner.invoke(app, ["inspect", http.url("rel"), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["release"] == http.url("rel") and doc["entries"]["total"] == 5
    assert not [p for p in fetched(http) if p.startswith("entries/")]
    assert {p for p in fetched(http) if p.startswith("index/")}  # the records shown come from the shards


def test_verify_everything_fetches_every_file_and_says_what_http_cannot_check(http: FolderServer, rel: Path,
                                                                              pub: Path) -> None:
    res = runner.invoke(app, ["verify", http.url("rel"), "--key", str(pub)])
    assert res.exit_code == 0, res.output
    listed = {p.relative_to(rel).as_posix() for p in rel.rglob("*") if p.is_file() and p.stat().st_size}
    assert fetched(http) == listed | {"model.sig", "kvgraft-subset.json"}
    assert "cannot be listed over HTTP" in res.stderr


def test_a_tampered_entry_is_refused_naming_url_entry_and_bytes(http: FolderServer, rel: Path, pub: Path,
                                                                private_cache: Path) -> None:
    entry = Release.open(rel).entry("rec-002")
    a, b = entry["tensors"]["layer.1.values"]["byte_range"]
    path = rel / entry["file"]
    data = bytearray(path.read_bytes())
    data[a + 5] ^= 1
    path.write_bytes(bytes(data))
    res = runner.invoke(app, ["verify", http.url("rel"), "--entry", "rec-002", "--key", str(pub)])
    assert res.exit_code == 1
    line = res.stderr.strip()
    assert "\n" not in line
    assert f"{http.url('rel')}/{entry['file']}: entry 'rec-002': bytes [{a}, {b}) (tensor 'layer.1.values')" in line
    assert Release.open(rel).file_meta(entry)["sha256"] not in verified_pieces(private_cache)
    assert not list((private_cache / "partial").glob("*"))  # the bytes that failed are kept nowhere


def test_a_tampered_manifest_is_refused_naming_the_url(http: FolderServer, rel: Path, pub: Path) -> None:
    doc = json.loads((rel / "manifest.json").read_text())
    doc["created"] = "2000-01-01T00:00:00Z"
    (rel / "manifest.json").write_text(json.dumps(doc))
    res = runner.invoke(app, ["verify", http.url("rel"), "--entry", "rec-000", "--key", str(pub)])
    assert res.exit_code == 1
    assert res.stderr.startswith(f"kvgraft: error: {http.url('rel')}/manifest.json: sha256 ")
    assert not [p for p in fetched(http) if p.startswith(("index/", "entries/"))]


@pytest.mark.parametrize("kind", ["http", "https", "s3", "hf"])
def test_a_location_that_names_no_release_is_one_line(kind: str, tmp_path: Path) -> None:
    url = {"http": "http://", "https": "https://", "s3": "s3://", "hf": "hf://datasets/only-org"}[kind]
    res = runner.invoke(app, ["verify", url])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and "kvgraft: error:" in res.stderr, res.output


def test_an_audit_plan_names_a_release_by_its_url(http: FolderServer, rel: Path, tmp_path: Path) -> None:
    from kvgraft.audit.plan import Plan
    from kvgraft.audit.run import _existing
    from kvgraft.errors import InputError

    url, root = http.url("rel"), Release.open(rel).manifest["root_digest"]
    existing = _existing(Plan(tmp_path / "plan.toml", {"release": {"path": url, "root_digest": root}}))
    assert existing is not None and existing.origin.kind == "existing" and existing.release.location == url
    assert (existing.release.root / "manifest.json").is_file()
    with pytest.raises(InputError, match=f"^{re.escape(url)}: root digest {root} is not the plan's"):
        _existing(Plan(tmp_path / "plan.toml", {"release": {"path": url, "root_digest": "0" * 64}}))


def test_a_listed_file_never_replaces_the_manifest_or_a_signature_read_at_opening(http: FolderServer) -> None:
    from kvgraft.errors import InputError
    from kvgraft.remote.location import parse
    from kvgraft.remote.mirror import open_mirror

    loc = parse(http.url("rel"))
    assert loc is not None
    with open_mirror(loc) as opened:
        bundle = (opened.root / "release.sigstore.json").read_bytes()
        with pytest.raises(InputError, match=r"the manifest lists release\.sigstore\.json as a file of the release"):
            opened.fetch("release.sigstore.json", "0" * 64, 10, "entry 'x'", None)
        assert (opened.root / "release.sigstore.json").read_bytes() == bundle
    assert not opened.root.exists()


def test_report_verify_checks_the_binding_to_a_release_at_its_url(http: FolderServer, rel: Path, tmp_path: Path) -> None:
    from kvgraft.report.signing import sign_report
    from kvgraft.signing import keys

    doc = json.loads((Path(__file__).parents[1] / "fixtures" / "report-example.json").read_text())
    bundle_sha = hashlib.sha256((rel / "release.sigstore.json").read_bytes()).hexdigest()
    root = Release.open(rel).manifest["root_digest"]
    doc["binding"].update(release_root_digest=root, release_attestation_digest=bundle_sha)
    doc["release_root_digest"] = root
    report = tmp_path / "report.json"
    report.write_text(json.dumps(doc))
    private, public = keys.write_keypair(tmp_path / "auditor")
    sign_report(report, keys.load_private_key(private))
    res = runner.invoke(app, ["report", "verify", str(report), "--key", str(public), "--release", http.url("rel")])
    assert res.exit_code == 0, res.output
    assert "bound to the release" in res.stdout
    (rel / "release.sigstore.json").write_bytes(b"{}")  # the release at that URL is no longer the one audited
    res = runner.invoke(app, ["report", "verify", str(report), "--key", str(public), "--release", http.url("rel")])
    assert res.exit_code == 1 and f"{http.url('rel')}/release.sigstore.json: sha256 " in res.stderr
