"""The GPU check (bench/gpu_check.sh): its import set, its sample sizes, and its dry run from the wheel folder."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# What the GPU audit path is: the modules bench/gpu_check.py runs (capture, recompute, graft, verify, sampling).
GPU_PATH = ("import kvgraft.inference.capture, kvgraft.recompute.audit, kvgraft.inference.graft, kvgraft.signing.verify, "
            "kvgraft.inference.runtime, kvgraft.sampling")


def _bench(name: str):  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_gpu_audit_path_imports_no_sigstore_nor_gguf() -> None:
    # The wheel folder carries neither: the GPU audit must not import them (kvgraft imports sigstore
    # only to sign or to check a Sigstore bundle, gguf only to convert the default model).
    probe = (f"{GPU_PATH}; import sys; "
             "bad = sorted({m.split('.')[0] for m in sys.modules} & {'sigstore', 'sigstore_models', 'gguf'}); "
             "sys.exit(', '.join(bad) if bad else 0)")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert out.returncode == 0, f"imported on the GPU audit path: {out.stderr.strip()}"


def _gpu_check():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(ROOT / "bench"))  # its own imports: gpu_plan, graft_vs_recompute
    try:
        return _bench("gpu_check")
    finally:
        sys.path.remove(str(ROOT / "bench"))


def test_the_tables_draw_from_a_run_cut_anywhere() -> None:
    # The hard stop writes whatever is there: a length row with only its capture, an (e) with only its size.
    res = {"dry_run": False, "started": "2026-12-01T00:00Z", "command": "bash bench/gpu_check.sh", "elapsed": 475.0,
           "budget": 480.0, "seed": 0, "library_tokens": 2_854_766, "tiny": [],
           "machine": {"device_name": "GPU", "torch": "2.11.0", "transformers": "5.24.0", "python": "3.12.3",
                       "cores": 16, "cpu": "CPU"},
           "probe": {"storage": {"said": "chose /dev/shm"}},
           "big": {"model": {"name": "gemma3-12b", "class": "Gemma3ForCausalLM", "parameters": 11.8e9, "layers": 48,
                             "build_seconds": 20.0, "seed": 0},
                   "lengths": [{"length": 2048, "capture_seconds": 3.0, "tokens": 2048, "prefill_seconds": [0.1]}],
                   "projection": []},
           "library": {"entries": 49, "entry_tokens": 4096, "target_tokens": 200_000, "size_reason": "49 entries",
                       "estimated_bytes": 29.6e9},
           "steps": [{"step": "12B 2048 tokens (c, d)", "estimate": 27.5, "basis": "b", "start": 440.0, "seconds": 35.0,
                      "status": "stopped", "why": "cut at the budget (475 of 480 s) after 35 s; estimated 28 s"},
                     {"step": "library capture (e)", "estimate": 30.0, "basis": "b", "status": "not started",
                      "why": "the run was cut at the budget before it"}],
           "errors": 1}
    md = _gpu_check().markdown(res)
    assert "| 2048 | not finished | | | | |" in md and "identity not computed" in md
    assert "| 12B 2048 tokens (c, d) | 27.5 | 35.0 | stopped: cut at the budget (475 of 480 s)" in md
    assert "| library capture (e) | 30.0 | nan | not started: the run was cut at the budget before it |" in md
    assert "A library of 49 entries" in md and "**1 step(s) raised or were cut**" in md


def test_sample_sizes_match_the_hypergeometric_and_binomial_bounds() -> None:
    from scipy.stats import hypergeom

    sizes = _gpu_check().sample_sizes
    for entries in (50, 100, 349, 1394, 44606):
        s = sizes(entries)
        failing = max(1, -(-entries // 100))
        assert s["failing_at_bound"] == failing
        assert s["binomial"] == 299  # ln(0.05) / ln(0.99) = 298.07
        # The smallest n whose chance of drawing no failing entry is at most 5%, by scipy.
        n = next(n for n in range(1, entries + 1) if hypergeom.pmf(0, entries, failing, n) <= 0.05)
        assert s["hypergeometric"] == n, entries
    assert sizes(100)["hypergeometric"] == 95  # one failing entry in 100: nearly all must be audited


def test_the_dry_run_must_say_it_ran_the_gpu_machines_torch(tmp_path: Path) -> None:
    # make gpu-check-dry's last step: torch 2.11.0 is pinned in the GPU machine's list; a run under this
    # machine's torch (2.13.0+cpu) fails it, one under 2.11.0 in any build passes.
    emulate = _bench("gpu_emulate")
    assert emulate.machine_pins()["torch"] == "2.11.0"
    result = tmp_path / "gpu_check.json"
    for torch, ok in (("2.11.0+cu130", True), ("2.11.0", True), ("2.13.0+cpu", False), ("2.11.1", False), ("", False)):
        result.write_text(json.dumps({"machine": {"torch": torch, "device_name": "CPU", "transformers": "5.24.0"}}))
        if ok:
            assert f"ran torch {torch} (the GPU machine's 2.11.0)" in emulate.check_ran(result)
        else:
            with pytest.raises(SystemExit, match=re.escape("not the GPU machine's 2.11.0")):
                emulate.check_ran(result)


def _requirements(wheel: Path) -> set[str]:
    """Requires-Dist names of a wheel, markers and extras dropped (an over-approximation is fine here)."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    reqs = set()
    for line in lines:
        if line.startswith("Requires-Dist:") and "extra ==" not in line:
            reqs.add(_norm(re.split(r"[ ;<>=!~\[(]", line.split(":", 1)[1].strip())[0]))
    return reqs


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.mark.slow
def test_dry_run_from_the_wheel_folder_in_a_venv_of_the_gpu_machines_packages(tmp_path: Path) -> None:
    from scipy.stats import hypergeom

    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    wheels = tmp_path / "wheels"
    subprocess.run(["make", "-s", "gpu-wheels", f"GPU_PY={version}", f"GPU_WHEELS={wheels}"], cwd=ROOT, check=True)
    files = sorted(wheels.glob("*.whl"))
    assert sum(f.stat().st_size for f in files) <= 30 << 20
    venv = tmp_path / "venv"
    # Fails unless cryptography, rfc8785, jsonschema(-rs), sigstore, gguf are NOT importable there and the pinned
    # versions are: torch 2.11.0 among them, whose wheels (2.6 GB with its CUDA libraries) are downloaded once into
    # the folder `make gpu-check-dry` keeps them in (ignored by git), the venv built anew (4.4 GB).
    emulate = _bench("gpu_emulate")
    subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_emulate.py"), str(venv),
                    "--machine-wheels", str(ROOT / "out" / "gpu-dry" / "machine-wheels")], check=True)
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PY=str(venv / "bin" / "python"), GPU_WHEELS=str(wheels), OUT=str(out), WORK=str(tmp_path / "work"))
    t0 = time.monotonic()
    # A budget no load on this shared machine reaches: the skips have their own test below.
    run = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), "--dry-run", "--budget", "3600"], env=env,
                         capture_output=True, text=True)
    seconds = time.monotonic() - t0
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    print(f"dry run: {seconds:.0f} s")
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.json", "gpu_check.log", "gpu_check.md"]  # <= 8
    res = json.loads((out / "gpu_check.json").read_text())
    # The GPU machine's torch ran it (its CUDA build, on the CPU here), not this machine's.
    assert res["machine"]["torch"].split("+")[0] == emulate.machine_pins()["torch"] == "2.11.0", res["machine"]
    assert res["machine"]["device"] == "cpu"
    # Every step of the plan ran, each after its estimate was checked; the library went where the probe chose.
    assert [r["step"] for r in res["steps"]] == [r["step"] for r in res["plan"]]
    assert all(r["status"] == "done" and r["estimate"] >= 0 for r in res["steps"]), res["steps"]
    assert res["probe"]["storage"]["folder"] and res["library"]["folder"].startswith(res["probe"]["storage"]["folder"])
    assert res["elapsed"] <= 3600 and "### Steps and budget" in (out / "gpu_check.md").read_text()
    tiny = res["tiny"]
    assert {r["family"] for r in tiny} == {"llama", "qwen3", "gpt2", "gemma3", "gemma4"}
    assert all("verdict" in r for r in tiny), [r for r in tiny if "verdict" not in r]
    assert sum(r["part"] == "a" for r in tiny) == 10 and sum(r["part"] == "b" for r in tiny) == 15
    # (a): captured and recomputed on the same device under the replayed conditions.
    assert all(r["verdict"] == "byte-exact" for r in tiny if r["part"] == "a")
    # Its controls: a planted change is found, a benign rerun is not taken for one.
    control = [r for r in tiny if r["part"] == "control"]
    assert len(control) == 10
    assert all(r["verdict"] == "inconsistent" for r in control if r["expect"] == "inconsistent")
    assert all(r["verdict"] != "inconsistent" for r in control if r["expect"] != "inconsistent")
    lengths = res["big"]["lengths"]
    assert [r["length"] for r in lengths] == [64, 256]
    assert all(r["audit"]["verdict"] == "byte-exact" and r["audit_tokens_per_s"] > 0 and r["restore_gbps"] > 0
               for r in lengths)
    assert [p["binomial"] for p in res["big"]["projection"]] == [299, 299]
    # (e): the sampled audit of a library, scaled down (4,096 tokens in entries of about 128).
    lib = res["library"]
    assert "error" not in lib and "skipped" not in lib, lib
    assert lib["release"]["tokens"] >= lib["target_tokens"] == 4096 and lib["release"]["entries"] == lib["entries"]
    assert 0.8 <= lib["release"]["kv_bytes"] / lib["estimated_bytes"] <= 1.1  # the disk check's estimate
    audit, drawn = lib["audit"], lib["audit"]["sample"]
    assert drawn["size"] == 8 and drawn["population"] == lib["entries"] and drawn["nonce_source"] == "drawn"
    assert drawn["population_tokens"] == lib["release"]["tokens"] and audit["rederived"] == []
    # The draw re-derived here from the root digest and the nonce (entry ids name their positions).
    from kvgraft import sampling

    again = sampling.draw(lib["release"]["root_digest"], drawn["nonce"], drawn["population"], drawn["size"])
    assert drawn["entries"] == [f"lib{i:05d}" for i in again]
    assert audit["verdicts"] == {"byte-exact": 8} and audit["bound"]["failing"] == 0
    # The bound: the largest D whose chance of 0 failing in the sample exceeds 5%, by scipy.
    n, population = drawn["size"], drawn["population"]
    d = max(d for d in range(population - n + 1) if hypergeom.pmf(0, population, d, n) > 0.05)
    assert audit["bound"]["max_failing_entries"] == d
    control = lib["control"]
    assert control["entry"] == drawn["entries"][0] and control["verdict"] == "inconsistent" and control["failing"]
    md = (out / "gpu_check.md").read_text()
    assert "DRY RUN" in md and "seeded random weights" in md and res["big"]["model"]["identity"][:16] in md
    assert f"**Bound: {audit['bound_sentence']}.**" in md
    # The wheel set is exactly what the run imported beyond the GPU machine's packages, plus what
    # those declare they need.
    machine = emulate.machine_packages()  # the GPU machine's list (and this machine's version skew)
    imported = {_norm(d) for d in res["imported_distributions"]}
    assert not imported & {"sigstore", "gguf", "kvgraft"} and res["sigstore_imported"] is False
    carried = {_norm(f.name.split("-")[0]): f for f in files}
    assert imported - machine <= set(carried), imported - machine - set(carried)
    needed = imported & set(carried)
    needed |= {r for name in needed for r in _requirements(carried[name])} & set(carried)
    assert set(carried) == needed, set(carried) - needed
    # transformers ran at the carried version, not at the GPU machine's (the venv has that one: gpu_emulate).
    assert res["machine"]["transformers"] == carried["transformers"].name.split("-")[1]
    assert res["machine"]["transformers"] != emulate.machine_pins()["transformers"]


