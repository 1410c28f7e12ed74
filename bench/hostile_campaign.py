"""A hostile-release campaign on the indexed format (format 2): attacks of bench/hostile_attacks.py, judged.

    PYTHONPATH=. .venv/bin/python bench/hostile_campaign.py [--runs 1100] [--seed 3] [--summary FILE]

Builds a format-2 release of 5 entries in 3 shards signed with k1, and an attacker's key k3. Each case
copies the release and applies one attack of a class (content attacks keep k1's signature; structure
attacks are re-signed with k3, every digest recomputed); then runs kvgraft commands on it: `verify
--key` (also --json, --entry), `inspect` (also --json, an entry), `run --entry` with one or two keys
(the model loader replaced by a stub: reaching it means the release verified, and no model loads), and
`inspect`/`verify` as real processes whose stdout is a closed pipe. A run is one command.

The commands run in one child process (in-process CLI calls, as tests/signing/test_fuzz_verify.py does),
its address space limited (RLIMIT_AS, --memory) so that a blow-up shows as a failed run, not a dead
machine. A run the child does not finish within --hang-after seconds is killed with the child, judged a
hang, and the campaign goes on in a new child from the next case; a signal is judged the same way.

A run fails when it is a miss (exit 0 where the attack violates what the command reads: the attack's
expected verdict, bench/hostile_attacks.py), a control refused, exit 70 or any code but 0, 1, 2, a
signal, a hang, an exception or a traceback, more than one line on stderr or a refusal without its
`kvgraft: error:` line, a raw control, bidi or C1 character or an injected line in what it prints, an
unparsable --json document, stdout over --max-output bytes, or over --slow seconds on an input under
10 MB (allocated bytes: a hole costs nothing). Prints per class: runs, exit codes, misses, failures,
the time of its runs, the slowest and the largest stdout; exits 1 when anything failed. Recorded in docs/hostile-releases.md.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import json
import os
import random
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import unicodedata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]  # the checkout this file lives in, not an installed kvgraft

import hostile_attacks as attacks  # noqa: E402

from kvgraft.release.format import MANIFEST  # noqa: E402
from kvgraft.signing.attest import BUNDLE_NAME  # noqa: E402

VERIFY = ["verify", "verify-json", "verify-entry"]
INSPECT = ["inspect", "inspect-json", "inspect-entry", "inspect-entry-json"]
# The commands each class runs: the first on every case, one or two of the others besides.
COMMANDS: dict[str, list[str]] = collections.defaultdict(lambda: VERIFY + INSPECT, {
    "certificate": ["inspect", "inspect-json", "verify", "verify-json", "verify-entry"],
    "hostile-strings": ["inspect-entry-json", "inspect-entry", "inspect", "inspect-json", "verify", "verify-json",
                        "verify-entry"],
    "hostile-record": ["inspect-entry", "inspect-entry-json", "inspect", "inspect-json", "verify", "verify-entry"],
    "control-k3": ["verify", "verify-k1", "verify-json", "verify-entry", *INSPECT],
    "run-two-keys": ["run-k1-k3", "run-k3-k1", "run-k3", "run-k1"],
    "broken-pipe": ["pipe-inspect", "pipe-verify", "pipe-inspect-json"],
})
# Cheap classes with many variants weigh more; costly ones less (a hole of 4 GiB is read until memory runs
# out by a reader that trusts the size; a record of 10,000 layers was drawn in full).
WEIGHTS = {"cut-grow": 1.5, "special-file": 1.5, "prefix-records": 1.5, "index-listing": 1.5, "hostile-strings": 1.5,
           "control-k3": 1.5, "broken-pipe": 0.3, "sparse-index": 0.7, "hostile-record": 0.7}
PLANTED = ("planted-miss", "planted-crash", "planted-hang")
SMALL_INPUT = 10 * 2**20
PIPE_CODES = (0, 1, 2, 141, -signal.SIGPIPE)  # a closed stdout: a quiet end, by SIGPIPE or not


# ------------------------------------------------------------------------------------------ the child


class _Reached(Exception):
    pass


# `run` names a model that is not there: were the loader not replaced by the stub, no model would load
# (and `run-k1`, which must reach the loader, would fail).
NO_MODEL = "/nonexistent/kvgraft-campaign-model"


def _argv(cmd: str, rel: str, key: str, x: str, base: attacks.Base) -> list[str]:
    k1, k3 = str(base.k1), str(base.k3)
    table = {
        "verify": ["verify", rel, "--key", key], "verify-json": ["verify", rel, "--key", key, "--json"],
        "verify-entry": ["verify", rel, "--key", key, "--entry", x], "verify-k1": ["verify", rel, "--key", k1],
        "inspect": ["inspect", rel], "inspect-json": ["inspect", rel, "--json"],
        "inspect-entry": ["inspect", rel, x], "inspect-entry-json": ["inspect", rel, x, "--json"],
        "run-k1": ["run", rel, "--model", NO_MODEL, "--entry", x, "--key", k1],
        "run-k3": ["run", rel, "--model", NO_MODEL, "--entry", x, "--key", k3],
        "run-k1-k3": ["run", rel, "--model", NO_MODEL, "--entry", x, "--key", k1, "--key", k3],
        "run-k3-k1": ["run", rel, "--model", NO_MODEL, "--entry", x, "--key", k3, "--key", k1],
    }
    return table[cmd.removeprefix("pipe-")]


def expected(attack: attacks.Attack, cmd: str, x: str, ctx: attacks.Ctx) -> str:
    """'refuse', 'accept' or 'any' (the module docstring of hostile_attacks)."""
    if cmd in attack.verdicts:
        return attack.verdicts[cmd]
    if attack.control:
        return "accept"
    if cmd.startswith("pipe-"):
        return "any"
    where = attack.where or ctx.where
    shard, entry = where.get(x, ("", ""))
    reads: set[str] | None = {
        "verify-entry": {MANIFEST, BUNDLE_NAME, shard, entry, f"entry:{x}"},
        "inspect": {MANIFEST, *ctx.shard_files}, "inspect-json": {MANIFEST, *ctx.shard_files},
        "inspect-entry": {MANIFEST, shard}, "inspect-entry-json": {MANIFEST, shard},
    }.get(cmd)  # None: the whole release (verify, run)
    hit = bool(attack.parts) if reads is None else bool(attack.parts & reads)
    return "refuse" if hit else "any"


def observe(stdout: str, stderr: str, cmd: str) -> dict[str, Any]:
    """What the judge needs of a run's output, without carrying megabytes back to the parent."""
    unsafe = None
    for stream, text in (("stdout", stdout), ("stderr", stderr)):
        if not text.isascii() or not all(c.isprintable() or c in "\n\t" for c in text):
            for c in text:
                if c not in "\n\t" and (unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")):
                    unsafe = f"U+{ord(c):04X} in {stream}"
                    break
        if unsafe:
            break
    injected = any(line.startswith(attacks.FORGED) for line in (stdout + "\n" + stderr).splitlines())
    json_exit: Any = None
    json_ok = None
    if cmd.endswith("json") and stdout.strip():
        try:
            doc = json.loads(stdout)
            json_ok = True
            json_exit = doc.get("exit_code") if isinstance(doc, dict) else None
        except ValueError:
            json_ok = False
    return {"stdout_bytes": len(stdout.encode("utf-8", "surrogatepass")), "stderr": stderr[:600],
            "stderr_lines": len(stderr.splitlines()), "traceback": "Traceback" in stdout or "Traceback" in stderr
            or "Exception ignored" in stderr, "unsafe": unsafe, "injected": injected, "json_ok": json_ok,
            "json_exit": json_exit}


def _input_bytes(root: Path) -> int:
    total = 0
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            with contextlib.suppress(OSError):  # gone since the listing
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
    return total


def _pipe_run(argv: list[str]) -> tuple[int, str]:
    """A real `kvgraft` process whose stdout is a pipe already closed at its reading end (`cmd | head -0`)."""
    r, w = os.pipe()
    os.close(r)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.Popen([sys.executable, "-c", "from kvgraft.cli import entrypoint; entrypoint()", *argv],
                         stdout=w, stderr=subprocess.PIPE, env=env, cwd=REPO)
    os.close(w)
    _, err = p.communicate(timeout=600)
    return p.returncode, err.decode("utf-8", "replace")


def _classes(args: argparse.Namespace) -> list[str]:
    names = args.classes.split(",") if args.classes else [n for n in attacks.ATTACKS if n not in PLANTED]
    return names + [f"planted-{p}" for p in (args.plant.split(",") if args.plant else [])]


def child(args: argparse.Namespace) -> None:
    import typer
    from typer.testing import CliRunner

    import kvgraft.inference.graft as graft
    from kvgraft.cli import app
    from kvgraft.release import format as release_format

    base = attacks.load_base(Path(args.base))
    names = _classes(args)
    reached: list[bool] = []

    def model_stub(*_: Any, **__: Any) -> Any:  # `run` verified the release: stop here, no model is loaded
        reached.append(True)
        raise typer.Exit(0)

    if not callable(getattr(graft, "model_for", None)):
        raise SystemExit("kvgraft.inference.graft.model_for is gone: the run command's model stub needs another home")
    graft.model_for = model_stub  # type: ignore[assignment]  # `kvgraft run` loads its model through it alone
    os.environ["HF_HUB_OFFLINE"] = "1"
    runner = CliRunner()
    work = Path(args.base) / "work"
    done, case = 0, args.start
    weights = [WEIGHTS.get(n, 1.0) for n in names]

    def emit(doc: dict[str, Any]) -> None:
        print(json.dumps(doc), flush=True)

    while done < args.runs:
        rng = random.Random(f"{args.seed}:{case}")
        cls = names[case] if case < len(names) else rng.choices(names, weights)[0]
        root = work / f"c{case}"
        shutil.copytree(base.root, root, symlinks=True)
        emit({"case": case, "class": cls, "phase": "attack"})
        ctx = attacks.Ctx(rng, root, base)
        try:
            attack = attacks.ATTACKS[cls](ctx)
        except Exception:
            emit({"case": case, "class": cls, "harness_error": traceback.format_exc()[-1500:]})
            shutil.rmtree(root, ignore_errors=True)
            case += 1
            continue
        size = _input_bytes(root)
        cmds = COMMANDS[cls]
        chosen = [cmds[0], *rng.sample(cmds[1:], min(len(cmds) - 1, rng.randint(1, 2)))]
        key = str(base.k1 if attack.signer == "k1" else base.k3)
        for cmd in chosen:
            if done >= args.runs:
                break
            x = attack.focus if attack.focus and rng.random() < 0.8 else rng.choice(attack.ids or ctx.ids)
            verdict = expected(attack, cmd, x, ctx)
            argv = _argv(cmd, str(root), key, x, base)
            head = {"case": case, "class": cls, "what": attack.what, "cmd": cmd, "expected": verdict,
                    "input_bytes": size}
            if cmd.startswith("run-"):
                from kvgraft.inference import graft, reapply  # noqa: F401  (torch, once: not inside a timed run)
            emit({**head, "phase": "run"})
            reached.clear()
            started = time.monotonic()
            if cmd.startswith("pipe-"):
                code, stderr = _pipe_run(argv)
                stdout, exception = "", None
            else:
                saved = release_format.check_manifest
                if cls == "planted-crash":
                    release_format.check_manifest = lambda *_: (_ for _ in ()).throw(RuntimeError("planted"))
                if cls == "planted-hang":
                    time.sleep(10**6)
                try:
                    r = runner.invoke(app, argv)
                finally:
                    release_format.check_manifest = saved
                code, stdout, stderr = r.exit_code, r.stdout, r.stderr
                exception = (None if r.exception is None or isinstance(r.exception, SystemExit)
                             else repr(r.exception)[:300])
            seconds = time.monotonic() - started
            if not cmd.startswith("pipe-"):
                del r  # its traceback holds the run's frames (a MemoryError's buffers): not into the next run
                if code not in (0, 1, 2) or exception:
                    gc.collect()
            emit({**head, "exit": code, "seconds": round(seconds, 3), "exception": exception,
                  "reached_model": bool(reached), **observe(stdout, stderr, cmd)})
            done += 1
        shutil.rmtree(root, ignore_errors=True)
        case += 1


# ------------------------------------------------------------------------------------------ the judge


def judge(run: dict[str, Any], args: argparse.Namespace) -> tuple[bool, list[str]]:
    """(a miss, the other failures) of one run."""
    code, reasons = run["exit"], []
    if run.get("killed"):
        return False, [f"hang: killed after {args.hang_after:g} s"]
    if run.get("died") is not None:
        return False, [f"the child died in this run ({run['died']}: a negative value is a signal)"]
    pipe = run["cmd"].startswith("pipe-")
    if code == 70:
        reasons.append("exit 70")
    elif code not in ((0, 1, 2) if not pipe else PIPE_CODES):
        reasons.append(f"exit {code}")
    miss = run["expected"] == "refuse" and code == 0
    if run["expected"] == "accept" and code != 0:
        reasons.append("a control was refused")
    if run["exception"]:
        reasons.append(f"exception {run['exception']}")
    if run["traceback"]:
        reasons.append("a traceback")
    if run["stderr_lines"] > 1:
        reasons.append(f"{run['stderr_lines']} lines on stderr")
    elif not pipe and code not in (0, 70) and not run["stderr"].startswith("kvgraft: error: "):
        reasons.append("a refusal without its one 'kvgraft: error:' line")
    if run["unsafe"]:
        reasons.append(f"raw {run['unsafe']}")
    if run["injected"]:
        reasons.append("an injected line")
    if run["json_ok"] is False or (run["cmd"].endswith("json") and code == 0 and not run["json_ok"]):
        reasons.append("--json printed no JSON document")
    if run["cmd"].startswith("verify-json") and run["json_ok"] and run["json_exit"] != code:
        reasons.append(f"--json says exit_code {run['json_exit']}, the exit is {code}")
    if run["stdout_bytes"] > args.max_output:
        reasons.append(f"{run['stdout_bytes']:,} bytes on stdout")
    if run["seconds"] > args.slow and run["input_bytes"] < SMALL_INPUT:
        reasons.append(f"{run['seconds']:.1f} s on {run['input_bytes']:,} bytes")
    return miss, reasons


# ----------------------------------------------------------------------------------------- the parent


def _limit_memory(limit: int) -> Any:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return apply


def campaign(args: argparse.Namespace, base_dir: Path) -> tuple[list[dict[str, Any]], list[str], int]:
    """Run children until --runs runs are recorded; return (runs, harness errors, children started)."""
    runs: list[dict[str, Any]] = []
    errors: list[str] = []
    start, children = 0, 0
    log = base_dir / "child.stderr"
    while len(runs) < args.runs:
        children += 1
        cmd = [sys.executable, __file__, "--child", "--base", str(base_dir), "--seed", str(args.seed),
               "--start", str(start), "--runs", str(args.runs - len(runs)), "--classes", ",".join(_classes(args))]
        with log.open("ab") as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, cwd=REPO, start_new_session=True,
                                    preexec_fn=_limit_memory(args.memory))
        assert proc.stdout is not None
        pending: dict[str, Any] | None = None
        buf = b""
        last_case = start - 1
        deadline = time.monotonic() + 600
        while True:
            if b"\n" not in buf:
                ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
                if not ready:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    if pending is not None and pending.get("phase") == "run":
                        runs.append({**pending, "killed": True, "exit": None})
                    else:
                        errors.append(f"case {last_case}: the attack did not finish in 600 s")
                    break
                chunk = os.read(proc.stdout.fileno(), 1 << 20)
                if not chunk:
                    rc = proc.wait()
                    if pending is not None and pending.get("phase") == "run":
                        runs.append({**pending, "died": rc, "exit": None})
                    elif rc != 0 or len(runs) < args.runs:
                        tail = log.read_text(errors="replace")[-800:]
                        errors.append(f"case {last_case}: the child ended with {rc} outside a run: {tail}")
                    break
                buf += chunk
                continue
            line, buf = buf.split(b"\n", 1)
            if not line.startswith(b"{"):
                continue  # not the driver's: a library's stray print
            doc = json.loads(line)
            last_case = doc["case"]
            if "harness_error" in doc:
                errors.append(f"case {doc['case']} ({doc['class']}): the attack raised: {doc['harness_error']}")
                pending = None
            elif "exit" in doc:
                runs.append(doc)
                pending = None
                deadline = time.monotonic() + 600
            else:
                pending = doc
                deadline = time.monotonic() + (args.hang_after if doc["phase"] == "run" else 600)
        start = last_case + 1
    return runs, errors, children


