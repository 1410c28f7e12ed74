"""Break each named check of the security and verdict core on purpose, one at a time, and run the test that must kill it.

Each mutant replaces one exact piece of source (it must occur exactly once: a check that moved makes
this script fail loudly instead of passing quietly), runs its killing test, expects it to FAIL, and
restores the file. Exit 0 only when every mutant is killed. Run from the repository root:

    python mutation/named_mutants.py            # all
    python mutation/named_mutants.py worst      # those whose name contains "worst"
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
T = "tests/core/test_checks_bite.py::"

# name, [(file, original, mutant)], killing test
MUTANTS: list[tuple[str, list[tuple[str, str, str]], str]] = [
    ("graft: per-tensor SHA-256 on read skipped",
     [("kvgraft/inference/graft.py", "        if actual != expected:\n            raise IntegrityError(tensor_mismatch(",
       "        if False:\n            raise IntegrityError(tensor_mismatch(")],
     T + "test_graft_refuses_a_tensor_changed_after_verification"),
    ("recompute._stored: stored tensors' digests not checked",
     [("kvgraft/recompute/audit.py", "    if actual != expected:\n        raise IntegrityError(tensor_mismatch(where",
       "    if False:\n        raise IntegrityError(tensor_mismatch(where")],
     T + "test_recompute_comparison_refuses_a_tensor_changed_after_verification"),
    ("integrity step 3: the listing (a statement's subjects) vs manifest files not compared",
     [("kvgraft/release/integrity.py", "            if listing.files.get(name) != expected.get(name):",
       "            if False:")],
     T + "test_signed_statement_listing_another_digest_for_a_file_is_refused"),
    ("verify.py: OMS file list not compared with the release",
     [("kvgraft/signing/verify.py", "    if compared != has:", "    if False:")],
     T + "test_oms_signature_over_another_file_list_beside_the_bundle_is_refused"),
    ("signing/oms.py: OMS subject digest not compared with its resources",
     [("kvgraft/signing/oms.py", '    if subject[0]["digest"].get("sha256") != _root_digest(listed):', "    if False:")],
     T + "test_oms_subject_digest_not_of_its_resources_is_refused"),
    ("verify.py OMS file list and oms.py subject digest, both removed",
     [("kvgraft/signing/verify.py", "    if compared != has:", "    if False:"),
      ("kvgraft/signing/oms.py", '    if subject[0]["digest"].get("sha256") != _root_digest(listed):', "    if False:")],
     T + "test_oms_signature_over_another_file_list_beside_the_bundle_is_refused"),
    ("verify.py OMS file list and integrity step 3, both removed (OMS-only release)",
     [("kvgraft/signing/verify.py", "    if compared != has:", "    if False:"),
      ("kvgraft/release/integrity.py", "            if listing.files.get(name) != expected.get(name):",
       "            if False:")],
     T + "test_oms_only_signature_over_another_file_list_is_refused"),
    ("check_commitments: entry digest mismatch ignored",
     [("kvgraft/release/records.py", '    if digest(entry) != entry["digest"]:', "    if False:")],
     T + "test_stale_entry_digest_is_refused"),
    ("check_commitments: root digest mismatch ignored",
     [("kvgraft/release/format.py", '    if actual != manifest["root_digest"]:', "    if False:")],
     T + "test_stale_root_digest_is_refused"),
    ("replay.load_options: recorded attention kernel ignored (default sdpa)",
     [("kvgraft/inference/reapply.py", '        attn = str(recorded.get("attn_implementation"))', '        attn = "sdpa"')],
     T + "test_recorded_attention_kernel_is_replayed_even_beside_an_override"),
    ("replay.applied: recorded attention kernel not set for the run",
     [("kvgraft/inference/reapply.py", "        if attn in ATTNS:\n            stack.enter_context(attention(lm, attn))",
       "        if False:\n            stack.enter_context(attention(lm, attn))")],
     T + "test_recorded_attention_kernel_is_replayed_even_beside_an_override"),
    ("replay.applied: recorded conditions ignored while overrides apply",
     [("kvgraft/inference/reapply.py", "        return overrides.get(key, recorded.get(key))",
       "        return overrides.get(key) if overrides else recorded.get(key)")],
     T + "test_recorded_attention_kernel_is_replayed_even_beside_an_override"),
    ("recompute: recorded prefill schedule ignored",
     [("kvgraft/recompute/audit.py", '    schedule = schedule or Schedule.from_dict(rel.manifest["schedule"])',
       "    schedule = schedule or Schedule()")],
     T + "test_recorded_prefill_schedule_is_replayed"),
    ("noise.worst: release verdict the best entry's",
     [("kvgraft/recompute/noise.py", 'return max(verdicts, key=VERDICTS.index, default="byte-exact")',
       'return min(verdicts, key=VERDICTS.index, default="byte-exact")')],
     T + "test_release_verdict_is_its_worst_entry"),
    ("noise.judge: non-finite stored where fresh is finite counted inside",
     [("kvgraft/recompute/noise.py", "    bad = ~torch.isfinite(s) & torch.isfinite(f)",
       "    bad = torch.zeros_like(s, dtype=torch.bool)")],
     T + "test_a_nan_stored_where_fresh_is_finite_is_outside_the_noise_bound"),
    ("recompute.classify: a shape mismatch alone judged consistent",
     [("kvgraft/recompute/audit.py", "    if not (layout or shape or outside):", "    if not (layout or outside):")],
     T + "test_a_tensor_stored_in_another_shape_is_inconsistent"),
    ("ray_worker.Worker.release: a release verified under another policy than the driver's",
     [("kvgraft/execution/ray_worker.py", "        rel = verified(root, policy)\n",
       "        rel = verified(root, VerifyPolicy())\n")],
     T + "test_a_ray_worker_verifies_the_release_under_the_drivers_policy"),
    ("ray_worker.Worker.release: a verification reused under another policy",
     [("kvgraft/execution/ray_worker.py", '        slot += f":{policy!r}"\n', "")],
     T + "test_a_ray_worker_verifies_the_release_under_the_drivers_policy"),
]


def main(argv: list[str]) -> int:
    chosen = [m for m in MUTANTS if not argv or any(a in m[0] for a in argv)]
    pytest = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    survived = 0
    for name, edits, test in chosen:
        originals: dict[Path, str] = {}
        for file, old, new in edits:
            path = ROOT / file
            text = originals.setdefault(path, path.read_text())
            current = path.read_text()
            if current.count(old) != 1:
                for p, t in originals.items():
                    p.write_text(t)
                print(f"ERROR {name}: {file} holds the original {current.count(old)} times (expected once): "
                      f"update {Path(__file__).name}")
                return 2
            path.write_text(current.replace(old, new))
            del text
        t0 = time.perf_counter()
        try:
            run = subprocess.run([*pytest, test], cwd=ROOT, env=env, capture_output=True, text=True)
        finally:
            for p, t in originals.items():
                p.write_text(t)
        # Killed only when the test ran and failed (exit 1): a collection or usage error (2-5) is no kill.
        killed = run.returncode == 1
        if run.returncode not in (0, 1):
            print(run.stdout[-2000:], run.stderr[-2000:])
        survived += not killed
        print(f"{'killed  ' if killed else 'SURVIVED'} {time.perf_counter() - t0:5.1f}s  {name}  <- {test.split('::')[-1]}",
              flush=True)
    print(f"{len(chosen) - survived}/{len(chosen)} named mutants killed")
    return 1 if survived else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