@pytest.mark.slow
def test_a_run_out_of_budget_skips_every_step_and_still_writes_its_files(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--dry-run", "--budget", "1",
                          "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")],
                         env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    res = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    steps = res["steps"]
    assert [r["step"] for r in steps[:5]] == [f"tiny {f} (a, b)" for f in ("llama", "qwen3", "gpt2", "gemma3", "gemma4")]
    assert [r["status"] for r in steps] == ["skipped"] * (len(steps) - 1) + ["done"]  # removing the library always runs
    assert all("of the budget left" in r["why"] for r in steps[:6])  # the tiny ones and the 12B build
    assert "needs 12B build" in steps[6]["why"] and res["tiny"] == [] and "big" not in res and "library" not in res
    md = (tmp_path / "out" / "gpu_check.md").read_text()
    assert "### Steps and budget" in md and f"| {steps[0]['step']} | 30.0 | nan | skipped: " in md
    assert "### (e)" in md and f"Not run: skipped: {steps[-4]['why']}" in md


@pytest.mark.slow
def test_plan_prints_the_steps_and_their_estimates_and_runs_none(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    work = tmp_path / "work"
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--plan", "--dry-run", "--budget", "120",
                          "--work", str(work), "--library-dir", str(tmp_path)], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [line.split(" | ") for line in run.stdout.splitlines() if re.match(r"\| \d+ \|", line)]
    assert [r[1] for r in rows][:6] == [*(f"tiny {f} (a, b)" for f in ("llama", "qwen3", "gpt2", "gemma3", "gemma4")),
                                        "12B build"]
    assert [r[1] for r in rows][-4:] == ["library capture (e)", "sampled audit (e)", "planted control (e)",
                                         "remove the library"]
    starts = [float(r[3]) for r in rows]
    assert starts == sorted(starts) and {r[4] for r in rows} == {"yes", "skipped"}  # 120 s: not everything fits
    # The storage was measured and chosen before the plan; nothing ran: no release, no library, no output files.
    assert f"chose {tmp_path}" in run.stdout and not (work / "releases").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]


