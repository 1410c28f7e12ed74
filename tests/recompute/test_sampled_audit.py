"""Sampled recompute audits: the sample is the one the root and nonce give, anyone re-derives it from the
result, a publisher-side change moves it, the bound is in the result, face, HTML and claim; an interrupted
audit resumes from its journal and judges no entry twice; Ray replays the recorded threads (local Ray)."""

from __future__ import annotations

import importlib.util
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvgraft import errors, sampling
from kvgraft.audit import checks as registry
from kvgraft.cli import app
from kvgraft.execution.executor import comparable
from kvgraft.inference import capture
from kvgraft.recompute import audit as recompute
from kvgraft.recompute.determinism import threads
from kvgraft.release.format import Release
from kvgraft.signing.policy import SignatureNotChecked
from kvgraft.signing.verify import verified

import rewrite

NO_KEY = SignatureNotChecked()  # as `kvgraft audit recompute` without --key verifies

runner = CliRunner()
ENTRIES = 8


@pytest.fixture(scope="module")
def model_dir(tiny_dir: Callable[[str], Path]) -> Path:
    return tiny_dir("llama")


def _capture(lm: Any, out: Path, n: int = ENTRIES, n_threads: int = 1) -> Path:
    import tiny

    text = " ".join(tiny._CORPUS)
    records = [("t", {"id": f"s{i}", "text": text[i * 17: i * 17 + 40 + 3 * i]}) for i in range(n)]
    with threads(n_threads):
        capture.capture(lm, records, out, probe_tokens=2)
    return out


