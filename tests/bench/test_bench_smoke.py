"""The benchmark scripts in bench/ at a tiny size, so that one that rots (crashes, prints nonsense) turns the suite red.

Each test runs a script as its own process with tiny arguments and checks what it printed against itself: the
figures' internal consistency, never a timing or a figure measured on another machine (the inject campaign's
strace-free part, the parsing of strace's output, is called in-process; its sweep needs strace and is skipped,
naming it, where strace is missing). Left out here, run by tests of their own: bench/vllm_ttft.py (needs vLLM;
tests/serving/test_vllm.py), remote.py (test_remote_bench.py), hostile_campaign.py and hostile_attacks.py
(tests/release/test_hostile_campaign_smoke.py), crash_campaign.py (tests/release/test_crash_sample.py),
fail_open.py (test_fail_open.py), gpu_check.py, gpu_emulate.py and gpu_plan.py (test_gpu_check.py,
test_gpu_plan.py). machine.py is a helper the others import, with nothing to run. The last test here fails
naming any bench/*.py that no test's code names (machine.py excepted). The full Ray scale-out and the behaviour
snapshot's whole setup/run/compare cycle take a minute or more each: they are marked slow (`make test-slow`),
beside a quick test of each in the default suite.

The scripts run with one torch thread (OMP_NUM_THREADS=1): on a loaded 2-core machine torch's thread pool waiting
for busy cores made the tiny models' audits some eight times slower.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from math import comb
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
FIXTURE_REPORT = ROOT / "tests" / "fixtures" / "report-example.json"
NUMBER = r"(-?\d+(?:\.\d+)?)"


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_VERBOSITY": "error", **extra}


def _run(args: list[str], timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=env or _env())


def _ok(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res.stdout


def _finite_positive(*xs: float) -> None:
    for x in xs:
        assert math.isfinite(x) and x > 0, xs


def _quotient(shown: float, num: float, den: float, step: float, shown_step: float, scale: float = 1.0) -> bool:
    """`shown` (printed to `shown_step`) is num / den * scale, where num and den were each printed to `step`."""
    lo = (num - step / 2) / (den + step / 2) * scale
    hi = (num + step / 2) / max(den - step / 2, 1e-12) * scale
    return lo - shown_step / 2 <= shown <= hi + shown_step / 2


def test_canonical_json_three_encoders_agree_and_its_ratios_are_its_times(tmp_path: Path) -> None:
    entries = 2000
    out = _ok(_run(["-m", "bench.canonical_json", "--entries", str(entries), "--repeat", "1", "--layers", "2"], 60))
    assert f"{entries} records (4 tokens, 2 layers), same bytes from all three; best of 1:" in out, out
    rows = {m[0].strip(): tuple(map(float, m[1:])) for m in re.findall(
        rf"^  (.{{16}}) +{NUMBER} s +{NUMBER} us/record +{NUMBER}x canonical \(now\)$", out, re.M)}
    assert set(rows) == {"canonical (now)", "walk before", "rfc8785.dumps"}, out
    canonical_us = rows["canonical (now)"][1]
    assert rows["canonical (now)"][2] == 1.0, out
    for seconds, us, ratio in rows.values():
        _finite_positive(seconds, us, ratio)
        # us/record is the seconds (printed to 1 ms) over the records; the ratio is one us/record over the other's
        assert abs(us - seconds / entries * 1e6) <= 0.0005 / entries * 1e6 + 0.05, out
        assert _quotient(ratio, us, canonical_us, 0.1, 0.01), out


def test_fuzz_campaign_counts_every_case_and_misses_none() -> None:
    cases = 24
    out = _ok(_run([str(BENCH / "fuzz_campaign.py"), "--cases", str(cases), "--seed", "7"], 120))
    assert re.search(rf"seed 7, {cases} of {cases} cases in \d+ s, child exit 0\n", out), out
    assert re.search(r"^failures: 0 \(", out, re.M), out
    classes = re.findall(r"^(\S+) +(\d+)  ((?:exit -?\d+: \d+(?:, )?)+) +(\d+\.\d+)$", out, re.M)
    assert classes, out
    per = {name: (int(n), dict(re.findall(r"exit (-?\d+): (\d+)", exits))) for name, n, exits, _ in classes}
    for name, (n, exits) in per.items():
        assert sum(map(int, exits.values())) == n, (name, out)
        assert set(exits) <= ({"0"} if name == "git-metadata" else {"1", "2"}), (name, out)  # refused, or the control
    all_row = re.search(r"^all +(\d+)  (.*)$", out, re.M)
    assert all_row and int(all_row[1]) == cases == sum(n for n, _ in per.values()), out
    assert sum(int(k) for k in re.findall(r"exit -?\d+: (\d+)", all_row[2])) == cases, out


def test_sample_power_detection_rates_match_the_hypergeometric_it_prints(tmp_path: Path) -> None:
    """10 entries of the tiny Llama (the script's default model), 2 planted; 1000 nonces per sample size."""
    n_entries, bad, nonces, sizes = 10, 2, 1000, (3, 5)
    figures = tmp_path / "power.json"
    out = _ok(_run([str(BENCH / "sample_power.py"), "--entries", str(n_entries), "--bad", str(bad), "--nonces",
                    str(nonces), "--sizes", ",".join(map(str, sizes)), "--end-to-end", "1", "--out", str(figures)], 150))
    assert "the failing entries are exactly the planted ones" in out, out
    f = json.loads(figures.read_text())
    assert f["verdicts"]["byte-exact"] == n_entries - bad, f["verdicts"]
    assert f["verdicts"]["consistent"] + f["verdicts"]["inconsistent"] == bad, f["verdicts"]
    assert [r["n"] for r in f["rows"]] == list(sizes)
    previous_bound = n_entries
    for r in f["rows"]:
        n, hit = r["n"], r["found_at_least_one"]
        exact = 1 - comb(n_entries - bad, n) / comb(n_entries, n)
        assert r["predicted"] == pytest.approx(exact, abs=1e-12), r
        assert 0.0 <= hit <= 1.0 and 0.0 <= r["bound_covers_true_k"] <= 1.0, r
        # `nonces` independent draws: the rate found is binomial around the exact probability; 4.5 standard
        # errors (two-sided, about 7 in a million) plus one draw's worth
        assert abs(hit - exact) <= 4.5 * math.sqrt(exact * (1 - exact) / nonces) + 1 / nonces, r
        # the 95% bound when a sample finds nothing: the most failing entries for which a clean sample of n is
        # still at least 5% likely (exactly, C(N - B, n) / C(N, n)); no larger for a larger sample
        b = r["bound_if_none_found"]
        assert comb(n_entries - b, n) / comb(n_entries, n) >= 0.05 > comb(n_entries - b - 1, n) / comb(n_entries, n), r
        assert b <= previous_bound, r
        previous_bound = b
    (e2e,) = f["end_to_end"]
    assert e2e["failing"] == e2e["expected"] and e2e["bound"] >= e2e["failing"], e2e
    assert re.search(r"^ +3 +\d\.\d{4} +\d\.\d{4} +-?\d+\.\d\d +\d+ \( *\d+\.\d%\) +\d\.\d{4}$", out, re.M), out


def test_recompute_overhead_ratios_are_its_printed_times(tiny_dir: Callable[[str], Path]) -> None:
    tokens = 64
    out = _ok(_run([str(BENCH / "recompute_overhead.py"), "--model", str(tiny_dir("llama")), "--tokens", str(tokens),
                    "--entries", "2"], 90))
    p = re.search(rf"^fresh prefill +{NUMBER} ms$", out, re.M)
    c = re.search(rf"^KV comparison beyond prefill +{NUMBER} ms  = {NUMBER}% of the prefill", out, re.M)
    e = re.search(rf"^whole audit_entry +{NUMBER} ms  = {NUMBER}x the prefill", out, re.M)
    m = re.search(r"^peak memory during comparison  (-?\d+) KiB above .*; one layer's K/V = (\d+) KiB", out, re.M)
    assert p and c and e and m, out
    prefill, compare, compare_pct, entry, entry_x = map(float, (p[1], c[1], c[2], e[1], e[2]))
    _finite_positive(prefill, compare, entry, entry_x)

    assert _quotient(compare_pct, compare, prefill, 0.1, 0.1, scale=100), out  # times printed to 0.1 ms
    assert _quotient(entry_x, entry, prefill, 0.1, 0.01), out
    # the tiny Llama: 2 key/value heads of 8 dims in float32, keys and values: 128 bytes a token; the entries'
    # texts are decoded from `tokens` ids and encoded again, which may merge or split a few
    assert abs(int(m[2]) * 1024 - 128 * tokens) <= 128 * 8 + 1024, out


def test_sensitivity_finds_its_planted_faults_and_raises_no_false_alarm(tmp_path: Path,
                                                                        tiny_dir: Callable[[str], Path]) -> None:
    figures = tmp_path / "sensitivity.json"
    out = _ok(_run([str(BENCH / "sensitivity.py"), "--model", str(tiny_dir("llama")), "--records", "train",
                    "--long-tokens", "40", "--weights-layer", "1", "--elements", "2", "--out", str(figures)], 150))
    f = json.loads(figures.read_text())
    rows = f["rows"]
    groups = {g: [r for r in rows if r["group"] == g] for g in ("control", "benign", "planted", "tokens", "weights",
                                                                  "model")}
    assert [r["case"] for r in groups["control"]] == ["train: unchanged", "long40: unchanged"], groups["control"]
    assert all(r["verdict"] == "byte-exact" for r in groups["control"]), groups["control"]
    assert len(groups["benign"]) == 2 * 7 and f["false_alarms"] == 0, groups["benign"]
    assert f["false_alarms"] == sum(r["verdict"] == "inconsistent" for r in groups["control"] + groups["benign"])
    assert f"false alarms: kvgraft 0/{2 + 14}," in out, out
    # the planted faults: one element moved by 1 or 1e-2 of itself or of its row's RMS, found where it was put
    planted = {r["case"]: r for r in groups["planted"]}
    assert len(planted) == 8, planted
    for r in planted.values():
        assert r["trials"] == 2 and len(r["excess_in_row_noise"]) == 2, r
        assert 0 <= r["detected_and_located"] <= 2 and 0 <= r["toploc_detected"] <= 2, r
    for case in ("one element +1 x |x|", "one element +1 x |row rms|", "one element +0.01 x |x|",
                 "one element +0.01 x |row rms|"):
        assert planted[case]["detected_and_located"] == 2, planted[case]
    # states of other tokens, of scaled weights (1e-2) and of another model, filed as the release's: refused
    assert len(groups["tokens"]) == 3 and all(r["verdict"] == "inconsistent" for r in groups["tokens"]), groups["tokens"]
    assert groups["weights"][0]["case"] == "layer 1 weights x (1 + 0.01)", groups["weights"]
    assert groups["weights"][0]["verdict"] == "inconsistent", groups["weights"]
    assert [r["verdict"] for r in groups["model"]] == ["inconsistent"], groups["model"]
    # leave-one-out: each benign perturbation, measured without itself, in row noise below the factor used
    assert f["leave_one_out"] and all(0 < x["excess_in_row_noise"] < f["factor"] for x in f["leave_one_out"])


def test_inject_campaign_counts_strace_lines_and_says_when_strace_is_missing(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """What needs no strace: the parsing of its output, and the exit 2 naming it where it is not installed."""
    from bench import inject_campaign

    trace = ("4242  write(3, \"-----BEGIN\"..., 241) = 241\n"
             "4242  fsync(3 <unfinished ...>\n"
             "4243  write(1, \"x\", 1)        = -1 ENOSPC (No space left on device) (INJECTED)\n"
             "4242  <... fsync resumed>)     = 0\n"
             "4242  renameat2(AT_FDCWD, \".k.key.pem.tmp\", AT_FDCWD, \"k.key.pem\", RENAME_EXCHANGE) = 0\n"
             "4242  pwrite64(4, \"\\0\", 1, 7) = 1\n"
             "4242  fdatasync(4)             = 0\n"
             "4242  openat(AT_FDCWD, \"write(\", O_RDONLY) = 5\n"
             "4242  +++ exited with 0 +++\n")
    # the openat naming a file "write(" is one open, not a write
    assert inject_campaign.count_calls(trace) == {"write": 3, "fsync": 2, "rename": 1, "open": 1}
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert inject_campaign.main(["--only", "keygen"]) == 2
    assert "strace is not installed" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace (apt-get install strace) to inject faults")
def test_inject_campaign_keygen_enospc_sweep() -> None:
    # about 35 keygen runs (the pyopen row: 11 of them): 92 s on 2 loaded cores, 2026-12-02
    out = _ok(_run(["-m", "bench.inject_campaign", "--only", "keygen", "--errno", "ENOSPC"], 300))
    rows = _inject_rows("keygen --overwrite", out)
    assert [(r[1], r[2]) for r in rows] == [(c, "ENOSPC") for c in ("write", "fsync", "rename", "open", "pyopen")], out
    for row in rows:
        runs, exit_io, exit_ok, previous, new, absent, violations = map(int, row[3:])
        assert runs >= 1 and violations == 0, row  # each class was called, and every injected call was survived
        assert exit_io + exit_ok == runs and previous + new == runs and absent == 0, row
        # the injections happened: in each class, a failure before the new pair was in place (the first rename,
        # the first key file's write or fsync) was exit 7 and left the previous pair
        assert exit_io >= 1 and previous >= 1, row


def _inject_rows(scenario: str, out: str) -> list[tuple[str, ...]]:
    cells = r" \| (\w+) \| (\w+)" + r" \| (\d+)" * 7
    return re.findall(rf"^\| ({re.escape(scenario)}){cells} \|$", out, re.M)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace (apt-get install strace) to inject faults")
def test_inject_campaign_report_rename_sweep() -> None:
    """`audit run`'s renames failed one at a time (the release's signature, the report's, the report, the page):
    each run loads a tiny model, some 30 s on a loaded 2-core machine, hence slow."""
    out = _ok(_run(["-m", "bench.inject_campaign", "--only", "report", "--errno", "EIO", "--syscall", "rename"], 900))
    rows = _inject_rows("audit run (report)", out)
    assert [(r[1], r[2]) for r in rows] == [("rename", "EIO")], out
    runs, exit_io, _exit_ok, previous, new, absent, violations = map(int, rows[0][3:])
    assert runs >= 4 and violations == 0 and exit_io == runs, rows  # every rename refused is exit 7, one line
    # a refused rename before the report was in place leaves none (the previous one was removed at the start);
    # the page's, after it, leaves the new report
    assert absent >= 3 and new >= 1 and absent + new + previous == runs, rows


def _volatile_copy(report: dict[str, Any]) -> dict[str, Any]:
    """The report as another run of the same code would write it: other time, sizes of a rebuilt release, digests."""
    # the release's root digest wherever it is shown
    other: dict[str, Any] = json.loads(json.dumps(report).replace(report["release_root_digest"], "ab" * 32))
    other["created"] = "2026-11-30T23:59:58Z"
    other["checks"][0]["data"]["bytes_hashed"] += 4096
    return other


def test_behaviour_snapshot_masks_what_changes_between_runs_and_reports_what_does_not(tmp_path: Path) -> None:
    """The demo path on the report fixture: a copy differing only in volatile members compares identical; a changed
    verdict differs (exit 1). The tags are of one length: the output folder's name, which holds the tag, is
    shown in `report show`'s text wrapped at 80 columns, and the tag is masked after the wrapping (a longer tag can
    move a line break: "before" against "after" differs in show.txt when the path falls on a wrapped line)."""
    report = json.loads(FIXTURE_REPORT.read_text())
    env = _env(SNAP=str(tmp_path / "snap"), WT=str(ROOT))
    for tag, doc, when in (("old", report, "2025-06-01T12:00:00Z"),
                           ("new", _volatile_copy(report), "2026-11-30T23:59:58Z")):
        out = tmp_path / f"demo_{tag}"
        out.mkdir()
        (out / "report.json").write_text(json.dumps(doc, indent=2))
        (out / "report.html").write_text(f"<html><p>created {when}, wall time: 12.5 s, 1,234 tokens/s</p></html>\n")
        _ok(_run([str(BENCH / "behaviour_snapshot.py"), "demo", tag, str(out)], 60, env))
        # what was snapshotted: the run's outputs as they were, and `report show`'s views of its report
        snap = tmp_path / "snap" / "snap" / tag / "demo"
        assert json.loads((snap / "report.json").read_text()) == doc
        assert (snap / "run.html").read_text() == (out / "report.html").read_text()
        assert (snap / "report.html").read_text().startswith("<!DOCTYPE html>")
        show, detail = (snap / "show.txt").read_text(), (snap / "detail.txt").read_text()
        assert show.startswith("kvgraft audit · example-audit · smollm2-135m\n"), show
        assert len(detail.splitlines()) > len(show.splitlines()), (show, detail)  # --detail all: every check's data
    compared = _run([str(BENCH / "behaviour_snapshot.py"), "compare", "old", "new", "demo"], 60, env)
    files = ("report.json", "show.txt", "detail.txt", "report.html", "run.html")
    assert _ok(compared).splitlines() == [f"demo {f} identical" for f in files], compared.stdout
    assert "ab" * 32 in (tmp_path / "snap" / "snap" / "new" / "demo" / "detail.txt").read_text()  # it was shown
    changed = tmp_path / "snap" / "snap" / "new" / "demo" / "report.json"
    doc = json.loads(changed.read_text())
    doc["verdict"]["status"] = "passed"
    changed.write_text(json.dumps(doc))
    compared = _run([str(BENCH / "behaviour_snapshot.py"), "compare", "old", "new", "demo"], 60, env)
    assert compared.returncode == 1, compared.stdout + compared.stderr
    assert re.search(r"^demo report.json DIFFERS \(\d+ lines\)$", compared.stdout, re.M), compared.stdout
    assert "demo show.txt identical" in compared.stdout


@pytest.mark.slow
def test_behaviour_snapshot_two_runs_of_one_tree_compare_identical(tmp_path: Path) -> None:
    """The whole cycle on plan A (a signed gemma3 release recomputed, claims): setup, the same tree run twice."""
    env = _env(SNAP=str(tmp_path), WT=str(ROOT))
    script = str(BENCH / "behaviour_snapshot.py")
    _ok(_run([script, "setup"], 300, env))
    for tag in ("old", "new"):  # tags of one length (see the test above)
        assert _ok(_run([script, "run", tag, "A"], 300, env)).split() in (["A", "exit", "0"], ["A", "exit", "4"])
    compared = _run([script, "compare", "old", "new", "A"], 60, env)
    assert _ok(compared).splitlines() == [f"A {f} identical" for f in ("report.json", "show.txt", "detail.txt",
                                                                       "report.html", "run.html", "exit")]


def test_scale_out_local_reference_builds_its_release(tmp_path: Path) -> None:
    """The part without Ray (--local-only): the model, a release of 2 entries and the in-process audit."""
    out = _ok(_run([str(BENCH / "scale_out.py"), "--entries", "2", "--tokens", "40", "--quiet-wait", "0", "--dir",
                    str(tmp_path), "--local-only"], 120))
    assert re.search(r"^release .*: 2 entries of \d+-\d+ tokens;", out, re.M), out
    local = re.search(rf"^local +1 thread in this process: {NUMBER} s \((\d+) ms per entry\)", out, re.M)
    assert local and float(local[1]) > 0, out
    assert "local     byte-exact 2/2" in out and "ray       local instance" not in out, out


@pytest.mark.slow
def test_scale_out_one_and_two_ray_workers_agree(tmp_path: Path) -> None:
    """The whole run on 2 entries: Ray's start and three actors take about a minute on a loaded 2-core machine."""
    pytest.importorskip("ray")
    out = _ok(_run([str(BENCH / "scale_out.py"), "--entries", "2", "--tokens", "40", "--repeat", "1", "--quiet-wait",
                    "0", "--dir", str(tmp_path)], 300))
    assert "results   1 worker, 2 workers and local identical apart from timing and placement: True" in out, out
    assert re.search(r"^1 worker  best .*; byte-exact 2/2$", out, re.M), out
    two = re.search(r"^2 workers best .*; byte-exact 2/2; entries per worker (\d+) \+ (\d+)$", out, re.M)
    assert two and int(two[1]) + int(two[2]) == 2, out
    speed = re.search(rf"^speed-up  {NUMBER}x best-of-1, {NUMBER}x median", out, re.M)
    assert speed, out
    _finite_positive(float(speed[1]), float(speed[2]))
    assert float(speed[1]) == float(speed[2]), out  # one repeat: its best is its median


def test_graft_vs_recompute_ratios_are_its_printed_times(tiny_dir: Callable[[str], Path]) -> None:
    """One round per length: each median is of one round, so "x faster" and "restore/limit" are quotients of the
    times printed beside them, and the second table repeats the first's."""
    lengths = (16, 48)
    out = _ok(_run([str(BENCH / "graft_vs_recompute.py"), "--model", str(tiny_dir("llama")), "--rounds", "1",
                    "--lengths", *map(str, lengths)], 90))
    assert re.search(rf"^model {re.escape(str(tiny_dir('llama')))} float32 sdpa on cpu, torch threads 1, cores \d+,",
                     out, re.M), out
    assert "1 rounds per length;" in out, out
    rows = [tuple(map(float, m)) for m in re.findall(rf"^ +(\d+) +{NUMBER} +{NUMBER} +{NUMBER} +(\d+) +{NUMBER} "
                                                     rf"+{NUMBER} +{NUMBER} +{NUMBER}$", out, re.M)]
    floors = re.findall(rf"^ +(\d+) +{NUMBER} +{NUMBER} +{NUMBER} +{NUMBER}$", out, re.M)
    assert [int(r[0]) for r in rows] == list(lengths), out  # the entry of each length holds that many tokens
    assert [int(f[0]) for f in floors] == list(lengths), out
    for (_, kv_mb, prefill, restore, x, limit, ratio, first, load), floor in zip(rows, floors, strict=True):
        _finite_positive(prefill, restore, first, load)
        assert kv_mb >= 0 and limit >= 0, out
        assert _quotient(x, prefill, restore, 0.1, 1), out  # prefill printed to 0.1 ms, restore to 0.01 ms
        assert _quotient(ratio, restore, limit, 0.01, 0.01), out
        # the second table: the same medians of the hashing limit and the restore, and the two floors between
        assert float(floor[1]) == limit and float(floor[4]) == restore, (floor, out)
        assert float(floor[2]) >= 0 and float(floor[3]) >= 0, out
    assert out.rstrip().endswith("the graft restore checks SHA-256 of every byte it restores"), out


def test_prefix_schedule_names_every_prefix_it_was_asked_for(tiny_dir: Callable[[str], Path]) -> None:
    lengths = (24, 100)
    model = tiny_dir("llama")
    out = _ok(_run([str(BENCH / "prefix_schedule.py"), "--model", str(model), "--lengths", ",".join(map(str, lengths)),
                    "--threads", "1"], 90))
    assert out.startswith(f"model {model}, float32, sdpa, 1 threads, "), out
    rows = re.findall(r"^ +(\d+) +(\d+)  (.*)$", out, re.M)
    # each T, and each block-aligned n below it (16, 64, 256, 1024) with T - 16, once, in order
    wanted = [(t, n) for t in lengths for n in sorted({n for n in (16, 64, 256, 1024, t - 16) if 0 < n < t})]
    assert [(int(t), int(n)) for t, n, _ in rows] == wanted == [(24, 8), (24, 16), (100, 16), (100, 64), (100, 84)]
    layers = json.loads((model / "config.json").read_text())["num_hidden_layers"]
    for t, n, verdict in rows:
        if verdict != "byte-identical":
            m = re.fullmatch(r"differ from layer\.(\d+)\.(keys|values), max \|diff\| (\S+)", verdict)
            assert m and int(m[1]) < layers and float(m[3]) > 0, (t, n, verdict)


def _counted(reads: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+) \((\d+) distinct\)", reads)
    assert m, reads
    return int(m[1]), int(m[2])


def test_scale_many_finds_the_entry_it_probed(tmp_path: Path) -> None:
    entries = 20
    probe = f"e{entries * 7 // 10:06d}"
    out = _ok(_run([str(BENCH / "scale.py"), "many", "--entries", str(entries), "--repeat", "1", "--dir",
                    str(tmp_path)], 90))
    assert re.search(rf"^release   {entries} entries \(2 layers x \[1, 2, 16, 8\] float32 .*, \d+ index files$", out,
                     re.M), out
    b = re.search(rf"^build     {NUMBER} s with ReleaseWriter \({NUMBER} ms per entry\), then signed$", out, re.M)
    assert b, out
    assert _quotient(float(b[2]), float(b[1]), entries, 0.1, 0.01, scale=1e3), out
    base = re.search(r"^baseline  .*: peak RSS (\d+) MB$", out, re.M)
    o = re.search(rf"^open +verified .* \+ find (\S+): {NUMBER} s \(find {NUMBER} ms\), peak RSS (\d+) MB$", out, re.M)
    v = re.search(rf"^verify 1  verify --entry (\S+): {NUMBER} s, (\d+) bytes hashed, peak RSS (\d+) MB$", out, re.M)
    s = re.search(rf"^startup   .*: {NUMBER} s, one lookup {NUMBER} ms -> \['(\S+)', (\d+)\], peak RSS (\d+) MB$", out,
                  re.M)
    assert base and o and v and s, out
    assert o[1] == v[1] == s[3] == probe, out  # each step on the probe; the lookup of its tokens + 3 finds it whole
    assert int(s[4]) == 16, out
    assert float(o[3]) <= float(o[2]) * 1e3 + 0.5 + 0.05, out  # the find is part of the open's time
    # one entry's tensors, 2 layers x keys and values of 1 x 2 x 16 x 8 float32, at least
    assert int(v[3]) >= 2 * 2 * 2 * 16 * 8 * 4, out
    _finite_positive(float(o[2]), float(v[2]), float(s[1]))
    # every step's process imports what the baseline's did (RSS printed to 1 MB)
    assert min(int(o[4]), int(v[4]), int(s[5])) >= int(base[1]) - 1, out


def test_scale_large_ratios_are_its_printed_figures(tmp_path: Path) -> None:
    """Two entries of 16 tokens (the least) of the 48-layer shape, 6 MiB each; the one-core hashing rate is
    measured for a fixed 2 s."""
    out = _ok(_run([str(BENCH / "scale.py"), "large", "--gib", "0.01", "--entry-mib", "1", "--repeat", "1", "--dir",
                    str(tmp_path)], 120))
    rel = re.search(rf"^releases  large: 2 entries x 16 tokens \(48 layers x \[1, 8, 16, 256\] bfloat16, random\), "
                    rf"{NUMBER} GB; small: 2 entries, {NUMBER} GB$", out, re.M)
    h = re.search(rf"^hashing   one core {NUMBER} GB/s in memory; limit (\d+) x = {NUMBER} GB/s$", out, re.M)
    r = re.search(rf"^repeat 1  floor \(read \+ hash, (\d+) threads\) {NUMBER} GB/s; kvgraft verify {NUMBER} GB/s "
                  rf"\({NUMBER} s\) = (\d+)% of the floor, (\d+)% of the limit$", out, re.M)
    best = re.search(rf"^verify    best repeat: {NUMBER} GB/s = (\d+)% of the read \+ hash floor \({NUMBER} GB/s\), "
                     rf"(\d+)% of the hashing limit$", out, re.M)
    assert rel and h and r and best, out
    one, cores, limit = float(h[1]), int(h[2]), float(h[3])
    assert int(r[1]) == cores and abs(limit - cores * one) <= cores * 0.005 + 0.005, out
    floor, rate = float(r[2]), float(r[3])
    _finite_positive(one, floor, rate, float(r[4]))
    assert _quotient(float(r[5]), rate, floor, 0.01, 1, scale=100), out
    assert _quotient(float(r[6]), rate, limit, 0.01, 1, scale=100), out
    # one repeat: the best is that repeat
    assert (best[1], best[2], best[3], best[4]) == (r[3], r[5], r[2], r[6]), out
    steps = re.findall(rf"^(\S+) +{NUMBER} s on {NUMBER} GB vs {NUMBER} s on {NUMBER} GB: {NUMBER}x; "
                       r"peak RSS (\d+) / (\d+) MB$", out, re.M)
    assert [s[0] for s in steps] == ["startup", "verify-one", "graft-one"], out
    for _, a, big_gb, b, small_gb, x, _, _ in steps:
        _finite_positive(float(a), float(b))
        assert _quotient(float(x), float(a), float(b), 0.001, 0.01), out
        # the sizes: the releases line's, to one fewer decimal
        assert abs(float(big_gb) - float(rel[1])) <= 0.05 + 0.005 and abs(float(small_gb) - float(rel[2])) <= 0.0055, out


def test_scale_index_reads_each_shard_it_needs(tmp_path: Path) -> None:
    """300 entries: `verify --sample 300` draws 300, and a release of fewer refuses that size (exit 1)."""
    entries, layers = 300, 2
    probe = f"e{entries * 7 // 10:06d}"
    out = _ok(_run([str(BENCH / "scale.py"), "index", "--entries", str(entries), "--layers", str(layers), "--dir",
                    str(tmp_path)], 120))
    rel = re.search(rf"^release   {entries} entries x {layers} layers .* in (\d+) shards, manifest\.json", out, re.M)
    assert rel and int(rel[1]) >= 2, out  # several shards, so that which of them a step read tells something
    shards = int(rel[1])
    assert re.search(rf"^build     {NUMBER} s with ReleaseWriter, then signed$", out, re.M), out
    base = [re.search(rf"^{name} +peak RSS (\d+) MB", out, re.M) for name in ("baseline", "baseline-torch")]
    assert base[0] and base[1] and int(base[1][1]) > int(base[0][1]), out  # torch imported on top
    labels = ["audit sample --size 20", "audit recompute --sample 20, to 1st", f"audit recompute --entry {probe}, to 1st",
              "verify --sample 300", "verify's record pass (check_index)", "inspect --limit 0 --json", "verify (everything)"]
    steps = re.findall(rf"^(.+?) +{NUMBER} s \({NUMBER} s CPU\), peak RSS +(\d+) MB, shard reads (\d+ \(\d+ distinct\))",
                       out, re.M)
    assert [s[0] for s in steps] == labels, out
    reads = {label: _counted(r) for label, _, _, _, r in steps}
    for label, (n, distinct) in reads.items():
        assert distinct <= min(n, shards), (label, out)
    # what each step must read: the shard of the one entry, or of the 20 drawn; every shard, for every entry
    assert reads[f"audit recompute --entry {probe}, to 1st"][1] >= 1, out
    assert reads["audit recompute --sample 20, to 1st"][1] >= 1, out
    for label in ("verify --sample 300", "verify's record pass (check_index)", "inspect --limit 0 --json", "verify (everything)"):
        assert reads[label][1] == shards, (label, out)
    assert re.search(r"^ +0 of 300 sampled entries damaged: at most 0% of 300 entries are damaged \(0\)", out, re.M), out


def test_verify_throughput_figures_agree_with_each_other(tmp_path: Path) -> None:
    entries = 2
    out = _ok(_run([str(BENCH / "verify.py"), "--entries", str(entries), "--mib", "1", "--layers", "2", "--tokens",
                    "16", "--repeat", "1", "--dir", str(tmp_path)], 90))
    rel = re.search(rf"^release   {re.escape(str(tmp_path / 'rel'))}: {entries} entries x 1 MiB \(2 layers x 2 tensors, "
                    rf"16 tokens each\), (\d+) files, {NUMBER} GiB, manifest {NUMBER} MiB$", out, re.M)
    cores = re.search(r"^machine   (\d+) cores usable;", out, re.M)
    one = re.search(rf"^hashlib   single core, in memory: {NUMBER} GiB/s \(best of 1: {NUMBER}\)$", out, re.M)
    limit = re.search(rf"^limit     cores x single core = (\d+) x {NUMBER} = {NUMBER} GiB/s$", out, re.M)
    v = re.search(rf"^verify    --key, page-cached: {NUMBER} GiB/s, {NUMBER} s for {NUMBER} GiB \(best of 1: {NUMBER}; "
                  rf"median {NUMBER}\); other processes used {NUMBER} CPUs meanwhile$", out, re.M)
    ratio = re.search(rf"^ratio     verify / limit = {NUMBER} % \(target >= 90 %\): (MET|NOT MET)$", out, re.M)
    assert rel and cores and one and limit and v and ratio, out
    assert int(rel[1]) >= entries + 1, out  # the entry files and the manifest at least
    assert one[1] == one[2] and limit[2] == one[1] and int(limit[1]) == int(cores[1]), out
    n, single, lim = int(limit[1]), float(one[1]), float(limit[3])
    assert abs(lim - n * single) <= n * 0.0005 + 0.0005, out
    rate, seconds, gib = float(v[1]), float(v[2]), float(v[3])
    _finite_positive(single, rate)
    assert v[1] == v[4] == v[5] and float(v[6]) >= 0, out  # one round: its rate is the best and the median
    assert abs(gib - float(rel[2])) <= 0.001, out  # verify hashed every file (printed to 1 MiB or so)
    assert _quotient(rate, gib, seconds, 0.001, 0.001), out
    assert _quotient(float(ratio[1]), rate, lim, 0.001, 0.1, scale=100), out
    assert float(ratio[1]) >= 90 if ratio[2] == "MET" else float(ratio[1]) <= 90, out  # met: at least 90 % unrounded
    for what in ("hashlib on \\d+ threads at once, in memory", "kvgraft.release.hashing.hash_files alone, page-cached"):
        d = re.search(rf"^  {what}: {NUMBER} GiB/s = {NUMBER} % of the limit \({NUMBER}\)$", out, re.M)
        assert d and d[1] == d[3], (what, out)
        assert _quotient(float(d[2]), float(d[1]), lim, 0.001, 0.1, scale=100), (what, out)
    assert re.search(rf"^  manifest alone .*: {NUMBER} s \(best of 1\)$", out, re.M), out
    assert re.search(rf"^  verify --deep \(every byte hashed twice\): {NUMBER} GiB/s of hashing, {NUMBER} s$", out,
                     re.M), out


# bench/*.py that no test need run: machine.py, busy_seconds() for the verify and scale-out benchmarks, has nothing
# of its own to run (a string here naming a script's file would count as a test of it)
HELPERS = ("machine",)


def _named_in_code(path: Path) -> set[str]:
    """The bench scripts a test file names in its code (not in its docstrings or comments): a string holding the
    file name ("NAME.py", "bench/NAME.py", "bench.NAME" for `-m`), or an import (`from bench import NAME`,
    `import bench.NAME`, `import NAME` with bench/ on sys.path), in the test's code or in code it hands a child."""
    import ast

    tree = ast.parse(path.read_text(), str(path))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            # a path's last part, or one under bench/ anywhere; a module under bench (`-m`, or code run by a child)
            names.update(re.findall(r"(?:^|(?<=bench/))(\w+)\.py\b", node.value))
            names.update(re.findall(r"\bbench\.(\w+)", node.value))
            for imported in re.findall(r"\bfrom bench import ([\w, ]+)", node.value):
                names.update(n.strip() for n in imported.split(","))
        elif isinstance(node, ast.ImportFrom) and node.module == "bench":
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("bench."):
            names.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            names.update(alias.name.removeprefix("bench.") for alias in node.names)
    return names


def test_every_bench_script_is_run_by_some_test() -> None:
    """Every bench/*.py is named by a test's code (see _named_in_code), so that none rots unnoticed; machine.py,
    a module of helpers the others import, is the one exception, and is checked to be only that."""
    scripts = sorted(p.stem for p in BENCH.glob("*.py"))
    named: set[str] = set()
    for path in (ROOT / "tests").rglob("*.py"):
        named |= _named_in_code(path)
    missing = [f"bench/{s}.py" for s in scripts if s not in named and s not in HELPERS]
    assert not missing, f"no test runs {', '.join(missing)}: add a smoke run at a tiny size (tests/bench/)"
    for helper in HELPERS:
        text = (BENCH / f"{helper}.py").read_text()
        assert "__main__" not in text and "argparse" not in text, f"bench/{helper}.py runs on its own: test it"
        assert any(re.search(rf"^from {helper} import ", (BENCH / f"{s}.py").read_text(), re.M) for s in scripts), helper