@pytest.mark.slow
def test_the_gpu_machines_wheel_set_takes_cpython_312(tmp_path: Path) -> None:
    """The GPU machine's Python is 3.12 (bench/gpu_machine_packages.txt): every wheel of its set admits
    CPython 3.12 on manylinux x86-64 by its tags and Requires-Python, transformers' requirements admit that
    machine's torch 2.11 and pinned packages; and where this machine has a CPython 3.12 the set installs
    there with --no-index and kvgraft's signing, digests and schema validation run on it. A machine may
    have pyenv's CPython 3.12.1 (part of the machine, not installed by kvgraft); the usual package
    sources have none to install where it is missing: Debian 12 has no python3.12 package, and PyPI has no
    CPython build (portable-python, the nearest, compiles one from sources it downloads from outside). Where
    there is none, the tags and metadata checked here are what stands for that install."""
    from packaging.requirements import Requirement
    from packaging.tags import compatible_tags, cpython_tags, parse_tag
    from packaging.version import Version

    wheels = tmp_path / "py3.12"
    subprocess.run(["make", "-s", "gpu-wheels", "GPU_PY=3.12", f"GPU_WHEELS={wheels}"], cwd=ROOT, check=True)
    platforms = [f"manylinux_2_{m}_x86_64" for m in range(28, 4, -1)] + ["manylinux2014_x86_64", "linux_x86_64"]
    supported = {*cpython_tags((3, 12), platforms=platforms), *compatible_tags((3, 12), "cp312", platforms)}
    pins = {**_bench("gpu_emulate").machine_pins(), "torch": "2.11.0", "safetensors": "0.8.0"}
    for wheel in sorted(wheels.glob("*.whl")):
        with zipfile.ZipFile(wheel) as z:
            info = {n.rsplit("/", 1)[1]: z.read(n).decode() for n in z.namelist()
                    if n.count("/") == 1 and n.split("/")[0].endswith(".dist-info") and n.endswith(("/WHEEL", "/METADATA"))}
        tags = {t for line in info["WHEEL"].splitlines() if line.startswith("Tag: ") for t in parse_tag(line[5:])}
        assert tags & supported, (wheel.name, tags)
        meta = info["METADATA"].splitlines()
        python = next((line.split(":", 1)[1].strip() for line in meta if line.startswith("Requires-Python:")), "")
        assert Version("3.12.3") in Requirement(f"x{python}").specifier, (wheel.name, python)
        for line in meta:
            if line.startswith("Requires-Dist:"):
                req = Requirement(line.split(":", 1)[1].strip())
                if _norm(req.name) in pins and (req.marker is None or req.marker.evaluate({"extra": "torch"})):
                    assert Version(pins[_norm(req.name)]) in req.specifier, (wheel.name, str(req))
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_emulate.py"), str(tmp_path / "py312"),
                          "--check-wheels", "3.12", str(wheels)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    said = out.stderr.strip().splitlines()[-1]
    if _bench("gpu_emulate").find_python("3.12") is None:
        assert said.startswith("no CPython 3.12 on this machine"), said
    else:  # found: it must have been used, not passed over
        assert said.startswith(f"{wheels}: installed with --no-index into") and "(Python 3.12." in said, said