@pytest.fixture(scope="module")
def release_dir(tiny_lm: Callable[[str], Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _capture(tiny_lm("llama"), tmp_path_factory.mktemp("sampled") / "rel")


def _root(rel: Path) -> str:
    return str(json.loads((rel / "manifest.json").read_text())["root_digest"])


def test_a_sampled_audit_audits_the_drawn_entries_and_bounds_the_release(tiny_lm: Callable[[str], Any],
                                                                          release_dir: Path) -> None:
    lm = tiny_lm("llama")
    # schema-checked
    result = registry.seal("recompute", recompute.audit(verified(release_dir, NO_KEY), lm, sample=3, nonce="auditor-1"))
    rel = Release.open(release_dir)
    positions = sampling.draw(_root(release_dir), "auditor-1", ENTRIES, 3)
    assert [e["id"] for e in result["entries"]] == [rel.entries[i]["id"] for i in positions]
    s = result["sample"]
    assert (s["nonce"], s["nonce_source"], s["size"], s["population"]) == ("auditor-1", "given", 3, ENTRIES)
    assert sampling.check_sample(s, _root(release_dir), rel.entry_ids(), rel.token_counts()) == []
    b = result["bound"]
    assert (b["failing"], b["sampled"], b["population"]) == (0, 3, ENTRIES) and result["all_byte_exact"]
    assert b["max_failing_entries"] == sampling.upper_bound(0, 3, ENTRIES)
    assert any(st.startswith("Bound: 0 of 3 sampled fail") for st in result["statements"])
    cost = result["cost"]
    assert cost["entries_recomputed"] == 3 and cost["tokens_recomputed"] == sum(e["num_tokens"] for e in result["entries"])
    assert cost["library_tokens"] == sum(e["num_tokens"] for e in rel.entries) and cost["projected_library_seconds"] > 0
    # No nonce: a fresh one is drawn and recorded.
    drawn = recompute.audit(verified(release_dir, NO_KEY), lm, sample=2)
    assert drawn["sample"]["nonce_source"] == "drawn" and len(drawn["sample"]["nonce"]) == 32
    # A chosen subset bounds nothing; the whole release is its own count.
    assert "bound" not in recompute.audit(verified(release_dir, NO_KEY), lm, entries=["s0"])
    with pytest.raises(errors.InputError, match="exclude each other"):
        recompute.audit(verified(release_dir, NO_KEY), lm, entries=["s0"], sample=2)


def test_a_failing_sampled_entry_is_counted_in_the_bound(tiny_lm: Callable[[str], Any], release_dir: Path,
                                                         tmp_path: Path) -> None:
    """A publisher-side change of one entry: root and sample change; sampled, it fails and the bound counts it."""
    bad = tmp_path / "bad"
    shutil.copytree(release_dir, bad)
    before = sampling.draw(_root(release_dir), "auditor-1", ENTRIES, 4)
    victim = before[0]
    rewrite.element(bad, victim, "layer.0.values", 3, lambda v: v + 1e-2)
    assert _root(bad) != _root(release_dir)
    after = sampling.draw(_root(bad), "auditor-1", ENTRIES, 4)
    assert after != before
    # Sample everything so the changed entry is in it: 1 failing of 8, the bound is exact.
    result = recompute.audit(verified(bad, NO_KEY), tiny_lm("llama"), sample=ENTRIES, nonce="auditor-1")
    failing = [e["id"] for e in result["entries"] if e["verdict"] != "byte-exact"]
    assert failing == [f"s{victim}"] and result["bound"]["failing"] == 1 and result["bound"]["max_failing_entries"] == 1
    part = recompute.audit(verified(bad, NO_KEY), tiny_lm("llama"), sample=4, nonce="auditor-1", require="consistent")
    sampled = f"s{victim}" in part["sample"]["entries"]
    assert part["bound"]["failing"] == int(sampled) and part["bound"]["fail_means"] == "inconsistent"
    assert part["bound"]["max_failing_entries"] == sampling.upper_bound(int(sampled), 4, ENTRIES)


def test_cli_sample_rederives_and_checks(tiny_lm: Callable[[str], Any], model_dir: Path, release_dir: Path,
                                         tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    r = runner.invoke(app, ["audit", "recompute", str(release_dir), "--model", str(model_dir), "--sample", "3",
                            "--out", str(out), "--quiet"])
    assert r.exit_code == 0, r.output
    result = json.loads(out.read_text())
    nonce = result["sample"]["nonce"]
    assert result["sample"]["nonce_source"] == "drawn" and not Path(f"{out}.journal").exists()
    r = runner.invoke(app, ["audit", "sample", str(release_dir), "--check", str(out)])
    assert r.exit_code == 0 and "identical" in r.output, r.output
    r = runner.invoke(app, ["audit", "sample", str(release_dir), "--nonce", nonce, "--size", "3"])
    assert r.exit_code == 0 and r.output.split() == result["sample"]["entries"]
    # A result whose sample is not the one the root and nonce give is refused.
    result["sample"]["nonce"] = nonce + "x"
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps(result))
    r = runner.invoke(app, ["audit", "sample", str(release_dir), "--check", str(forged)])
    assert r.exit_code == errors.EXIT_FAILED and "NOT re-derived" in r.output
    # Bad input: one line, exit 2, nothing written.
    for bad, says in ((["--sample", "0"], "--sample 0"), (["--sample", "9"], "--sample 9: expected 1 to 8"),
                      (["--sample", "2", "--nonce", "a b"], "--nonce 'a b'"), (["--nonce", "x"], "--nonce draws a sample"),
                      (["--sample", "2", "--target-fraction", "0.5"], "exclude each other"),
                      (["--target-fraction", "1.5"], "--target-fraction 1.5")):
        r = runner.invoke(app, ["audit", "recompute", str(release_dir), "--model", str(model_dir), *bad,
                                "--out", str(tmp_path / "bad.json"), "--quiet"])
        assert r.exit_code == errors.EXIT_INPUT and says in r.output and "Traceback" not in r.output, (bad, r.output)
        assert not (tmp_path / "bad.json").exists()
    r = runner.invoke(app, ["audit", "sample", str(release_dir), "--check", str(tmp_path / "t.json")])
    assert r.exit_code == errors.EXIT_INPUT  # no such file
    (tmp_path / "nosample.json").write_text("{}")
    r = runner.invoke(app, ["audit", "sample", str(release_dir), "--check", str(tmp_path / "nosample.json")])
    assert r.exit_code == errors.EXIT_INPUT and "records no sample" in r.output
    # --target-fraction sizes the sample: with 8 entries a bound of 30% needs sampling.sample_size(0.3, 8).
    r = runner.invoke(app, ["audit", "recompute", str(release_dir), "--model", str(model_dir), "--target-fraction", "0.3",
                            "--nonce", "n1", "--out", str(tmp_path / "t.json"), "--quiet"])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "t.json").read_text())["sample"]["size"] == sampling.sample_size(0.3, ENTRIES)


def test_progress_shows_tokens_per_second_and_eta() -> None:
    from kvgraft.cli.audit import speed

    state = {"done": 3, "total": 10, "tokens_done": 600, "tokens_total": 2000, "resumed": 1, "tokens_resumed": 200}
    # 400 tokens recomputed in 2 s: 200 tokens/s; 1,400 left: 7 s. The resumed 200 took no time here.
    assert speed(state, 2.0) == ("200 tokens/s (1 resumed)", "ETA 0:07")
    assert speed({**state, "tokens_total": 2_000_000}, 2.0)[1] == "ETA 2:46:37"
    assert speed({**state, "tokens_done": 200}, 2.0) == ("0 tokens/s (1 resumed)", "ETA -")


