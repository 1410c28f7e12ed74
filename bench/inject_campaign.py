"""Inject ENOSPC, EIO and EDQUOT into the Nth write, fsync, rename and open of kvgraft commands, for every N.

    python -m bench.inject_campaign                    # sign, keygen, a tiny capture, a report: a table on stdout
    python -m bench.inject_campaign --only sign        # one scenario
    python -m bench.inject_campaign --only keygen --errno ENOSPC   # one errno (tests/bench/test_bench_smoke.py)
    python -m bench.inject_campaign --only report --errno EIO --syscall rename   # one syscall class
    python -m bench.inject_campaign --only capture --jobs 2      # two injected runs at a time

strace's syscall fault injection (`strace -f -e inject=write:error=ENOSPC:when=N`) fails the Nth call of
one syscall class; the classes' counts come from one traced complete run. Opens are counted and failed only
where they name the output's folder, final names or lock files (`strace -P PATH`, which restricts both the
tracing and the injection to calls on PATH; sign, keygen, capture and report). `pyopen` reaches the opens -P cannot
name (mkstemp's random names, capture's hidden partial folder): a Python audit hook (bench/fail_open.py) fails
the Nth open whose path lies under the output's folder, at the Python layer. Each injected run must end in
one of two ways: exit 7 (EXIT_IO) with exactly one stderr line naming the cause's errno and no traceback,
the previous artifact intact; or exit 0 with the new artifact complete (a failure after it was in place,
such as its folder's flush, is a warning). Anything else is a violation (but for one admitted state, LEFT,
listed below the table). Exit 1 when there is one.

`report`: `audit run` of a plan that re-signs an existing release (a fixed key: another than the previous
run's) and runs the verify check only, the cheapest plan that writes a signed report (it still loads the
model: `audit run` loads it before any check). The previous state is a complete run's folder (release,
report.json, report.sigstore.json, report.html). `audit run` removes the previous report when it starts
(an older report must not look current), so a third state is honest after exit 7: no report.json at all (a
signature without its report may stay; docs/reliability.md). A report that does not verify with its run's
key and the release, an html page without its report, a release that verifies with neither key, or a
hidden temp file left in the folder is a violation.
"""

from __future__ import annotations

import argparse
import os
import queue
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from bench.crash_campaign import KVGRAFT, ROOT, _env, _records, _tiny_model

CLASSES = {"write": "write,pwrite64", "fsync": "fsync,fdatasync", "rename": "rename,renameat,renameat2",
           "open": "open,openat", "pyopen": ""}
# The interpreter opens thousands of files of its own, so opens are counted and failed only where they name
# one of the output's paths (strace -P: its folder, its final names, their lock files). mkstemp's temp files
# have random names -P cannot list: `pyopen` (no syscall: bench/fail_open.py's audit hook) fails the Nth open
# under the scenario's folder, whatever its name.
RESTRICTED = {"open"}
HOOKED = "pyopen"
ERRNOS = ("ENOSPC", "EIO", "EDQUOT")


@dataclass
class Row:
    scenario: str
    syscall: str
    code: str
    runs: int = 0
    exit_io: int = 0  # exit 7, one line naming the errno, no traceback
    exit_ok: int = 0
    previous: int = 0
    new: int = 0
    absent: int = 0  # no output at all, where the command removes the previous one on purpose (report)
    violations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # runs in an admitted state (LEFT), counted as "new"


# A capture whose replaced release could not be removed after the swap (the failure came after the new release
# was in place): exit 0, a warning naming the hidden folder that holds it, which the next writer clears
# (tests/release/test_nothing_lost.py). Admitted with the warning only; without it, a violation.
LEFT = "new, the replaced release left beside it"


@dataclass
class Scenario:
    """One copy of a scenario's world (each job of `--jobs` runs in its own). `state` says "previous", "new",
    "absent" (where the scenario admits no output after a failed run) or what is wrong; `reset` restores the
    previous; `paths`, the output's own paths, where the restricted classes are injected, and `folder`, where
    `pyopen` is (without them, they are not)."""
    name: str
    args: Callable[[], list[str]]
    state: Callable[[], str]
    reset: Callable[[], None]
    paths: Callable[[], list[Path]] | None = None
    folder: Path | None = None
    codes: tuple[str, ...] = ERRNOS  # the errnos injected unless --errno says
    skip: Path | None = None  # under `folder`, where pyopen does not count (what another scenario sweeps)


def traced(args: list[str], syscalls: str, inject: str | None = None,
           paths: list[Path] | tuple[()] = ()) -> subprocess.CompletedProcess[bytes]:
    # --seccomp-bpf: only the traced calls stop the process (without it every call does: ~1.5x the runtime)
    cmd = ["strace", "-f", "-qq", "--seccomp-bpf", "-o", "/dev/null" if inject else "/dev/stderr",
           "-e", f"trace={syscalls}"]
    cmd += [arg for p in paths for arg in ("-P", str(p))]
    if inject:
        cmd += ["-e", f"inject={syscalls}:{inject}"]
    return subprocess.run([*cmd, *KVGRAFT, *args], env=_env(), capture_output=True, check=False)


