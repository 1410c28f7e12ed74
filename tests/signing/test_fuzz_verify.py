"""Seeded fuzzing of `kvgraft verify --key` on a small signed release: bit flips, truncations,
extensions, swaps and deletions in every file; and same-size entry headers stating too many
dimensions or a product of thousands of digits, JSON re-encoded as UTF-16/32 or behind a BOM, a path
longer than PATH_MAX, file names holding markup, ESC or a newline. Every mutated release must be refused
with exit 1 or 2, one plain line on stderr, no traceback, and no crash signal; the positive control,
a repository's .git and .gitattributes added at the root, must verify (exit 0).

The cases run in one child process (in-process CLI calls, so hundreds fit in the time bound); a crash
signal kills the child, which the test sees as a negative return code naming the last case started. A
few cases also run as their own `kvgraft` processes, as a user would run them.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvgraft.signing import keys, sign

from release_factory import make_release

SEED = 1313
CASES = 700
SECONDS = 20  # the bound: stop starting cases after this long (a loaded machine runs fewer)
REPO = Path(__file__).resolve().parents[2]

_DRIVER = r"""
import json, os, random, shutil, sys, time
from pathlib import Path
from typer.testing import CliRunner
from kvgraft.cli import app

pristine, pub, work = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
seed, cases, seconds = int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
files = sorted(str(p.relative_to(pristine)) for p in pristine.rglob("*") if p.is_file())
entries = [f for f in files if f.endswith(".safetensors")]
rng = random.Random(seed)
runner = CliRunner()
deadline = time.monotonic() + seconds


