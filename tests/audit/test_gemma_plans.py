"""The real Gemma 3 270M's audit plans run end to end and their signed reports verify (`make test-slow`).

Minutes each on a 2-core CPU (docs/gemma-audit.md states the time and memory of one run); the model is converted once
into $KVGRAFT_HOME by the first of them. `make test-gemma` leaves these out (`-m 'gemma and not slow'`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.gemma]

AUDIT = Path(__file__).resolve().parents[2] / "audit"
KVGRAFT = [sys.executable, "-c", "from kvgraft.cli import entrypoint; entrypoint()"]


@pytest.mark.parametrize("plan", ["gemma.toml", "gemma-generalization.toml"])
def test_a_gemma_plan_passes_and_its_report_verifies(plan: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    run = subprocess.run([*KVGRAFT, "audit", "run", str(AUDIT / plan), "--out", str(out)], capture_output=True,
                         text=True, timeout=3 * 3600)
    assert run.returncode == 0, run.stderr[-4000:]
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"]["status"] == "passed", report["verdict"]
    verify = subprocess.run([*KVGRAFT, "report", "verify", str(out / "report.json"), "--key",
                             str(out / "keys" / "ephemeral.pub.pem"), "--release", str(out / "release")],
                            capture_output=True, text=True, timeout=600)
    assert verify.returncode == 0, verify.stderr