def hooked(world: Scenario, n: int, code: str, log: Path | None = None) -> subprocess.CompletedProcess[bytes]:
    """kvgraft with the Nth open under the world's folder failed by bench/fail_open.py's audit hook (0: none)."""
    own = [str(world.folder), str(n), code, *(["--log", str(log)] if log else []),
           *(["--skip", str(world.skip)] if world.skip else [])]
    return subprocess.run([sys.executable, "-m", "bench.fail_open", *own, "--", *world.args()], env=_env(),
                          capture_output=True, check=False)


def counts(world: Scenario, classes: list[str]) -> Counter[str]:
    """How many calls of each of `classes` a complete run makes (strace's lines on stderr); of the restricted
    classes, those on the world's paths; of `pyopen`, the opens under its folder. (A traced run per kind.)"""
    found: Counter[str] = Counter()
    if free := ",".join(CLASSES[k] for k in classes if k not in RESTRICTED and k != HOOKED):
        found += count_calls(traced(world.args(), free).stderr.decode(errors="replace"))
    if world.paths and RESTRICTED & set(classes):
        only = ",".join(CLASSES[k] for k in RESTRICTED)
        world.reset()
        found += count_calls(traced(world.args(), only, paths=world.paths()).stderr.decode(errors="replace"))
    if world.folder and HOOKED in classes:
        world.reset()
        with tempfile.TemporaryDirectory() as tmp:
            done = hooked(world, 0, "EIO", Path(tmp) / "opens")
            opens = (Path(tmp) / "opens").read_text().splitlines()
        if done.returncode:
            raise RuntimeError(f"{world.name}: the counting run failed: {done.stderr.decode()[-400:]}")
        found[HOOKED] = len(opens)
        print(f"{world.name}: {len(opens)} opens under {world.folder}:", *opens, sep="\n  ", file=sys.stderr)
    return found


def count_calls(trace: str) -> Counter[str]:
    """The calls of each class in `strace -f` output (each line "PID name(args) = result"; a call strace
    shows as "<unfinished ...>" and then "<... name resumed>" counts once)."""
    found: Counter[str] = Counter()
    for line in trace.splitlines():
        name = line.split(" ", 1)[-1].split("(", 1)[0].strip()
        for cls, names in CLASSES.items():
            if names and name in names.split(","):
                found[cls] += 1
    return found


def sweep(worlds: list[Scenario], codes: tuple[str, ...], classes: tuple[str, ...]) -> list[Row]:
    """Every (class, errno, N), as many runs at a time as there are worlds."""
    first, free = worlds[0], queue.Queue[Scenario]()
    for world in worlds:
        free.put(world)
    chosen = [c for c in CLASSES if c in classes and (c != HOOKED or first.folder)
              and (c not in RESTRICTED or first.paths)]
    first.reset()
    total = counts(first, chosen)

    def one(cls: str, code: str, n: int) -> tuple[int, list[str], str]:
        world = free.get()
        try:
            world.reset()
            if cls == HOOKED:
                done = hooked(world, n, code)
            else:
                only = world.paths() if world.paths and cls in RESTRICTED else ()
                done = traced(world.args(), CLASSES[cls], f"error={code}:when={n}", only)
            return done.returncode, done.stderr.decode(errors="replace").strip().splitlines(), world.state()
        finally:
            free.put(world)

    rows = []
    with ThreadPoolExecutor(len(worlds)) as pool:
        runs = {(cls, code): [pool.submit(one, cls, code, n) for n in range(1, total[cls] + 1)]
                for cls in chosen for code in codes}
        for (cls, code), futures in runs.items():
            row = Row(first.name, cls, code)
            for n, future in enumerate(futures, 1):
                returncode, err, now = future.result()
                row.runs += 1
                where = f"{cls} #{n} {code}: exit {returncode}"
                if now == LEFT and returncode == 0 and any(line.startswith("kvgraft: warning:") for line in err):
                    now = "new"  # admitted: the replaced release could not be removed, and the warning names it
                    row.notes.append(f"{where}: {err[-1][:300]}")
                row.previous += now == "previous"
                row.new += now == "new"
                row.absent += now == "absent"
                if now not in ("previous", "new", "absent"):
                    row.violations.append(f"{where}: {now}")
                elif returncode == 0:
                    row.exit_ok += 1
                    if now != "new":
                        row.violations.append(f"{where}: exit 0 but the output is not the new one")
                elif returncode == 7 and len(err) == 1 and code in err[0] and "Traceback" not in err[0]:
                    row.exit_io += 1
                else:
                    row.violations.append(f"{where}: {' / '.join(err)[-300:]}")
            rows.append(row)
            print(_line(row), file=sys.stderr, flush=True)  # progress: a long run
    return rows


