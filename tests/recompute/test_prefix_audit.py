"""Prefix grafts judged by `kvgraft audit recompute --prefix N`.

The rows a prefix graft holds are rows [0, n) of the entry's recorded prefill of all T tokens: the
audit judges them under that schedule (the verdict) and against a prefill of the n tokens alone,
byte-exact where they are byte-identical, else by the noise bound of that computation.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvgraft import errors
from kvgraft.cli import app
from kvgraft.recompute import audit as recompute
from kvgraft.recompute import prefix as prefix_audit
from kvgraft.release.format import Release
from kvgraft.results.recompute import PrefixComparison, PrefixGraft
from kvgraft.signing.policy import SignatureNotChecked
from kvgraft.signing.verify import verified

import rewrite
from release_factory import records_plan

runner = CliRunner()


def _text(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


def _capture(lm: Any, out: Path, records: list[tuple[str, int]], **kw: Any) -> Release:
    from kvgraft.inference import capture

    capture.capture(lm, [(f"t{i}", {"id": rid, "text": _text(k)}) for i, (rid, k) in enumerate(records)], out,
                    probe_tokens=0, **kw)
    return Release.open(out)


def test_audit_recompute_prefix_cli(tiny_dir: Any, tiny_lm: Any, tmp_path: Path) -> None:
    """`--prefix 16`: the long entry's prefix graft is judged and byte-exact under its schedule; the
    against-alone answer is this machine's, computed here; the short entry is listed as skipped."""
    import torch

    from kvgraft.inference.runtime import Schedule, layer_map, prefill

    lm = tiny_lm("llama")
    rel = _capture(lm, tmp_path / "rel", [("long", 50), ("short", 4)])
    assert rel.entry("short")["num_tokens"] <= 16 < rel.entry("long")["num_tokens"]
    out = tmp_path / "r.json"
    res = runner.invoke(app, ["audit", "recompute", str(tmp_path / "rel"), "--model", str(tiny_dir("llama")),
                              "--prefix", "16", "--out", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    grafts = doc["prefix_grafts"]
    assert grafts["tokens"] == 16 and [s["entry"] for s in grafts["skipped"]] == ["short"]
    (g,) = grafts["entries"]
    assert g["entry"] == "long" and g["tokens"] == 16 and g["of"] == rel.entry("long")["num_tokens"]
    assert g["verdict"] == "byte-exact" and g["byte_exact"] and g["schedule"] == rel.manifest["schedule"]
    assert g["rows"] == f"rows [0, 16) of a one-shot prefill of all {g['of']} tokens"
    ids = rel.entry("long")["token_ids"]
    with torch.no_grad():
        whole, _ = prefill(lm, ids, Schedule())
        alone, _ = prefill(lm, ids[:16], Schedule())
    same = all(torch.equal(layer_map(lm, whole)[1][k][:, :, :16, :], t) for k, t in layer_map(lm, alone)[1].items())
    assert g["against_prefix_alone"]["byte_exact"] == same
    assert any(s.startswith("Prefix grafts of 16 tokens") for s in doc["statements"])
    bad = runner.invoke(app, ["audit", "recompute", str(tmp_path / "rel"), "--model", str(tiny_dir("llama")),
                              "--prefix", "0"])
    assert bad.exit_code == 2 and "--prefix 0" in bad.output


def test_a_one_ulp_row_is_consistent_and_a_large_one_is_not(tiny_lm: Any, tmp_path: Path) -> None:
    """Controls for the noise bound path: a stored row inside the prefix moved by one ulp (every
    commitment rewritten) makes the prefix graft consistent, not byte-exact (so `--require exact`
    fails it); moved by 0.5 it is inconsistent. The release's verdict follows the prefix graft's."""
    lm = tiny_lm("llama")
    _capture(lm, tmp_path / "rel", [("p", 50)])

    def one_ulp(x: float) -> float:
        (bits,) = struct.unpack("<I", struct.pack("<f", x))
        (y,) = struct.unpack("<f", struct.pack("<I", bits + 1))
        return float(y)

    rewrite.element(tmp_path / "rel", 0, "layer.1.keys", 5, one_ulp)  # head 0, position 0: inside the prefix
    result = prefix_audit.audit(verified(tmp_path / "rel", SignatureNotChecked()), lm, prefix=16, require="consistent")
    (g,) = result["prefix_grafts"]["entries"]
    assert g["verdict"] == "consistent" and not g["byte_exact"]
    under = g["under_recorded_schedule"]
    assert under["first_differing_tensor"] == "layer.1.keys" and under["outside"] == 0 and 0 < under["max_excess"] <= 1
    assert result["passed"] and not recompute.passes(g["verdict"], "exact")

    rewrite.element(tmp_path / "rel", 0, "layer.1.keys", 5, lambda x: x + 0.5)
    result = prefix_audit.audit(verified(tmp_path / "rel", SignatureNotChecked()), lm, prefix=16, require="consistent")
    (g,) = result["prefix_grafts"]["entries"]
    assert g["verdict"] == "inconsistent" and g["under_recorded_schedule"]["first_outside_tensor"] == "layer.1.keys"
    assert result["verdict"] == "inconsistent" and not result["passed"]
    assert not math.isnan(g["under_recorded_schedule"]["max_excess"])


@pytest.mark.parametrize("family", ["gemma3", "gemma4"])
def test_prefix_audit_of_sliding_layers(tiny_lm: Any, tmp_path: Path, family: str) -> None:
    """Sliding layers stored with every position: the prefix graft is judged (byte-exact under its
    schedule); stored as their window, the entry has no prefix graft and is listed as skipped."""
    lm = tiny_lm(family)
    _capture(lm, tmp_path / "all", [("g", 40)], sliding="all")
    _capture(lm, tmp_path / "win", [("g", 40)])
    (g,) = prefix_audit.audit(verified(tmp_path / "all", SignatureNotChecked()), lm, prefix=16)["prefix_grafts"]["entries"]
    assert g["verdict"] == "byte-exact" and g["sliding_layers_every_position"]
    grafts = prefix_audit.audit(verified(tmp_path / "win", SignatureNotChecked()), lm, prefix=16)["prefix_grafts"]
    assert grafts["entries"] == [] and "needs every layer to hold every position" in grafts["skipped"][0]["reason"]


@pytest.mark.slow
def test_prefix_against_the_prefix_alone_on_the_default_model(smollm2: Any, tmp_path: Path) -> None:
    """SmolLM2-135M: for some (T, n) rows [0, n) of a prefill of T differ from a prefill of n on this
    CPU (bench/prefix_schedule.py); each is judged consistent against the prefix alone, and the graft
    stays byte-exact under its recorded schedule. Which n differ is computed here, not assumed."""
    import torch

    from kvgraft.inference.runtime import Schedule, layer_map, prefill
    from kvgraft.recompute.prefix import audit_prefix

    rel = _capture(smollm2, tmp_path / "rel", [("p", 40)])
    ids = rel.entry("p")["token_ids"]
    with torch.no_grad():
        _, whole = layer_map(smollm2, prefill(smollm2, ids, Schedule())[0])
    for n in (16, 32, 48, 64):
        with torch.no_grad():
            _, alone = layer_map(smollm2, prefill(smollm2, ids[:n], Schedule())[0])
        same = all(torch.equal(whole[k][:, :, :n, :], t) for k, t in alone.items())
        r = audit_prefix(verified(tmp_path / "rel", SignatureNotChecked()), "p", n, smollm2)
        assert r["verdict"] == "byte-exact"
        assert r["against_prefix_alone"]["verdict"] == ("byte-exact" if same else "consistent"), n


def test_outside_the_prefix_alone_noise_bound_fails_the_release(tiny_lm: Any, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows byte-exact under their schedule but outside the noise bound of the prefix alone are not the
    prefix's computation: the prefix graft is inconsistent, and so is the release, though every entry
    is byte-exact (the comparison against the prefix alone is made to say so here)."""

    lm = tiny_lm("llama")
    _capture(lm, tmp_path / "rel", [("p", 50)])
    real = prefix_audit._compare
    calls: list[int] = []

    def second_outside(*a: Any) -> PrefixComparison:
        calls.append(1)
        r = real(*a)
        return r.model_copy(update={"verdict": "inconsistent"}) if len(calls) == 2 else r

    monkeypatch.setattr(prefix_audit, "_compare", second_outside)
    result = prefix_audit.audit(verified(tmp_path / "rel", SignatureNotChecked()), lm, prefix=16)
    (g,) = result["prefix_grafts"]["entries"]
    assert result["entries"][0]["verdict"] == "byte-exact" and g["byte_exact"]
    assert g["verdict"] == "inconsistent" and result["verdict"] == "inconsistent" and not result["passed"]


def test_audit_run_plan_judges_prefix_grafts(tiny_dir: Any, tmp_path: Path) -> None:
    """`checks.recompute.prefix` in a plan: the report's recompute check carries the prefix grafts."""
    tables = '[checks.verify]\n[checks.recompute]\nprefix = 16\n[signing]\nkey = "ephemeral"\n'
    plan = records_plan(tmp_path, "prefix", tiny_dir("llama"), [_text(50)], tables, probe_tokens=0)
    res = runner.invoke(app, ["audit", "run", str(plan), "--quiet"])
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    (check,) = [c for c in report["checks"] if c["kind"] == "recompute"]
    (g,) = check["data"]["prefix_grafts"]["entries"]
    assert g["entry"] == "r0" and g["tokens"] == 16 and g["verdict"] == "byte-exact"
    assert "Prefix grafts of 16 tokens" in check["summary"]


# ------------------------------------------------------------------ prefix grafts journaled


class Interrupt(KeyboardInterrupt):
    pass


REAL_JUDGE = prefix_audit.judge_prefix


def _counted(monkeypatch: pytest.MonkeyPatch, calls: list[str], stop_at: int | None = None) -> None:
    """judge_prefix counted per entry; with `stop_at`, Ctrl-C as that call starts (the grafts before it landed)."""
    def counted(rel: Any, entry: dict[str, Any], *a: Any, **k: Any) -> PrefixGraft:
        calls.append(entry["id"])
        if stop_at is not None and len(calls) == stop_at:
            raise Interrupt
        return REAL_JUDGE(rel, entry, *a, **k)

    monkeypatch.setattr(prefix_audit, "judge_prefix", counted)


@pytest.fixture(scope="module")
def grafted(tiny_lm: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("prefix-journal") / "rel"
    _capture(tiny_lm("llama"), out, [("a", 30), ("b", 34), ("c", 38), ("short", 4)])
    return out


def test_an_interrupted_prefix_audit_resumes_and_judges_no_graft_twice(tiny_lm: Any, grafted: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed after two grafts landed, a torn line planted after them: the rerun judges no entry and only the
    third graft, reads the two back (said so), and its result is the uninterrupted one's."""
    lm = tiny_lm("llama")
    journal = tmp_path / "r.json.journal"
    calls: list[str] = []
    _counted(monkeypatch, calls, stop_at=3)
    with pytest.raises(Interrupt):
        prefix_audit.audit(verified(grafted, SignatureNotChecked()), lm, prefix=16, journal=journal)
    assert calls == ["a", "b", "c"] and journal.exists()
    with journal.open("ab") as fh:
        fh.write(b'{"unit": ["prefix", 16, "c"], "result": {"entry": "c", "tok')  # killed mid-write
    entries: list[str] = []
    real_entry = recompute.audit_entry
    monkeypatch.setattr(recompute, "audit_entry", lambda rel, e, *a, **k: entries.append(e["id"]) or real_entry(rel, e, *a, **k))
    calls.clear()
    _counted(monkeypatch, calls)
    result = prefix_audit.audit(verified(grafted, SignatureNotChecked()), lm, prefix=16, journal=journal)
    assert entries == [] and calls == ["c"]  # each entry and each graft judged exactly once over the two runs
    assert result["cost"]["entries_resumed"] == 4 and result["cost"]["prefix_grafts_resumed"] == 2
    grafts = result["prefix_grafts"]["entries"]
    assert [g["entry"] for g in grafts] == ["a", "b", "c"]
    assert [s["entry"] for s in result["prefix_grafts"]["skipped"]] == ["short"]
    assert [g["placement"].get("resumed", False) for g in grafts] == [True, True, False]
    assert f"4 results and 2 prefix grafts resumed from {journal}" in " ".join(result["statements"])
    from kvgraft.audit import checks as registry
    from kvgraft.execution.executor import comparable

    registry.seal("recompute", result)  # schema-checked, resumed grafts included
    # Apart from timing, placement and the resumed sayings, the result is an uninterrupted run's.
    fresh = registry.seal("recompute", prefix_audit.audit(verified(grafted, SignatureNotChecked()), lm, prefix=16))
    for r in (result, fresh):
        r["statements"] = [s for s in r["statements"] if "resumed from" not in s]
        r["cost"] = {k: v for k, v in r["cost"].items() if k == "library_entries"}
    assert comparable(json.loads(json.dumps(result, default=str))) == comparable(json.loads(json.dumps(fresh, default=str)))
    # The journal binds the prefix length: one of another --prefix is refused, never mixed in.
    with pytest.raises(errors.InputError, match=r"journal of another run \(run\.prefix_tokens differs\)"):
        prefix_audit.audit(verified(grafted, SignatureNotChecked()), lm, prefix=8, journal=journal)


def test_a_forged_prefix_graft_in_the_journal_refuses_the_resume(tiny_lm: Any, grafted: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A graft read back is re-judged from its comparisons: a byte-exact verdict over an inconsistent comparison,
    or a graft of other tokens, refuses the resume naming the line; the honest journal resumes (the control)."""
    lm = tiny_lm("llama")
    journal = tmp_path / "j.journal"
    calls: list[str] = []
    _counted(monkeypatch, calls, stop_at=2)
    with pytest.raises(Interrupt):
        prefix_audit.audit(verified(grafted, SignatureNotChecked()), lm, prefix=16, entries=["a", "b"], journal=journal)
    honest = journal.read_bytes()
    lines = honest.splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if json.loads(line).get("unit") == ["prefix", 16, "a"])
    doc = json.loads(lines[at])
    for forge, why in ((lambda g: g["under_recorded_schedule"].update(  # a comparison that holds, its verdict forged
                            verdict="inconsistent", byte_exact=False, first_differing_tensor="layer.0.keys",
                            differing_elements=3, outside=3, first_outside_tensor="layer.0.keys"),
                        r"its verdict \(byte-exact\) is not what its comparisons give"),
                       (lambda g: g["against_prefix_alone"].update(verdict="consistent"),
                        r"its against_prefix_alone verdict \(consistent\) is not what its comparison gives"),
                       (lambda g: g.update(tokens=8), r"graft of 8 of 'a'")):
        forged = json.loads(json.dumps(doc))
        forge(forged["result"])
        journal.write_bytes(b"".join(lines[:at]) + json.dumps(forged).encode() + b"\n" + b"".join(lines[at + 1:]))
        with pytest.raises(errors.InputError, match=rf"j\.journal:{at + 1}: unit \('prefix', 16, 'a'\): {why}"):
            prefix_audit.audit(verified(grafted, SignatureNotChecked()), lm, prefix=16, entries=["a", "b"], journal=journal)
    journal.write_bytes(honest)
    calls.clear()
    _counted(monkeypatch, calls)
    result = prefix_audit.audit(verified(grafted, SignatureNotChecked()), lm, prefix=16, entries=["a", "b"], journal=journal)
    assert calls == ["b"] and result["cost"]["prefix_grafts_resumed"] == 1


def test_cli_interrupted_prefix_audit_resumes_from_its_journal(tiny_dir: Any, grafted: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "r.json"
    calls: list[str] = []
    _counted(monkeypatch, calls, stop_at=2)
    args = ["audit", "recompute", str(grafted), "--model", str(tiny_dir("llama")), "--prefix", "16",
            "--entry", "a", "--entry", "b", "--out", str(out), "--quiet"]
    r = runner.invoke(app, args)
    assert r.exit_code == 130 and not out.exists(), r.output
    assert "rerun the same command to resume" in r.output and Path(f"{out}.journal").exists()
    calls.clear()
    _counted(monkeypatch, calls)
    r = runner.invoke(app, args)
    assert r.exit_code == 0 and calls == ["b"], r.output
    assert "2 results and 1 prefix graft resumed from" in r.output
    assert json.loads(out.read_text())["cost"]["prefix_grafts_resumed"] == 1 and not Path(f"{out}.journal").exists()
