"""A release read from S3: what opening it and checking a few entries transfer and take, against the bytes needed.

    .venv/bin/python bench/remote.py [--entries 2000] [--entry-kib 1024] [--sample 20] [--dir DIR] [--keep] [--json F]

A release of ENTRIES entries of about ENTRY-KIB KiB each (2 layers x [1, 2, T, 64] bfloat16 keys and values,
T = ENTRY-KIB tokens, random bytes, every entry file distinct) is written by kvgraft's writer
(bench/scale.py's build: ReleaseWriter format 2, signed with a fresh key), uploaded to moto's S3 server on
127.0.0.1 (the server tests/remote_servers.py starts, here behind a WSGI layer that counts the body bytes of
every GET it answers: the bytes transferred are counted by the server, not by kvgraft) and read back as
s3://bench/rel. Steps, each in a fresh process with an empty cache (KVGRAFT_CACHE), then once more with the
cache the first run left (warm):

  open        verified(URL): signature, statement, manifest (library call)
  graft-one   verified(URL), then read_entry_tensors of one entry: the read + check a graft does before any
              tensor is used (library call, no model: `kvgraft run` needs the model the release was made with)
  verify-1    kvgraft verify URL --entry ID
  verify-N    kvgraft verify URL --sample N --nonce X where `verify` has --sample; else kvgraft verify URL
              --entry ... for the N entries of the same draw (kvgraft.sampling.draw)
  pull-N      kvgraft pull URL --sample N --nonce X --out DIR

bytes needed = the opening files present + each distinct index shard of the entries read + their entry files
(+ the prefix index for pull, which a subset keeps; sizes from the local folder). Transferred = the body bytes
the server sent (S3's 404 answers for the absent optional files and listings included; headers not). Each
step is also run on the local folder, and beside it the whole release is fetched first (s3fs get of the
prefix, timed once, server-counted) as the alternative to reading in place. --steps runs some of the steps.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "tests")]
from scale import build  # noqa: E402

OPENING = ("manifest.json", "release.sigstore.json", "model.sig", "kvgraft-subset.json")
BUCKET, PREFIX = "bench", "rel"
URL = f"s3://{BUCKET}/{PREFIX}"
NONCE = "bench-remote-nonce-0001"
GB = 1e9
STEP = [sys.executable, str(Path(__file__).resolve()), "_step"]  # a library step in a fresh process


class Counted:
    """A WSGI layer that counts the body bytes of every GET answered, by object key."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app, self.lock = app, threading.Lock()
        self.by_key: dict[str, int] = defaultdict(int)
        self.requests = 0

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        body = self.app(environ, start_response)
        if environ["REQUEST_METHOD"] != "GET":
            return body
        key = environ.get("PATH_INFO", "").removeprefix(f"/{BUCKET}/").removeprefix(f"{PREFIX}/")
        with self.lock:
            self.requests += 1

        def counting() -> Iterator[bytes]:
            try:
                for chunk in body:
                    with self.lock:
                        self.by_key[key] += len(chunk)
                    yield chunk
            finally:
                close = getattr(body, "close", None)
                if close is not None:
                    close()

        return counting()

    def take(self) -> tuple[dict[str, int], int]:
        """The bytes served per key and the GET count since the last take."""
        with self.lock:
            got, n = dict(self.by_key), self.requests
            self.by_key.clear()
            self.requests = 0
        return got, n


