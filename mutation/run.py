"""`make mutate`: mutmut (pinned in the dev extra) over the security and verdict core, one module group at a time.

Each group gets its own scratch copy of the project under .mutation/GROUP/ (kvgraft/, tests/, schemas/
and a pyproject.toml whose [tool.mutmut] names what to mutate and the fast test files that cover it;
no SmolLM2 test runs here), then `mutmut run` in it. The score is read from mutmut's own per-mutant
records (mutants/**/*.meta): killed = a test failed (or timed out) with the mutant in place.
Results: .mutation/GROUP/result.json and a summary line per group; docs/mutation.md records a run.

    python mutation/run.py                 # every group
    python mutation/run.py stats verify    # only these (groups: see GROUPS)
    python mutation/run.py --rescore stats # re-read after retesting mutants by name in .mutation/stats
    python mutation/run.py --sample 120 verify integrity   # a uniform random sample of each group's mutants

A sampled run (--sample N, seed --seed S, default 0) generates every mutant of the group, draws N of them
uniformly (random.Random(f"{S}:{GROUP}") over the sorted names, written to .mutation/GROUP/sample.txt), runs
those alone and scores them with a Wilson 95% interval: a statement about the whole group's score with a
stated bound, at the cost of N mutants. mutmut's own order (cheapest first) is not a sample: a stopped full
run says nothing about the mutants it did not reach.
"""

from __future__ import annotations

import fnmatch
import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / ".mutation"

# group -> (files to mutate, mutant names to run (fnmatch patterns; [] = all of them), fast test files that
# cover them, extra pytest arguments). One group per module of the core (release/ and signing/ split in
# two: the file with the most checks alone), so that each runs only the tests that reach it.
NO_MODEL = "not smollm2"
# tests/core/test_checks_bite.py's tests that load the tiny model: out of the no-torch groups' runs (each would
# add ~20 s to every surviving mutant of the verifier, which they call only on the way to a model).
MODEL_BITES = ("graft_refuses or recompute_comparison or worst_entry or nan_stored or another_shape "
               "or attention_kernel or prefill_schedule")
NO_TORCH_K = f"not smollm2 and not ({MODEL_BITES})"
# The no-model tests of the release, signing and verify core. Not tests/signing/test_fuzz_verify.py: it verifies in a
# child process, which mutmut's per-test coverage cannot see, and runs 50 s (a cost in every run, no kill).
CORE_TESTS = ["tests/core/test_checks_bite.py", "tests/signing/test_verify_bite.py", "tests/signing/test_verify_tamper.py",
              "tests/signing/test_oms.py", "tests/signing/test_attest.py", "tests/release/test_release_bite.py",
              "tests/signing/test_signing_bite.py"]
# recompute/audit.py's verdict: how compared rows become a verdict, the statements and the --require reading
# (its other functions load a model and run the audit: their checks are the named ones above).
RECOMPUTE_VERDICT = ["kvgraft.recompute.audit.x_" + f + "__mutmut_*" for f in (
    "_stored", "_judged", "_named", "classify", "_first_difference", "statements", "prefix_statement",
    "verdict_statement", "check_requirement", "passes", "failing", "bound", "conclude")]
# Each check kind's status rule (the result -> passed/failed/incomplete, hence the audit's exit code) and the
# registry that applies it and seals the result: part of the verdict; the kinds' renderers are not.
CHECK_KINDS = ["kvgraft/audit/checks/" + f + ".py" for f in (
    "__init__", "claims", "controls", "determinism", "generalization", "recompute", "verify")]
STATUS_RULES = ["kvgraft.audit.checks.*x_" + f + "__mutmut_*" for f in ("status", "seal", "kind")]
# test_hostile_index.py's prefix-index tests (about 7 s of its 24 to 41 s: not its control, shard or inspect
# tests): they kill the prefix records' checks and messages in index.py and format.py (sample G).
PREFIX_TESTS = ["tests/release/test_hostile_index.py::" + t for t in (
    "test_a_prefix_index_larger_than_the_limit_is_refused_at_opening",
    "test_verify_weighs_the_prefix_records_against_the_entries_blocks_before_reading",
    "test_prefix_lookups_hold_pages_of_the_prefix_index_not_the_file", "test_verify_checks_every_prefix_record",
    "test_a_bad_record_met_by_a_lookup_is_an_integrity_error", "test_records_of_the_writer_pass_the_record_checks")]
