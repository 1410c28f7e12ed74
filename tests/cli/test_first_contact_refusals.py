"""What a new user meets first: `inspect --json` answers a refusal with a document, as `verify --json` does; help
read by a pipe that closes early ends with status 0; a negative `cache ls --limit` is refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvgraft.cli import app
from kvgraft.errors import EXIT_INPUT
from kvgraft.schema import validate

runner = CliRunner()
KVGRAFT = [sys.executable, "-c", "from kvgraft.cli import entrypoint; entrypoint()"]


@pytest.mark.parametrize("args", [["/nonexistent/release"], ["/nonexistent/release", "rec-000"]])
def test_inspect_json_prints_a_document_when_it_refuses(args: list[str], tmp_path: Path) -> None:
    r = runner.invoke(app, ["inspect", *args, "--json"])
    assert r.exit_code == EXIT_INPUT
    doc = json.loads(r.stdout)
    validate(doc, "inspect-result.v1.json", "inspect --json")
    assert doc["ok"] is False and doc["exit_code"] == EXIT_INPUT and doc["release"] == args[0]
    assert r.stderr.strip() == f"kvgraft: error: {doc['error']}"
    (tmp_path / "manifest.json").write_text("{")
    r = runner.invoke(app, ["inspect", str(tmp_path), "--json"])
    assert r.exit_code == EXIT_INPUT and "invalid JSON" in json.loads(r.stdout)["error"]


@pytest.mark.parametrize("args", [["--help"], ["verify", "--help"], ["audit", "run", "--help"]])
def test_help_into_a_pipe_closed_at_once_ends_with_status_0(args: list[str]) -> None:
    """`kvgraft --help | head -c 0`: the reader took what it wanted; no error, no traceback."""
    shell = " ".join([*(f"'{a}'" for a in KVGRAFT), *args]) + " | head -c 0; echo ${PIPESTATUS[0]}"
    r = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "0" and r.stderr == "", (r.stdout, r.stderr)


def test_cache_ls_refuses_a_negative_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVGRAFT_HOME", str(tmp_path))
    r = runner.invoke(app, ["cache", "ls", "--limit", "-5"])
    assert r.exit_code == EXIT_INPUT and "--limit -5: expected a number of at least 0" in r.stderr, r.output
    assert runner.invoke(app, ["cache", "ls", "--limit", "0"]).exit_code == 0
