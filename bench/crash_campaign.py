"""Kill kvgraft with SIGKILL at points spread over a command's runtime and check what survives.

    python -m bench.crash_campaign                 # the full campaign (>= 200 kills), a table on stdout
    python -m bench.crash_campaign --kills 3       # a sample: 3 kills per scenario (tests/release/test_crash_sample.py)

Scenarios: `sign` (a release re-signed with another key), `keygen --overwrite`, `capture --overwrite` of a
tiny random model (tests/tiny.py), a resumable sampled `audit recompute --out` (its journal), `library build
--overwrite` (`--only library`) and `audit run` of a plan that signs its report (`--only report`). Each
run is killed at time t_i = D * (i + 0.5) / n, D the command's uninterrupted runtime measured first, so
the kills spread evenly over it. After each kill the scenario's invariant is checked:

- sign: the release verifies with the previous key or with the new one (never neither);
- keygen: the private and public key files each exist and form one pair;
- capture: the release at the output path is whole and verifies (the previous one or the new one);
- audit: the journal holds no unit twice, and a result file, if there is one, is complete and valid;
- library: the library release at the output path is whole and verifies (the previous one or the new one);
- report: a report.json at the path verifies (what `kvgraft report verify --key --release` checks: its
  signature by the run's key, its digest, its binding to the release), and the release is whole; or there is
  no report (a run removes the previous one first).

Leftovers (hidden temp files and folders beside an output) are counted after each kill and must be gone
after the next complete run. Exit 1 when any invariant failed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KVGRAFT = [sys.executable, "-c", "from kvgraft.cli import entrypoint; entrypoint()"]


@dataclass
class Tally:
    name: str
    kills: int = 0
    before_exit: int = 0  # kills that landed while the command still ran
    held: int = 0  # invariant held after the kill
    leftovers_seen: int = 0  # kills after which a hidden leftover sat beside the output
    cleared: bool = True  # the next complete run left none
    failures: list[str] = field(default_factory=list)
    # held, in the one partial state docs/reliability.md admits (keygen: a private key whose public key the
    # kill kept from being written; the next keygen --overwrite completes the pair)
    admitted: int = 0


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false"}


def run(args: list[str], kill_at: float | None = None) -> tuple[int | None, float]:
    """Run kvgraft; with `kill_at`, SIGKILL it that many seconds after the start. (exit status or None, s)."""
    start = time.monotonic()
    proc = subprocess.Popen([*KVGRAFT, *args], env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if kill_at is None:
        _, err = proc.communicate()
        if proc.returncode:
            raise RuntimeError(f"kvgraft {' '.join(args)}: exit {proc.returncode}: {err.decode()[-400:]}")
        return proc.returncode, time.monotonic() - start
    try:
        proc.wait(timeout=kill_at)
        return proc.returncode, time.monotonic() - start
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return None, time.monotonic() - start


def leftovers(folder: Path, name: str) -> list[str]:
    """Hidden names a writer of `name` leaves: temp files, temp folders, lock files."""
    return sorted(n for n in os.listdir(folder) if n.startswith(f".{name}."))


def campaign(tally: Tally, kills: int, once: Callable[[float | None], int | None],
             check: Callable[[], str | None], spots: Callable[[], list[tuple[Path, str]]]) -> None:
    """Measure the command's runtime, then kill it `kills` times spread over it, checking after each."""
    _, duration = run_timed(once)
    for i in range(kills):
        t = duration * (i + 0.5) / kills
        code = once(t)
        tally.kills += 1
        tally.before_exit += code is None
        problem = check()
        if problem is None:
            tally.held += 1
        else:
            tally.failures.append(f"kill at {t:.2f}s: {problem}")
        tally.leftovers_seen += any(leftovers(f, n) for f, n in spots())
    once(None)  # a complete run: leftovers of the killed ones must be gone, and no partial state admitted
    admitted = tally.admitted
    final = check()
    if final is not None or tally.admitted != admitted or any(leftovers(f, n) for f, n in spots()):
        tally.cleared = False
        tally.failures.append(f"after a complete run: {final or 'a partial state'} "
                              f"{[leftovers(f, n) for f, n in spots()]}")
    tally.admitted = admitted


def run_timed(once: Callable[[float | None], int | None]) -> tuple[int | None, float]:
    start = time.monotonic()
    code = once(None)
    return code, time.monotonic() - start


