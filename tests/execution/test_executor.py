"""Executors: the same audit under `local` and `ray` gives the same JSON apart from timing and placement;
a worker killed mid-run is replaced by its peers with identical results; retries that run out name the
entries that were not audited (exit code 2). Ray tests share one local Ray instance (2 CPUs) per module."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvgraft import errors
from kvgraft.audit import checks as registry
from kvgraft.cli import app
from kvgraft.execution.executor import (
    LocalExecutor,
    ModelSpec,
    NotAuditedError,
    RayExecutor,
    comparable,
    from_options,
    plan_options,
)
from kvgraft.generalization import audit as gen
from kvgraft.inference import capture
from kvgraft.inference.reapply import Conditions
from kvgraft.recompute import audit as recompute
from kvgraft.recompute.determinism import threads
from kvgraft.release.format import Release
from kvgraft.signing.policy import OwnOutput, SignatureNotChecked
from kvgraft.signing.verify import verified

from release_factory import flat_manifest

HAVE_RAY = importlib.util.find_spec("ray") is not None
NO_KEY = SignatureNotChecked()  # as `kvgraft audit recompute` without --key verifies
needs_ray = pytest.mark.skipif(not HAVE_RAY, reason="ray is not installed (pip install 'kvgraft[ray]'); the Ray "
                                                    "executor tests need a local Ray instance")
runner = CliRunner()
ENTRIES = 6


def strip_timing_and_placement(obj: Any) -> Any:
    """The comparison of the acceptance criteria, written out independently of kvgraft.execution.executor.comparable.

    Drops the keys `seconds`, `placement` and every key ending in `_seconds`; also `cost` (the recompute cost
    ledger: tokens per second and wall time), `executor` (which
    executor and workers: placement), `created` (a timestamp) and `energy` / `energy_joules` (energy is
    measured or estimated over wall time: timing).
    """
    drop = {"seconds", "placement", "executor", "created", "energy", "energy_joules", "cost"}
    if isinstance(obj, dict):
        return {k: strip_timing_and_placement(v) for k, v in obj.items() if k not in drop and not k.endswith("_seconds")}
    if isinstance(obj, list):
        return [strip_timing_and_placement(v) for v in obj]
    return obj


def _json(obj: Any) -> Any:
    """What the JSON file would hold (tuples become lists, str subclasses plain strings)."""
    return json.loads(json.dumps(obj, default=str))


def assert_same_apart_from_timing_and_placement(a: dict[str, Any], b: dict[str, Any]) -> None:
    sa, sb = strip_timing_and_placement(_json(a)), strip_timing_and_placement(_json(b))
    assert sa == sb
    assert comparable(_json(a)) == comparable(_json(b)) == sa


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def model_dir(tiny_dir: Callable[[str], Path]) -> Path:
    return tiny_dir("llama")


@pytest.fixture(scope="module")
def release_dir(tiny_lm: Callable[[str], Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Six entries of a tiny Llama captured with 1 torch thread (the thread count of every worker below)."""
    import tiny

    lm = tiny_lm("llama")
    text = " ".join(tiny._CORPUS)
    records = [("t", {"id": f"e{i}", "text": text[i * 23 : i * 23 + 160 + 10 * i]}) for i in range(ENTRIES)]
    out = tmp_path_factory.mktemp("exec") / "rel"
    with threads(1):
        capture.capture(lm, records, out, probe_tokens=4)
    yield out
    digest = json.loads((out / "manifest.json").read_text())["root_digest"]
    shutil.rmtree(Path(tempfile.gettempdir()) / "kvgraft-ray" / digest, ignore_errors=True)  # the shipped copy


@pytest.fixture(scope="module")
def local_result(tiny_lm: Callable[[str], Any], release_dir: Path) -> dict[str, Any]:
    return recompute.audit(verified(release_dir, NO_KEY), tiny_lm("llama"), executor=LocalExecutor(threads=1))


@pytest.fixture(scope="module")
def ray_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if not HAVE_RAY:
        pytest.skip("ray is not installed")
    import ray

    started = not ray.is_initialized()
    if started:  # the workers' cache of remote pieces in the test's own folder, not the user's
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"KVGRAFT_CACHE": str(tmp_path_factory.mktemp("ray-cache"))}})
    yield ray
    _close_pool()
    if started:
        ray.shutdown()