def mutate(root):
    kind = rng.choice(["flip", "flip", "flip", "truncate", "extend", "swap", "delete", "flip-many",
                       # sizes, encodings, paths, markup; and ignored repository metadata (exit 0)
                       "header-rank", "header-elements", "reencode", "deep-path", "hostile-name", "git-metadata"])
    name = rng.choice(files)
    path = root / name
    data = bytearray(path.read_bytes())
    if kind in ("header-rank", "header-elements"):
        # A same-size entry whose header states very many dimensions, or a product of thousands of digits.
        name = rng.choice(entries)
        path, size = root / name, (root / name).stat().st_size
        dims = rng.randint(9, (size - 120) // 2) if kind == "header-rank" else rng.randint(2, 8)
        shape = [rng.choice([1, 2])] * dims if kind == "header-rank" else [2**40] * dims
        body = json.dumps({"t": {"dtype": "F32", "shape": shape, "data_offsets": [0, 4]}}, separators=(",", ":"))
        raw = (body + " " * (size - 12 - len(body))).encode()
        path.write_bytes(len(raw).to_bytes(8, "little") + raw + bytes(4))
        return f"{kind} {name} ({dims} dimensions)"
    if kind == "reencode":
        # Valid JSON in another Unicode encoding (or behind a BOM): RFC 8259 says UTF-8.
        name = rng.choice([f for f in files if not f.endswith(".safetensors")])
        enc = rng.choice(["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-8-sig"])
        (root / name).write_bytes((root / name).read_text().encode(enc))
        return f"reencode {name} as {enc}"
    if kind == "deep-path":
        # A folder path longer than PATH_MAX inside the release: every stat of it is ENAMETOOLONG.
        fd = os.open(root, os.O_RDONLY)
        for _ in range(22):
            os.mkdir("d" * 200, dir_fd=fd)
            nxt = os.open("d" * 200, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        os.close(os.open("x", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
        os.close(fd)
        return "deep-path (4,400 characters)"
    if kind == "hostile-name":
        # An extra file whose name holds markup, ESC and a newline: refused, and printed as text.
        bad = rng.choice(["[/x]", "[conceal]x[/conceal]", "a\x1b[31mb", "a\nkvgraft: verified"])
        (root / bad).parent.mkdir(exist_ok=True)
        (root / bad).write_bytes(b"x")
        return f"hostile-name {bad!r}"
    if kind == "git-metadata":
        # What a git or Hub repository adds at the root: no part of the release, verify passes.
        (root / ".git" / "objects").mkdir(parents=True)
        (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
        (root / ".gitattributes").write_text("*.safetensors filter=lfs diff=lfs merge=lfs -text\n")
        return "git-metadata .git .gitattributes"
    if kind in ("flip", "flip-many"):
        for _ in range(1 if kind == "flip" else rng.randint(2, 16)):
            at = rng.randrange(len(data))
            data[at] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(data))
        return f"{kind} {name}"
    if kind == "truncate":
        n = rng.randrange(len(data))
        while n > 0 and not data[n:].strip():
            n -= 1  # a JSON file cut at its trailing newline only is the same document: cut into it
        os.truncate(path, n)
        return f"truncate {name} to {n}"
    if kind == "extend":
        # not whitespace alone: trailing whitespace is an allowed re-formatting of JSON
        extra = b"x" + rng.randbytes(rng.randint(0, 64))
        path.write_bytes(bytes(data) + extra)
        return f"extend {name} by {len(extra)}"
    if kind == "swap":
        other = rng.choice([f for f in files if f != name])
        a, b = path.read_bytes(), (root / other).read_bytes()
        path.write_bytes(b)
        (root / other).write_bytes(a)
        return f"swap {name} {other}"
    if name == "model.sig":
        # Deleting the OpenSSF signature alone changes nothing attested: release.sigstore.json still
        # signs every file, and verify rightly passes. Delete a file it signs instead.
        name = rng.choice([f for f in files if f != name])
        path = root / name
    path.unlink()
    return f"delete {name}"


for i in range(cases):
    if time.monotonic() > deadline:
        break
    root = work / f"case{i}"
    shutil.copytree(pristine, root)
    what = mutate(root)
    print(json.dumps({"case": i, "what": what, "started": True}), flush=True)
    t0 = time.monotonic()
    r = runner.invoke(app, ["verify", str(root), "--key", pub])
    print(json.dumps({"case": i, "what": what, "exit": r.exit_code, "stderr": r.stderr, "stdout": r.stdout,
                      "seconds": round(time.monotonic() - t0, 4),
                      "exception": None if r.exception is None or isinstance(r.exception, SystemExit)
                      else repr(r.exception)}), flush=True)
    shutil.rmtree(root)
"""


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("fuzz")
    private, public = keys.write_keypair(folder / "k")
    # Entries of 64 KiB: room for a same-size header with tens of thousands of dimensions.
    make_release(folder / "rel", entries=3, layers=2, heads=4, tokens=64, head_dim=16, seed=SEED)
    sign.sign_release(folder / "rel", keys.load_private_key(private))
    return folder / "rel", public


def _check(case: dict[str, object]) -> None:
    what, code, err = case["what"], case["exit"], str(case["stderr"])
    if str(what).startswith("git-metadata"):  # the positive control: refusal is not blanket
        assert code == 0 and case["exception"] is None, f"{what}: exit {code}: {err}"
        return
    assert code in (1, 2), f"{what}: exit {code}: {err}"
    assert case["exception"] is None, f"{what}: {case['exception']}"
    assert "Traceback" not in err and "Traceback" not in str(case["stdout"]), f"{what}: {err}"
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvgraft: error: "), f"{what}: {lines}"
    assert "\x1b" not in err, f"{what}: an ESC reached the terminal: {err!r}"
    assert "[conceal]" not in err or "[conceal]x[/conceal]" in err, f"{what}: markup interpreted: {err}"


def test_fuzzed_releases_are_refused_cleanly(signed: tuple[Path, Path], tmp_path: Path) -> None:
    root, public = signed
    r = subprocess.run([sys.executable, "-c", _DRIVER, str(root), str(public), str(tmp_path), str(SEED), str(CASES),
                        str(SECONDS)], capture_output=True, text=True, timeout=SECONDS + 120, cwd=REPO)
    results = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    done = [c for c in results if "exit" in c]
    last = results[-1] if results else None
    assert r.returncode == 0, f"driver died with {r.returncode} (a negative value is a signal) in case {last}: {r.stderr[-2000:]}"
    assert len(done) >= 50, f"only {len(done)} cases ran in {SECONDS} s"
    kinds = {str(c["what"]).split()[0] for c in done}
    assert {"flip", "truncate", "extend", "swap", "delete", "header-rank", "header-elements", "reencode", "deep-path",
            "hostile-name", "git-metadata"} <= kinds
    for case in done:
        _check(case)


def test_fuzzed_releases_in_their_own_processes(signed: tuple[Path, Path], tmp_path: Path) -> None:
    """A handful of cases as real `kvgraft verify` processes: the exit status a shell sees, no signal."""
    root, public = signed
    rng = random.Random(SEED + 1)
    files = sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())
    started = time.monotonic()
    for i in range(6):
        case = Path(shutil.copytree(root, tmp_path / f"p{i}"))
        name = files[i % len(files)]
        data = bytearray((case / name).read_bytes())
        if i % 2:
            data = data[: rng.randrange(len(data))]
        else:
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        (case / name).write_bytes(bytes(data))
        r = subprocess.run([sys.executable, "-c", "from kvgraft.cli import entrypoint; entrypoint()", "verify", str(case),
                            "--key", str(public), "--json"], capture_output=True, text=True, timeout=120, cwd=REPO)
        _check({"what": f"{name} case {i}", "exit": r.returncode, "stderr": r.stderr, "stdout": "", "exception": None})
        assert json.loads(r.stdout)["exit_code"] == r.returncode
    assert time.monotonic() - started < 120