# test_index_reads.py's torch-free tests of the index itself (about 1 s of its 20 s here: not its CLI, model or
# window tests): the shard's token counts against the manifest's, the shard byte bound (sample H).
INDEX_TESTS = ["tests/release/test_index_reads.py::" + t for t in (
    "test_a_tampered_token_count_is_caught_when_its_shard_is_read",
    "test_a_shard_closes_at_its_byte_bound_as_well_as_its_record_count",
    "test_the_manifest_lists_each_shards_token_counts", "test_a_manifest_without_token_counts_is_read_from_its_shards")]
GROUPS: dict[str, tuple[list[str], list[str], list[str], list[str]]] = {
    "stats": (["kvgraft/generalization/stats.py"], [],
              ["tests/generalization/test_stats.py", "tests/generalization/test_stats_bite.py"], []),
    "verify": (["kvgraft/signing/verify.py", "kvgraft/signing/policy.py"], [],
               [*CORE_TESTS, "tests/signing/test_sigstore_fixtures.py"], ["-k", NO_TORCH_K]),
    "integrity": (["kvgraft/release/integrity.py"], [],
                  [*CORE_TESTS, "tests/release/test_hostile_release.py", "tests/release/test_verify_streams.py"],
                  ["-k", NO_TORCH_K]),
    "release": (["kvgraft/release/format.py", "kvgraft/release/index.py", "kvgraft/release/records.py",
                 "kvgraft/release/hashing.py", "kvgraft/release/safetensors_header.py"], [],
                [*CORE_TESTS, "tests/release/test_hostile_release.py", "tests/release/test_hashing.py",
                 "tests/release/test_verify_streams.py", *PREFIX_TESTS, *INDEX_TESTS],
                ["-k", NO_TORCH_K]),
    "attest": (["kvgraft/signing/attest.py"], [], [*CORE_TESTS, "tests/signing/test_sigstore_fixtures.py"],
               ["-k", NO_TORCH_K]),
    "signing": (["kvgraft/signing/keys.py", "kvgraft/signing/oms.py", "kvgraft/signing/sigstore.py"], [],
                [*CORE_TESTS, "tests/signing/test_sigstore_fixtures.py"], ["-k", NO_TORCH_K]),
    # The noise bound and the recorded conditions reapplied in one run (the same tests; one stats pass
    # instead of two): scored per file.
    "noise": (["kvgraft/recompute/noise.py", "kvgraft/inference/reapply.py"], [],
              ["tests/core/test_checks_bite.py", "tests/recompute/test_verdict_bite.py"], ["-k", NO_MODEL]),
    "verdict": (["kvgraft/recompute/audit.py", "kvgraft/verdict.py", *CHECK_KINDS],
                [*RECOMPUTE_VERDICT, "kvgraft.verdict.*", *STATUS_RULES],
                ["tests/core/test_checks_bite.py", "tests/core/test_verdict.py", "tests/recompute/test_verdict_bite.py",
                 "tests/audit/test_status_rules.py", "tests/audit/test_check_kinds.py"],
                ["-k", NO_MODEL]),
}
# mutmut's exit codes per mutant (mutmut/__main__.py status_by_exit_code)
KILLED = {1, 3, -24, 24, 36, 152, 255}  # a test failed, or the run timed out (counted as killed, as mutmut does)
TIMED_OUT = {-24, 24, 36, 152, 255}  # of those, the ones killed by the CPU-time limit: reported apart
SURVIVED = {0}
NO_TESTS = {5, 33}


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


