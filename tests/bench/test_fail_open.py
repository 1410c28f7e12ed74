"""bench/fail_open.py, the inject campaign's `pyopen` injector: it must fail exactly the Nth open under its folder,
whatever the open's name (mkstemp's random ones included) and however it is made, and no open elsewhere.

The hook cannot be removed once installed, so each case runs in a child interpreter (well under a second)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# opens, in order: outside the folder (never counted), then under it by builtins.open, os.open (relative to the
# working folder, which is the folder's parent), tempfile.mkstemp (a random name) and pathlib
CHILD = """
import json, os, sys, tempfile
from bench.fail_open import install
folder, nth = sys.argv[1], int(sys.argv[2])
seen = []
install(folder, nth, 5, seen)  # EIO
steps = [lambda: open(os.path.join(folder, "..", "outside.txt"), "w").close(),
         lambda: open(os.path.join(folder, "a.txt"), "w").close(),
         lambda: os.close(os.open(os.path.join(os.path.basename(folder), "b.txt"), os.O_WRONLY | os.O_CREAT)),
         lambda: os.close(tempfile.mkstemp(dir=folder, prefix=".c.", suffix=".tmp")[0]),
         lambda: __import__("pathlib").Path(folder, "d.txt").write_text("d")]
out = []
for step in steps:
    try:
        step()
        out.append("ok")
    except OSError as exc:
        out.append([exc.errno, os.path.basename(exc.filename)])
print(json.dumps({"steps": out, "seen": len(seen)}))
"""


@pytest.mark.parametrize("nth", [0, 1, 2, 3, 4, 5])
def test_fails_exactly_the_nth_open_under_the_folder(tmp_path: Path, nth: int) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", CHILD, str(folder), str(nth)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60, check=True)
    result = json.loads(done.stdout)
    steps = result["steps"]
    assert steps[0] == "ok"  # outside the folder: never failed, never counted
    assert result["seen"] == 4
    for i, step in enumerate(steps[1:], 1):
        if i != nth:
            assert step == "ok", steps
        else:
            assert step[0] == 5, steps  # EIO, naming the path the open asked for (a random one for mkstemp)
            assert step[1] in ("a.txt", "b.txt", "d.txt") or step[1].startswith(".c."), steps
    assert (folder / "a.txt").exists() == (nth != 1)  # the open never reached the kernel
    assert len([p for p in folder.iterdir() if p.name.startswith(".c.")]) == (nth != 3)  # the failed open made none


def test_skip_leaves_a_subfolder_uncounted(tmp_path: Path) -> None:
    child = ("import sys; from bench.fail_open import install; seen = []; install(sys.argv[1], 1, 28, seen, sys.argv[2])\n"
             "open(sys.argv[2] + '/x', 'w').close(); print(len(seen))\n"
             "try:\n    open(sys.argv[1] + '/y', 'w')\nexcept OSError as exc:\n    print(exc.errno, exc.filename)")
    (tmp_path / "sub").mkdir()
    done = subprocess.run([sys.executable, "-c", child, str(tmp_path), str(tmp_path / "sub")], env={
        **os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.split("\n")[:2] == ["0", f"28 {tmp_path / 'y'}"], done  # the first open counted is failed