def serve() -> tuple[Counted, str, Any]:
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    counted = Counted(DomainDispatcherApplication(create_backend_app))
    srv = make_server("127.0.0.1", 0, counted, threaded=True, request_handler=MotoRequestHandler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    host, port = srv.server_address[:2]
    return counted, f"http://{host}:{port}", srv


# ------------------------------------------------------------------------------------- child steps

def step(name: str, release: str, key: str, arg: str) -> dict[str, object]:
    """A library step in this (fresh) process."""
    from kvgraft.signing.policy import verify_policy
    from kvgraft.signing.verify import verified

    policy = verify_policy(key=Path(key), require_signature=True)
    if name == "graft-one":
        from kvgraft.inference.graft import read_entry_tensors
    t0 = time.perf_counter()
    out: dict[str, object] = {}
    with verified(release, policy) as checked:  # closed: the mirror's folder removed, the cache within its limit
        if name == "graft-one":
            _, n = read_entry_tensors(checked, checked.release.entry(arg))
            out["bytes_read"] = n
        out["seconds"] = time.perf_counter() - t0  # the step, not the closing
    return out


def fetch_all(dest: str) -> dict[str, object]:
    """The whole release, fetched first (s3fs get of the prefix), as one would without reading in place."""
    import s3fs

    t0 = time.perf_counter()
    s3fs.S3FileSystem(skip_instance_cache=True).get(f"{BUCKET}/{PREFIX}/", dest + "/", recursive=True)
    return {"seconds": time.perf_counter() - t0}


# ------------------------------------------------------------------------------------- parent

class Bench:
    def __init__(self, local: Path, key: Path, endpoint: str, counted: Counted, scratch: Path) -> None:
        self.local, self.key, self.endpoint, self.counted, self.scratch = local, key, endpoint, counted, scratch
        self.kvgraft = str(Path(sys.executable).parent / "kvgraft")

    def env(self, cache: Path) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(ROOT), "KVGRAFT_CACHE": str(cache), "HF_HUB_OFFLINE": "1",
                "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_ENDPOINT_URL": self.endpoint}

    def run(self, argv: list[str], cache: Path) -> tuple[float, dict[str, int], int, float | None]:
        """Wall seconds of a fresh process (interpreter start included), the bytes served per key, GETs, and a
        library step's own seconds (from verified() on: imports excluded)."""
        self.counted.take()
        t0 = time.perf_counter()
        res = subprocess.run(argv, capture_output=True, text=True, env=self.env(cache), timeout=3600)
        seconds = time.perf_counter() - t0
        if res.returncode != 0:
            raise SystemExit(f"{' '.join(argv)}: exit {res.returncode}: {(res.stderr or res.stdout)[-2000:]}")
        got, n = self.counted.take()
        inner = json.loads(res.stdout.strip().splitlines()[-1])["seconds"] if argv[:3] == STEP else None
        return seconds, got, n, inner

    def argv(self, name: str, release: str, ids: list[str], sample_flag: bool) -> list[str]:
        key = ["--key", str(self.key)]
        if name in ("open", "graft-one"):
            return [*STEP, name, release, str(self.key), ids[0] if ids else ""]
        if name == "verify-1":
            return [self.kvgraft, "verify", release, "--entry", ids[0], *key]
        if name == "verify-N":
            if sample_flag:
                return [self.kvgraft, "verify", release, "--sample", str(len(ids)), "--nonce", NONCE, *key]
            return [self.kvgraft, "verify", release, *[a for i in ids for a in ("--entry", i)], *key]
        if name == "pull-N":
            out = Path(tempfile.mkdtemp(dir=self.scratch, prefix="pull-")) / "out"
            return [self.kvgraft, "pull", release, "--sample", str(len(ids)), "--nonce", NONCE, "--out", str(out), *key]
        raise SystemExit(f"unknown step {name}")


def needed(local: Path, ids: list[str], extra: tuple[str, ...] = ()) -> dict[str, int]:
    """The bytes a step reading `ids` needs: the opening files present, their distinct shards, their files,
    and the `extra` files (a pulled subset keeps the prefix index)."""
    from kvgraft.release.format import Release

    rel = Release.open(local)
    assert rel.index is not None
    want = {name: (local / name).stat().st_size for name in (*OPENING, *extra) if (local / name).exists()}
    for i in ids:
        shard = rel.index.shards[rel.index.owner[i]]["file"]
        entry = rel.entry(i)["file"]
        want[shard] = (local / shard).stat().st_size
        want[entry] = (local / entry).stat().st_size
    return want