def prepare(group: str) -> Path:
    files, _names, tests, extra = GROUPS[group]
    tests = [t for t in tests if (ROOT / t.split("::")[0]).exists()]  # a test file, or a node id in one
    here = WORK / group
    shutil.rmtree(here, ignore_errors=True)
    here.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("kvgraft", "tests", "schemas"):
        shutil.copytree(ROOT / name, here / name, ignore=ignore)
    # tests/signing/test_sigstore_fixtures.py reads real Sigstore bundles from ../shared/fixtures/sigstore (outside
    # the repository; they skip without it). mutmut runs the tests in .mutation/GROUP/mutants/, so the
    # folder they look for is .mutation/GROUP/shared: a link to the checkout's ../shared (or $KVGRAFT_SHARED).
    shared = Path(os.environ.get("KVGRAFT_SHARED", ROOT.parent / "shared"))
    if shared.is_dir():
        (here / "shared").symlink_to(shared.resolve())
    # A pyproject.toml of the copy, its pytest options kept, with the mutmut section for this group.
    base = (ROOT / "pyproject.toml").read_text()
    (here / "pyproject.toml").write_text(base + f"""
[tool.mutmut]
source_paths = ["kvgraft"]
also_copy = ["schemas"]
only_mutate = {_toml_list(files)}
pytest_add_cli_args_test_selection = {_toml_list(tests)}
pytest_add_cli_args = {_toml_list(["-p", "no:cacheprovider", *extra])}
process_isolation = "forkserver"
use_git_change_detection = false
# A mutant that loops is killed after 5x its tests' clean time + 2 s (mutmut's default, 15x + 1 s, spends
# minutes on each such mutant on two shared cores).
timeout_multiplier = 5.0
timeout_constant = 2.0
""")
    return here


def records(here: Path) -> Iterator[tuple[Path, dict[str, Any], str, Any]]:
    """mutmut's per-mutant records in a scratch copy: (the .meta file, its parsed document, mutant name, exit code;
    None: not run). The one reader of them (score, draw, retest.py)."""
    for meta in sorted((here / "mutants").rglob("*.meta")):
        doc = json.loads(meta.read_text())
        for key, code in list(doc.get("exit_code_by_key", {}).items()):
            yield meta, doc, key, code


def score(here: Path, names: list[str] | None = None) -> dict[str, object]:
    """Counts from mutmut's records; `names` (fnmatch patterns): only those mutants (a group's part of a file)."""
    counts = {"killed": 0, "survived": 0, "no_tests": 0, "not_run": 0, "other": 0}
    per_file: dict[str, dict[str, int]] = {}
    survivors: list[str] = []
    for meta, _doc, key, code in records(here):
        name = str(meta.relative_to(here / "mutants")).removesuffix(".meta")
        fc = per_file.setdefault(name, {"killed": 0, "survived": 0, "no_tests": 0, "not_run": 0, "other": 0})
        if names and not any(fnmatch.fnmatch(key, n) for n in names):
            continue
        kind = ("not_run" if code is None else "killed" if code in KILLED else "survived" if code in SURVIVED
                else "no_tests" if code in NO_TESTS else "other")
        counts[kind] += 1
        fc[kind] += 1
        if code in TIMED_OUT:
            counts["of_killed_timed_out"] = counts.get("of_killed_timed_out", 0) + 1
        if kind in ("survived", "no_tests"):
            survivors.append(f"{key} ({kind})")
    return {"counts": counts, "per_file": per_file, "survivors": survivors}


def with_interval(result: dict[str, Any]) -> tuple[float, float]:
    """Sets result["wilson95"] from its counts (killed of killed + survived + without a test); returns it."""
    c = result["counts"]
    lo, hi = interval(c["killed"], c["killed"] + c["survived"] + c["no_tests"])
    result["wilson95"] = [round(lo, 4), round(hi, 4)]
    return lo, hi


