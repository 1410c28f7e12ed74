"""A hostile-input campaign on keys, journals and plans, and on releases re-signed with an attacker's key.

    PYTHONPATH=. .venv/bin/python bench/hostile_input_campaign.py [--runs 0] [--summary FILE] [--work DIR]

Each run is one kvgraft command as its own process (a journal read back by the library, `Journal.open`, is run
the same way: a process that calls it and ends as the CLI ends): `verify`, `sign`, `run` and `audit run` with a
`--key` or plan key that is a device, a FIFO, a socket, a folder, a link, a huge sparse or an oversized file or
not a key; `audit recompute --journal` (and its default journal beside `--out`) on users' files, special files
and journals with deep, huge or too many lines; `audit run` on plans nested 100,000 deep, with integers beyond
2^53, nan and inf, outputs that are empty, under /proc, /sys or /dev, the audited release or a user's file, and
plan files that are devices or huge; releases re-signed with the attacker's key whose tensor digests are wrong,
whose layer maps name layer 10^9 or no layer, and (a tiny random model's release) tensors of shapes the model
cannot hold over sparse files, grafted by `run`.

A run fails when it ends with exit 70 or by a signal, takes 20 s or more (killed then), peaks over 300 MB of
resident memory (its own, from wait4), prints a traceback, refuses without one `kvgraft: error:` line (other
lines must be kvgraft's own notes), accepts what it must refuse (or refuses a control), changes or removes a
user's file it was handed, or leaves anything behind in the folders it was given (a refused run writes nothing).
Runs are interleaved across the surfaces, so `--runs N` (0: all) samples each. Prints a table per surface and
exits 1 when any run failed. Recorded in docs/hostile-releases.md ("Keys, journals and plans").
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import hashlib
import itertools
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench"), str(REPO / "tests")]  # this checkout, its test helpers

MAX_SECONDS = 20.0
MAX_RSS_MB = 300
ADDRESS_SPACE = 6 * 2**30  # a blow-up fails the run instead of the machine
# Each run reports its own peak resident memory (VmHWM, reset when it exec'd) as it exits: wait4's figure would
# include this process's, which the forked child held until exec.
PEAK = ("import atexit, os\n"
        "def _peak():\n"
        "    for line in open('/proc/self/status'):\n"
        "        if line.startswith('VmHWM:'):\n"
        "            open(os.environ['CAMPAIGN_PEAK'], 'w').write(line.split()[1])\n"
        "atexit.register(_peak)\n")
KVGRAFT = [sys.executable, "-c", PEAK + "from kvgraft.cli import entrypoint; entrypoint()"]
JOURNAL_OPEN = (  # Journal.open on a path, ending as the CLI ends (one line, the error's exit code)
    PEAK +
    "import sys\n"
    "from pathlib import Path\n"
    "from kvgraft.errors import Error\n"
    "from kvgraft.execution.journal import Journal\n"
    "try:\n"
    "    Journal.open(Path(sys.argv[1]), {'release_root_digest': 'ab' * 32, 'entries': ['a', 'b']}, {'a', 'b'}).close()\n"
    "except Error as exc:\n"
    "    print(f'kvgraft: error: {exc}', file=sys.stderr)\n"
    "    sys.exit(exc.exit_code)\n")
GIB = 2**30
MODEL_BASELINE_MB = [0.0]  # `run` of the tiny model on its unaltered release, measured when the cases are built


@dataclass
class Case:
    surface: str
    name: str
    argv: list[str]
    expect: str = "refuse"  # refuse (exit 1-8), accept (exit 0) or any (not 70)
    cwd: Path | None = None
    protect: list[Path] = field(default_factory=list)  # users' files: never changed or removed
    watch: list[Path] = field(default_factory=list)  # folders a refused run must leave as they were
    rss_limit_mb: float = MAX_RSS_MB  # a run that loads a model: that model's cost on top (build_cases)


# ------------------------------------------------------------------------------------------------ setup


def _sparse(path: Path, size: int, head: bytes = b"") -> Path:
    with open(path, "wb") as fh:
        fh.write(head)
        fh.truncate(size)
    return path


def _copy_sparse(src: Path, dst: Path) -> None:
    """A copy of one of these files, sparse as it is: each holds data in its first MiB at most, then a hole (a
    plain copy would write the hole's gigabytes of zeros)."""
    with open(src, "rb") as fh:
        head = fh.read(2**20)
    _sparse(dst, src.stat().st_size, head)


def _deep(n: int) -> bytes:
    return b"[" * n + b"]" * n


def _hostile_paths(folder: Path, real_private: Path, real_public: Path) -> dict[str, Path]:
    """Paths a person (or an attacker writing a plan) may hand kvgraft as a file to read ("the other half of a
    key pair": the private key where a public one is read; `_other_half` turns it round for the readers of
    private keys)."""
    folder.mkdir(parents=True, exist_ok=True)
    fifo = folder / "fifo"
    os.mkfifo(fifo)
    sock = folder / "socket"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock))  # left bound: the file stays a socket
    (folder / "dir").mkdir()
    (folder / "to-zero").symlink_to("/dev/zero")
    (folder / "to-key").symlink_to(real_public)
    (folder / "empty.pem").write_bytes(b"")
    (folder / "junk.pem").write_bytes(os.urandom(4096))
    (folder / "not-utf8.pem").write_bytes(b"-----BEGIN PUBLIC KEY-----\n\xff\xfe\x00\n-----END PUBLIC KEY-----\n")
    (folder / "deep.pem").write_bytes(_deep(30_000))
    (folder / "big.pem").write_bytes(b"-----BEGIN PUBLIC KEY-----\n" + b"QUFB\n" * 60_000 + b"-----END PUBLIC KEY-----\n")
    (folder / "file").write_bytes(b"a user's file\n")
    return {
        "/dev/zero": Path("/dev/zero"), "/dev/urandom": Path("/dev/urandom"), "/dev/null": Path("/dev/null"),
        "fifo": fifo, "socket": sock, "folder": folder / "dir", "link to /dev/zero": folder / "to-zero",
        "link to a key": folder / "to-key", "8 GiB sparse": _sparse(folder / "huge.pem", 8 * GIB),
        "empty": folder / "empty.pem", "random bytes": folder / "junk.pem", "not UTF-8": folder / "not-utf8.pem",
        "nested 30,000 deep": folder / "deep.pem", "over the size bound": folder / "big.pem",
        "missing": folder / "missing.pem", "through a file": folder / "file" / "key.pem",
        "name over NAME_MAX": folder / ("k" * 300), "the other half of a key pair": real_private,
    }


