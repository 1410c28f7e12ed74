"""Key files that are not small regular files: refused before a byte is read, whatever reads them.

A device such as /dev/zero reports size 0 and never ends; a FIFO blocks its reader until a writer comes.
Each command runs as its own process under an address-space limit and a timeout, so that a reader without
its bound shows as a failed test, not a dead machine.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from kvgraft.errors import EXIT_INPUT

from release_factory import make_release

KVGRAFT = [sys.executable, "-c", "from kvgraft.cli import entrypoint; entrypoint()"]
MEMORY = 2 * 2**30


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def _kvgraft(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KVGRAFT, *args], capture_output=True, text=True, timeout=20, cwd=cwd,
                          preexec_fn=_limited)


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("key-files") / "rel"
    make_release(root, entries=1, seed=5)
    return root


def _fifo(tmp_path: Path) -> Path:
    fifo = tmp_path / "key.fifo"
    os.mkfifo(fifo)
    return fifo


@pytest.mark.parametrize("kind", ["device", "fifo", "folder", "huge"])
def test_a_key_that_is_not_a_small_regular_file_is_refused_at_once(release: Path, tmp_path: Path, kind: str) -> None:
    key = {"device": lambda: Path("/dev/zero"), "fifo": lambda: _fifo(tmp_path), "folder": lambda: tmp_path,
           "huge": lambda: tmp_path / "huge.pub.pem"}[kind]()
    if kind == "huge":  # a sparse file: its size is claimed, not stored
        with open(key, "wb") as fh:
            fh.truncate(8 * 2**30)
    for args in (["verify", str(release), "--key", str(key)], ["sign", str(release), "--key", str(key)]):
        r = _kvgraft(*args, cwd=tmp_path)
        assert r.returncode == EXIT_INPUT, (args, r.returncode, r.stderr[-2000:])
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("kvgraft: error: ") and str(key) in lines[0], r.stderr
        assert "Traceback" not in r.stderr
    if kind == "huge":
        assert key.stat().st_size == 8 * 2**30  # the user's file, untouched
