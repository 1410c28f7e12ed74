"""`kvgraft inspect`: what a release holds, from its manifest alone, saying plainly that nothing was verified."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_attest import schema_validator
from test_verify_no_torch import CLI, FIXTURES
from test_verify_no_torch import run as run_blocked
from typer.testing import CliRunner

from kvgraft.cli import app
from kvgraft.signing import keys

import rewrite
from release_factory import make_release, signed_release, unsign
from third_party import needs_sigstore_bundles

runner = CliRunner()
WIDE = {"COLUMNS": "200"}


@pytest.fixture(autouse=True)
def wide_console() -> Any:
    """Tables at 200 columns whatever the environment says (rich reads the width on each print otherwise)."""
    from kvgraft.cli._base import out

    before = out._width
    out.width = 200
    yield
    out._width = before


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root, private, _public = signed_release(tmp_path_factory.mktemp("inspect"), entries=7, seed=5)
    return root, keys.key_id(keys.load_private_key(private))


def manifest(root: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((root / "manifest.json").read_text())
    return doc


def inspect_json(*args: str) -> dict[str, Any]:
    r = runner.invoke(app, ["inspect", *args, "--json"])
    assert r.exit_code == 0, r.output
    doc: dict[str, Any] = json.loads(r.stdout)
    assert list(schema_validator("inspect-result.v1.json").iter_errors(doc)) == []
    return doc


def test_listing_names_model_conditions_signers_and_entries(signed: tuple[Path, str]) -> None:
    root, kid = signed
    m = manifest(root)
    r = runner.invoke(app, ["inspect", str(root)], env=WIDE)
    assert r.exit_code == 0, r.output
    text = r.stdout
    for what in (m["model"]["spec"], m["model"]["identity"]["sha256"], m["model"]["identity"]["weights_sha256"],
                 m["root_digest"], "one-shot", m["environment"]["device_name"], m["environment"]["torch"], kid):
        assert what in text, what
    assert "NOT verified" in text and "no signature was checked" in text and "model.sig" in text
    for e in m["entries"]:
        size = m["files"][e["file"]]["size"]
        line = next(x for x in text.splitlines() if f" {e['id']} " in x)
        assert f"{size:,}" in line and " text " in line and e["source"]["text"].split()[0] in line
        assert str(e["num_tokens"]) in line


def test_json_pages_with_limit_and_offset(signed: tuple[Path, str]) -> None:
    root, kid = signed
    m = manifest(root)
    ids = [e["id"] for e in m["entries"]]
    doc = inspect_json(str(root), "--limit", "3", "--offset", "2")
    assert doc["verified"] is False and "not verified" in doc["note"]
    assert doc["entries"]["total"] == 7 and [r["id"] for r in doc["entries"]["rows"]] == ids[2:5]
    assert doc["model"] == m["model"] and doc["schedule"] == m["schedule"] and doc["environment"] == m["environment"]
    assert {s["file"]: (s["method"], s["signer"], s["verified"]) for s in doc["signatures"]} == {
        "release.sigstore.json": ("key", kid, False), "model.sig": ("key", doc["signatures"][1]["signer"], False)}
    assert doc["signatures"][0]["names_this_manifest"] is True
    assert [r["id"] for r in inspect_json(str(root), "--limit", "0")["entries"]["rows"]] == ids
    assert inspect_json(str(root), "--offset", "7")["entries"]["rows"] == []
    r = runner.invoke(app, ["inspect", str(root), "--limit", "2"], env=WIDE)
    assert "5 more: --offset 2" in r.stdout
    r = runner.invoke(app, ["inspect", str(root), "--offset", "-1"])
    assert r.exit_code == 2 and "--offset" in r.output


def test_one_entry_in_detail(signed: tuple[Path, str]) -> None:
    root, _ = signed
    e = manifest(root)["entries"][4]
    doc = inspect_json(str(root), e["id"])["entry"]
    assert doc["layers"] == e["layers"] and doc["digest"] == e["digest"]
    assert {t["name"]: (t["dtype"], t["shape"], t["sha256"]) for t in doc["tensors"]} == {
        n: (t["dtype"], t["shape"], t["sha256"]) for n, t in e["tensors"].items()}
    r = runner.invoke(app, ["inspect", str(root), e["id"]], env=WIDE)
    assert r.exit_code == 0, r.output
    for name, t in e["tensors"].items():
        line = next(x for x in r.stdout.splitlines() if f" {name} " in x and t["sha256"] in x)
        assert "×".join(map(str, t["shape"])) in line and t["dtype"] in line
    assert "layers (2)" in r.stdout and "not verified" in r.stdout
    r = runner.invoke(app, ["inspect", str(root), "no-such-entry"])
    assert r.exit_code == 2 and "no-such-entry" in r.output


def test_reads_no_entry_file(signed: tuple[Path, str], tmp_path: Path) -> None:
    """Entry files that are garbage or absent change nothing: inspect reads the manifest only."""
    root = Path(shutil.copytree(signed[0], tmp_path / "rel"))
    before = inspect_json(str(root), "--limit", "0")
    detail = inspect_json(str(root), "rec-001")
    files = sorted((root / "entries").iterdir())
    files[0].unlink()
    for f in files[1:]:
        f.write_bytes(b"\xff" * 7)
    assert inspect_json(str(root), "--limit", "0") == before
    assert inspect_json(str(root), "rec-001") == detail
    assert inspect_json(str(root), "rec-000")["entry"]["id"] == "rec-000"
    # ... while verify does read them: the same release is refused there.
    assert runner.invoke(app, ["verify", str(root)]).exit_code == 1


def test_unsigned_and_unreadable_signatures(signed: tuple[Path, str], tmp_path: Path) -> None:
    root = Path(shutil.copytree(signed[0], tmp_path / "rel"))
    (root / "release.sigstore.json").write_text("{not json")
    doc = inspect_json(str(root))
    bundle = next(s for s in doc["signatures"] if s["file"] == "release.sigstore.json")
    assert bundle["method"] is None and "release.sigstore.json" in bundle["problem"]
    unsign(root)
    assert inspect_json(str(root))["signatures"] == []
    r = runner.invoke(app, ["inspect", str(root)], env=WIDE)
    assert "none: the release is unsigned" in r.stdout


def test_stale_bundle_is_named_not_trusted(signed: tuple[Path, str], tmp_path: Path) -> None:
    root = Path(shutil.copytree(signed[0], tmp_path / "rel"))
    rewrite.manifest(root, lambda m: m["entries"][0]["source"].update(text="changed after signing"))
    doc = inspect_json(str(root))
    assert doc["signatures"][0]["names_this_manifest"] is False
    r = runner.invoke(app, ["inspect", str(root)], env=WIDE)
    assert "ANOTHER root digest" in r.stdout


@needs_sigstore_bundles
def test_sigstore_bundle_names_its_certificate_identity(signed: tuple[Path, str], tmp_path: Path) -> None:
    root = Path(shutil.copytree(signed[0], tmp_path / "rel"))
    shutil.copy(FIXTURES / "a.dsse.staging-rekor-v2.txt.sigstore.json", root / "release.sigstore.json")
    sig = inspect_json(str(root))["signatures"][0]
    assert sig["method"] == "sigstore" and sig["verified"] is False
    assert sig["signer"] and "@" in sig["signer"] and str(sig["issuer"]).startswith("https://")


def test_hostile_names_are_printed_escaped(signed: tuple[Path, str], tmp_path: Path) -> None:
    root = Path(shutil.copytree(signed[0], tmp_path / "rel"))
    unsign(root)

    def change(m: dict[str, Any]) -> None:
        m["entries"][0]["id"] = "evil\x1b[2J\nid[/]"
        m["entries"][0]["source"]["text"] = "[bold red]markup[/] \u202ereversed"

    rewrite.manifest(root, change)
    r = runner.invoke(app, ["inspect", str(root)], env=WIDE)
    assert r.exit_code == 0, r.output
    assert "\x1b" not in r.stdout and "\u202e" not in r.stdout
    assert "evil\\x1b[2J\\x0aid[/]" in r.stdout and "[bold red]markup[/]" in r.stdout


def test_inspect_imports_no_torch(signed: tuple[Path, str], tmp_path: Path) -> None:
    root, kid = signed
    r = run_blocked(CLI, "inspect", str(root), tmp=tmp_path)
    assert r["code"] == 0, r["stderr"]
    assert r["torch_imported"] is False and kid in str(r["stdout"]).replace("\n", "").replace(" ", "")
    r = run_blocked(CLI, "inspect", str(root), "rec-002", "--json", tmp=tmp_path)
    assert r["code"] == 0, r["stderr"]
    assert r["torch_imported"] is False and '"layers"' in str(r["stdout"])


def test_library_inspection_imports_no_torch(signed: tuple[Path, str], tmp_path: Path) -> None:
    script = CLI.split("from kvgraft.cli import app")[0] + (
        "from kvgraft import inspection\n"
        "d = inspection.inspect(sys.argv[1], limit=None)\n"
        "report(n=len(d['entries']['rows']))\n")
    env = {**os.environ}
    proc = subprocess.run([sys.executable, "-c", script, str(signed[0])], capture_output=True, text=True, env=env,
                          timeout=120, check=False)
    result = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[7:])
    assert result == {"n": 7, "torch_imported": False}


def test_preview_is_the_first_words() -> None:
    from kvgraft.inspection import preview

    assert preview({"kind": "text", "text": "one two  three\nfour five six seven eight nine ten"}) == \
        "one two three four five six seven eight…"
    assert preview({"kind": "text", "text": "short text"}) == "short text"
    assert preview({"kind": "messages", "messages": [{"role": "user", "content": "What is 2 + 2?"},
                                                     {"role": "assistant", "content": "4"}]}) == "user: What is 2 + 2?"
    assert preview({"kind": "text", "text": "x" * 100}) == "x" * 60 + "…"
    assert preview({"kind": "messages", "messages": []}) == ""


def test_format_2_pages_read_only_their_shards(tmp_path: Path) -> None:
    """An indexed release: a page reads the shards that hold its records, never an entry file."""
    from kvgraft.inspection import Listing

    root = tmp_path / "rel2"
    make_release(root, entries=200, seed=3, format_version=2, shard_entries=16)
    for f in (root / "entries").rglob("*.safetensors"):
        f.write_bytes(b"\xff" * 7)  # garbage: inspect must not need them
    listing = Listing.open(root)
    index = listing._release.index
    assert index is not None and listing.count() == 200
    ids = listing._release.entry_ids()
    rows = listing.page(100, 5)
    assert [r["id"] for r in rows] == ids[100:105]
    shard_size = max(s["size"] for s in index.shards)
    assert 0 < index.bytes_read <= 2 * shard_size  # records 100-104 live in one or two shards of 16
    doc = inspect_json(str(root), "--limit", "3", "--offset", "197")
    assert doc["entries"]["total"] == 200 and [r["id"] for r in doc["entries"]["rows"]] == ids[197:]
    assert all(r["bytes"] > 7 for r in doc["entries"]["rows"])  # the record's size, not the file's


def test_inspect_json_refused_midway_prints_no_half_document(tmp_path: Path) -> None:
    """The rows are read shard by shard; a shard refused after others were read must leave no half document:
    stdout holds the refusal's document alone (ok false, its exit code and line), the line on stderr; the control
    lists every row."""
    rel = tmp_path / "rel"
    make_release(rel, entries=5, format_version=2, shard_entries=2)
    good = runner.invoke(app, ["inspect", str(rel), "--limit", "0", "--json"])
    assert good.exit_code == 0, good.output
    assert [r["id"] for r in json.loads(good.stdout)["entries"]["rows"]] == [f"rec-{i:03d}" for i in range(5)]
    last = rel / "index" / "00002.json"
    last.write_bytes(last.read_bytes().replace(b"rec-004", b"rec-00X"))  # same size, another digest
    r = runner.invoke(app, ["inspect", str(rel), "--limit", "0", "--json"])
    assert r.exit_code == 1, r.output
    doc = json.loads(r.stdout)
    assert set(doc) == {"format", "format_version", "kvgraft_version", "release", "ok", "exit_code", "error"}
    assert doc["ok"] is False and doc["exit_code"] == 1 and r.stderr.strip() == f"kvgraft: error: {doc['error']}"
    assert "index shard 2" in r.stderr and "does not match the manifest" in r.stderr