def _journal_files(folder: Path) -> dict[str, Path]:
    """Journal paths: users' files, special files, journals bounded in nothing but their own lines."""
    folder.mkdir(parents=True, exist_ok=True)
    header = json.dumps({"kind": "kvgraft-journal", "version": 1, "run": {"release_root_digest": "ab" * 32,
                                                                          "entries": ["a", "b"]}}).encode() + b"\n"
    other = json.dumps({"kind": "kvgraft-journal", "version": 1, "run": {"other": 1}}).encode() + b"\n"
    files = {
        "notes, no newline": b"my notes, the only copy", "notes with lines": b"line one\nline two\n", "empty": b"",
        "binary": os.urandom(2048), "torn header": header[:20], "another run": other,
        "deep header": _deep(200_000) + b"\n", "deep result": header + b'{"unit": "a", "result": ' + _deep(200_000) + b"}\n",
        "long number": header + b'{"unit": "a", "result": {"x": ' + b"9" * 100_000 + b"}}\n",
        "too many units": header + b'{"unit": "a", "result": {}}\n' * 50_000,
        "not a unit": header + b'{"unit": ["x", {"y": 1}], "result": {}}\n',
    }
    paths = {name: folder / f"j-{i}.journal" for i, name in enumerate(files)}
    for name, data in files.items():
        paths[name].write_bytes(data)
    paths["6 GiB line"] = _sparse(folder / "line.journal", 6 * GIB, header + b'{"unit": "a", "result": "')
    paths["8 GiB, no newline"] = _sparse(folder / "huge.journal", 8 * GIB, b"{")
    fifo = folder / "fifo.journal"
    os.mkfifo(fifo)
    (folder / "dir.journal").mkdir()
    (folder / "link.journal").symlink_to(paths["notes, no newline"])
    (folder / "zero.journal").symlink_to("/dev/zero")
    paths.update({"fifo": fifo, "folder": folder / "dir.journal", "link to a user's file": folder / "link.journal",
                  "link to /dev/zero": folder / "zero.journal", "/dev/null": Path("/dev/null")})
    return paths