def sign_scenario(work: Path, kills: int) -> Tally:
    from kvgraft.signing import keys
    from kvgraft.signing.policy import ALL, SignedWithKeys
    from kvgraft.signing.verify import verify
    from tests.release_factory import make_release

    rel = work / "signed"
    make_release(rel, entries=40, format_version=2)
    pairs = [keys.write_keypair(work / name) for name in ("a", "b")]
    turn = [0]

    def once(kill_at: float | None) -> int | None:
        turn[0] += 1
        return run(["sign", str(rel), "--key", str(pairs[turn[0] % 2][0])], kill_at)[0]

    def check() -> str | None:
        errors = []
        for _, public in pairs:
            try:
                verify(rel, SignedWithKeys((public,)), ALL).close()
                return None
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
        return "verifies with neither key: " + " | ".join(e[:200] for e in errors)

    tally = Tally("sign")
    run(["sign", str(rel), "--key", str(pairs[0][0])])
    # its temp files and lock lie beside the release (a killed sign leaves nothing inside it)
    campaign(tally, kills, once, check,
             lambda: [(rel, "release.sigstore.json"), (rel, "model.sig"), (rel.parent, rel.name)])
    return tally


def keygen_scenario(work: Path, kills: int) -> Tally:
    from kvgraft.signing import keys

    prefix = work / "k"

    def once(kill_at: float | None) -> int | None:
        return run(["keygen", "--out", str(prefix), "--overwrite"], kill_at)[0]

    tally = Tally("keygen --overwrite")

    def check() -> str | None:
        private, public = Path(f"{prefix}.key.pem"), Path(f"{prefix}.pub.pem")
        try:
            derived = keys.public_pem(keys.load_private_key(private))
        except Exception as exc:
            return f"private key: {type(exc).__name__}: {exc}"
        if not public.exists():
            tally.admitted += 1  # killed between the two writes: two files cannot be replaced in one step
            return None
        if public.read_bytes() != derived:
            return "the public key file is not the private key's (a half-replaced pair)"
        return None

    campaign(tally, kills, once, check, lambda: [(work, "k.key.pem"), (work, "k.pub.pem")])
    return tally


def _whole(rel: Path) -> Callable[[], str | None]:
    """The check that the release at `rel` is whole and verifies (check_release), as a scenario's invariant."""
    from kvgraft.release.integrity import check_release

    def check() -> str | None:
        try:
            check_release(rel)
            return None
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"

    return check


def _tiny_model(work: Path) -> Path:
    from tests import tiny

    return tiny.build("llama", work / "tiny-llama")


def _records(path: Path, n: int) -> Path:
    from tests.tiny import _CORPUS

    path.write_text("".join(json.dumps({"id": f"r{i}", "text": _CORPUS[i % 3] * 2}) + "\n" for i in range(n)))
    return path


def capture_scenario(work: Path, kills: int, model: Path) -> Tally:

    src, rel = _records(work / "records.jsonl", 12), work / "captured"

    def once(kill_at: float | None) -> int | None:
        return run(["capture", str(src), "--out", str(rel), "--model", str(model), "--overwrite", "--probe", "2"],
                   kill_at)[0]

    tally = Tally("capture --overwrite")
    campaign(tally, kills, once, _whole(rel), lambda: [(work, "captured")])
    return tally


def audit_scenario(work: Path, kills: int, model: Path) -> Tally:
    from kvgraft._internal import jsonio
    from kvgraft.schema import validate

    src, rel = _records(work / "audit-records.jsonl", 10), work / "audited"
    run(["capture", str(src), "--out", str(rel), "--model", str(model), "--probe", "2"])
    out = work / "audit.json"
    journal = Path(f"{out}.journal")

    def once(kill_at: float | None) -> int | None:
        if out.exists():
            out.unlink()  # the previous run completed: start the next one afresh
        return run(["audit", "recompute", str(rel), "--model", str(model), "--sample", "8", "--nonce", "crash",
                    "--out", str(out), "-q"], kill_at)[0]

    def check() -> str | None:
        if journal.exists():
            lines = journal.read_bytes().split(b"\n")[1:]
            units = [json.dumps(json.loads(x)["unit"]) for x in lines if x.strip()][:-1 or None]  # the last may be torn
            if len(units) != len(set(units)):
                return f"a unit judged twice in {journal}"
        if out.exists():
            try:
                validate(jsonio.load_file(out), "recompute-result.v1.json", str(out))
            except Exception as exc:
                return f"{type(exc).__name__}: {exc}"
        return None

    tally = Tally("audit recompute (journal)")
    campaign(tally, kills, once, check, lambda: [(work, "audit.json")])
    return tally


def _problems(path: Path) -> Path:
    from tests.sample_problems import PROBLEMS

    path.write_text("".join(json.dumps({"id": p.id, "problem": p.problem, "answer": p.answer, "solution": p.solution})
                            + "\n" for p in PROBLEMS[:4]))
    return path


