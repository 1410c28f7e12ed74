"""The verify path imports no torch: `kvgraft verify` runs on CI machines without it.

Each check runs in a fresh interpreter in which importing torch raises, and asserts afterwards
that "torch" is not in sys.modules.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from release_factory import signed_release
from third_party import SIGSTORE_BUNDLES, needs_sigstore_bundles

FIXTURES = SIGSTORE_BUNDLES

PRELUDE = r"""
import json, sys

class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is blocked: the verify path must not import it")
        return None

sys.meta_path.insert(0, _NoTorch())

def report(**kw):
    kw["torch_imported"] = "torch" in sys.modules
    print("RESULT " + json.dumps(kw))
"""

CLI = PRELUDE + r"""
from kvgraft.cli import app
try:
    app(sys.argv[1:], prog_name="kvgraft")
    code = 0
except SystemExit as exc:
    code = exc.code
report(code=code)
"""

LIBRARY = PRELUDE + r"""
from pathlib import Path
from kvgraft.signing.policy import Everything, SignedWithKeys
from kvgraft.signing.verify import verify
with verify(Path(sys.argv[1]), SignedWithKeys((Path(sys.argv[2]),)), Everything(deep=True)) as checked:
    r = checked.checked
report(status=r.signature.status, files=r.files)
"""

SIGSTORE = PRELUDE + r"""
from pathlib import Path
from kvgraft.signing.sigstore import SigstoreTrust, verify_sigstore_bundle
f = Path(sys.argv[1])
r = verify_sigstore_bundle((f / "bundle.txt").read_bytes(), (f / "bundle.txt.sigstore").read_bytes(),
                           identity="a@tny.town", issuer="https://github.com/login/oauth",
                           trust=SigstoreTrust(staging=True, offline=True))
report(identity=r.identity)
"""


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root, _private, public = signed_release(tmp_path_factory.mktemp("notorch"), entries=2, seed=11)
    return root, public


def run(script: str, *args: str, tmp: Path) -> dict[str, object]:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp / "cache"), "XDG_DATA_HOME": str(tmp / "data")}
    proc = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=env, timeout=120,
                          check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"no result; stdout={proc.stdout!r} stderr={proc.stderr!r}"
    result: dict[str, object] = json.loads(lines[-1][len("RESULT "):])
    result["stdout"], result["stderr"] = proc.stdout, proc.stderr
    return result


def test_cli_verify_imports_no_torch(signed: tuple[Path, Path], tmp_path: Path) -> None:
    root, public = signed
    r = run(CLI, "verify", str(root), "--key", str(public), "--deep", tmp=tmp_path)
    assert r["code"] == 0, r["stderr"]
    assert r["torch_imported"] is False
    assert "verified" in str(r["stdout"])


def test_cli_verify_failure_imports_no_torch(signed: tuple[Path, Path], tmp_path: Path) -> None:
    import shutil

    root = Path(shutil.copytree(signed[0], tmp_path / "rel"))
    (root / "entries/00001.safetensors").write_bytes(b"damaged")
    r = run(CLI, "verify", str(root), "--key", str(signed[1]), tmp=tmp_path)
    assert r["code"] == 1 and "entries/00001.safetensors" in str(r["stderr"])
    assert r["torch_imported"] is False


def test_library_verify_imports_no_torch(signed: tuple[Path, Path], tmp_path: Path) -> None:
    r = run(LIBRARY, str(signed[0]), str(signed[1]), tmp=tmp_path)
    assert (r["status"], r["files"]) == ("verified", 3)
    assert r["torch_imported"] is False


@needs_sigstore_bundles
def test_sigstore_verify_imports_no_torch(tmp_path: Path) -> None:
    r = run(SIGSTORE, str(FIXTURES), tmp=tmp_path)
    assert r["identity"] == "a@tny.town"
    assert r["torch_imported"] is False