def rescore(group: str) -> dict[str, Any]:
    """Re-read a group's records after `mutmut run NAME...` retested some mutants in .mutation/GROUP."""
    here = WORK / group
    # A run stopped before it ended wrote no result.json: its per-mutant records are still there.
    done = here / "result.json"
    result = json.loads(done.read_text()) if done.exists() else {"group": group, "files": GROUPS[group][0],
                                                                  "stopped": True}
    # A sampled run: only its sample (the names it ran; the rest of the group's mutants were never run).
    names = result.get("mutants")
    result.update(score(here, names if isinstance(names, list) else GROUPS[group][1]))
    with_interval(result)
    (here / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


# Generates the group's mutants (mutmut's own first step of `run`, nothing run) in the scratch copy.
GENERATE = """
import os, mutmut.__main__ as m
os.makedirs("mutants", exist_ok=True)
m.copy_src_dir(); m.copy_also_copy_files(); m.setup_source_paths(); m.store_lines_covered_by_tests()
m.create_mutants(os.cpu_count() or 2)
"""


def draw(here: Path, group: str, n: int, seed: int, env: dict[str, str]) -> list[str]:
    """N of the group's mutant names, drawn uniformly with a seed of its own per group; written to sample.txt."""
    subprocess.run([sys.executable, "-c", GENERATE], cwd=here, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    patterns = GROUPS[group][1]
    names = sorted(key for _meta, _doc, key, _code in records(here)
                   if not patterns or any(fnmatch.fnmatch(key, p) for p in patterns))
    chosen = sorted(random.Random(f"{seed}:{group}").sample(names, min(n, len(names))))
    (here / "sample.txt").write_text(f"# {len(chosen)} of {len(names)} mutants, seed {seed}\n" + "\n".join(chosen) + "\n")
    return chosen


def interval(killed: int, judged: int) -> tuple[float, float]:
    sys.path.insert(0, str(ROOT))
    from kvgraft.generalization.stats import wilson
    return wilson(killed, judged)


def main(argv: list[str]) -> int:
    sample, seed = 0, 0
    while argv[:1] in (["--sample"], ["--seed"]):
        if argv[0] == "--sample":
            sample = int(argv[1])
        else:
            seed = int(argv[1])
        argv = argv[2:]
    if argv[:1] == ["--rescore"]:
        for group in argv[1:]:
            result = rescore(group)
            print(group, result["counts"], "Wilson 95%", result["wilson95"])
        return 0
    groups = argv or list(GROUPS)
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        print(f"unknown group(s) {unknown}; groups: {', '.join(GROUPS)}")
        return 2
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(TRANSFORMERS_VERBOSITY="error", HF_HUB_OFFLINE="1")
    if os.environ.get("KVGRAFT_MUTMUT_PATH"):  # mutmut installed outside the venv (a --target folder)
        env["PYTHONPATH"] = os.environ["KVGRAFT_MUTMUT_PATH"]
    worst = 0
    for group in groups:
        here = prepare(group)
        t0 = time.perf_counter()
        names = draw(here, group, sample, seed, env) if sample else GROUPS[group][1]
        run = subprocess.run([sys.executable, "-m", "mutmut", "run", *names], cwd=here, env=env,
                             stdout=(here / "mutmut.log").open("w"), stderr=subprocess.STDOUT)
        seconds = time.perf_counter() - t0
        result: dict[str, Any] = {
            "group": group, "files": GROUPS[group][0], "mutants": names or "all", "tests": GROUPS[group][2],
            "sample": {"n": len(names), "seed": seed} if sample else None,
            "seconds": round(seconds), "mutmut_exit": run.returncode, **score(here, names)}
        lo, hi = with_interval(result)
        (here / "result.json").write_text(json.dumps(result, indent=2) + "\n")
        c = result["counts"]
        judged = c["killed"] + c["survived"] + c["no_tests"]
        pct = 100.0 * c["killed"] / judged if judged else 0.0
        print(f"{group}: {c['killed']}/{judged} killed ({pct:.1f}%, Wilson 95% {100 * lo:.1f}-{100 * hi:.1f}%"
              f"{', a sample' if sample else ''}), {c['survived']} survived, {c['no_tests']} "
              f"without a covering test, {c['not_run']} not run; {seconds / 60:.1f} min; mutmut exit "
              f"{run.returncode}; {here / 'result.json'}", flush=True)
        worst = max(worst, 0 if run.returncode == 0 else 1)
    return worst


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