def library_scenario(work: Path, kills: int, model: Path) -> Tally:

    src, rel = _problems(work / "problems.jsonl"), work / "library"

    def once(kill_at: float | None) -> int | None:
        return run(["library", "build", "--source", str(src), "--library-fraction", "1", "--no-generate", "--out",
                    str(rel), "--model", str(model), "--overwrite", "--probe", "2", "-q"], kill_at)[0]

    tally = Tally("library build --overwrite")  # the previous library or the new one: either whole, verifying
    campaign(tally, kills, once, _whole(rel), lambda: [(work, "library")])
    return tally


def _plan(work: Path, model: Path, records: Path) -> Path:
    plan = work / "plan.toml"
    plan.write_text(f"""format = "kvgraft-audit-plan"
format_version = 1
name = "crash"
out = "{work / 'run'}"
[model]
spec = "{model}"
[release]
records = "{records}"
probe_tokens = 2
[checks.verify]
[checks.recompute]
[signing]
key = "ephemeral"
""")
    return plan


def audit_run_scenario(work: Path, kills: int, model: Path) -> Tally:
    from kvgraft.release.integrity import check_release
    from kvgraft.report.signing import verify_report

    plan, out = _plan(work, model, _records(work / "records.jsonl", 4)), work / "run"
    report, pub = out / "report.json", out / "keys" / "ephemeral.pub.pem"

    def once(kill_at: float | None) -> int | None:
        return run(["audit", "run", str(plan), "-q"], kill_at)[0]

    def check() -> str | None:
        # A run removes the previous report before it starts (an older one must not look current), so the
        # report at the path is the new one, signed by this run's key and bound to its release, or none.
        try:
            if report.exists():
                verify_report(report, key=pub, release=out / "release")  # what `kvgraft report verify` checks
            if (out / "release").exists():
                check_release(out / "release")
            return None
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"

    def spots() -> list[tuple[Path, str]]:
        names = ("report.json", "report.sigstore.json", "report.html", "release")
        return [*((out, n) for n in names), *((out / "keys", f"ephemeral.{k}.pem") for k in ("key", "pub"))]

    tally = Tally("audit run (report, signature)")
    campaign(tally, kills, once, check, spots)
    return tally


UNMODELLED: dict[str, Callable[[Path, int], Tally]] = {"sign": sign_scenario, "keygen": keygen_scenario}
# These load a model each run: a tiny random one (tests/tiny.py), built once for them all.
MODELLED: dict[str, Callable[[Path, int, Path], Tally]] = {
    "capture": capture_scenario, "audit": audit_scenario, "library": library_scenario, "report": audit_run_scenario}
SCENARIOS = (*UNMODELLED, *MODELLED)
# The full campaign: more kills where a run is cheap (a capture or an audit loads a model each time).
FULL = {"sign": 90, "keygen": 70, "capture": 25, "audit": 20, "library": 15, "report": 15}


def table(tallies: list[Tally]) -> str:
    rows = ["| scenario | kills | landed before exit | invariant held | of them, the admitted partial state "
            "| kills leaving a leftover | leftovers cleared by the next run |", "|---|---|---|---|---|---|---|"]
    for t in tallies:
        rows.append(f"| {t.name} | {t.kills} | {t.before_exit} | {t.held}/{t.kills} | {t.admitted} | "
                    f"{t.leftovers_seen} | {'yes' if t.cleared else 'no'} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=None,
                        help=f"kills per scenario (default: {', '.join(f'{k} {v}' for k, v in FULL.items())}: "
                             f"{sum(FULL.values())} in all)")
    parser.add_argument("--only", choices=SCENARIOS, action="append", help="run only these scenarios")
    args = parser.parse_args(argv)
    chosen = args.only or list(SCENARIOS)
    sys.path.insert(0, str(ROOT))
    tallies = []
    with tempfile.TemporaryDirectory(prefix="kvgraft-crash-") as tmp:
        work = Path(tmp)
        model = _tiny_model(work) if set(MODELLED) & set(chosen) else None
        for name in chosen:
            (work / name).mkdir()
            kills = args.kills or FULL[name]
            if name in MODELLED:
                assert model is not None
                tallies.append(MODELLED[name](work / name, kills, model))
            else:
                tallies.append(UNMODELLED[name](work / name, kills))
            print(table(tallies[-1:]).splitlines()[-1], file=sys.stderr, flush=True)  # progress: a long run
    print(table(tallies))
    for t in tallies:
        for failure in t.failures[:5]:
            print(f"{t.name}: {failure}")
        if len(t.failures) > 5:
            print(f"{t.name}: ... and {len(t.failures) - 5} more")
    return 1 if any(t.failures for t in tallies) else 0


if __name__ == "__main__":
    sys.exit(main())