def _line(r: Row) -> str:
    return (f"| {r.scenario} | {r.syscall} | {r.code} | {r.runs} | {r.exit_io} | {r.exit_ok} | {r.previous} | "
            f"{r.new} | {r.absent} | {len(r.violations)} |")


def sign(work: Path) -> Scenario:
    from kvgraft.signing import keys
    from kvgraft.signing.policy import ALL, SignedWithKeys
    from kvgraft.signing.verify import verify
    from tests.release_factory import make_release

    rel = work / "rel"
    make_release(rel, entries=4, format_version=2)
    (old_key, old_pub), (new_key, new_pub) = keys.write_keypair(work / "a"), keys.write_keypair(work / "b")
    signed = work / "out" / "signed"  # alone in its folder: sign's lock and temp files lie beside it

    def reset() -> None:
        shutil.rmtree(signed.parent, ignore_errors=True)
        signed.parent.mkdir()
        shutil.copytree(rel, signed)
        subprocess.run([*KVGRAFT, "sign", str(signed), "--key", str(old_key)], env=_env(), check=True,
                       capture_output=True)

    def state() -> str:
        beside = sorted(set(os.listdir(signed.parent)) - {signed.name})
        if beside:
            return f"left beside the release: {beside}"
        for label, pub in (("previous", old_pub), ("new", new_pub)):
            try:
                verify(signed, SignedWithKeys((pub,)), ALL).close()
                return label
            except Exception:
                pass
        return "verifies with neither key"

    def paths() -> list[Path]:
        names = {*(p.name for p in signed.iterdir()), *(f".{n}.lock" for n in ("release.sigstore.json", "model.sig"))}
        return [signed.parent, signed.parent / f".{signed.name}.lock", signed, *(signed / n for n in sorted(names))]

    return Scenario("sign", lambda: ["sign", str(signed), "--key", str(new_key)], state, reset, paths, signed.parent)


def keygen(work: Path) -> Scenario:
    from kvgraft.signing import keys

    prefix = work / "k"
    private, public = Path(f"{prefix}.key.pem"), Path(f"{prefix}.pub.pem")
    keys.write_keypair(work / "old")
    old = (work / "old.key.pem").read_bytes(), (work / "old.pub.pem").read_bytes()

    def reset() -> None:
        private.write_bytes(old[0])
        public.write_bytes(old[1])

    def state() -> str:
        try:
            pair = private.read_bytes(), public.read_bytes()
            derived = keys.public_pem(keys.load_private_key(private))
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        if derived != pair[1]:
            return "the public key file is not the private key's (a half-replaced pair)"
        return "previous" if pair == old else "new"

    def paths() -> list[Path]:
        return [work, private, public, *(p.with_name(f".{p.name}.lock") for p in (private, public))]

    return Scenario("keygen --overwrite", lambda: ["keygen", "--out", str(prefix), "--overwrite"], state, reset, paths,
                    work)


def capture(work: Path) -> Scenario:
    from kvgraft._internal import jsonio
    from kvgraft.release.integrity import check_release

    model = _tiny_model(work)
    # the release alone in its folder (`out`), where pyopen counts opens: the model and records lie outside it
    src, out, first = _records(work / "records.jsonl", 3), work / "out", work / "first"
    rel = out / "rel"
    args = ["capture", str(src), "--out", str(rel), "--model", str(model), "--overwrite", "--probe", "2"]
    subprocess.run([*KVGRAFT, *args[:3], str(first), *args[4:]], env=_env(), check=True, capture_output=True)
    before = jsonio.load_file(first / "manifest.json")["root_digest"]

    def reset() -> None:
        shutil.rmtree(rel, ignore_errors=True)
        shutil.copytree(first, rel)

    def state() -> str:
        try:
            check_release(rel)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        leftovers = [n for n in out.iterdir() if n.name.startswith(".rel.")]
        now = "previous" if jsonio.load_file(rel / "manifest.json")["root_digest"] == before else "new"
        if leftovers and now == "new" and all(n.name.endswith(".partial") and (n / "manifest.json").is_file()
                                              and jsonio.load_file(n / "manifest.json")["root_digest"] == before
                                              for n in leftovers):
            return LEFT
        return f"left beside it: {[n.name for n in leftovers]}" if leftovers else now

    def paths() -> list[Path]:
        return [out, rel, out / ".rel.lock", *sorted(rel.iterdir())]

    return Scenario("capture --overwrite", lambda: args, state, reset, paths, out, ("ENOSPC",))