def _kind(reason: str) -> str:
    """A failure reason without its figures, to count them per class."""
    for head in ("hang", "the child died", "exception", "--json says"):
        if reason.startswith(head):
            return head
    if reason.endswith("bytes on stdout"):
        return "stdout over --max-output"
    if " s on " in reason:
        return "slow"
    return reason


def report(args: argparse.Namespace, runs: list[dict[str, Any]], errors: list[str], wall: float,
           children: int) -> dict[str, Any]:
    per: dict[str, dict[str, Any]] = {}
    failures: list[str] = []
    for run in runs:
        miss, reasons = judge(run, args)
        row = per.setdefault(run["class"], {"runs": 0, "exits": collections.Counter(), "misses": 0, "failures": 0,
                                            "seconds": 0.0, "slowest": 0.0, "max_stdout": 0,
                                            "reasons": collections.Counter()})
        row["runs"] += 1
        row["exits"]["killed" if run.get("killed") else run["exit"] if run["exit"] is not None else "died"] += 1
        row["misses"] += miss
        row["failures"] += bool(reasons)
        row["reasons"].update(_kind(r) for r in reasons)
        row["seconds"] += run.get("seconds") or (args.hang_after if run.get("killed") else 0.0)
        row["slowest"] = max(row["slowest"], run.get("seconds") or 0.0)
        row["max_stdout"] = max(row["max_stdout"], run.get("stdout_bytes") or 0)
        if miss or reasons:
            why = "; ".join((["MISS (exit 0, a refusal expected)"] if miss else []) + reasons)
            stderr = f" | stderr {run['stderr'][:200]!r}" if run.get("stderr") else ""
            failures.append(f"case {run['case']} {run['class']} {run['cmd']}: {run['what']!r}: {why}{stderr}")
    codes = collections.Counter(r["exit"] for r in runs)
    print(f"kvgraft hostile campaign, indexed format: seed {args.seed}, {len(runs)} of {args.runs} runs in "
          f"{wall:.0f} s, {children} child process{'es' if children > 1 else ''}")
    print(f"{'class':<19}{'runs':>5}  {'exits':<30}{'misses':>7}{'failed':>7}{'total s':>8}{'slowest s':>10}"
          f"{'max out KB':>11}")
    for name in sorted(per):
        row = per[name]
        exits = ", ".join(f"{k}: {n}" for k, n in sorted(row["exits"].items(), key=str))
        print(f"{name:<19}{row['runs']:>5}  {exits:<30}{row['misses']:>7}{row['failures']:>7}{row['seconds']:>8.0f}"
              f"{row['slowest']:>10.2f}{row['max_stdout'] / 1024:>11.1f}")
    total_miss = sum(r["misses"] for r in per.values())
    total_fail = sum(r["failures"] for r in per.values())
    print(f"{'all':<19}{len(runs):>5}  " + ", ".join(f"exit {k}: {n}" for k, n in sorted(codes.items(), key=str)))
    print(f"misses: {total_miss}; failed runs: {total_fail}; harness errors: {len(errors)}")
    for name in sorted(per):
        if per[name]["reasons"]:
            print(f"  {name}: " + ", ".join(f"{r} ({n})" for r, n in per[name]["reasons"].most_common()))
    for f in failures[:args.show]:
        print("  " + f)
    for e in errors[:10]:
        print("  harness: " + e)
    return {"seed": args.seed, "runs": len(runs), "asked": args.runs, "seconds": round(wall, 1), "misses": total_miss,
            "failed": total_fail, "harness_errors": errors, "failures": failures,
            "classes": {n: {**{k: v for k, v in r.items() if k not in ("exits", "reasons")},
                            "exits": {str(k): v for k, v in r["exits"].items()}, "reasons": dict(r["reasons"])}
                        for n, r in per.items()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=1100)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--classes", default="", help="comma-separated classes (default: every one but the planted)")
    ap.add_argument("--plant", default="", help="the judge's positive controls: miss,crash,hang")
    ap.add_argument("--hang-after", type=float, default=60.0, help="seconds before a run is killed as a hang")
    ap.add_argument("--slow", type=float, default=20.0, help="a run longer than this on an input under 10 MB fails")
    ap.add_argument("--max-output", type=int, default=2**20, help="bytes of stdout a run may print")
    ap.add_argument("--memory", type=int, default=3 * 2**30, help="the child's address-space limit (bytes)")
    ap.add_argument("--summary", type=Path, help="also write the per-class results here (JSON)")
    ap.add_argument("--show", type=int, default=40, help="failed runs listed")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--base", help=argparse.SUPPRESS)
    ap.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return 0
    unknown = set(_classes(args)) - set(attacks.ATTACKS)
    if unknown:
        ap.error(f"unknown classes: {', '.join(sorted(unknown))}")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kvgraft-hostile-") as tmp:
        attacks.build_base(Path(tmp), args.seed)
        (Path(tmp) / "work").mkdir()
        runs, errors, children = campaign(args, Path(tmp))
    summary = report(args, runs, errors, time.monotonic() - started, children)
    if args.summary:
        args.summary.write_text(json.dumps(summary, indent=2))
    return 1 if summary["misses"] or summary["failed"] or errors or len(runs) < args.runs else 0


if __name__ == "__main__":
    raise SystemExit(main())
