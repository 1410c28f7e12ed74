"""hf:// locations through huggingface_hub, against a local server standing in for the Hub (HF_ENDPOINT): the revision
pinned to one commit, the files read at its resolve/ URLs with the token, HF_HUB_OFFLINE honoured."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvgraft.cli import app
from kvgraft.release.format import Release
from kvgraft.remote.location import parse

from remote_servers import HUB_COMMIT, FolderServer, hub_server

runner = CliRunner()
COMMIT = HUB_COMMIT


@pytest.fixture()
def hub(rel: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FolderServer]:
    with hub_server(rel, tmp_path, monkeypatch) as server:
        yield server


def test_hf_location_is_parsed_as_the_hub_writes_it() -> None:
    loc = parse("hf://datasets/org/kv-releases@refs%2Fpr%2F3/releases/v1/")
    assert loc is not None
    assert (loc.kind, loc.repo_type, loc.repo_id, loc.revision, loc.prefix) == (
        "hf", "dataset", "org/kv-releases", "refs/pr/3", "releases/v1")
    model = parse("hf://org/model-repo/rel")
    assert model is not None and (model.repo_type, model.revision, model.prefix) == ("model", None, "rel")


def test_verify_entry_from_the_hub_reads_at_the_pinned_commit_with_the_token(hub: FolderServer, rel: Path,
                                                                             pub: Path) -> None:
    url = "hf://datasets/org/kv-releases@main/releases/v1"
    res = runner.invoke(app, ["verify", url, "--entry", "rec-002", "--key", str(pub), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["release"] == url and doc["checked_entries"] == ["rec-002"]
    assert f"revision main is commit {COMMIT}" in " ".join(doc["warnings"])
    files = [r for r in hub.log if "/resolve/" in r.path]
    assert files and all(f"/resolve/{COMMIT}/" in r.path for r in files)  # never at the moving branch
    ours = [r for r in hub.log if "org/kv-releases" in r.path]  # (the library may ask the Hub other things too)
    assert {r.authorization for r in ours} == {"Bearer hf_kvgraft_test_token"}
    entry_file = Release.open(rel).entry("rec-002")["file"]
    assert [r.path.rsplit("/v1/", 1)[1] for r in files if "/entries/" in r.path] == [entry_file]


def test_a_commit_in_the_location_needs_no_resolution(hub: FolderServer, pub: Path) -> None:
    res = runner.invoke(app, ["inspect", f"hf://datasets/org/kv-releases@{COMMIT}/releases/v1", "--json"])
    assert res.exit_code == 0, res.output
    assert not [r for r in hub.log if r.path.startswith("/api/")]


def test_hub_offline_mode_refuses_an_hf_location(hub: FolderServer, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    res = runner.invoke(app, ["inspect", "hf://datasets/org/kv-releases@main/releases/v1"])
    assert res.exit_code == 2 and "HF_HUB_OFFLINE is set" in res.stderr
    assert hub.log == []


def test_an_unknown_revision_is_one_line(hub: FolderServer) -> None:
    res = runner.invoke(app, ["inspect", "hf://datasets/org/kv-releases@no-such-branch/releases/v1"])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1
    assert "the Hub cannot resolve dataset org/kv-releases at revision no-such-branch" in res.stderr
