"""A release read from S3 (moto's server on 127.0.0.1): what is used is fetched, checked, and named when it differs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvgraft.cli import app
from kvgraft.release.format import Release

from remote_servers import S3Server, s3_server, upload, verified_pieces

runner = CliRunner()
OPENING = {"manifest.json", "release.sigstore.json", "model.sig", "kvgraft-subset.json"}


@pytest.fixture(scope="module")
def server() -> Iterator[S3Server]:
    with s3_server() as s:
        yield s


@pytest.fixture()
def s3(server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """Credentials and endpoint the standard way: botocore's environment variables."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint)
    server.requests.seen.clear()
    return server


def test_verify_entry_from_s3_reads_only_that_entrys_objects(s3: S3Server, rel: Path, pub: Path,
                                                              private_cache: Path) -> None:
    upload(s3.endpoint, "releases", "v1/rel", rel)
    s3.requests.seen.clear()
    r = Release.open(rel)
    assert r.index is not None
    res = runner.invoke(app, ["verify", "s3://releases/v1/rel", "--entry", "rec-004", "--key", str(pub), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["checked_entries"] == ["rec-004"]
    shard, file = r.index.shards[r.index.owner["rec-004"]]["file"], r.entry("rec-004")["file"]
    assert {k.removeprefix("v1/rel/") for k in s3.gets("releases")} == OPENING | {shard, file}
    assert len(verified_pieces(private_cache)) == 2


def test_a_tampered_object_is_refused_naming_it(s3: S3Server, rel: Path, pub: Path, private_cache: Path) -> None:
    entry = Release.open(rel).entry("rec-000")
    path = rel / entry["file"]
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x40
    path.write_bytes(bytes(data))
    upload(s3.endpoint, "releases", "v2/rel", rel)
    res = runner.invoke(app, ["verify", "s3://releases/v2/rel", "--entry", "rec-000", "--key", str(pub)])
    assert res.exit_code == 1, res.output
    assert res.stderr.startswith(f"kvgraft: error: s3://releases/v2/rel/{entry['file']}: entry 'rec-000': bytes [")
    assert verified_pieces(private_cache) and not list((private_cache / "partial").glob("*"))


def test_verify_everything_lists_the_prefix_and_refuses_a_file_beside_the_release(s3: S3Server, rel: Path,
                                                                                   pub: Path) -> None:
    upload(s3.endpoint, "releases", "v3/rel", rel)
    assert runner.invoke(app, ["verify", "s3://releases/v3/rel", "--key", str(pub)]).exit_code == 0
    (rel / "entries" / "stray.bin").write_bytes(b"not listed")
    upload(s3.endpoint, "releases", "v4/rel", rel)
    res = runner.invoke(app, ["verify", "s3://releases/v4/rel", "--key", str(pub)])
    assert res.exit_code == 1
    assert "not part of the release: entries/stray.bin" in res.stderr and "s3://releases/v4/rel" in res.stderr


def test_a_missing_object_is_named(s3: S3Server, rel: Path, pub: Path) -> None:
    entry = Release.open(rel).entry("rec-001")
    (rel / entry["file"]).unlink()
    upload(s3.endpoint, "releases", "v5/rel", rel)
    res = runner.invoke(app, ["verify", "s3://releases/v5/rel", "--entry", "rec-001", "--key", str(pub)])
    assert res.exit_code == 1
    assert f"s3://releases/v5/rel/{entry['file']}: entry 'rec-001': missing on the server" in res.stderr


def test_a_stray_object_at_the_top_of_the_prefix_is_refused(s3: S3Server, rel: Path, pub: Path) -> None:
    (rel / "stray.bin").write_bytes(b"not listed")
    upload(s3.endpoint, "releases", "v6/rel", rel)
    res = runner.invoke(app, ["verify", "s3://releases/v6/rel", "--key", str(pub)])
    assert res.exit_code == 1, res.output
    assert "not part of the release: stray.bin" in res.stderr and "s3://releases/v6/rel" in res.stderr


def test_no_credentials_is_one_line_at_once(s3: S3Server, pub: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    started = time.monotonic()
    res = runner.invoke(app, ["verify", "s3://releases/v1/rel", "--entry", "rec-000", "--key", str(pub)])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1, res.output
    assert "not retried" in res.stderr and "credentials" in res.stderr.lower()
    assert time.monotonic() - started < 5
