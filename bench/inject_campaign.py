"""Inject ENOSPC, EIO and EDQUOT into the Nth write, fsync, rename and open of kvgraft commands, for every N.

    python -m bench.inject_campaign                    # sign, keygen, a tiny capture, a report: a table on stdout
    python -m bench.inject_campaign --only sign        # one scenario
    python -m bench.inject_campaign --only keygen --errno ENOSPC   # one errno (tests/bench/test_bench_smoke.py)
    python -m bench.inject_campaign --only report --errno EIO --syscall rename   # one syscall class

strace's syscall fault injection (`strace -f -e inject=write:error=ENOSPC:when=N`) fails the Nth call of
one syscall class; the classes' counts come from one traced complete run. Opens are counted and failed only
where they name the output's folder, final names or lock files (`strace -P PATH`, which restricts both the
tracing and the injection to calls on PATH; sign, keygen and report). Each injected run must end in
one of two ways: exit 7 (EXIT_IO) with exactly one stderr line naming the cause's errno and no traceback,
the previous artifact intact; or exit 0 with the new artifact complete (a failure after it was in place,
such as its folder's flush, is a warning). Anything else is a violation. Exit 1 when there is one.

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
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.crash_campaign import KVGRAFT, ROOT, _env, _records, _tiny_model

CLASSES = {"write": "write,pwrite64", "fsync": "fsync,fdatasync", "rename": "rename,renameat,renameat2",
           "open": "open,openat"}
# The interpreter opens thousands of files of its own, so opens are counted and failed only where they name
# one of the output's paths (strace -P: its folder, its final names, their lock files). mkstemp's temp files
# have random names -P cannot list: their opens are not injected.
RESTRICTED = {"open"}
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


def traced(args: list[str], syscalls: str, inject: str | None = None,
           paths: list[Path] | tuple[()] = ()) -> subprocess.CompletedProcess[bytes]:
    cmd = ["strace", "-f", "-qq", "-o", "/dev/null" if inject else "/dev/stderr", "-e", f"trace={syscalls}"]
    cmd += [arg for p in paths for arg in ("-P", str(p))]
    if inject:
        cmd += ["-e", f"inject={syscalls}:{inject}"]
    return subprocess.run([*cmd, *KVGRAFT, *args], env=_env(), capture_output=True, check=False)


def counts(args: list[str], paths: list[Path] | None) -> Counter[str]:
    """How many calls of each class a complete run makes (strace's lines on stderr); of the restricted
    classes, those on `paths` (none without them)."""
    free = ",".join(v for k, v in CLASSES.items() if k not in RESTRICTED)
    found = count_calls(traced(args, free).stderr.decode(errors="replace"))
    if paths:
        only = ",".join(CLASSES[k] for k in RESTRICTED)
        found += count_calls(traced(args, only, paths=paths).stderr.decode(errors="replace"))
    return found


def count_calls(trace: str) -> Counter[str]:
    """The calls of each class in `strace -f` output (each line "PID name(args) = result"; a call strace
    shows as "<unfinished ...>" and then "<... name resumed>" counts once)."""
    found: Counter[str] = Counter()
    for line in trace.splitlines():
        name = line.split(" ", 1)[-1].split("(", 1)[0].strip()
        for cls, names in CLASSES.items():
            if name in names.split(","):
                found[cls] += 1
    return found


def sweep(name: str, args: Callable[[], list[str]], state: Callable[[], str], reset: Callable[[], None],
          codes: tuple[str, ...] = ERRNOS, paths: Callable[[], list[Path]] | None = None,
          classes: tuple[str, ...] = tuple(CLASSES)) -> list[Row]:
    """Every (class, errno, N); `state` says "previous", "new", "absent" (where the scenario admits no output
    after a failed run) or what is wrong; `reset` restores the previous; `paths`, the output's own paths,
    where the restricted classes are injected (without them, they are not)."""
    reset()
    total = counts(args(), paths() if paths else None)
    rows = []
    for cls in (c for c in CLASSES if c in classes and (paths or c not in RESTRICTED)):
        only = paths() if paths and cls in RESTRICTED else ()
        for code in codes:
            row = Row(name, cls, code)
            for n in range(1, total[cls] + 1):
                reset()
                done = traced(args(), CLASSES[cls], f"error={code}:when={n}", only)
                row.runs += 1
                err = done.stderr.decode(errors="replace").strip().splitlines()
                now = state()
                row.previous += now == "previous"
                row.new += now == "new"
                row.absent += now == "absent"
                where = f"{cls} #{n} {code}: exit {done.returncode}"
                if now not in ("previous", "new", "absent"):
                    row.violations.append(f"{where}: {now}")
                elif done.returncode == 0:
                    row.exit_ok += 1
                    if now != "new":
                        row.violations.append(f"{where}: exit 0 but the output is not the new one")
                elif done.returncode == 7 and len(err) == 1 and code in err[0] and "Traceback" not in err[0]:
                    row.exit_io += 1
                else:
                    row.violations.append(f"{where}: {' / '.join(err)[-300:]}")
            rows.append(row)
            print(_line(row), file=sys.stderr, flush=True)  # progress: a long run
    return rows


def _line(r: Row) -> str:
    return (f"| {r.scenario} | {r.syscall} | {r.code} | {r.runs} | {r.exit_io} | {r.exit_ok} | {r.previous} | "
            f"{r.new} | {r.absent} | {len(r.violations)} |")


def sign_rows(work: Path, codes: tuple[str, ...] = ERRNOS, classes: tuple[str, ...] = tuple(CLASSES)) -> list[Row]:
    from kvgraft.signing import keys
    from kvgraft.signing.verify import verify_release
    from tests.release_factory import make_release

    rel = work / "rel"
    make_release(rel, entries=4, format_version=2)
    (old_key, old_pub), (new_key, new_pub) = keys.write_keypair(work / "a"), keys.write_keypair(work / "b")
    signed = work / "signed"

    def reset() -> None:
        shutil.rmtree(signed, ignore_errors=True)
        shutil.copytree(rel, signed)
        subprocess.run([*KVGRAFT, "sign", str(signed), "--key", str(old_key)], env=_env(), check=True,
                       capture_output=True)

    def state() -> str:
        for label, pub in (("previous", old_pub), ("new", new_pub)):
            try:
                verify_release(signed, key=pub)
                return label
            except Exception:
                pass
        return "verifies with neither key"

    def paths() -> list[Path]:
        names = {*(p.name for p in signed.iterdir()), *(f".{n}.lock" for n in ("release.sigstore.json", "model.sig"))}
        return [signed, *(signed / n for n in sorted(names))]

    return sweep("sign", lambda: ["sign", str(signed), "--key", str(new_key)], state, reset, codes, paths, classes)


def keygen_rows(work: Path, codes: tuple[str, ...] = ERRNOS,
                classes: tuple[str, ...] = tuple(CLASSES)) -> list[Row]:
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

    return sweep("keygen --overwrite", lambda: ["keygen", "--out", str(prefix), "--overwrite"], state, reset, codes,
                 paths, classes)


def capture_rows(work: Path, codes: tuple[str, ...] = ("ENOSPC",),
                 classes: tuple[str, ...] = tuple(CLASSES)) -> list[Row]:
    from kvgraft._internal import jsonio
    from kvgraft.release.integrity import check_release

    model = _tiny_model(work)
    src, rel, first = _records(work / "records.jsonl", 3), work / "rel", work / "first"
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
        leftovers = [n for n in Path(work).iterdir() if n.name.startswith(".rel.")]
        if leftovers:
            return f"left beside it: {[n.name for n in leftovers]}"
        return "previous" if jsonio.load_file(rel / "manifest.json")["root_digest"] == before else "new"

    return sweep("capture --overwrite", lambda: args, state, reset, codes, classes=classes)


def report_rows(work: Path, codes: tuple[str, ...] = ("EIO",), classes: tuple[str, ...] = tuple(CLASSES)) -> list[Row]:
    from kvgraft.report.signing import verify_report
    from kvgraft.signing import keys
    from kvgraft.signing.verify import verify_release
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
                verify_release(out / "release", key=pub)
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

    return sweep("audit run (report)", lambda: ["audit", "run", str(new_plan), "-q"], state, reset, codes, paths,
                 classes)


SCENARIOS = {"sign": sign_rows, "keygen": keygen_rows, "capture": capture_rows, "report": report_rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=list(SCENARIOS), action="append")
    parser.add_argument("--errno", choices=ERRNOS, action="append",
                        help="inject only these (default: each scenario's own; capture injects ENOSPC only, report "
                             "EIO only: each of their runs loads a model)")
    parser.add_argument("--syscall", choices=list(CLASSES), action="append", help="inject only these classes")
    args = parser.parse_args(argv)
    if shutil.which("strace") is None:
        print("strace is not installed (apt-get install strace)", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    rows: list[Row] = []
    for name in args.only or list(SCENARIOS):
        with tempfile.TemporaryDirectory(prefix=f"kvgraft-inject-{name}-") as tmp:
            chosen: dict[str, tuple[str, ...]] = {"classes": tuple(args.syscall or CLASSES)}
            if args.errno:
                chosen["codes"] = tuple(args.errno)
            rows += SCENARIOS[name](Path(tmp), **chosen)
    print("| scenario | syscall | errno | injected runs | exit 7, one line | exit 0 (after the output was in place) "
          "| previous intact | new complete | no output (removed at the start) | violations |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(_line(r))
    for r in rows:
        for v in r.violations[:3]:
            print(f"{r.scenario}: {v}")
    return 1 if any(r.violations for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
