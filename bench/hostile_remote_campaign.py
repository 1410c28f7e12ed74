"""A hostile campaign on the remote surface: a faulty or hostile server, bad URLs, a damaged cache, bad settings.

    PYTHONPATH=. .venv/bin/python bench/hostile_remote_campaign.py [--runs 260] [--seed 1] [--summary FILE]

Builds a signed format-2 release of 5 entries and serves it from the test HTTP server on 127.0.0.1
(tests/remote_servers.py). Each run draws one case of a class (a connection dropped in a small file or an
entry, a stall, a server dripping bytes, whole-file answers to ranges, a range one or more bytes short or
from another start, a redirect to another host or in a loop, an HTTP status, a byte changed on the wire, a
bad URL, a damaged cached piece or junk under partial/, a bad setting) and runs one kvgraft command on it
as a real process (`verify --entry`, `verify`, `inspect`, `pull --entry`), with a cache of its own (warm
for the cache classes).

A run fails when its exit status is 70 or a signal, stderr holds a traceback or more than the lines the
class allows, its peak RSS (wait4) is 300 MB or more, it takes 20 s or more, or it leaves behind what it
should not: a mirror folder, a cached piece that does not hash to its name, a pull's folder or temp folder
after a refusal, a changed file named by KVGRAFT_CACHE. A network fault the command should get through
(retried, resumed, read whole) is a miss when it ends other than 0. Prints per class: runs, exit codes,
misses, failures, the slowest run and the largest RSS; exits 1 when anything failed.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from kvgraft.release.format import Release  # noqa: E402
from kvgraft.signing import keys, sign  # noqa: E402

from release_factory import make_release  # noqa: E402
from remote_servers import Fault, FolderServer, folder_server  # noqa: E402

# The process records its own peak RSS (VmHWM) when it exits: wait4's ru_maxrss would count the memory of
# this campaign, which the kernel carries over into a child's maximum at exec.
CLI = [sys.executable, "-c", "import atexit, os; atexit.register(lambda: open(os.environ['CAMPAIGN_HWM_FILE'], 'w')"
       ".write(open('/proc/self/status').read())); from kvgraft.cli import entrypoint; entrypoint()"]
MAX_RSS_MB, MAX_SECONDS = 300, 20.0
# Tries, timeouts and chunk size small enough for a run to take seconds; every fault below fits in them.
ENV = {"KVGRAFT_REMOTE_TRIES": "3", "KVGRAFT_REMOTE_TIMEOUT": "0.5", "KVGRAFT_FETCH_DEADLINE": "8"}
CLASSES = ["drop-small", "drop-entry", "stall", "drip", "whole-file", "short-range", "shift", "elsewhere", "loop",
           "status", "corrupt-wire", "bad-url", "damaged-cache", "partial-junk", "bad-setting"]


class Case:
    def __init__(self, cls: str, command: str, *, faults: list[Fault] | None = None, url: str | None = None,
                 env: dict[str, str] | None = None, ok: bool = False, ranges: bool = True,
                 damage: str | None = None, lines: int = 1) -> None:
        self.cls, self.command, self.faults, self.url = cls, command, faults or [], url
        self.env, self.ok, self.ranges, self.damage, self.lines = env or {}, ok, ranges, damage, lines


def draw(cls: str, rng: random.Random, files: dict[str, str]) -> Case:
    """One case of `cls`; `ok`: a fault a correct client gets through (exit 0 expected)."""
    entry = files["entry"]
    small = rng.choice(["manifest.json", "release.sigstore.json", "model.sig"])
    command = rng.choice(["verify-entry", "verify-entry", "verify", "pull", "inspect"])
    if cls == "drop-small":
        times = rng.choice([1, 2, 3])
        return Case(cls, command, faults=[Fault(f"/rel/{small}", "drop", times=times, after=rng.randrange(0, 300))],
                    ok=times < 3)
    if cls == "drop-entry":
        times = rng.choice([1, 2, 5])
        return Case(cls, rng.choice(["verify-entry", "pull"]),
                    faults=[Fault(entry, "drop", times=times, after=rng.randrange(0, 400))], ok=times < 3)
    if cls == "stall":
        target = rng.choice([entry, "/rel/manifest.json", "/index/"])
        times = rng.choice([1, 3])
        return Case(cls, command, faults=[Fault(target, "stall", times=times, after=rng.randrange(0, 50), seconds=30)],
                    ok=times < 3)
    if cls == "drip":
        target = rng.choice([entry, "/rel/manifest.json"])
        return Case(cls, command, faults=[Fault(target, "drip", times=-1, seconds=0.1)],
                    env={"KVGRAFT_FETCH_DEADLINE": str(rng.choice([1, 2]))})
    if cls == "whole-file":
        return Case(cls, command, ranges=False, ok=True)
    if cls == "short-range":
        return Case(cls, rng.choice(["verify-entry", "pull", "verify"]),
                    faults=[Fault(rng.choice([entry, "/rel/manifest.json", "/index/"]), "short-range",
                                  times=rng.choice([1, 2]), by=rng.choice([1, 1, 2, 100]))], ok=True)
    if cls == "shift":
        times = rng.choice([1, 2, -1])
        return Case(cls, rng.choice(["verify-entry", "pull"]),
                    faults=[Fault(rng.choice([entry, "/index/"]), "shift", times=times, by=rng.choice([1, 7]))],
                    ok=times != -1)
    if cls == "elsewhere":  # always (-1): localhost too redirects to itself, a loop refused
        times = rng.choice([1, -1])
        return Case(cls, command, faults=[Fault(rng.choice([entry, "/rel/manifest.json", "/index/"]), "elsewhere",
                                                times=times, to="localhost")], ok=times == 1)
    if cls == "loop":
        return Case(cls, command, faults=[Fault(rng.choice([entry, "/rel/manifest.json"]), "loop", times=-1)])
    if cls == "status":
        status = rng.choice([400, 401, 403, 405, 408, 410, 416, 429, 500, 502, 503, 504])
        times = rng.choice([1, -1])
        return Case(cls, command, faults=[Fault(rng.choice([entry, "/rel/manifest.json", "/index/", "/rel/model.sig"]),
                                                "status", times=times, status=status)])
    if cls == "corrupt-wire":
        return Case(cls, rng.choice(["verify-entry", "pull", "verify"]),
                    faults=[Fault(rng.choice([entry, "/index/", "/rel/manifest.json"]), "corrupt", times=-1,
                                  at=rng.randrange(0, 200))])
    if cls == "bad-url":
        port = rng.choice(["99999", "0", "x", "-1"])
        url = rng.choice(["file:///tmp/rel", "ftp://127.0.0.1/rel", "http://[::1/x", f"http://127.0.0.1:{port}/rel",
                          "https:///rel", "http://user:pw-secret@127.0.0.1:1/rel", "hf://", "s3://", "gopher://x/y",
                          "http://%00host/rel", "http://ho st/rel", "http://" + "a" * 300 + "/rel", "REFUSED"])
        return Case(cls, command, url=url)
    if cls == "damaged-cache":
        return Case(cls, rng.choice(["verify-entry", "pull"]), ok=True, lines=2,
                    damage=rng.choice(["flip", "symlink", "truncate", "folder", "empty"]))
    if cls == "partial-junk":
        return Case(cls, rng.choice(["verify-entry", "pull"]), ok=True, damage=rng.choice(["junk", "long", "folder"]))
    if cls == "bad-setting":
        var, value = rng.choice([
            ("KVGRAFT_CACHE", "@file"), ("KVGRAFT_CACHE", "/proc/kvgraft-cache"), ("KVGRAFT_CACHE", "/dev/null"),
            ("KVGRAFT_CACHE_LIMIT", "lots"), ("KVGRAFT_CACHE_LIMIT", "-5"), ("KVGRAFT_REMOTE_TRIES", "0"),
            ("KVGRAFT_REMOTE_TRIES", "abc"), ("KVGRAFT_REMOTE_TIMEOUT", "nan"), ("KVGRAFT_REMOTE_TIMEOUT", "-1"),
            ("KVGRAFT_REMOTE_TIMEOUT", "inf"), ("KVGRAFT_FETCH_DEADLINE", "0"), ("KVGRAFT_FETCH_DEADLINE", "nan"),
            ("KVGRAFT_FETCH_DEADLINE", "1e400"), ("KVGRAFT_REMOTE_PARALLEL", "100000"), ("KVGRAFT_REMOTE_PARALLEL", "1.5")])
        return Case(cls, command, env={var: value})
    raise ValueError(cls)


def args_for(case: Case, url: str, pub: Path, out: Path) -> list[str]:
    return {"verify-entry": ["verify", url, "--entry", "rec-002", "--key", str(pub)],
            "verify": ["verify", url, "--key", str(pub)],
            "inspect": ["inspect", url],
            "pull": ["pull", url, "--entry", "rec-002", "--out", str(out), "--key", str(pub)]}[case.command]


def run(argv: list[str], env: dict[str, str]) -> tuple[int, str, float, float]:
    """(status, stderr, seconds, peak RSS MB) of one process; killed at 3 x MAX_SECONDS."""
    with tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as out, tempfile.TemporaryDirectory() as tmp:
        hwm = Path(tmp) / "status"
        started = time.monotonic()
        proc = subprocess.Popen(argv, env={**env, "CAMPAIGN_HWM_FILE": str(hwm)}, stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL)
        try:
            proc.wait(timeout=3 * MAX_SECONDS)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        seconds = time.monotonic() - started
        err.seek(0)
        peak = 0.0
        for line in hwm.read_text().splitlines() if hwm.exists() else []:
            if line.startswith("VmHWM:"):
                peak = int(line.split()[1]) / 1024
        return proc.returncode, err.read().decode("utf-8", "replace"), seconds, peak


def damage_cache(cache: Path, damage: str, sha: str, size: int, rng: random.Random, scratch: Path) -> None:
    piece = cache / "pieces" / sha[:2] / sha
    if damage in ("flip", "symlink", "truncate", "folder", "empty"):
        good = piece.read_bytes()
        piece.chmod(0o644)
        piece.unlink()
        if damage == "flip":
            at = rng.randrange(len(good))
            piece.write_bytes(good[:at] + bytes([good[at] ^ 1]) + good[at + 1:])
        elif damage == "symlink":
            (scratch / "target").write_bytes(good)
            piece.symlink_to(scratch / "target")
        elif damage == "truncate":
            piece.write_bytes(good[: len(good) // 2])
        elif damage == "folder":
            piece.mkdir()
        else:
            piece.write_bytes(b"")
        return
    piece.chmod(0o644)
    piece.unlink()  # the piece is fetched again, into a partial/ folder an earlier process left junk in
    work = cache / "partial" / f"{sha}-{size}"
    work.mkdir(parents=True, exist_ok=True)
    part = work / f"{0:016d}"
    if damage == "junk":
        part.write_bytes(os.urandom(rng.randrange(1, size)))
    elif damage == "long":
        part.write_bytes(os.urandom(size + 10))
    else:
        part.mkdir()


def left_behind(cache: Path, out: Path, code: int, case: Case, bad_file: Path | None) -> list[str]:
    found = []
    mirrors = cache / "mirrors"
    if mirrors.is_dir() and [p for p in mirrors.iterdir() if p.is_dir()]:
        found.append("a mirror folder")
    for piece in (cache / "pieces").glob("*/*") if (cache / "pieces").is_dir() else []:
        if piece.is_file() and not piece.is_symlink() and hashlib.sha256(piece.read_bytes()).hexdigest() != piece.name:
            found.append(f"an unverified piece {piece.name[:12]}")
    if case.command == "pull" and code != 0 and (out.exists() or list(out.parent.glob(f".{out.name}.*"))):
        found.append("a pull's folder after a refusal")
    if bad_file is not None and bad_file.read_bytes() != b"not a folder":
        found.append("KVGRAFT_CACHE's file changed")
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=260)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--summary", type=Path, default=None)
    a = ap.parse_args(argv)
    rng = random.Random(a.seed)
    work = Path(tempfile.mkdtemp(prefix="kvgraft-remote-campaign-"))
    try:
        rel = work / "rel"
        make_release(rel, entries=5, format_version=2, shard_entries=2, tokens=20)
        private, pub = keys.write_keypair(work / "signer")
        sign.sign_release(rel, keys.load_private_key(private))
        r = Release.open(rel)
        e = r.entry("rec-002")
        meta = r.file_meta(e)
        files = {"entry": "/" + e["file"]}
        base_env = {**os.environ, **ENV, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        stats: dict[str, dict[str, Any]] = collections.defaultdict(lambda: {
            "runs": 0, "codes": collections.Counter(), "misses": 0, "failed": 0, "slowest": 0.0, "rss": 0.0})
        failures: list[str] = []
        with folder_server(rel=rel) as server:
            warm = work / "warm-cache"
            rc, err, _, _ = run([*CLI, "verify", server.url("rel"), "--entry", "rec-002", "--key", str(pub)],
                                {**base_env, "KVGRAFT_CACHE": str(warm)})
            assert rc == 0, err
            for i in range(a.runs):
                cls = CLASSES[i % len(CLASSES)]
                case = draw(cls, rng, files)
                one_outcome(i, case, server, rel, pub, meta, warm, work, base_env, rng, stats[cls], failures)
        lines = table(stats)
        text = "\n".join([*lines, f"failed runs: {len(failures)}", *failures[:20]])
        print(text)
        if a.summary is not None:
            a.summary.write_text(text + "\n")
        return 1 if failures else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


def one_outcome(i: int, case: Case, server: FolderServer, rel: Path, pub: Path, meta: dict[str, Any], warm: Path,
                work: Path, base_env: dict[str, str], rng: random.Random, st: dict[str, Any],
                failures: list[str]) -> None:
    scratch = work / f"run-{i}"
    scratch.mkdir()
    cache, out = scratch / "cache", scratch / "out"
    bad_file = None
    if case.damage is not None:
        shutil.copytree(warm, cache, symlinks=True)
        damage_cache(cache, case.damage, meta["sha256"], int(meta["size"]), rng, scratch)
    env = {**base_env, "KVGRAFT_CACHE": str(cache), **case.env}
    if env["KVGRAFT_CACHE"] == "@file":
        bad_file = scratch / "a-file"
        bad_file.write_bytes(b"not a folder")
        env["KVGRAFT_CACHE"] = str(bad_file)
    url = case.url or server.url("rel")
    if url == "REFUSED":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            url = f"http://127.0.0.1:{s.getsockname()[1]}/rel"
    server.faults[:] = case.faults
    server.ranges = case.ranges
    code, err, seconds, rss = run([*CLI, *args_for(case, url, pub, out)], env)
    server.faults.clear()
    server.ranges = True
    problems = []
    if code == 70 or code < 0 or code > 128:
        problems.append(f"exit {code}")
    if "Traceback" in err:
        problems.append("a traceback")
    if len(err.strip().splitlines()) > case.lines and code != 0:
        problems.append(f"{len(err.strip().splitlines())} lines on stderr")
    if code not in (0,) and "kvgraft: error:" not in err:
        problems.append("no error line")
    if rss >= MAX_RSS_MB:
        problems.append(f"{rss:.0f} MB")
    if seconds >= MAX_SECONDS:
        problems.append(f"{seconds:.1f} s")
    problems += left_behind(cache, out, code, case, bad_file)
    if "pw-secret" in err:
        problems.append("a password echoed")
    miss = case.ok and code != 0
    st["runs"] += 1
    st["codes"][code] += 1
    st["misses"] += int(miss)
    st["failed"] += int(bool(problems))
    st["slowest"] = max(st["slowest"], seconds)
    st["rss"] = max(st["rss"], rss)
    if problems or miss:
        first = err.strip().splitlines()[-1][:200] if err.strip() else ""
        failures.append(f"run {i} {case.cls}/{case.command}: {'; '.join(problems) or 'a miss'}: {first}")
    shutil.rmtree(scratch, ignore_errors=True)


def table(stats: dict[str, dict[str, Any]]) -> list[str]:
    lines = [f"{'class':<14} {'runs':>5}  {'exit codes':<28} {'misses':>6} {'failed':>6} {'slowest s':>9} {'RSS MB':>7}"]
    total: collections.Counter[int] = collections.Counter()
    for cls in CLASSES:
        s = stats.get(cls)
        if s is None:
            continue
        total.update(s["codes"])
        codes = ", ".join(f"{c}: {n}" for c, n in sorted(s["codes"].items()))
        lines.append(f"{cls:<14} {s['runs']:>5}  {codes:<28} {s['misses']:>6} {s['failed']:>6} {s['slowest']:>9.2f} "
                     f"{s['rss']:>7.0f}")
    lines.append(f"{'all':<14} {sum(total.values()):>5}  " + ", ".join(f"exit {c}: {n}" for c, n in sorted(total.items())))
    lines.append(f"misses: {sum(s['misses'] for s in stats.values())}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
