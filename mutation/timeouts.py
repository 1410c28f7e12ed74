"""Re-run a group's timed-out mutants without mutmut's CPU-time limit: is each a failing test, or only slow?

    python mutation/timeouts.py GROUP [--wall SECONDS] [--dir FOLDER]   # FOLDER: a copy of .mutation/GROUP

mutmut counts a mutant whose tests pass the CPU-time limit (5x their clean time + 2 s here) as killed. That
is a kill only if the tests would fail (or never end); a mutant that is merely slower is a survivor in
disguise. For each timed-out mutant of .mutation/GROUP (of its sample, for a sampled run) this runs the
group's tests with the mutant active, in a child with a wall-clock limit, and prints: `fails` (a test
failed), `passes` (a survivor: the timeout was the only kill), or `hangs` (still running at the limit). The
records are not changed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMED_OUT = {-24, 24, 36, 152, 255}


def main(argv: list[str]) -> int:
    wall = 600
    if "--wall" in argv:
        at = argv.index("--wall")
        wall, argv = int(argv[at + 1]), argv[:at] + argv[at + 2:]
    here = None
    if "--dir" in argv:
        at = argv.index("--dir")
        here, argv = Path(argv[at + 1]), argv[:at] + argv[at + 2:]
    group = argv[0]
    sys.path.insert(0, str(ROOT / "mutation"))
    from run import GROUPS

    here = here or ROOT / ".mutation" / group
    result = json.loads((here / "result.json").read_text())
    drawn = set(result["mutants"]) if isinstance(result.get("mutants"), list) else None
    _files, _names, tests, extra = GROUPS[group]
    counts = {"fails": 0, "passes": 0, "hangs": 0}
    for meta in sorted((here / "mutants").rglob("*.meta")):
        for key, code in json.loads(meta.read_text()).get("exit_code_by_key", {}).items():
            if code not in TIMED_OUT or (drawn is not None and key not in drawn):
                continue
            env = {**os.environ, "MUTANT_UNDER_TEST": key}
            try:
                rc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *extra,
                                     *tests], cwd=here / "mutants", env=env, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, timeout=wall).returncode
                verdict = "fails" if rc == 1 else "passes" if rc == 0 else f"exit {rc}"
            except subprocess.TimeoutExpired:
                verdict = "hangs"
            counts[verdict] = counts.get(verdict, 0) + 1
            print(f"{verdict:8} {key}", flush=True)
    print(group, counts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