def report(work: Path) -> Scenario:
    from kvgraft.report.signing import verify_report
    from kvgraft.signing import keys
    from kvgraft.signing.policy import ALL, SignedWithKeys
    from kvgraft.signing.verify import verify
    from tests.release_factory import make_release

    model = _tiny_model(work)
    (old_key, old_pub), (new_key, new_pub) = keys.write_keypair(work / "a"), keys.write_keypair(work / "b")
    first, out = work / "first", work / "run"
    make_release(first / "release", entries=4, format_version=2)

    def plan(name: str, key: Path) -> Path:
        # verify only: the cheapest check; the release is the output folder's own (re-signed by each run)
        path = work / f"{name}.toml"
        path.write_text(f"""format = "kvgraft-audit-plan"
format_version = 1
name = "inject"
out = "{out}"
[model]
spec = "{model}"
[release]
path = "{out / 'release'}"
[checks.verify]
[signing]
key = "{key}"
""")
        return path

    old_plan, new_plan = plan("old", old_key), plan("new", new_key)
    shutil.copytree(first, out)
    subprocess.run([*KVGRAFT, "audit", "run", str(old_plan), "-q"], env=_env(), check=True, capture_output=True)
    shutil.rmtree(first)
    shutil.copytree(out, first)  # the previous state: a complete run's folder, its report signed by the old key
    previous = (first / "report.json").read_bytes()
    report = out / "report.json"

    def reset() -> None:
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(first, out)

    def state() -> str:
        hidden = sorted(p.name for d in (out, out / "release") if d.is_dir() for p in d.iterdir()
                        if p.name.startswith("."))
        if hidden:
            return f"left in the folder: {hidden}"
        release = []
        for pub in (old_pub, new_pub):
            try:
                verify(out / "release", SignedWithKeys((pub,)), ALL).close()
                break
            except Exception as exc:
                release.append(f"{type(exc).__name__}: {exc}")
        else:
            return "the release verifies with neither key: " + " | ".join(e[:200] for e in release)
        if not report.exists():
            if (out / "report.html").exists():
                return "report.html without its report.json"
            return "absent"  # removed at the start on purpose (a signature without its report may stay)
        errors = []
        for label, pub in (("previous", old_pub), ("new", new_pub)):
            try:
                verify_report(report, key=pub, release=out / "release")  # what `kvgraft report verify` checks
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
                continue
            if label == "previous" and report.read_bytes() != previous:
                return "a report signed by the old key that is not the previous one"
            return label
        return "a report that verifies with neither key: " + " | ".join(e[:200] for e in errors)

    def paths() -> list[Path]:
        reports = ("report.json", "report.sigstore.json", "report.html")
        names = {*(p.name for p in out.iterdir()), *reports, *(f".{n}.lock" for n in reports)}
        rel = out / "release"
        inside = {*(p.name for p in rel.iterdir()), *(f".{n}.lock" for n in ("release.sigstore.json", "model.sig"))}
        return [out, *(out / n for n in sorted(names)), *(rel / n for n in sorted(inside))]

    # pyopen: the report's own files; the release's opens inside (its re-signing) are sign's, swept there
    return Scenario("audit run (report)", lambda: ["audit", "run", str(new_plan), "-q"], state, reset, paths, out,
                    ("EIO",), out / "release")


SCENARIOS = {"sign": sign, "keygen": keygen, "capture": capture, "report": report}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=list(SCENARIOS), action="append")
    parser.add_argument("--errno", choices=ERRNOS, action="append",
                        help="inject only these (default: each scenario's own; capture injects ENOSPC only, report "
                             "EIO only: each of their runs loads a model)")
    parser.add_argument("--syscall", choices=list(CLASSES), action="append", help="inject only these classes")
    parser.add_argument("--jobs", type=int, default=1, help="injected runs at a time, each in its own copy")
    args = parser.parse_args(argv)
    if shutil.which("strace") is None:
        print("strace is not installed (apt-get install strace)", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    rows: list[Row] = []
    for name in args.only or list(SCENARIOS):
        with tempfile.TemporaryDirectory(prefix=f"kvgraft-inject-{name}-") as tmp:
            worlds = []
            for job in range(max(1, args.jobs)):
                (Path(tmp) / str(job)).mkdir()
                worlds.append(SCENARIOS[name](Path(tmp) / str(job)))
            rows += sweep(worlds, tuple(args.errno or worlds[0].codes), tuple(args.syscall or CLASSES))
    print("| scenario | syscall | errno | injected runs | exit 7, one line | exit 0 (after the output was in place) "
          "| previous intact | new complete | no output (removed at the start) | violations |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(_line(r))
    for r in rows:
        for v in r.violations[:3]:
            print(f"{r.scenario}: {v}")
        for note in r.notes:
            print(f"{r.scenario}: admitted: {note}")
    return 1 if any(r.violations for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
