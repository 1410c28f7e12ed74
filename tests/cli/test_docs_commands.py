"""The CI checks in docs/ci-signing.md run as written (on a small synthetic release).

Each shell block after a `<!-- ci-check: NAME -->` marker is run with bash -e in a folder holding
`release/`, with this environment's kvgraft and model_signing first on PATH. The `pip install` line
is skipped (this environment has the packages: the `oms` extra).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from release_factory import make_many, make_release

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
needs_cli = pytest.mark.skipif(not (shutil.which("model_signing") or (BIN / "model_signing").exists()),
                               reason="model_signing CLI not installed")


def blocks(path: Path) -> dict[str, str]:
    text = path.read_text()
    return {m.group(1): m.group(2) for m in re.finditer(r"<!-- ci-check: ([\w-]+) -->\s*```sh\n(.*?)```", text, re.S)}


def run(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    lines = [ln for ln in script.splitlines() if not ln.startswith("pip install")]
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(["bash", "-euo", "pipefail", "-c", "\n".join(lines)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    make_release(tmp_path / "release", entries=2, seed=11)
    return tmp_path


def test_every_ci_check_block_is_found() -> None:
    assert set(blocks(REPO / "docs/ci-signing.md")) == {"interop", "oms", "oms-converse", "oms-published", "sample"}


@needs_cli
def test_docs_oms_check_and_converse_run_as_written(workdir: Path) -> None:
    docs = blocks(REPO / "docs/ci-signing.md")
    for name in ("oms", "oms-converse"):
        r = run(docs[name], workdir)
        assert r.returncode == 0, (name, r.stdout, r.stderr)
    # and the same check fails after one flipped byte
    entry = sorted((workdir / "release/entries").iterdir())[0]
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 1
    entry.write_bytes(bytes(data))
    assert run(docs["oms-converse"].splitlines()[-1], workdir).returncode == 1


@needs_cli
@pytest.mark.skipif(not (shutil.which("git") and shutil.which("openssl")), reason="needs git and openssl")
def test_docs_published_oms_check_runs_as_written(workdir: Path) -> None:
    """A P-384 Hub signer beside the kvgraft signer, in a git repository with a card, then detached."""
    script = blocks(REPO / "docs/ci-signing.md")["oms-published"]
    r = run(script, workdir)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "release.sigstore.json verified with key" in r.stdout and "README.md" in r.stdout
    (workdir / "release" / "README.md").write_text("# edited\n")  # the card is signed by the Hub signer's model.sig
    assert run(script.splitlines()[-1], workdir).returncode == 1


@needs_cli
def test_interop_ci_check_runs_as_written(workdir: Path) -> None:
    r = run("kvgraft keygen --out release-signer\n" + blocks(REPO / "docs/ci-signing.md")["interop"], workdir)
    assert r.returncode == 0, (r.stdout, r.stderr)


def test_docs_sampled_check_runs_as_written(tmp_path: Path) -> None:
    """The sampled CI check: passes on a signed 1,000-entry release, fails after one flipped byte in a drawn entry."""
    from kvgraft import sampling
    from kvgraft.release.format import Release

    make_many(tmp_path / "release", entries=1000)
    script = blocks(REPO / "docs/ci-signing.md")["sample"]
    setup = "kvgraft keygen --out release-signer\nkvgraft sign release --key release-signer.key.pem\n"
    r = run(f"export GITHUB_SHA=0123abcd\n{setup}{script}", tmp_path)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "0 of 300 sampled entries damaged: at most" in " ".join(r.stdout.split())
    rel = Release.open(tmp_path / "release")
    drawn = rel.entry(rel.entry_ids()[sampling.draw(rel.manifest["root_digest"], "0123abcd", 1000, 300)[-1]])
    entry = tmp_path / "release" / drawn["file"]
    data = bytearray(entry.read_bytes())
    data[-3] ^= 1
    entry.write_bytes(bytes(data))
    r = run(f"export GITHUB_SHA=0123abcd\n{script}", tmp_path)
    assert r.returncode == 1 and drawn["id"] in r.stderr, (r.stdout, r.stderr)
