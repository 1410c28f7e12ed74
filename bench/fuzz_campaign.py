"""A fuzz campaign on `kvgraft verify --key`: the mutations of tests/signing/test_fuzz_verify.py, many more cases.

    .venv/bin/python bench/fuzz_campaign.py [--cases 1200] [--seed 2323] [--case-timeout 30]

Builds the test's signed release (kvgraft-signed: release.sigstore.json and model.sig), runs the
test's driver (in-process CLI calls in one child process) without its time bound, and prints per
mutation class: cases, exit codes, the slowest case. A case is a failure when it exits other than
1 or 2 (0 for the git-metadata control), raises, prints more than one line, or runs longer than
--case-timeout; a signal or a hang of the child fails the campaign. Exit 1 if anything failed.
Recorded in docs/hostile-releases.md.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "signing"))  # test_fuzz_verify.py

import test_fuzz_verify as fuzz  # noqa: E402  (the driver and its checks live with the test)

from kvgraft.signing import keys, sign  # noqa: E402

from release_factory import make_release  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=1200)
    ap.add_argument("--seed", type=int, default=2323)
    ap.add_argument("--case-timeout", type=float, default=30.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        private, public = keys.write_keypair(folder / "k")
        make_release(folder / "rel", entries=3, layers=2, heads=4, tokens=64, head_dim=16, seed=args.seed)
        sign.sign_release(folder / "rel", keys.load_private_key(private))
        (folder / "work").mkdir()
        started = time.monotonic()
        # The child's total bound: every case at its timeout would be far beyond it; a hang shows as rc 124.
        try:
            r = subprocess.run([sys.executable, "-c", fuzz._DRIVER, str(folder / "rel"), str(public), str(folder / "work"),
                                str(args.seed), str(args.cases), str(1e9)], capture_output=True, text=True,
                               timeout=args.cases * 2 + 600, cwd=REPO)
            rc, stdout, stderr = r.returncode, r.stdout, r.stderr
        except subprocess.TimeoutExpired as exc:
            rc, stdout, stderr = 124, (exc.stdout or b"").decode(), (exc.stderr or b"").decode()
        wall = time.monotonic() - started
    results = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    done = [c for c in results if "exit" in c]
    per: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    slowest: dict[str, float] = collections.defaultdict(float)
    failures: list[str] = []
    for case in done:
        kind = str(case["what"]).split()[0]
        per[kind][f"exit {case['exit']}"] += 1
        slowest[kind] = max(slowest[kind], float(case["seconds"]))
        try:
            fuzz._check(case)
            if float(case["seconds"]) > args.case_timeout:
                raise AssertionError(f"{case['what']}: {case['seconds']} s, over {args.case_timeout} s")
        except AssertionError as exc:
            failures.append(f"case {case['case']}: {str(exc).splitlines()[0][:300]}")
    print(f"kvgraft verify --key fuzz campaign: seed {args.seed}, {len(done)} of {args.cases} cases in {wall:.0f} s, "
          f"child exit {rc}{' (a signal)' if rc < 0 else ' (timeout)' if rc == 124 else ''}")
    print(f"{'class':<16}{'cases':>7}  exits{'':<26}slowest s")
    for kind in sorted(per):
        exits = ", ".join(f"{k}: {n}" for k, n in sorted(per[kind].items()))
        print(f"{kind:<16}{sum(per[kind].values()):>7}  {exits:<30} {slowest[kind]:.3f}")
    codes = collections.Counter(c["exit"] for c in done)
    print(f"{'all':<16}{len(done):>7}  " + ", ".join(f"exit {k}: {n}" for k, n in sorted(codes.items())))
    print(f"failures: {len(failures)} (exit 70, traceback, exception, not one line, control not verifying, or slow)")
    for f in failures[:20]:
        print("  " + f)
    if rc != 0:
        print(f"the child ended with {rc}: {stderr[-1000:]}")
    return 1 if failures or rc != 0 or len(done) < args.cases else 0


if __name__ == "__main__":
    raise SystemExit(main())
