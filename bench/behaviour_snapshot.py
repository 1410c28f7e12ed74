"""Before/after snapshots of `kvgraft audit run` outputs, for a refactor that must change no output (a hand-run tool).

Not a benchmark: it records, for three tiny plans (A: verify, recompute, claims on a signed gemma3 release; B:
verify, sampled recompute, determinism, claims on an existing qwen3 release; C: verify, generalization, controls on
a llama library) and optionally the demo, the report JSON, `report show` at 80 columns, `report show --detail all`,
and the HTML (the run's and `report show --html`), masks what changes from run to run (timestamps, durations, rates,
pids, memory, energy, fresh digests of a rebuilt release, ephemeral key ids, output folder names), and diffs.

    python bench/behaviour_snapshot.py setup                       # tiny models, a release, a key, the plans
    WT=OLD_TREE python bench/behaviour_snapshot.py run before      # from a copy of the old code (git archive)
    WT=NEW_TREE python bench/behaviour_snapshot.py run after
    WT=NEW_TREE python bench/behaviour_snapshot.py run after A     # only the named plans (default: A B C)
    WT=OLD_TREE python bench/behaviour_snapshot.py demo before OUT_DIR_OF_A_DEMO_RUN
    python bench/behaviour_snapshot.py compare before after A B C demo   # exit 1 when anything differs

Files live under $SNAP (default /tmp/kvgraft-snap). Run each tree from its own copy: lazy imports would read an
edited tree in the middle of a run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

WT = Path(os.environ.get("WT", Path(__file__).resolve().parents[1]))
BASE = Path(os.environ.get("SNAP", "/tmp/kvgraft-snap"))
KV = [str(Path(sys.executable).parent / "kvgraft")]
ENV = {**os.environ, "PYTHONPATH": str(WT), "COLUMNS": "80", "TERM": "dumb", "HF_HUB_OFFLINE": "1"}
CLAIMS = WT / "audit/claims/kv-grafting-preprint.toml"
FILES = ("report.json", "show.txt", "detail.txt", "report.html", "run.html")
TS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z?")
# Members that change from run to run: time, rates, process ids, memory, energy, sizes of a rebuilt release.
VOLATILE = {"created", "seconds", "wall_seconds", "tokens_per_second", "projected_library_seconds", "wall time",
            "elapsed_seconds", "signed_at", "timestamp", "pid", "rss_before_bytes", "peak_rss_bytes", "joules",
            "energy_joules", "watts", "busy_fraction", "rss_before_bytes_min", "peak_rss_bytes_grafted",
            "upstream_energy_joules", "throughput_bytes_per_s", "bytes_hashed", "restore_seconds", "prefill_seconds",
            "decode_seconds", "upstream_seconds", "cpu_seconds", "total", "restore", "prefill", "decode"}
# Digests that differ between runs (a release captured anew, a fresh ephemeral key): replaced by their member name.
FRESH = ("release_root_digest", "release_attestation_digest", "root_digest", "manifest_sha256", "bundle_sha256",
         "key_id", "oms_sha256")


def sh(*args: str) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([*KV, *args], env=ENV, capture_output=True, text=True, cwd=WT)
    if r.returncode not in (0, 4, 6):
        sys.exit(f"{args}: exit {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


def setup() -> None:
    sys.path.insert(0, str(WT / "tests"))
    import tiny

    for fam in ("gemma3", "qwen3", "llama"):
        d = BASE / "models" / fam
        if not d.exists():
            d.mkdir(parents=True)
            tiny.build(fam, d)
    recs = BASE / "records.jsonl"
    recs.write_text("".join(json.dumps({"id": f"r{i}", "text": f"Problem {i}: Mia has {i + 3} apples. Answer: {i + 3}"})
                            + "\n" for i in range(4)))
    sh("capture", str(recs), "--out", str(BASE / "rel-qwen3"), "--model", str(BASE / "models/qwen3"), "--device", "cpu",
       "--overwrite")
    sh("keygen", "--out", str(BASE / "signer"), "--algorithm", "ed25519")
    head = 'format = "kvgraft-audit-plan"\nformat_version = 1\n'
    plans = {
        "A": f'{head}name = "tiny-a"\n[model]\nspec = "{BASE}/models/gemma3"\ndevice = "cpu"\n[release]\n'
             f'records = "{recs}"\nprobe_tokens = 3\n[checks.verify]\n[checks.recompute]\n[checks.claims]\n'
             f'file = "{CLAIMS}"\n[signing]\nkey = "{BASE}/signer.key.pem"\n',
        "B": f'{head}name = "tiny-b"\n[model]\nspec = "{BASE}/models/qwen3"\ndevice = "cpu"\n[release]\n'
             f'path = "{BASE}/rel-qwen3"\n[checks.verify]\n[checks.recompute]\nsample = 2\nnonce = "snap-nonce"\n'
             f'[checks.determinism]\nlength = 24\n[checks.claims]\nfile = "{CLAIMS}"\n[executor]\nthreads = 1\n',
        "C": f'{head}name = "tiny-c"\n[model]\nspec = "{BASE}/models/llama"\ndevice = "cpu"\n[release.library]\n'
             'source = "synthetic"\nlimit = 8\nlibrary_fraction = 0.5\nsalt = "snap"\n[checks.verify]\n'
             '[checks.generalization]\nsynthetic = 2\nmax_new_tokens = 4\npolicy = "nearest"\n[checks.controls]\n'
             'n = 6\nmax_new_tokens = 3\n',
    }
    for name, text in plans.items():
        (BASE / f"plan-{name}.toml").write_text(text)


def snapshot(out: Path, dest: Path) -> None:
    """The outputs of one run, as they are; masking happens when comparing."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "report.json").write_text((out / "report.json").read_text())
    (dest / "show.txt").write_text(sh("report", "show", str(out / "report.json")).stdout)
    (dest / "detail.txt").write_text(sh("report", "show", str(out / "report.json"), "--detail", "all").stdout)
    sh("report", "show", str(out / "report.json"), "--html", str(out / "snap.html"))
    (dest / "report.html").write_text((out / "snap.html").read_text())
    (dest / "run.html").write_text((out / "report.html").read_text())