def test_plan_executor_threads_override_the_record(tiny_lm: Callable[[str], Any], model_dir: Path,
                                                   tmp_path: Path) -> None:
    from kvgraft.audit import plan
    from kvgraft.audit import run as audit_run

    rel = _capture(tiny_lm("llama"), tmp_path / "rel2", n=2, n_threads=2)
    p = tmp_path / "plan.toml"
    p.write_text('format = "kvgraft-audit-plan"\nformat_version = 1\nname = "t"\n'
                 f'[model]\nspec = "{model_dir}"\ndevice = "cpu"\n[release]\npath = "{rel}"\n'
                 '[checks.recompute]\n[executor]\nthreads = 1\n')
    data = next(c for c in audit_run.run(plan.load(p), out_dir=tmp_path / "out").report.checks
                if c.kind == "recompute").data
    assert data["conditions"]["overridden"] == {"threads": {"recorded": 2, "used": 1}}
    assert data["environment"]["current"]["threads"] == 1


class Interrupt(KeyboardInterrupt):
    pass


def test_an_interrupted_audit_resumes_and_judges_no_entry_twice(tiny_lm: Callable[[str], Any], release_dir: Path,
                                                                tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lm = tiny_lm("llama")
    calls: list[str] = []
    real = recompute.audit_entry

    def counted(rel: Any, entry: dict[str, Any], *a: Any, **k: Any) -> dict[str, Any]:
        calls.append(entry["id"])
        return real(rel, entry, *a, **k)

    monkeypatch.setattr(recompute, "audit_entry", counted)
    journal = tmp_path / "j.journal"

    def stop_after(n: int) -> Callable[[dict[str, int]], None]:
        def tick(s: dict[str, int]) -> None:
            if s["done"] - s["resumed"] >= n:
                raise Interrupt
        return tick

    with pytest.raises(Interrupt):  # Ctrl-C after 2 entries are judged; no nonce given: one is drawn and journaled
        recompute.audit(verified(release_dir, NO_KEY), lm, sample=6, journal=journal, on_progress=stop_after(2))
    assert len(calls) == 2 and journal.exists()
    with journal.open("ab") as fh:
        fh.write(b'{"unit": "s1", "result": {"torn')  # killed mid-write: this line is not a judged entry
    with pytest.raises(Interrupt):  # interrupted again after 1 more
        recompute.audit(verified(release_dir, NO_KEY), lm, sample=6, journal=journal, on_progress=stop_after(1))
    assert len(calls) == 3 and len(set(calls)) == 3
    result = recompute.audit(verified(release_dir, NO_KEY), lm, sample=6, journal=journal)  # resumes with the journal's nonce
    assert sorted(calls) == sorted(result["sample"]["entries"]) and len(calls) == 6  # each judged exactly once
    assert result["cost"]["entries_resumed"] == 3 and result["cost"]["entries_recomputed"] == 3
    assert sum(e["placement"].get("resumed", False) for e in result["entries"]) == 3
    # The nonce was read from the journal, and the result says so, and where the resumed results came from.
    assert (result["sample"]["nonce_source"], result["cost"]["resumed_from"]) == ("journal", str(journal))
    assert f"3 results resumed from {journal}" in result["statements"][-2]
    # The resumed result equals an uninterrupted one apart from timing, placement and those two sayings.
    again = recompute.audit(verified(release_dir, NO_KEY), lm, sample=6, nonce=result["sample"]["nonce"])
    again["sample"]["nonce_source"] = "journal"  # given now
    again["statements"] = [st.replace("(given)", f"(from the journal {journal})") for st in again["statements"]]
    again["statements"].insert(-1, result["statements"][-2])
    assert comparable(json.loads(json.dumps(result, default=str))) == comparable(json.loads(json.dumps(again, default=str)))
    # A journal of another run (another schedule) is refused, never mixed in.
    from kvgraft.inference.runtime import Schedule

    with pytest.raises(errors.InputError, match=r"journal of another run \(run.schedule"):
        recompute.audit(verified(release_dir, NO_KEY), lm, sample=6, journal=journal, schedule=Schedule(chunk_tokens=4))


def test_cli_interrupted_audit_writes_no_result_and_resumes(tiny_lm: Callable[[str], Any], model_dir: Path,
                                                            release_dir: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "r.json"
    real = recompute.audit_entry
    calls: list[str] = []

    def dies_on_third(rel: Any, entry: dict[str, Any], *a: Any, **k: Any) -> dict[str, Any]:
        calls.append(entry["id"])
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(rel, entry, *a, **k)

    monkeypatch.setattr(recompute, "audit_entry", dies_on_third)
    args = ["audit", "recompute", str(release_dir), "--model", str(model_dir), "--sample", "5", "--nonce", "n2",
            "--out", str(out), "--quiet"]
    r = runner.invoke(app, args)
    assert r.exit_code == 130 and not out.exists(), r.output  # no result from a partial run
    assert "rerun the same command to resume" in r.output and Path(f"{out}.journal").exists()
    monkeypatch.setattr(recompute, "audit_entry", real)
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    result = json.loads(out.read_text())
    assert result["cost"]["entries_resumed"] == 2 and result["cost"]["entries_recomputed"] == 3
    assert not Path(f"{out}.journal").exists()


def test_sampled_audit_in_the_report_face_html_and_claim(tiny_lm: Callable[[str], Any], model_dir: Path,
                                                         release_dir: Path, tmp_path: Path) -> None:
    from kvgraft.audit import face, plan
    from kvgraft.audit import run as audit_run
    from kvgraft.audit.render_html import to_html

    claims = Path(__file__).resolve().parents[2] / "audit" / "claims" / "kv-grafting-preprint.toml"
    p = tmp_path / "plan.toml"
    p.write_text('format = "kvgraft-audit-plan"\nformat_version = 1\nname = "sampled"\n'
                 f'[model]\nspec = "{model_dir}"\ndevice = "cpu"\n[release]\npath = "{release_dir}"\n'
                 '[checks.recompute]\nsample = 3\nnonce = "plan-nonce"\n'
                 f'[checks.claims]\nfile = "{claims}"\n')
    outcome = audit_run.run(plan.load(p), out_dir=tmp_path / "out")
    check = next(c for c in outcome.report.checks if c.kind == "recompute")
    assert check.data["sample"]["nonce"] == "plan-nonce" and len(check.data["entries"]) == 3
    f = face.face(check)
    assert "(a sample of 8)" in f.verdict
    bound_line = next(x for x in f.figures if x.startswith("bound: "))
    assert bound_line == "bound: " + sampling.sentence(check.data["bound"])
    assert any(x.startswith("sample: 3 of 8 entries") and "plan-nonce" in x for x in f.figures)
    assert any(x.startswith("cost: ") and "tokens/s" in x for x in f.figures)
    html = to_html(outcome.report)
    assert "sample and bound" in html and sampling.sentence(check.data["bound"]) in html
    exact = next(c for c in outcome.report.claims if c.id == "restore-exact")
    assert "0 of 3 sampled fail (not byte-exact): at most" in json.dumps(exact.model_dump())
    # The report's sample re-derives from the release.
    r = runner.invoke(app, ["audit", "sample", str(release_dir), "--check", str(outcome.report_path)])
    assert r.exit_code == 0, r.output
    assert not list((tmp_path / "out").glob("*.journal"))  # complete: the journal is gone


# ---------------------------------------------------------------- Ray replays the recorded threads

HAVE_RAY = importlib.util.find_spec("ray") is not None


@pytest.fixture(scope="module")
def ray4() -> Iterator[Any]:
    if not HAVE_RAY:
        pytest.skip("ray is not installed")
    import ray

    started = not ray.is_initialized()
    if started:  # 4 logical CPUs: 2 workers of 2 threads each (Ray's CPUs are a count, not cores)
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield ray
    if started:
        ray.shutdown()


def test_ray_replays_the_recorded_threads_and_agrees_with_local(ray4: Any, tiny_lm: Callable[[str], Any],
                                                                model_dir: Path, tmp_path: Path) -> None:
    """A release recorded with 2 threads: Ray actors reserve 2 CPUs each and run 2 torch threads, so the
    verdicts are those of a local run (before: 'threads 2 -> 1 not replayed')."""
    rel = _capture(tiny_lm("llama"), tmp_path / "rel2", n=4, n_threads=2)
    local, remote = tmp_path / "local.json", tmp_path / "ray.json"
    common = ["audit", "recompute", str(rel), "--model", str(model_dir), "--quiet", "--sample", "4", "--nonce", "n"]
    r = runner.invoke(app, [*common, "--out", str(local)])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, [*common, "--executor", "ray", "--workers", "2", "--out", str(remote)])
    assert r.exit_code == 0, r.output
    a, b = json.loads(local.read_text()), json.loads(remote.read_text())
    assert comparable(a) == comparable(b)
    assert b["conditions"]["not_replayed"] == {} and b["conditions"]["overridden"] == {}
    assert {w["threads"] for w in b["executor"]["workers"]} == {2} and len(b["executor"]["workers"]) == 2
    assert b["executor"]["worker_resources"]["num_cpus"] == 2
    assert {e["placement"]["environment"]["threads"] for e in b["entries"]} == {2}
    # --threads overrides the record and says so.
    r = runner.invoke(app, [*common, "--executor", "ray", "--workers", "2", "--threads", "1", "--out", str(remote)])
    over = json.loads(remote.read_text())
    assert over["conditions"]["overridden"] == {"threads": {"recorded": 2, "used": 1}}
    assert {w["threads"] for w in over["executor"]["workers"]} == {1}
