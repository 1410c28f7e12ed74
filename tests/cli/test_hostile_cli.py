"""Hostile releases (the indexed format): what the command line does with them.

- an output on a read-only filesystem is refused (exit 2, one line) before any model loads or release is hashed.
- every --json escapes control, bidi and separator characters as JSON \\u sequences, as text mode escapes them.
- `run --key A --key B` follows verify's rule: each key must verify one of the signatures.
- `audit sample --check` compares values as JSON (`true` is not 1) and cuts what it quotes.
- a reader that closed the pipe ends the command quietly (status 141, as a Unix tool killed by SIGPIPE).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvgraft import sampling
from kvgraft._internal import jsonio
from kvgraft.cli import app
from kvgraft.cli._base import EXIT_PIPE
from kvgraft.errors import EXIT_FAILED, EXIT_INPUT, InputError
from kvgraft.inference import models
from kvgraft.release.format import Release
from kvgraft.render.text import json_text
from kvgraft.signing import keys

import rewrite
from release_factory import make_release, unsign

runner = CliRunner()
KVGRAFT = [sys.executable, "-c", "from kvgraft.cli import entrypoint; entrypoint()"]
HOSTILE = "a\u202eb\u2028c\u009bd"  # a bidi override, a line separator, a C1 control (CSI)
RAW = ("\u202e", "\u2028", "\u009b")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile-cli") / "rel"
    make_release(root, entries=3, seed=11)
    return root


@pytest.fixture
def release(built: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(built, tmp_path / "rel"))


class ModelLoaded(InputError):
    """What the tests' models.load raises: the command got as far as loading a model."""


@pytest.fixture
def no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    def load(*args: Any, **kwargs: Any) -> Any:
        raise ModelLoaded("models.load was called")

    monkeypatch.setattr(models, "load", load)


def _one_line(r: Any) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.output, r.output
    return str(lines[0])


# ------------------------------------------------------------------------------ 6: read-only outputs


def _commands(release: Path, out: Path, tmp_path: Path) -> dict[str, list[str]]:
    """Each command that writes an output, writing it into `out`; `release` is a signed release for recompute."""
    private, _ = keys.write_keypair(tmp_path / "signer")
    src = tmp_path / "src.jsonl"
    src.write_text(json.dumps({"id": "e0", "text": "Problem 0: Mia has 3 apples."}) + "\n")
    return {"keygen": ["keygen", "--out", str(out / "k")],
            "sign": ["sign", str(out / "rel"), "--key", str(private)],
            "capture": ["capture", str(src), "--out", str(out / "captured")],
            "audit recompute": ["audit", "recompute", str(release), "--out", str(out / "result.json")]}