def kind(key: str) -> str:
    return "entry" if key.startswith("entries/") else "index" if key.startswith("index/") else "opening"


def has_sample_option(kvgraft: str) -> bool:
    res = subprocess.run([kvgraft, "verify", "--help"], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"})
    return "--sample" in res.stdout and "--nonce" in res.stdout


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_step":
        name, release, key, arg = sys.argv[2:6]
        print(json.dumps(fetch_all(arg) if name == "fetch-all" else step(name, release, key, arg)))
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--entries", type=int, default=2000)
    p.add_argument("--entry-kib", type=int, default=1024)
    p.add_argument("--sample", type=int, default=20)
    p.add_argument("--dir", default="/tmp/kvgraft-bench-remote")
    p.add_argument("--steps", default="open,graft-one,verify-1,verify-N,pull-N", help="The steps to run, comma-separated.")
    p.add_argument("--json", type=Path, help="Also write the rows as JSON here.")
    p.add_argument("--keep", action="store_true", help="Keep the release and the caches (default: deleted at the end).")
    args = p.parse_args()
    base = Path(args.dir)
    base.mkdir(parents=True, exist_ok=True)
    try:
        result = bench(args, base)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


def bench(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    from kvgraft import sampling
    from kvgraft.release.format import Release

    from remote_servers import upload

    load0 = os.getloadavg()
    local = base / "rel"
    t0 = time.perf_counter()
    # 2 layers x K and V x [1, 2, T, 64] bfloat16 = 1 KiB per token: ENTRY-KIB tokens per entry
    build(local, args.entries, 2, [1, 2, args.entry_kib, 64], "bfloat16", args.entries)
    built = time.perf_counter() - t0
    key = base / "rel-key.pub.pem"
    total = sum(p.stat().st_size for p in local.rglob("*") if p.is_file())
    counted, endpoint, srv = serve()
    try:
        t0 = time.perf_counter()
        os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"})
        upload(endpoint, BUCKET, PREFIX, local)
        uploaded = time.perf_counter() - t0
        counted.take()
        print(f"release   {args.entries} entries x {args.entry_kib} KiB (2 layers x [1, 2, {args.entry_kib}, 64] bfloat16, "
              f"random, distinct), {total:,} bytes: manifest, signature, {len(list((local / 'index').iterdir()))} index "
              f"files, {args.entries:,} entry files; "
              f"built + signed {built:.0f} s, uploaded to moto {uploaded:.0f} s", flush=True)
        rel = Release.open(local)
        ids_all = rel.entry_ids()
        probe = ids_all[len(ids_all) * 7 // 10]
        drawn = [ids_all[i] for i in sampling.draw(str(rel.manifest["root_digest"]), NONCE, len(ids_all),
                                                     min(args.sample, len(ids_all)))]
        b = Bench(local, key, endpoint, counted, base)
        sample_flag = has_sample_option(b.kvgraft)
        steps = [(name, {"open": [], "graft-one": [probe], "verify-1": [probe]}.get(name, drawn))
                 for name in args.steps.split(",")]
        # the alternative: fetch everything first (once), then do the step on the local copy
        whole = base / "whole"
        full_s, full_got, full_n, _ = b.run([*STEP, "fetch-all", "", "", str(whole)], base / "cache-full")
        full_bytes = sum(full_got.values())
        shutil.rmtree(whole, ignore_errors=True)
        rows = []
        for name, ids in steps:
            want = needed(local, ids, ("index/prefix.bin",) if name == "pull-N" else ())
            cache = base / f"cache-{name}"
            cold_s, cold, cold_n, cold_in = b.run(b.argv(name, URL, ids, sample_flag), cache)
            warm_s, warm, _, warm_in = b.run(b.argv(name, URL, ids, sample_flag), cache)
            local_s, _, _, local_in = b.run(b.argv(name, str(local), ids, sample_flag), base / "cache-local")
            shutil.rmtree(cache, ignore_errors=True)
            row = {"step": name, "entries": len(ids), "needed": sum(want.values()), "transferred": sum(cold.values()),
                   "gets": cold_n, "by_kind": {k: sum(v for x, v in cold.items() if kind(x) == k)
                                               for k in ("opening", "index", "entry")},
                   "not_needed": {k: v for k, v in sorted(cold.items()) if k not in want},
                   "warm_transferred": sum(warm.values()),
                   "warm_entry_bytes": sum(v for x, v in warm.items() if kind(x) == "entry"),
                   "remote_s": cold_s, "warm_s": warm_s, "local_s": local_s, "fetch_all_then_local_s": full_s + local_s,
                   "in_process_s": {"remote": cold_in, "warm": warm_in, "local": local_in} if cold_in is not None else None,
                   "fetch_all_ratio": full_bytes / sum(want.values()),
                   "sample_option": sample_flag if name == "verify-N" else None}
            row["ratio"] = row["transferred"] / row["needed"]
            rows.append(row)
            print(f"{name:10} {json.dumps(row)}", file=sys.stderr, flush=True)
        rows.append({"step": "fetch-all", "entries": args.entries, "needed": total, "transferred": full_bytes,
                     "gets": full_n, "remote_s": full_s, "ratio": full_bytes / total})
    finally:
        srv.shutdown()
    load1 = os.getloadavg()
    table(rows, args, total, full_bytes, full_s, sample_flag, load0, load1)
    from kvgraft.release.index import SHARD_ENTRIES

    sampled = [r for r in rows if r["step"] == "verify-N"]
    if not sampled:
        return {"rows": rows}
    model = record_model(local)
    opening = sum(needed(local, []).values())  # the manifest and the signature grow with the files they list
    return {"rows": rows, "record_model": model, "opening_per_entry": opening / args.entries,
            "paper": paper(sampled[0]["ratio"], model, opening / args.entries, SHARD_ENTRIES)}


def table(rows: list[dict[str, Any]], args: argparse.Namespace, total: int, full_bytes: int, full_s: float,
          sample_flag: bool, load0: tuple[float, ...], load1: tuple[float, ...]) -> None:
    n = args.sample
    label = {"open": "open (verified)", "graft-one": "one-entry graft (verified + read_entry_tensors)",
             "verify-1": "verify --entry", "verify-N": f"verify --sample {n}" if sample_flag else
             f"verify --entry x {n} (the --sample {n} draw: no --sample)", "pull-N": f"pull --sample {n}"}
    print(f"load average {load0[0]:.1f} {load0[1]:.1f} {load0[2]:.1f} at the start, "
          f"{load1[0]:.1f} {load1[1]:.1f} {load1[2]:.1f} at the end; {len(os.sched_getaffinity(0))} cores")
    print(f"whole release fetched first (s3fs get): {full_bytes:,} bytes served for {total:,} on disk, {full_s:.1f} s")
    print()
    print("| step | bytes needed | transferred (cold cache) | ratio | GETs | warm cache: transferred (of it entry files) "
          "| remote, cold | remote, warm | local folder | fetch all first (ratio), then local |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if r["step"] == "fetch-all":
            print(f"| fetch the whole release (s3fs get; positive control) | {r['needed']:,} | {r['transferred']:,} | "
                  f"{r['ratio']:.3f} | {r['gets']:,} | | {r['remote_s']:.1f} s | | | |")
            continue
        def t(w: float, k: str, inner: dict[str, float] | None = r["in_process_s"]) -> str:
            return f"{w:.2f} s" + (f" ({inner[k]:.2f})" if inner else "")

        print(f"| {label[r['step']]} | {r['needed']:,} | {r['transferred']:,} | {r['ratio']:.3f} | {r['gets']} | "
              f"{r['warm_transferred']:,} ({r['warm_entry_bytes']:,}) | {t(r['remote_s'], 'remote')} | "
              f"{t(r['warm_s'], 'warm')} | {t(r['local_s'], 'local')} | "
              f"{r['fetch_all_then_local_s']:.1f} s ({r['fetch_all_ratio']:.0f}x) |")


# The preprint's library (docs/release-format.md, "The preprint's library, on paper"): every token of every
# layer stored, Gemma 3 12B KV in bfloat16.
PAPER_TOKENS = 2_854_766
PAPER_LAYERS = 48
KV_PER_TOKEN = PAPER_LAYERS * 2 * 8 * 256 * 2  # layers x K and V x 8 heads x 256 dims x 2 bytes = 384 KiB


def record_model(local: Path) -> tuple[float, float, float]:
    """Bytes of an index record, from the bench release's first shard: (fixed, per layer, per token id)."""
    from kvgraft.release.format import Release

    rel = Release.open(local)
    assert rel.index is not None
    shard = local / rel.index.shards[0]["file"]
    records = json.loads(shard.read_text())["entries"]
    per = shard.stat().st_size / len(records)
    compact = (lambda x: len(json.dumps(x, separators=(",", ":"))))  # noqa: E731
    layers = sum(compact(r["layers"]) for r in records) / sum(len(r["layers"]) for r in records)
    tokens = sum(compact(r["token_ids"]) for r in records) / sum(len(r["token_ids"]) for r in records)
    fixed = per - layers * len(records[0]["layers"]) - tokens * len(records[0]["token_ids"])
    return fixed, layers, tokens


def paper(ratio: float, model: tuple[float, float, float], opening_per_entry: float,
          shard_entries: int) -> list[dict[str, float]]:
    """The preprint's library at 10^3 to 10^5 entries: bytes and time to audit a 1% sample (computed)."""
    fixed, per_layer, per_token = model
    library = PAPER_TOKENS * KV_PER_TOKEN
    print()
    print(f"| entries | tokens / entry | 1% sample | KV bytes of the sample | opening (manifest + signature) | "
          f"index shards read (expected) | bytes needed | x {ratio:.4f} measured = transferred | 1 Gbit/s | "
          "10 Gbit/s | whole library at 1 / 10 Gbit/s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    out = []
    for entries in (1_000, 10_000, 100_000):
        per_entry = PAPER_TOKENS / entries
        n = entries // 100
        kv = n * per_entry * KV_PER_TOKEN
        opening = opening_per_entry * entries
        shards = -(-entries // shard_entries)
        # expected distinct shards holding n of `entries` drawn without replacement, shard_entries to a shard
        hit = shards * (1 - _none_drawn(entries, shard_entries, n))
        shard_bytes = hit * shard_entries * (fixed + PAPER_LAYERS * per_layer + per_entry * per_token)
        need = kv + opening + shard_bytes
        sent = need * ratio
        out.append({"entries": entries, "sample": n, "kv": kv, "opening": opening, "shards": hit,
                    "shard_bytes": shard_bytes, "needed": need, "transferred": sent, "s_1gbit": sent * 8 / 1e9,
                    "s_10gbit": sent * 8 / 1e10})
        print(f"| {entries:,} | {per_entry:,.0f} | {n:,} | {kv / GB:.2f} GB | {opening / 1e6:.1f} MB | "
              f"{hit:,.0f} ({shard_bytes / 1e6:.1f} MB) | {need / GB:.2f} GB | {sent / GB:.2f} GB | "
              f"{sent * 8 / 1e9:.0f} s | {sent * 8 / 1e10:.1f} s | "
              f"{library * 8 / 1e9 / 3600:.1f} h / {library * 8 / 1e10 / 60:.0f} min |")
    return out


def _none_drawn(population: int, group: int, n: int) -> float:
    """P(none of a group's members among n drawn without replacement)."""
    p = 1.0
    for i in range(n):
        p *= (population - group - i) / (population - i)
        if p <= 0:
            return 0.0
    return p


if __name__ == "__main__":
    main()
