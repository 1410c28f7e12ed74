"""bench/hostile_input_campaign.py at a tiny size: a few runs on each surface but the tiny model's (whose model
takes longer to build than the rest). Every run must pass its judge, so a key, journal or plan reader that loses
its bound, or a verify that stops checking a commitment, turns this red."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SURFACES = ("key", "journal", "plan", "re-signed")


def test_a_small_hostile_input_campaign_passes(tmp_path: Path) -> None:
    args = [a for s in SURFACES for a in ("--surface", s)]
    r = subprocess.run([sys.executable, str(REPO / "bench" / "hostile_input_campaign.py"), "--runs", "16",
                        "--work", str(tmp_path / "work"), *args], capture_output=True, text=True, timeout=300,
                       cwd=REPO)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    rows = {m[0]: (int(m[1]), int(m[2])) for m in re.findall(r"^(\S+) +(\d+) .*? (\d+) +[\d.]+ +\d+$", r.stdout, re.M)}
    assert rows == {**{s: (4, 0) for s in SURFACES}, "all": (16, 0)}, r.stdout
    assert "FAIL" not in r.stdout
