"""bench/hostile_remote_campaign.py at a tiny size: one run of each of its first classes, judged as the full
campaign judges them (docs/hostile-releases.md), and its judge shown to see what it must."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "bench")]

import hostile_remote_campaign as campaign  # noqa: E402


def test_a_tiny_campaign_runs_every_class_it_draws_and_fails_none(tmp_path: Path) -> None:
    summary = tmp_path / "summary.txt"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "hostile_remote_campaign.py"), "--runs", "5",
                           "--seed", "4", "--summary", str(summary)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {line.split()[0]: line.split() for line in summary.read_text().splitlines()[1:6]}
    assert list(rows) == campaign.CLASSES[:5]
    for cls, row in rows.items():
        assert row[1] == "1", cls  # one run each
        assert 30 < float(row[-1]) < campaign.MAX_RSS_MB, cls  # a peak RSS was read, of the kvgraft process alone
    assert "failed runs: 0" in summary.read_text() and "misses: 0" in summary.read_text()


def test_the_judge_sees_what_a_run_leaves_behind(tmp_path: Path) -> None:
    cache, out = tmp_path / "cache", tmp_path / "out"
    (cache / "mirrors" / "rel-x").mkdir(parents=True)
    (cache / "pieces" / "ab").mkdir(parents=True)
    (cache / "pieces" / "ab" / ("ab" + "0" * 62)).write_bytes(b"not these bytes")
    out.mkdir()
    case = campaign.Case("drop-entry", "pull")
    found = campaign.left_behind(cache, out, 2, case, None)
    assert found == ["a mirror folder", f"an unverified piece {'ab' + '0' * 10}", "a pull's folder after a refusal"]
