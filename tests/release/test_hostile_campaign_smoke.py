"""The hostile campaign's harness (bench/hostile_campaign.py) works, its judge included.

A small campaign on a few classes, beside the judge's positive controls: a planted acceptance (a class
that changes nothing, yet expects a refusal) must be reported as a miss in every run, a planted
internal error (the manifest check raising RuntimeError) as exit 70, a planted hang as a hang (the run
killed with its child, the campaign going on in a new one). The real classes chosen here, content and
re-signed structure attacks and the re-signing control, must pass; the campaign then exits 1, because
of the planted runs only.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CLASSES = ("flip-shard", "flip-entry-data", "special-file", "duplicate-id", "control-k3")
RUNS = 40


def test_the_campaign_runs_and_its_judge_catches_a_planted_miss_crash_and_hang(tmp_path: Path) -> None:
    summary = tmp_path / "summary.json"
    r = subprocess.run([sys.executable, str(REPO / "bench" / "hostile_campaign.py"), "--runs", str(RUNS),
                        "--seed", "7", "--classes", ",".join(CLASSES), "--plant", "miss,crash,hang",
                        "--hang-after", "4", "--summary", str(summary)],
                       capture_output=True, text=True, timeout=300, cwd=REPO)
    assert r.returncode == 1, r.stdout + r.stderr[-3000:]
    s = json.loads(summary.read_text())
    found = s["classes"]
    assert s["runs"] == RUNS and not s["harness_errors"], s
    miss, crash, hang = found["planted-miss"], found["planted-crash"], found["planted-hang"]
    assert miss["runs"] > 0 and miss["misses"] == miss["runs"], miss
    assert crash["runs"] > 0 and crash["reasons"].get("exit 70") == crash["runs"], crash
    assert hang["runs"] > 0 and hang["reasons"].get("hang") == hang["runs"], hang
    assert s["misses"] == miss["runs"] and s["failed"] == crash["runs"] + hang["runs"], s["failures"]
    for name in CLASSES:
        assert found[name]["runs"] > 0 and found[name]["misses"] == 0 and found[name]["failures"] == 0, (name, found)
    assert found["control-k3"]["exits"].get("0", 0) > 0  # the re-signed release verified with k3
    assert f"{RUNS} of {RUNS} runs" in r.stdout and "planted-miss" in r.stdout


def test_every_attack_of_the_campaign_still_applies_and_is_answered_as_it_expects(tmp_path: Path) -> None:
    """Each attack class of bench/hostile_attacks.py once at least (a case takes 1 to 3 runs, and the first
    case of each class comes first): none raises in the harness (an attack that rotted with the format), none
    is missed, none fails the judge."""
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import hostile_attacks
    finally:
        sys.path.remove(str(REPO / "bench"))
    real = sorted(n for n in hostile_attacks.ATTACKS if not n.startswith("planted-"))
    summary = tmp_path / "summary.json"
    r = subprocess.run([sys.executable, str(REPO / "bench" / "hostile_campaign.py"), "--runs", str(3 * len(real)),
                        "--seed", "11", "--summary", str(summary)], capture_output=True, text=True, timeout=600,
                       cwd=REPO)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    s = json.loads(summary.read_text())
    assert not s["harness_errors"] and s["misses"] == 0 and s["failed"] == 0, (s["harness_errors"], s["failures"])
    assert sorted(n for n, c in s["classes"].items() if c["runs"] > 0) == real
