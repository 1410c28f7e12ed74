"""Retest a group's surviving mutants against test files added since its run, without a full rerun.

    python mutation/retest.py GROUP tests/test_x.py [tests/test_y.py::test_z ...] [--only PATTERN ...]

Test arguments may be pytest node ids (file::test); `--only` (fnmatch patterns) limits the mutants retried.

Copies the test files into .mutation/GROUP/mutants/tests/, then for each mutant the group's records
list as survived (or without a covering test) runs those files with the mutant active (mutmut's own
switch, MUTANT_UNDER_TEST, in a forked child) and records a failure as killed in mutmut's per-mutant
record, as `mutmut run` does. A mutant these files do not kill keeps its record. Then
`python mutation/run.py --rescore GROUP` re-reads the score.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str]) -> int:
    only: list[str] = []
    if "--only" in argv:
        at = argv.index("--only")
        argv, only = argv[:at], argv[at + 1:]
    group, tests = argv[0], argv[1:]
    here = ROOT / ".mutation" / group / "mutants"
    for t in {t.split("::")[0] for t in tests}:
        shutil.copy(ROOT / t, here / t)
    os.chdir(here)
    sys.path.insert(0, str(here))
    import pytest  # imported once here; each forked child reuses it

    killed = kept = 0
    for meta in sorted(here.rglob("*.meta")):
        doc = json.loads(meta.read_text())
        codes = doc.get("exit_code_by_key", {})
        for key, code in codes.items():
            if code not in (0, 5, 33) or (only and not any(fnmatch.fnmatch(key, p) for p in only)):
                continue
            pid = os.fork()
            if pid == 0:
                os.environ["MUTANT_UNDER_TEST"] = key
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, 1)
                os.dup2(devnull, 2)
                os._exit(int(pytest.main(["-q", "-x", "-p", "no:cacheprovider", *tests])))
            _, status = os.waitpid(pid, 0)
            rc = os.waitstatus_to_exitcode(status)
            if rc == 1:
                codes[key] = 1
                killed += 1
                meta.write_text(json.dumps(doc, indent=2))  # after each kill: a stopped retest keeps its results
                print(f"killed   {key}", flush=True)
            else:
                kept += 1
                print(f"kept     {key} (exit {rc})", flush=True)
    print(f"{killed} killed by {', '.join(tests)}; {kept} unchanged")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