def test_an_output_that_cannot_be_written_is_refused_before_any_model_loads(
        release: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_model: None) -> None:
    """The probe of check_writable meets the error a read-only filesystem gives (as the test below, on a real one,
    where a machine allows it). Was: exit 70 (OSError 30), capture and recompute only after loading the model."""
    out = tmp_path / "out"
    shutil.copytree(release, out / "rel")
    commands = _commands(release, out, tmp_path)
    assert runner.invoke(app, commands["capture"]).exit_code == EXIT_INPUT  # control: this one loads a model...
    assert "models.load was called" in runner.invoke(app, commands["capture"]).stderr  # ...and gets that far

    def read_only(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(jsonio.tempfile, "TemporaryFile", read_only)
    for name, args in commands.items():
        r = runner.invoke(app, args)
        line = _one_line(r)
        assert r.exit_code == EXIT_INPUT and "Read-only file system" in line and str(out) in line, (name, r.output)
        assert "models.load" not in line
    assert sorted(p.name for p in out.iterdir()) == ["rel"] and not (out / "rel" / "release.sigstore.json").exists()


_IN_A_READ_ONLY_MOUNT = """
import json, sys
from typer.testing import CliRunner
from kvgraft.cli import app
from kvgraft.inference import models

def load(*args, **kwargs):
    raise SystemExit("models.load was called")

models.load = load
results = {}
for name, args in json.loads(sys.argv[1]).items():
    r = CliRunner().invoke(app, args)
    results[name] = [r.exit_code, r.stderr]
print("RESULT " + json.dumps(results))
"""


def _can_mount_read_only(folder: Path) -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o ro tmpfs '{folder}'"],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


def test_outputs_on_a_real_read_only_filesystem_are_refused(release: Path, tmp_path: Path) -> None:
    """A tmpfs mounted read-only in a private mount namespace (root, `unshare -m`); the commands run there with
    models.load replaced by an exit that says it was called."""
    out = tmp_path / "ro"
    out.mkdir()
    if not _can_mount_read_only(out):
        pytest.skip("this machine does not let the tests mount a read-only tmpfs (needs root and unshare -m); "
                    "the test above covers the same refusals through the probe")
    commands = _commands(release, out, tmp_path)
    script = (f"mount -t tmpfs tmpfs '{out}' && cp -r '{release}' '{out}/rel' && mount -o remount,ro '{out}' && "
              f"exec \"$0\" -c \"$1\" \"$2\"")
    proc = subprocess.run(["unshare", "-m", "sh", "-c", script, sys.executable, _IN_A_READ_ONLY_MOUNT,
                           json.dumps(commands)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    for name, (code, stderr) in results.items():
        assert code == EXIT_INPUT and stderr.count("\n") == 1, (name, code, stderr)
        assert "Read-only file system" in stderr and str(out) in stderr, (name, stderr)
    assert list(out.iterdir()) == []  # the mount was private to that namespace


# ----------------------------------------------------------------------- 7: --json escapes what text escapes


def test_json_text_escapes_each_character_plain_escapes() -> None:
    doc = {"k\u202e": [HOSTILE, "\x7f", "\U000e0001", "caf\u00e9 \u2192 \u4e2d", "\ud800"]}
    text = json_text(doc)
    for c in (*RAW, "\x7f", "\U000e0001", "\ud800"):
        assert c not in text
    assert "caf\u00e9 \u2192 \u4e2d" in text  # other text as it is
    assert "\\ud800" in text and "\\udb40\\udc01" in text  # a lone surrogate; beyond the BMP, a surrogate pair
    assert json.loads(text) == doc


def test_inspect_json_escapes_bidi_and_c1_characters(release: Path) -> None:
    """Was: raw U+202E, U+2028 and U+009B in `inspect --json` (text mode escapes them)."""
    unsign(release)

    def change(m: dict[str, Any]) -> None:
        m["entries"][0]["id"] = HOSTILE
        m["entries"][0]["source"]["text"] = f"text {HOSTILE}"

    rewrite.manifest(release, change)
    for args in (["inspect", str(release), "--json"], ["inspect", str(release), HOSTILE, "--json"]):
        r = runner.invoke(app, args)
        assert r.exit_code == 0, r.output
        assert not any(c in r.stdout for c in RAW), args
        assert "\\u202e" in r.stdout and "\\u2028" in r.stdout and "\\u009b" in r.stdout
        assert HOSTILE in json.dumps(json.loads(r.stdout), ensure_ascii=False)  # the same strings, escaped


def test_run_json_escapes_bidi_and_c1_characters(tiny_dir: Callable[[str], Path], tmp_path: Path) -> None:
    """Was: raw U+202E, U+2028 and U+009B in `run --json` (the entry id it grafted)."""
    model = tiny_dir("llama")
    src = tmp_path / "src.jsonl"
    src.write_text(json.dumps({"id": HOSTILE, "text": "Problem 1: Mia has 3 apples."}) + "\n")
    made = runner.invoke(app, ["capture", str(src), "--out", str(tmp_path / "rel"), "--model", str(model), "--probe", "1"])
    assert made.exit_code == 0, made.output
    r = runner.invoke(app, ["run", str(tmp_path / "rel"), "--entry", HOSTILE, "--prompt", " Answer:", "-n", "2",
                            "--model", str(model), "--json"])
    assert r.exit_code == 0, r.output
    assert not any(c in r.stdout for c in RAW)
    assert json.loads(r.stdout)["entry"] == HOSTILE


# ------------------------------------------------------------------------------- 8: run --key A --key B


def test_run_with_two_keys_follows_verifys_rule(release: Path, tmp_path: Path, no_model: None) -> None:
    """Was: `run --key STRAY --key SIGNER` used the last key only and went on; verify refused the same two keys."""
    private, public = keys.write_keypair(tmp_path / "signer")
    _, stray = keys.write_keypair(tmp_path / "stray")
    assert runner.invoke(app, ["sign", str(release), "--key", str(private)]).exit_code == 0
    run = ["run", str(release), "--entry", "rec-000", "--prompt", "x"]
    r = runner.invoke(app, [*run, "--key", str(public)])
    assert r.exit_code == EXIT_INPUT and "models.load was called" in r.stderr, r.output  # control: verified, went on
    for command in (run, ["verify", str(release)], ["audit", "recompute", str(release)]):
        r = runner.invoke(app, [*command, "--key", str(stray), "--key", str(public)])
        line = _one_line(r)
        assert r.exit_code == EXIT_FAILED and f"key {keys.key_id(keys.load_public_key(stray))} verifies no signature" \
            in line, (command, r.output)


# --------------------------------------------------------------------------------- 10: audit sample --check


def _recorded(release: Path, tmp_path: Path, **change: Any) -> Path:
    rel = Release.open(release)
    sample = sampling.sample_record(rel.manifest["root_digest"], "nonce-1", rel.entry_ids(), rel.token_counts(), 1,
                                    nonce_source="auditor")
    sample.update(change)
    path = tmp_path / "result.json"
    path.write_text(json.dumps({"sample": sample}))
    return path


def test_sample_check_compares_as_json_and_cuts_what_it_quotes(release: Path, tmp_path: Path) -> None:
    """Was: `"size": true` accepted as 1; a 10 MB nonce echoed in a 10 MB error line."""
    check = ["audit", "sample", str(release), "--check"]
    r = runner.invoke(app, [*check, str(_recorded(release, tmp_path))])
    assert r.exit_code == 0 and "identical" in r.stdout, r.output  # control
    r = runner.invoke(app, [*check, str(_recorded(release, tmp_path, size=True))])
    line = _one_line(r)
    assert r.exit_code == EXIT_FAILED and "recorded size True is not 1 to 3" in line, r.output
    r = runner.invoke(app, [*check, str(_recorded(release, tmp_path, nonce="n" * 10_000_000))])
    line = _one_line(r)
    assert r.exit_code == EXIT_FAILED and "recorded nonce 'nnn" in line and len(line) < 1000, r.output[:300]


# ----------------------------------------------------------------------------------- 12: a closed pipe


def _into_a_closed_pipe(*args: str) -> subprocess.CompletedProcess[bytes]:
    """Run the command with its stdout the write end of a pipe whose reader has already closed it."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([*KVGRAFT, *args], stdout=write, stderr=subprocess.PIPE, timeout=300)
    finally:
        os.close(write)


def test_a_closed_pipe_ends_the_command_quietly(release: Path, tmp_path: Path) -> None:
    """Was: `kvgraft verify REL --key K.pub.pem | head -1` exited 70, "internal error: BrokenPipeError"."""
    private, public = keys.write_keypair(tmp_path / "k")
    assert runner.invoke(app, ["sign", str(release), "--key", str(private)]).exit_code == 0
    for args in (["verify", str(release), "--key", str(public)], ["verify", str(release), "--json"],
                 ["inspect", str(release)]):
        proc = _into_a_closed_pipe(*args)
        assert (proc.returncode, proc.stderr) == (EXIT_PIPE, b""), (args, proc.stderr[-500:])
    ok = subprocess.run([*KVGRAFT, "verify", str(release), "--key", str(public)], capture_output=True, timeout=300)
    assert ok.returncode == 0 and ok.stdout.startswith(b"verified")  # control: read to the end, it succeeds