def _plan_text(body: str, head: str = "") -> str:
    return (f'format = "kvgraft-audit-plan"\nformat_version = 1\nname = "p"\n{head}\n[model]\nspec = "synthetic/none"\n'
            f'[release]\npath = "rel"\n{body}\n')


def _other_half(key: Path, private: Path, public: Path) -> Path:
    """For a reader of private keys, the public key where the hostile paths hold the private one."""
    return public if key == private else key


def _plans(folder: Path, hostile_keys: dict[str, Path], pair: tuple[Path, Path]) -> dict[str, Path]:
    """Plan files, each refused before any model loads."""
    n = itertools.count()
    out: dict[str, Path] = {}

    def plan(name: str, text: str | bytes) -> None:
        path = folder / f"plan-{next(n)}.toml"
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        out[name] = path

    for depth in (100, 1_000, 100_000):
        plan(f"array {depth:,} deep", _plan_text("[checks.claims]\nfile = " + "[" * depth + "]" * depth))
        plan(f"inline table {depth:,} deep", _plan_text("[executor]\nx = " + "{a = " * depth + "1" + "}" * depth))
    for depth in (100, 5_000):
        plan(f"table header {depth:,} deep", _plan_text("[executor." + ".".join(["a"] * depth) + "]\nx = 1"))
    for key, table in (("prefix", "checks.recompute"), ("sample", "checks.recompute"), ("length", "checks.determinism"),
                       ("seed", "checks.controls"), ("chunk", "release"), ("threads", "executor"),
                       ("max_new_tokens", "checks.generalization"), ("limit", "release.library")):
        for value in ("1000000000000000000", "-9223372036854775808", "9007199254740992", "1000000000000"):
            if key == "seed" and value == "1000000000000":
                continue  # within a seed's bound: no refusal to check
            body = f"[{table}]\n{key} = {value}" if table != "release" else f"[checks.verify]\n[release]\n{key} = {value}"
            if table == "release.library":
                body = f'[checks.verify]\n[release.library]\nsource = "x"\n{key} = {value}'
            plan(f"{table}.{key} = {value}", _plan_text(body))
    for key, table in (("max_minutes", "limits"), ("temperature", "checks.generalization"),
                       ("target_fraction", "checks.recompute")):
        for value in ("nan", "inf", "-inf", "-nan"):
            plan(f"{table}.{key} = {value}", _plan_text(f"[checks.verify]\n[{table}]\n{key} = {value}"))
    plan("a date in [executor]", _plan_text("[executor]\nwhen = 1979-05-27T07:32:00Z"))
    plan("a time in a plugin's check", _plan_text("[checks.mykind]\nat = 07:32:00"))
    user = folder / "notes.txt"
    user.write_text("a user's notes\n")
    for name, out_dir in (("out empty", ""), ("out /proc/sys/x", "/proc/sys/x"), ("out /proc/self", "/proc/self"),
                          ("out /sys/kernel/x", "/sys/kernel/x"), ("out /dev/shm", "/dev/shm"), ("out /dev/null", "/dev/null"),
                          ("out the release", "rel"), ("out inside the release", "rel/index"),
                          ("out a user's file", "notes.txt"), ("out under a user's file", "notes.txt/x")):
        plan(name, _plan_text("[checks.verify]", head=f"out = {json.dumps(out_dir)}"))
    for name, key in hostile_keys.items():
        key = _other_half(key, *pair)
        plan(f"key: {name}", _plan_text(f"[checks.verify]\n[signing]\nkey = {json.dumps(str(key))}"))
    plan("not UTF-8", b'format = "kvgraft-audit-plan"\nname = "\xff\xfe"\n')
    out["plan is /dev/zero"] = Path("/dev/zero")
    out["plan is a FIFO"] = hostile_keys["fifo"]
    out["plan of 100 MB, sparse"] = _sparse(folder / "huge.toml", 100 * 2**20, b'format = "kvgraft-audit-plan"\n')
    return out