_POOL: dict[str, RayExecutor] = {}


def _close_pool() -> None:
    ex = _POOL.pop("pool", None)
    if ex is not None:
        ex.close()


@pytest.fixture()
def pool(ray_session: Any, model_dir: Path) -> RayExecutor:
    """Two CPU workers (1 thread each) holding the tiny Llama; started once, restarted only after a kill."""
    ex = _POOL.get("pool")
    if ex is None or not all(ex.alive):
        _close_pool()
        ex = RayExecutor(ModelSpec(str(model_dir), Conditions("cpu", "float32", "sdpa")), workers=2)
        ex.start()
        _POOL["pool"] = ex
    ex.ship, ex.inflight, ex.max_retries = False, 2, 2
    return ex


def _cpus_back(ray: Any, want: float = 2.0) -> bool:
    """Killed actors hand their CPUs back asynchronously."""
    import time

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if ray.available_resources().get("CPU") == want:
            return True
        time.sleep(0.2)
    return False


# ---------------------------------------------------------------- no Ray needed


def test_local_executor_keeps_results_and_adds_placement(local_result: dict[str, Any], tiny_lm: Callable[[str], Any],
                                                         release_dir: Path) -> None:
    lm = tiny_lm("llama")
    rel = verified(release_dir, NO_KEY)
    assert [e["id"] for e in local_result["entries"]] == [f"e{i}" for i in range(ENTRIES)]
    assert local_result["all_byte_exact"]
    assert local_result["executor"] == {"kind": "local", "workers": 1, "threads": 1}
    with threads(1):
        direct = recompute.audit_entry(rel, rel.release.entry("e3"), lm).model_dump(exclude_unset=True)
    got = local_result["entries"][3]
    assert strip_timing_and_placement(_json(direct)) == strip_timing_and_placement(_json(got))
    p = got["placement"]
    assert p["executor"] == "local" and p["device"] == "cpu" and p["attempt"] == 1 and p["node_id"] is None
    assert p["environment"]["threads"] == 1 and p["model_identity"] == lm.identity.sha256
    assert p["environment_differences"] == {}
    assert local_result["environment"]["current"]["threads"] == 1


def test_comparison_strips_only_timing_and_placement() -> None:
    a = {"x": 1, "seconds": {"total": 1.0}, "placement": {"node_id": "n1"}, "restore_seconds": 2.0,
         "rows": [{"v": [1, 2], "decode_seconds": 0.1}], "energy": {"joules": 3.0}}
    b = {"x": 1, "seconds": {"total": 9.0}, "placement": {"node_id": "n2"}, "restore_seconds": 7.0,
         "rows": [{"v": [1, 2], "decode_seconds": 0.9}], "energy": {"joules": 8.0}}
    assert strip_timing_and_placement(a) == strip_timing_and_placement(b) == {"x": 1, "rows": [{"v": [1, 2]}]}
    assert comparable(a) == comparable(b)
    assert comparable({**a, "x": 2}) != comparable(b)


