"""bench/remote.py at a tiny size: it runs, and the bytes its S3 server counts show `verify --entry` reading what
it needs (within 5%), while fetching the whole release first, the positive control counted
by the same server, is many times that."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_remote_bench_reads_what_verify_entry_needs(tmp_path: Path) -> None:
    rows_path = tmp_path / "rows.json"
    res = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "remote.py"), "--entries", "20", "--entry-kib", "16", "--steps",
         "verify-1", "--dir", str(tmp_path / "work"), "--json", str(rows_path)],
        capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr[-3000:]
    rows = {r["step"]: r for r in json.loads(rows_path.read_text())["rows"]}
    one, whole = rows["verify-1"], rows["fetch-all"]
    assert one["ratio"] <= 1.05, one
    assert one["by_kind"]["entry"] >= 16 * 1024  # the entry file itself went through the counted server
    assert one["warm_entry_bytes"] == 0, one  # a second run reads the entry from the cache
    # positive control: the whole release, counted by the same server, is the release and many times one entry's need
    assert whole["transferred"] >= whole["needed"], whole
    assert one["fetch_all_ratio"] == whole["transferred"] / one["needed"] > 3, (one, whole)
    assert "| verify --entry |" in res.stdout
    assert not (tmp_path / "work").exists()  # the release and the caches are deleted at the end