def _resigned(base: Path, folder: Path, k3: Path) -> dict[str, tuple[Path, str]]:
    """Copies of the release re-signed with the attacker's key, each with one commitment the model or its bytes
    contradict; the entry each names."""
    import hostile_attacks as attacks

    edits: dict[str, tuple[int, int, Callable[[dict[str, Any]], None]]] = {}  # name: (shard, entry in it, edit)
    for t in ("layer.0.keys", "layer.0.values", "layer.1.keys", "layer.1.values"):
        for shard in (0, 2):
            edits[f"{t} sha256 wrong, shard {shard}"] = (shard, 0, lambda e, t=t: e["tensors"][t].update(sha256="0" * 64))
    layer_edits: dict[str, Callable[[list[dict[str, Any]]], Any]] = {
        "layer 10^9": lambda ls: ls[1].update(index=10**9), "layer -1 as 2^53": lambda ls: ls[0].update(index=2**53 - 1),
        "no layers": lambda ls: ls.clear(), "one layer short": lambda ls: ls.pop(),
        "a layer too many": lambda ls: ls.append(dict(ls[1], index=2)), "a layer twice": lambda ls: ls[1].update(index=0),
        "layers reversed": lambda ls: ls.reverse(), "shared with 10^9": lambda ls: ls[1].update(kind="shared", shared_with=10**9),
        "shared with itself": lambda ls: ls[0].update(kind="shared", shared_with=0),
        "no values tensor": lambda ls: ls[0].pop("values"),
    }
    for name, edit in layer_edits.items():
        edits[name] = (1, 0, lambda e, edit=edit: edit(e["layers"]))
    out: dict[str, tuple[Path, str]] = {}
    for i, (name, (k, j, edit)) in enumerate(edits.items()):
        root = folder / f"resigned-{i}"
        shutil.copytree(base, root)
        draft = attacks.Draft.open(root)
        entry = draft.shards[k]["entries"][j]
        edit(entry)
        draft.reseal(k3)
        out[name] = (root, str(entry["id"]))
    control = folder / "resigned-control"
    shutil.copytree(base, control)
    draft = attacks.Draft.open(control)
    draft.reseal(k3)
    out["control: re-signed, unchanged"] = (control, str(draft.shards[0]["entries"][0]["id"]))
    return out


