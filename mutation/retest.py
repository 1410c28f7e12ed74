"""Retest a group's mutants without a full rerun: its survivors against test files added since, or its timed-out ones.

    python mutation/retest.py GROUP tests/test_x.py [tests/test_y.py::test_z ...] [--only PATTERN ...]
    python mutation/retest.py GROUP --timed-out [--wall SECONDS] [--covering]

Test arguments may be pytest node ids (file::test); `--only` (fnmatch patterns) limits the mutants retried.

Survivors: copies the test files into .mutation/GROUP/mutants/tests/, then for each mutant the group's records
list as survived (or without a covering test) runs those files with the mutant active (mutmut's own
switch, MUTANT_UNDER_TEST, in a forked child) and records a failure as killed in mutmut's per-mutant
record, as `mutmut run` does. A mutant these files do not kill keeps its record. Then
`python mutation/run.py --rescore GROUP` re-reads the score.

--timed-out: mutmut counts a mutant whose tests pass its CPU-time limit (5x their clean time + 2 s here) as
killed. That is a kill only if the tests would fail (or never end); a mutant that is only slower is a survivor
in disguise. Each timed-out mutant (of the sample, for a sampled run) is run against the group's own tests as
they were in the run, with a wall-clock limit (default 600 s), and reported: `fails` (a test failed),
`passes` (a survivor: the timeout was its only kill), `hangs` (still running at the limit). Run it before
retesting survivors against new test files (those would be copied into the same tests/). Records are not changed.
--covering: each timed-out mutant against only the tests mutmut's stats pass found covering its function (what
`mutmut run` ran for it, in mutants/mutmut-stats.json), not the whole selection: minutes fewer each.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "mutation"))
from run import GROUPS, NO_TESTS, SURVIVED, TIMED_OUT, records  # noqa: E402


def _run_with(key: str, args: list[str], wall: int | None, pytest: object) -> int:
    """pytest's exit code with mutant `key` active, in a forked child (-SIGALRM: past the wall-clock limit)."""
    pid = os.fork()
    if pid == 0:
        os.environ["MUTANT_UNDER_TEST"] = key
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        if wall:
            signal.alarm(wall)
        os._exit(int(pytest.main(["-q", "-x", "-p", "no:cacheprovider", *args])))  # type: ignore[attr-defined]
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def main(argv: list[str]) -> int:
    only: list[str] = []
    if "--only" in argv:
        at = argv.index("--only")
        argv, only = argv[:at], argv[at + 1:]
    wall = 600
    if "--wall" in argv:
        at = argv.index("--wall")
        wall, argv = int(argv[at + 1]), argv[:at] + argv[at + 2:]
    timed_out = "--timed-out" in argv
    covering = "--covering" in argv
    group, tests = argv[0], [a for a in argv[1:] if a not in ("--timed-out", "--covering")]
    here = ROOT / ".mutation" / group
    if timed_out:
        _files, _names, own, extra = GROUPS[group]
        tests = [*extra, *(t for t in own if (here / "mutants" / t.split("::")[0]).exists())]
        result = here / "result.json"
        ran = json.loads(result.read_text()).get("mutants") if result.exists() else None
        drawn = set(ran) if isinstance(ran, list) else None
    else:
        for t in {t.split("::")[0] for t in tests}:
            shutil.copy(ROOT / t, here / "mutants" / t)
    os.chdir(here / "mutants")
    sys.path.insert(0, str(here / "mutants"))
    import pytest  # imported once here; each forked child reuses it

    counts: dict[str, int] = {}
    for meta, doc, key, code in records(here):
        if only and not any(fnmatch.fnmatch(key, p) for p in only):
            continue
        if timed_out:
            if code not in TIMED_OUT or (drawn is not None and key not in drawn):
                continue
            if covering:
                stats = json.loads((here / "mutants" / "mutmut-stats.json").read_text())
                function = key.rsplit("__mutmut_", 1)[0]
                covered = sorted(stats["tests_by_mangled_function_name"].get(function, []))
                rc = _run_with(key, [*extra, *covered], wall, pytest) if covered else 5
            else:
                rc = _run_with(key, tests, wall, pytest)
            verdict = "fails" if rc == 1 else "passes" if rc == 0 else "hangs" if rc == -signal.SIGALRM else f"exit {rc}"
        else:
            if code not in SURVIVED | NO_TESTS:
                continue
            rc = _run_with(key, tests, None, pytest)
            verdict = "killed" if rc == 1 else "kept"
            if rc == 1:
                doc["exit_code_by_key"][key] = 1
                meta.write_text(json.dumps(doc, indent=2))  # after each kill: a stopped retest keeps its results
        counts[verdict] = counts.get(verdict, 0) + 1
        print(f"{verdict:8} {key}" + ("" if verdict != "kept" else f" (exit {rc})"), flush=True)
    print(f"{group}: {counts}" + ("" if timed_out else f" against {', '.join(tests)}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
