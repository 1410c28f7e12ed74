"""`kvgraft run` on a release served over HTTP: the same continuation as from the folder, only the grafted entry's
pieces transferred, and a tampered piece refused before a byte of it is grafted."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvgraft.cli import app
from kvgraft.release.format import Release
from kvgraft.signing import keys, sign

from remote_servers import folder_server

runner = CliRunner()
TEXT = " ".join(f"w{i}" for i in range(40))


@pytest.fixture(scope="module")
def captured(tiny_lm: Callable[[str], Any], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Three entries captured with the tiny llama (one long enough for a prefix graft), signed: (release, key)."""
    from kvgraft.inference import capture

    base = tmp_path_factory.mktemp("remote-run")
    records = [("t", {"id": "long", "text": TEXT}), ("t", {"id": "e1", "text": "Mia has 3 apples."}),
               ("t", {"id": "e2", "text": "Tom has 5 pears."})]
    capture.capture(tiny_lm("llama"), records, base / "rel", probe_tokens=0)
    private, public = keys.write_keypair(base / "signer")
    sign.sign_release(base / "rel", keys.load_private_key(private))
    return base / "rel", public


def run(tiny_dir: Callable[[str], Path], release: str, pub: Path, *args: str) -> Any:
    return runner.invoke(app, ["run", release, "--model", str(tiny_dir("llama")), "-n", "4", "--key", str(pub),
                               "--json", *args])


def test_run_entry_over_http_grafts_what_the_folder_grafts_and_fetches_only_that_entry(
        captured: tuple[Path, Path], tiny_dir: Callable[[str], Path]) -> None:
    rel, pub = captured
    local = run(tiny_dir, str(rel), pub, "--entry", "e1", "--prompt", " How many?")
    assert local.exit_code == 0, local.output
    with folder_server(rel=rel) as server:
        remote = run(tiny_dir, server.url("rel"), pub, "--entry", "e1", "--prompt", " How many?")
        assert remote.exit_code == 0, remote.output
        r = Release.open(rel)
        assert r.index is not None
        used = {r.index.shards[r.index.owner["e1"]]["file"], r.entry("e1")["file"]}
        got = {p.split("/rel/", 1)[1] for p in server.paths()}
        assert got - {"manifest.json", "release.sigstore.json", "model.sig", "kvgraft-subset.json"} == used
    assert json.loads(remote.stdout)["token_ids"] == json.loads(local.stdout)["token_ids"]


def test_run_prefix_over_http_reads_the_prefix_index(captured: tuple[Path, Path], tiny_dir: Callable[[str], Path]) -> None:
    rel, pub = captured
    with folder_server(rel=rel) as server:
        res = run(tiny_dir, server.url("rel"), pub, "--prefix", "--prompt", TEXT + " and more")
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["entry"] == "long"
        got = {p.split("/rel/", 1)[1] for p in server.paths()}
    r = Release.open(rel)
    assert "index/prefix.bin" in got and r.entry("long")["file"] in got
    assert r.entry("e1")["file"] not in got and r.entry("e2")["file"] not in got


def test_run_refuses_a_tampered_entry_naming_it(captured: tuple[Path, Path], tiny_dir: Callable[[str], Path],
                                                tmp_path: Path) -> None:
    rel = Path(shutil.copytree(captured[0], tmp_path / "rel"))
    entry = Release.open(rel).entry("e2")
    path = rel / entry["file"]
    data = bytearray(path.read_bytes())
    data[-2] ^= 0x01
    path.write_bytes(bytes(data))
    with folder_server(rel=rel) as server:
        res = run(tiny_dir, server.url("rel"), captured[1], "--entry", "e2")
        assert res.exit_code == 1
        assert res.stderr.startswith(f"kvgraft: error: {server.url('rel')}/{entry['file']}: entry 'e2': bytes [")
        assert res.stdout == ""  # nothing was generated from the grafted bytes


def test_audit_recompute_of_a_sample_over_http_fetches_only_the_sampled_entry(
        captured: tuple[Path, Path], tiny_dir: Callable[[str], Path], tmp_path: Path) -> None:
    rel, pub = captured
    with folder_server(rel=rel) as server:
        res = runner.invoke(app, ["audit", "recompute", server.url("rel"), "--model", str(tiny_dir("llama")),
                                  "--sample", "1", "--nonce", "n1", "--key", str(pub), "--quiet",
                                  "--out", str(tmp_path / "out.json")])
        assert res.exit_code == 0, res.output
        entries = {p.split("/rel/", 1)[1] for p in server.paths() if "/entries/" in p}
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["sample"]["entries"] and len(doc["sample"]["entries"]) == 1
    assert entries == {Release.open(rel).entry(doc["sample"]["entries"][0])["file"]}