def _shapes(folder: Path, k3_private: Path) -> tuple[Path, dict[str, Path]]:
    """A tiny random llama and releases of it whose one tensor claims a shape the model cannot hold (sparse)."""
    from kvgraft.inference import capture, models

    import release_factory
    import rewrite
    import tiny

    model = tiny.build("llama", folder / "tiny-llama")
    lm = models.load(str(model), device="cpu")
    base = folder / "tiny-release"
    manifest = capture.capture(lm, [("t", {"id": "e", "text": "Two apples and three pears."})], base, probe_tokens=0)
    _, heads, tokens, dim = manifest["entries"][0]["tensors"]["layer.1.keys"]["shape"]
    claimed = 256 * 2**20 // 4
    shapes = {"tokens 256 MB": [1, heads, claimed // (heads * dim), dim],
              "heads 256 MB": [1, claimed // (tokens * dim), tokens, dim],
              "head size 256 MB": [1, heads, tokens, claimed // (heads * tokens)], "rank 256 MB": [1, 1, 1, claimed]}
    out: dict[str, Path] = {}
    for i, (name, shape) in enumerate(shapes.items()):
        root = folder / f"shape-{i}"
        shutil.copytree(base, root)
        rewrite.claim_shape(root, 0, "layer.1.keys", shape)
        release_factory.sign_as(root, k3_private)
        out[name] = root
    release_factory.sign_as(base, k3_private)
    out["control: the model's own shapes"] = base
    return model, out


SURFACES = ("key", "journal", "plan", "re-signed", "shape")


def build_cases(work: Path, wanted: set[str] | frozenset[str] = frozenset(SURFACES)) -> list[Case]:
    from kvgraft.signing import keys, sign

    from release_factory import make_release

    k1_private, k1 = keys.write_keypair(work / "k1")
    k3_private, k3 = keys.write_keypair(work / "k3")
    base = work / "release"
    make_release(base, entries=5, seed=43, format_version=2, shard_entries=2)
    sign.sign_release(base, keys.load_private_key(k1_private))
    hostile = _hostile_paths(work / "keys", k1_private, k1)
    surfaces: dict[str, list[Case]] = collections.defaultdict(list)

    for name, key in hostile.items() if "key" in wanted else ():
        refused = "any" if name == "link to a key" else "refuse"  # links are refused; what matters is the bound
        surfaces["key"].append(Case("key", f"verify --key {name}", ["verify", str(base), "--key", str(key)], refused,
                                    protect=[key], watch=[base]))
        copy = work / "sign" / f"{len(surfaces['key'])}"
        private = _other_half(key, k1_private, k1)
        surfaces["key"].append(Case("key", f"sign --key {name}", ["sign", str(copy), "--key", str(private)], refused,
                                    protect=[private], watch=[copy]))
        shutil.copytree(base, copy)
        surfaces["key"].append(Case("key", f"verify --oms-signature {name}",
                                    ["verify", str(base), "--key", str(k1), "--oms-signature", str(key)], refused,
                                    protect=[key], watch=[base]))
    for name in ("/dev/zero", "fifo", "8 GiB sparse", "folder", "socket") if "key" in wanted else ():
        surfaces["key"].append(Case("key", f"run --key {name}", ["run", str(base), "--model", "/nonexistent", "--entry",
                                                                   "rec-000", "--key", str(hostile[name])],
                                    protect=[hostile[name]], watch=[base]))

    journals = _journal_files(work / "journals")
    out_json = work / "journal-out"
    out_json.mkdir()
    for name, path in journals.items() if "journal" in wanted else ():
        args = ["audit", "recompute", str(base), "--model", "/nonexistent", "--quiet", "--journal", str(path)]
        surfaces["journal"].append(Case("journal", f"--journal {name}", args, protect=[path],
                                        watch=[base, path.parent]))
        surfaces["journal"].append(Case("journal", f"Journal.open {name}", [str(path)], protect=[path],
                                        watch=[path.parent]))
        if path.parent == work / "journals" and path.is_file():  # the default journal beside --out
            beside = out_json / f"{path.name}.json"
            _copy_sparse(path, Path(f"{beside}.journal"))
            surfaces["journal"].append(Case("journal", f"--out, its journal {name}",
                                            ["audit", "recompute", str(base), "--model", "/nonexistent", "--quiet",
                                             "--out", str(beside)], protect=[Path(f"{beside}.journal")],
                                            watch=[out_json]))

    plans_dir = work / "plans"
    plans_dir.mkdir()
    shutil.copytree(base, plans_dir / "rel")
    for name, path in _plans(plans_dir, hostile, (k1_private, k1)).items() if "plan" in wanted else ():
        surfaces["plan"].append(Case("plan", name, ["audit", "run", str(path), "--quiet"], cwd=plans_dir,
                                     protect=[plans_dir / "notes.txt"], watch=[plans_dir]))

    resigned = _resigned(base, work / "resigned", k3_private) if "re-signed" in wanted else {}
    for name, (root, eid) in resigned.items():
        expect = "accept" if name.startswith("control") else "refuse"
        for args in (["--json"], ["--entry", eid], ["--deep"], []):
            surfaces["re-signed"].append(Case("re-signed", f"verify {' '.join(args[:1])} {name}".replace("  ", " "),
                                              ["verify", str(root), "--key", str(k3), *args], expect, watch=[root]))
        pulled = work / "pulled" / root.name
        surfaces["re-signed"].append(Case("re-signed", f"pull {name}", ["pull", str(root), "--out", str(pulled),
                                                                          "--entry", eid, "--key", str(k3)], expect,
                                          watch=[root, pulled.parent]))
        (work / "pulled").mkdir(exist_ok=True)

    if "shape" not in wanted:
        return _interleaved(surfaces)
    model, shaped = _shapes(work / "shapes", k3_private)
    # `run` loads the model: its bound is the same graft of the unaltered release plus 50 MB (a claim refused
    # before its bytes are read costs nothing beyond the model), and never more than the model plus MAX_RSS_MB.
    control = run_case(Case("shape", "baseline", ["run", str(shaped["control: the model's own shapes"]), "--model",
                                                  str(model), "--entry", "e", "--key", str(k3), "--prompt", " Answer:",
                                                  "-n", "1"], "accept"))
    assert not control["problems"] or control["problems"] == [f"{control['rss_mb']:.0f} MB resident"], control
    MODEL_BASELINE_MB[0] = control["rss_mb"]
    for name, root in shaped.items():
        expect = "accept" if name.startswith("control") else "refuse"
        surfaces["shape"].append(Case("shape", f"verify {name}", ["verify", str(root), "--key", str(k3)], "accept",
                                      watch=[root]))
        for extra in ([], ["--json"]):
            surfaces["shape"].append(Case("shape", f"run {' '.join(extra)} {name}".replace("  ", " "),
                                          ["run", str(root), "--model", str(model), "--entry", "e", "--key", str(k3),
                                           "--prompt", " Answer:", "-n", "1", *extra], expect, watch=[root],
                                          rss_limit_mb=MODEL_BASELINE_MB[0] + 50))
    return _interleaved(surfaces)


def _interleaved(surfaces: dict[str, list[Case]]) -> list[Case]:
    """Any prefix of the list samples every surface."""
    return [c for group in itertools.zip_longest(*surfaces.values()) for c in group if c is not None]


# ------------------------------------------------------------------------------------------------- judge


def _state(path: Path) -> Any:
    """What a user's file or a watched folder is now: its type, size and digest, or each name's under it."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if path.is_dir() and not path.is_symlink():
        return sorted((str(p.relative_to(path)), _state(p) if not p.is_dir() or p.is_symlink() else "dir")
                      for p in path.rglob("*"))
    if not os.path.isfile(path) or os.path.islink(path) or st.st_size > 16 * 2**20:
        return (st.st_mode, st.st_size, st.st_mtime_ns)
    return (st.st_mode, st.st_size, hashlib.sha256(path.read_bytes()).hexdigest())


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def run_case(case: Case) -> dict[str, Any]:
    before = {str(p): _state(p) for p in case.protect + case.watch}
    argv = [sys.executable, "-c", JOURNAL_OPEN, *case.argv] if case.name.startswith("Journal.open") else \
        [*KVGRAFT, *case.argv]
    peak_file = Path(tempfile.mkstemp(prefix="kvgraft-campaign-peak-")[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "CAMPAIGN_PEAK": str(peak_file)}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=case.cwd, env=env,
                                preexec_fn=_limit)
        timed_out = False
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - t0 >= MAX_SECONDS:
                proc.kill()
                _, status, usage = os.wait4(proc.pid, 0)
                timed_out = True
                break
            time.sleep(0.02)
        proc.returncode = -1  # reaped here: Popen must not wait for it again
        seconds = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(1 << 20).decode("utf-8", "replace"), err.read(1 << 20).decode("utf-8", "replace")
    code = os.waitstatus_to_exitcode(status)
    reported = peak_file.read_text().strip()
    peak_file.unlink()
    # A run that ended without reporting (killed) is judged by wait4's figure, an upper bound.
    rss_mb = int(reported) / 1024 if reported.isdigit() else usage.ru_maxrss / 1024
    problems: list[str] = []
    if timed_out:
        problems.append(f"ran {MAX_SECONDS:.0f} s, killed")
    elif code < 0:
        problems.append(f"signal {signal.Signals(-code).name}")
    elif code == 70:
        problems.append("exit 70")
    if rss_mb > case.rss_limit_mb:
        problems.append(f"{rss_mb:.0f} MB resident")
    if "Traceback" in stderr:
        problems.append("traceback")
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    one_line = bool(lines) and lines[-1].startswith("kvgraft: error: ") and all(ln.startswith("kvgraft: ") for ln in lines)
    if code > 0 and not timed_out and not one_line:
        problems.append(f"not one error line: {stderr[-300:]!r}")
    if case.expect == "refuse" and code == 0:
        problems.append("accepted")
    if case.expect == "accept" and code != 0:
        problems.append(f"control refused: {lines[-1:] or stdout[-200:]}")
    after = {str(p): _state(p) for p in case.protect + case.watch}
    for p in case.protect:
        if before[str(p)] != after[str(p)]:
            problems.append(f"user's file changed or removed: {p}")
    if code != 0:
        for p in case.watch:
            if before[str(p)] != after[str(p)]:
                problems.append(f"left something in {p}")
    return {"surface": case.surface, "name": case.name, "exit": code, "seconds": round(seconds, 2),
            "rss_mb": round(rss_mb, 1), "problems": problems, "error": (lines[-1] if lines else "")[:300]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=0, help="runs to make, interleaved across surfaces (0: every case)")
    ap.add_argument("--summary", type=Path, help="write every run's record here as JSON")
    ap.add_argument("--surface", action="append", choices=SURFACES,
                    help="build and run only this surface's cases (repeatable; default: all)")
    ap.add_argument("--work", type=Path, help="folder to build the inputs in (default: a temporary one, removed)")
    args = ap.parse_args(argv)
    with contextlib.ExitStack() as stack:
        work = args.work or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kvgraft-hostile-input-")))
        t0 = time.perf_counter()
        cases = build_cases(work, set(args.surface or SURFACES))
        baseline = (f"; `run` of the tiny model on its unaltered release peaks at {MODEL_BASELINE_MB[0]:.0f} MB"
                    if MODEL_BASELINE_MB[0] else "")
        print(f"{len(cases)} cases built in {time.perf_counter() - t0:.0f} s{baseline}", flush=True)
        chosen = cases[: args.runs] if args.runs else cases
        records = []
        for case in chosen:
            record = run_case(case)
            records.append(record)
            if record["problems"]:
                print(f"FAIL {case.surface}: {case.name}: {'; '.join(record['problems'])} ({record['error']})", flush=True)
    by: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for r in records:
        by[r["surface"]].append(r)
    print(f"\n{'surface':<11} {'runs':>5} {'exit codes':<26} {'failed':>6} {'max s':>6} {'max MB':>7}")
    for surface, rs in by.items():
        codes = collections.Counter(r["exit"] for r in rs)
        shown = " ".join(f"{c}:{n}" for c, n in sorted(codes.items()))
        print(f"{surface:<11} {len(rs):>5} {shown:<26} {sum(bool(r['problems']) for r in rs):>6} "
              f"{max(r['seconds'] for r in rs):>6.1f} {max(r['rss_mb'] for r in rs):>7.0f}")
    failed = sum(bool(r["problems"]) for r in records)
    print(f"{'all':<11} {len(records):>5} {'':<26} {failed:>6} {max(r['seconds'] for r in records):>6.1f} "
          f"{max(r['rss_mb'] for r in records):>7.0f}")
    if args.summary:
        args.summary.write_text(json.dumps(records, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