def test_executor_options_are_checked(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = ModelSpec(str(model_dir))
    assert isinstance(from_options("local", spec), LocalExecutor)
    for kwargs in ({"workers": 2}, {"ship": True}, {"address": "ray://x:10001"}):
        with pytest.raises(errors.InputError, match=r"need.*--executor ray"):
            from_options("local", spec, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(errors.InputError, match="expected one of local, ray"):
        from_options("dask", spec)
    with pytest.raises(errors.InputError, match="--workers must be >= 1"):
        RayExecutor(spec, workers=0)
    assert plan_options({"kind": "ray", "workers": 2}, {"ship": True, "workers": None}) == \
        {"kind": "ray", "workers": 2, "ship": True}
    assert plan_options(None) == {"kind": "local"}
    with pytest.raises(errors.InputError, match="unknown key 'gpus'"):
        plan_options({"gpus": 2})
    with pytest.raises(errors.InputError, match=r"executor.workers: expected int"):
        plan_options({"workers": "2"})
    # Without Ray installed, asking for it is unusable input (exit 2), not a crash; local needs no Ray.
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(errors.InputError, match=r"pip install 'kvgraft\[ray\]'") as exc:
        RayExecutor(spec).start()
    assert exc.value.exit_code == errors.EXIT_INPUT


def test_cli_ray_options_need_the_ray_executor(release_dir: Path, model_dir: Path) -> None:
    r = runner.invoke(app, ["audit", "recompute", str(release_dir), "--model", str(model_dir), "--device", "cpu", "--ship"])
    assert r.exit_code == errors.EXIT_INPUT and "--executor ray" in r.output


# ---------------------------------------------------------------- Ray


@needs_ray
def test_recompute_local_and_ray_give_identical_results(pool: RayExecutor, local_result: dict[str, Any],
                                                        tiny_lm: Callable[[str], Any], release_dir: Path) -> None:
    lm = tiny_lm("llama")
    # a shipped release is opened from the node's copy, not from the driver's path
    shipped = Path(tempfile.gettempdir()) / "kvgraft-ray" / local_result["release"]["root_digest"]
    for ship in (False, True):
        pool.ship = ship
        seen: list[tuple[int, int]] = []
        result = recompute.audit(verified(release_dir, NO_KEY), lm, executor=pool,
                                 progress=lambda i, n, seen=seen: seen.append((i, n)))
        assert_same_apart_from_timing_and_placement(local_result, result)
        assert result["all_byte_exact"] and len(result["entries"]) == ENTRIES
        assert [e["id"] for e in result["entries"]] == [f"e{i}" for i in range(ENTRIES)]  # entry order, not finish order
        placements = [e["placement"] for e in result["entries"]]
        assert {p["executor"] for p in placements} == {"ray"}
        assert {p["worker"] for p in placements} == {0, 1}  # both workers took work
        assert {p["pid"] for p in placements} == {w["pid"] for w in result["executor"]["workers"]}
        for p in placements:
            assert p["node_id"] and p["hostname"] and p["device"] == "cpu" and p["attempt"] == 1
            assert p["environment"]["threads"] == 1 and p["environment_differences"] == {}
        assert result["executor"]["kind"] == "ray" and result["executor"]["ship"] is ship
        roots = {p["release_root"] for p in placements}
        assert roots == ({str(release_dir.resolve())} if not ship else {str(shipped)})
        assert result["executor"]["failures"] == []
        assert seen[-1] == (ENTRIES, ENTRIES) and sorted(seen) == seen  # one tick per finished entry, across workers
    assert (shipped / "manifest.json").read_bytes() == (release_dir / "manifest.json").read_bytes()


@needs_ray
def test_a_release_read_where_it_is_published_is_read_there_by_each_worker(
        pool: RayExecutor, local_result: dict[str, Any], tiny_lm: Callable[[str], Any], release_dir: Path,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Over HTTP the workers open the location themselves (the driver's mirror folder is on the driver's
    machine): the same verdicts as the local folder's audit, and each sampled entry fetched once, by the
    worker that judged it."""
    from remote_servers import folder_server

    monkeypatch.setenv("KVGRAFT_CACHE", str(tmp_path / "driver-cache"))
    with folder_server(rel=release_dir) as server:
        result = recompute.audit(verified(server.url("rel"), NO_KEY), tiny_lm("llama"), executor=pool, sample=2,
                                 nonce="ray-remote")
        fetched = [p for p in server.paths() if p.startswith("/rel/entries/")]
    local = recompute.audit(verified(release_dir, NO_KEY), tiny_lm("llama"), executor=LocalExecutor(threads=1), sample=2,
                            nonce="ray-remote")
    drop = ("release",)  # its path: the URL's mirror folder vs the local folder
    assert_same_apart_from_timing_and_placement({k: v for k, v in local.items() if k not in drop},
                                                {k: v for k, v in result.items() if k not in drop})
    files = {Release.open(release_dir).entry(e)["file"] for e in result["sample"]["entries"]}
    assert sorted(fetched) == sorted(f"/rel/{f}" for f in files)  # by the workers; the driver read none
    roots = {e["placement"]["release_root"] for e in result["entries"]}
    assert all("/ray-cache" in r and "/mirrors/" in r for r in roots)  # the workers' own mirrors


@needs_ray
def test_generalization_local_and_ray_give_identical_results(pool: RayExecutor, model_dir: Path,
                                                             tiny_lm: Callable[[str], Any], tmp_path: Path) -> None:
    from test_generalization import PROBLEMS, _jsonl

    from kvgraft.generalization import library
    from kvgraft.inference.runtime import Schedule
    from kvgraft.schema import validate

    lm = tiny_lm("llama")
    probs, rec = library.load_problems(str(_jsonl(tmp_path / "problems.jsonl", PROBLEMS)))
    with threads(1):
        library.build(lm, probs, tmp_path / "lib", library_fraction=0.5, salt="t", source=rec,
                      settings=library.BuildSettings(generate=False), schedule=Schedule(chunk_tokens=16))
    rel = verified(tmp_path / "lib", OwnOutput("a library this test built"))
    queries, prepared = gen.prepare(rel, synthetic_n=1)
    settings = gen.Settings(max_new_tokens=4, n_boot=200, track_memory=False)
    local = gen.audit(lm, rel, queries, settings, prepared=prepared, executor=LocalExecutor(threads=1)).model_dump(
        mode="json", exclude_unset=True)
    labels: list[str] = []
    remote = gen.audit(lm, rel, queries, settings, prepared=prepared, executor=pool,
                       progress=lambda i, n, label: labels.append(label)).model_dump(mode="json", exclude_unset=True)
    assert_same_apart_from_timing_and_placement(local, remote)
    assert len(remote["runs"]) == len(local["runs"]) > 9 and labels[-1] == "aggregating"
    assert [(r["query_id"], r["condition"]) for r in remote["runs"]] == [(r["query_id"], r["condition"]) for r in local["runs"]]
    assert {r["placement"]["worker"] for r in remote["runs"]} == {0, 1}
    assert remote["model"]["executor"]["kind"] == "ray"
    validate(_json(remote), gen.SCHEMA, "ray generalization result")


@needs_ray
def test_a_failing_unit_is_not_retried_and_keeps_its_exit_code(pool: RayExecutor, tiny_lm: Callable[[str], Any],
                                                               release_dir: Path, tmp_path: Path) -> None:
    bad = tmp_path / "rel"
    shutil.copytree(release_dir, bad)
    m = flat_manifest(bad)
    f = bad / m["entries"][2]["file"]
    data = bytearray(f.read_bytes())
    start = next(iter(m["entries"][2]["tensors"].values()))["byte_range"][0]
    data[start] ^= 0xFF  # stored bytes no longer match their SHA-256 (the manifest is untouched)
    f.write_bytes(bytes(data))
    with pytest.raises(errors.IntegrityError, match="sha256") as exc:
        recompute.audit(verified(bad, NO_KEY), tiny_lm("llama"), executor=pool)
    assert exc.value.exit_code == errors.EXIT_FAILED
    assert all(pool.alive) and pool.failures == []


@needs_ray
def test_killed_worker_is_retried_elsewhere_with_identical_results(pool: RayExecutor, local_result: dict[str, Any],
                                                                   tiny_lm: Callable[[str], Any], release_dir: Path) -> None:
    lm = tiny_lm("llama")
    killed: list[int] = []
    pool.inflight = ENTRIES // 2  # every unit is dispatched at once: 3 per worker, run one after another

    def kill_first_worker(done: int, _n: int) -> None:
        if done == 1 and not killed:  # after one result worker 0 still has 2 or 3 units in flight
            killed.append(done)
            pool.kill_worker(0)

    result = recompute.audit(verified(release_dir, NO_KEY), lm, executor=pool, progress=kill_first_worker)
    assert killed and pool.alive == [False, True]
    assert_same_apart_from_timing_and_placement(local_result, result)
    ids = [e["id"] for e in result["entries"]]
    assert ids == [f"e{i}" for i in range(ENTRIES)] and len(set(ids)) == ENTRIES  # nothing lost, nothing twice
    retried = [e for e in result["entries"] if e["placement"]["attempt"] > 1]
    assert retried and all(e["placement"]["worker"] == 1 for e in retried)
    failures = result["executor"]["failures"]
    assert {f["unit"] for f in failures} == {e["id"] for e in retried} and {f["worker"] for f in failures} == {0}
    assert all("ActorDied" in f["error"] or "Actor" in f["error"] for f in failures)
    assert result["executor"]["retried_units"] == len(retried)

    # The last worker dies too, with no retries allowed: the audit names what it did not audit (exit 2).
    pool.max_retries = 0
    pool.failures.clear()

    def kill_last_worker(done: int, _n: int) -> None:
        if done == 1:
            pool.kill_worker(1)

    with pytest.raises(NotAuditedError) as exc:
        recompute.audit(verified(release_dir, NO_KEY), lm, executor=pool, progress=kill_last_worker)
    err = exc.value
    assert err.exit_code == errors.EXIT_INPUT
    assert err.missing and set(err.missing) < {f"e{i}" for i in range(ENTRIES)}
    assert "NOT audited" in str(err) and all(m in str(err) for m in err.missing)
    assert err.failures and {f.worker for f in err.failures} == {1}


@needs_ray
def test_cli_recompute_on_ray(ray_session: Any, release_dir: Path, model_dir: Path, local_result: dict[str, Any],
                              tmp_path: Path) -> None:
    _close_pool()  # the CLI starts its own workers on the module's 2-CPU Ray instance
    out = tmp_path / "r.json"
    r = runner.invoke(app, ["audit", "recompute", str(release_dir), "--model", str(model_dir), "--device", "cpu",
                            "--executor", "ray", "--workers", "2", "--ship", "--out", str(out), "--quiet"])
    assert r.exit_code == 0, r.output
    result = json.loads(out.read_text())
    # the command's result carries its own status (kvgraft.verdict) and what was checked of the release's signature
    # (here nothing: no --key); the library result it wraps carries neither
    assert result["status"] == registry.status("recompute", local_result) == "passed"
    assert result["release_signature"]["checked"] is False
    assert_same_apart_from_timing_and_placement(
        {**local_result, "status": result["status"], "release_signature": result["release_signature"]}, result)
    assert result["executor"]["ship"] is True and len(result["executor"]["workers"]) == 2
    assert all(e["placement"]["executor"] == "ray" for e in result["entries"])
    assert _cpus_back(ray_session)  # the command's workers are gone


@needs_ray
def test_audit_run_plan_executor_on_ray(ray_session: Any, release_dir: Path, model_dir: Path, tmp_path: Path) -> None:
    from kvgraft.audit import plan
    from kvgraft.audit import run as auditrun

    _close_pool()
    (tmp_path / "plan.toml").write_text(
        'format = "kvgraft-audit-plan"\nformat_version = 1\nname = "ray"\n'
        f'[model]\nspec = "{model_dir}"\ndevice = "cpu"\n[release]\npath = "{release_dir}"\n'
        '[checks.recompute]\n[executor]\nkind = "ray"\nworkers = 2\nthreads = 1\n')
    outcome = auditrun.run(plan.load(tmp_path / "plan.toml"), out_dir=tmp_path / "out")
    check = next(c for c in outcome.report.checks if c.kind == "recompute")
    data = check.data
    assert check.status == "passed" and data["all_byte_exact"]
    assert data["executor"]["kind"] == "ray" and {e["placement"]["worker"] for e in data["entries"]} == {0, 1}
    assert _cpus_back(ray_session)


@needs_ray
@pytest.mark.slow
def test_two_audits_on_ray_at_once_on_one_machine_both_finish(release_dir: Path, model_dir: Path,
                                                               local_result: dict[str, Any], tmp_path: Path) -> None:
    """Two `audit recompute --executor ray` processes started together, each with its own local Ray instance
    (one ended in exit 70 while two other Ray jobs shared the machine, before): both finish, each with the
    verdict and results a local run gives."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["KVGRAFT_CACHE"] = str(tmp_path / "cache")
    kvgraft = str(Path(sys.executable).parent / "kvgraft")
    runs = [subprocess.Popen([kvgraft, "audit", "recompute", str(release_dir), "--model", str(model_dir),
                              "--device", "cpu", "--executor", "ray", "--workers", "1",
                              "--out", str(tmp_path / f"r{i}.json"), "--quiet"],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
    outputs = [p.communicate(timeout=900)[0] for p in runs]
    for p, out in zip(runs, outputs, strict=True):
        assert p.returncode == 0, out[-3000:]
    for i in range(2):
        result = json.loads((tmp_path / f"r{i}.json").read_text())
        assert result["status"] == "passed" and result["executor"]["kind"] == "ray"
        # The environment each process runs in is its own (a CLI process sets OMP_WAIT_POLICY, this one did
        # not); what was replayed, and every result, are the local run's.
        assert result["environment"]["differences"] == {}
        mine = {**local_result, "status": result["status"],
                "environment": {**local_result["environment"], "current": result["environment"]["current"]}}
        assert_same_apart_from_timing_and_placement(mine, result)