def run(tag: str, names: list[str]) -> None:
    for name in names:
        out = BASE / f"out-{name}-{tag}"
        r = sh("audit", "run", str(BASE / f"plan-{name}.toml"), "--out", str(out), "--quiet")
        snapshot(out, BASE / "snap" / tag / name)
        (BASE / "snap" / tag / name / "exit").write_text(str(r.returncode))
        print(name, "exit", r.returncode)


def _fresh(x: Any, found: dict[str, str]) -> dict[str, str]:
    if isinstance(x, dict):
        for k, v in x.items():
            if k in FRESH and isinstance(v, str):
                found.setdefault(v, f"<{k}>")
            _fresh(v, found)
    elif isinstance(x, list):
        for v in x:
            _fresh(v, found)
    return found


def _mask_json(x: Any, key: str | None = None) -> Any:
    if key in VOLATILE:
        return "<masked>"
    if isinstance(x, dict):
        return {k: _mask_json(v, k) for k, v in x.items()}
    if isinstance(x, list):
        return [_mask_json(v) for v in x]
    return x


def _mask_text(s: str, fresh: dict[str, str], tag: str) -> str:
    for digest, name in fresh.items():
        s = s.replace(digest, name)
    s = s.replace(f"-{tag}", "-TAG").replace(f"demo_{tag}", "demo_TAG")
    s = TS.sub("<ts>", s)
    keys = sorted(VOLATILE | {"energy joules", "rss", "bytes hashed"}, key=len, reverse=True)
    s = re.sub(r"\b(" + "|".join(map(re.escape, keys)) + r")((?:&quot;|\")?:?\s+)-?[\d.,]+(e[+-]?\d+)?", r"\1\2<m>", s)
    s = re.sub(r"\d+(\.\d+)?\s+(s|min|h)\b", "<dur>", s)  # durations, also where a line wraps before the unit
    s = re.sub(r"[\d,]+ tokens/s", "<rate>", s)
    s = re.sub(r"[\d,]+(\.\d+)? J\b", "<J>", s)
    return re.sub(r"[\d,]+ bytes\b", "<n> bytes", s)


def compare(a: str, b: str, names: list[str]) -> int:
    differing = 0
    for name in names:
        for tag in (a, b):
            d = BASE / "snap" / tag / name
            report = json.loads((d / "report.json").read_text())
            fresh = _fresh(report, {})
            out = BASE / "cmp" / tag / name
            out.mkdir(parents=True, exist_ok=True)
            masked = json.dumps(_mask_json(report), indent=1, sort_keys=True, ensure_ascii=False)
            (out / "report.json").write_text(_mask_text(masked, fresh, tag))
            for f in FILES[1:]:
                (out / f).write_text(_mask_text((d / f).read_text(), fresh, tag))
        for f in (*FILES, "exit"):
            pa, pb = BASE / "cmp" / a / name / f, BASE / "cmp" / b / name / f
            if f == "exit":
                pa, pb = BASE / "snap" / a / name / f, BASE / "snap" / b / name / f
                if not pa.exists():
                    continue
            r = subprocess.run(["diff", str(pa), str(pb)], capture_output=True, text=True)
            print(name, f, "identical" if r.returncode == 0 else f"DIFFERS ({len(r.stdout.splitlines())} lines)")
            differing += r.returncode != 0
    return differing


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "setup":
        setup()
    elif cmd == "run":
        run(sys.argv[2], sys.argv[3:] or ["A", "B", "C"])
    elif cmd == "demo":
        snapshot(Path(sys.argv[3]), BASE / "snap" / sys.argv[2] / "demo")
    elif cmd == "compare":
        sys.exit(1 if compare(sys.argv[2], sys.argv[3], sys.argv[4:] or ["A", "B", "C"]) else 0)
