"""A sampled audit's journal is checked, not trusted: a planted journal's nonce is reported as read from it (never
"drawn"), a result line that is not a whole entry result is refused (exit 2, file and line), and a verdict its own
comparisons do not give is refused; an honest journal still resumes, and the output says from where."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvgraft import errors, sampling
from kvgraft.cli import app
from kvgraft.inference import capture
from kvgraft.recompute import audit as recompute
from kvgraft.release.format import Release
from kvgraft.signing.policy import SignatureNotChecked
from kvgraft.signing.verify import verified

runner = CliRunner()
SAMPLE = 3

NO_KEY = SignatureNotChecked()  # as `kvgraft audit recompute` without --key verifies


class Interrupt(KeyboardInterrupt):
    pass


@pytest.fixture(scope="module")
def release(tiny_lm: Callable[[str], Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    import tiny

    text = " ".join(tiny._CORPUS)
    out = tmp_path_factory.mktemp("trust") / "rel"
    capture.capture(tiny_lm("llama"), [("t", {"id": f"s{i}", "text": text[i * 11: i * 11 + 30]}) for i in range(5)],
                    out, probe_tokens=2)
    return out


def _header_only(release: Path, lm: Any, journal: Path, nonce: str | None = None) -> dict[str, Any]:
    """The journal an audit interrupted before its first entry leaves: its header alone (returned)."""

    def stop(_state: dict[str, int]) -> None:
        raise Interrupt

    journal.unlink(missing_ok=True)

    with pytest.raises(Interrupt):
        recompute.audit(verified(release, NO_KEY), lm, sample=SAMPLE, nonce=nonce, journal=journal, on_progress=stop)
    (line,) = journal.read_text().splitlines()
    return dict(json.loads(line))


def _audit(release: Path, model: Path, out: Path, *extra: str) -> Any:
    return runner.invoke(app, ["audit", "recompute", str(release), "--model", str(model), "--device", "cpu",
                               "--sample", str(SAMPLE), "--out", str(out), "--quiet", *extra])


def _one_error_line(r: Any, journal: Path, lineno: int) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.output, r.output
    assert lines[0].startswith(f"kvgraft: error: {journal}:{lineno}: "), lines[0]
    return lines[0]


def test_a_planted_nonce_is_reported_as_read_from_the_journal_never_drawn(
        tiny_lm: Callable[[str], Any], tiny_dir: Callable[[str], Path], release: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    journal = Path(f"{out}.journal")
    doc = _header_only(release, tiny_lm("llama"), journal)
    # Whoever can write the output folder chose this sample: the nonce, and the entries it draws.
    rel = Release.open(release)
    doc["run"]["sample"]["nonce"] = "attacker-0"
    doc["run"]["entries"] = [rel.entries[i]["id"] for i in sampling.draw(rel.manifest["root_digest"], "attacker-0",
                                                                         len(rel.entries), SAMPLE)]
    journal.write_text(json.dumps(doc) + "\n")
    r = _audit(release, tiny_dir("llama"), out)
    assert r.exit_code == 0, r.output
    result = json.loads(out.read_text())
    assert result["sample"]["nonce"] == "attacker-0" and result["sample"]["nonce_source"] == "journal"
    assert result["cost"]["resumed_from"] == str(journal) and result["cost"]["entries_resumed"] == 0
    said = "\n".join(result["statements"])
    assert f"nonce 'attacker-0' (from the journal {journal})" in said and "(drawn)" not in said
    assert f"0 results resumed from {journal}" in said and f"0 results resumed from {journal}" in r.stderr
    # The auditor's own nonce: the planted journal is of another run, refused, never mixed in.
    journal.write_text(json.dumps(doc) + "\n")
    r = _audit(release, tiny_dir("llama"), out, "--nonce", "auditor-1")
    assert r.exit_code == errors.EXIT_INPUT and f"{journal}: a journal of another run" in r.output, r.output


def test_a_result_line_that_is_no_entry_result_is_refused_naming_file_and_line(
        tiny_lm: Callable[[str], Any], tiny_dir: Callable[[str], Path], release: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    journal = Path(f"{out}.journal")
    doc = _header_only(release, tiny_lm("llama"), journal, nonce="n1")
    with journal.open("a") as fh:
        fh.write(json.dumps({"unit": doc["run"]["entries"][0], "result": {}}) + "\n")
    r = _audit(release, tiny_dir("llama"), out, "--nonce", "n1")
    assert r.exit_code == errors.EXIT_INPUT, r.output  # was 70: a KeyError on the empty result
    assert "schema error" in _one_error_line(r, journal, 2) and not out.exists()


def test_a_forged_verdict_is_refused_and_an_honest_result_resumes(
        tiny_lm: Callable[[str], Any], tiny_dir: Callable[[str], Path], release: Path, tmp_path: Path) -> None:
    lm = tiny_lm("llama")
    audited = recompute.audit(verified(release, NO_KEY), lm, sample=SAMPLE, nonce="n1")
    honest = json.loads(json.dumps(audited["entries"][0], default=str))
    assert honest["verdict"] == "byte-exact"
    out = tmp_path / "r.json"
    journal = Path(f"{out}.journal")
    forged = {**honest, "verdict": "inconsistent", "byte_exact": False}  # comparisons untouched: max |diff| 0
    _header_only(release, lm, journal, nonce="n1")
    with journal.open("a") as fh:
        fh.write(json.dumps({"unit": honest["id"], "result": forged}) + "\n")
    r = _audit(release, tiny_dir("llama"), out, "--nonce", "n1")
    assert r.exit_code == errors.EXIT_INPUT, r.output  # was 4: the forged verdict reported as measured
    assert "is not what its comparisons give" in _one_error_line(r, journal, 2) and not out.exists()
    # The positive control: the same line unforged is reused, and the output says so and from where.
    _header_only(release, lm, journal, nonce="n1")
    with journal.open("a") as fh:
        fh.write(json.dumps({"unit": honest["id"], "result": honest}) + "\n")
    r = _audit(release, tiny_dir("llama"), out, "--nonce", "n1")
    assert r.exit_code == 0, r.output
    result = json.loads(out.read_text())
    assert (result["cost"]["entries_resumed"], result["cost"]["resumed_from"]) == (1, str(journal))
    assert f"1 result resumed from {journal}" in r.stderr and not journal.exists()


@pytest.fixture(scope="module")
def judged(tiny_lm: Callable[[str], Any], release: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """One entry's record and its result as a journal line holds it."""
    result = recompute.audit(verified(release, NO_KEY), tiny_lm("llama"), sample=1, nonce="n2")["entries"][0]
    return Release.open(release).entry(result["id"]), json.loads(json.dumps(result, default=str))


def _stored(r: dict[str, Any]) -> None:
    r["layers"][0]["keys"]["sha256_stored"] = "0" * 64


def _fresh(r: dict[str, Any]) -> None:
    r["layers"][0]["values"]["sha256_fresh"] = "1" * 64  # differs, yet recorded as equal


def _outside(r: dict[str, Any]) -> None:
    r["layers"][0]["keys"].update(equal=False, sha256_fresh="2" * 64, outside=3, max_excess=2.0)  # no location


@pytest.mark.parametrize(("change", "says"), [
    (lambda r: r.update(id="other"), "not of this entry"),
    (lambda r: r.update(num_tokens=r["num_tokens"] + 1), "not of this entry"),
    (lambda r: r["layers"].pop(), "its layers are not the entry's"),
    (_stored, "its digests disagree with the release's"),
    (_fresh, "its digests disagree with the release's"),
    (_outside, "its comparisons are incomplete"),
    (lambda r: r.update(tensors_equal=0), "its tensors_equal"),
    (lambda r: r.update(max_excess=5.0), "its max_excess"),
    (lambda r: r.pop("matched"), "schema error"),
])
def test_each_resumed_result_is_checked_against_the_entry_and_re_judged(
        judged: tuple[dict[str, Any], dict[str, Any]], change: Callable[[dict[str, Any]], Any], says: str) -> None:
    entry, result = judged
    assert recompute.resumed_problem(entry, result) is None  # the positive control: an honest result is reused
    forged = copy.deepcopy(result)
    change(forged)
    assert says in str(recompute.resumed_problem(entry, forged))


@pytest.mark.parametrize("line", [b'{"unit": [], "result": {}}', b'[1]', b'{"unit": "a", "result": []}', b'{"unit": "a"}'])
def test_a_malformed_line_is_one_error_naming_the_file_and_line(tmp_path: Path, line: bytes) -> None:
    from kvgraft.execution.journal import Journal

    path = tmp_path / "j.journal"
    run = {"release_root_digest": "ab" * 32, "entries": ["a"]}
    Journal.open(path, run, {"a"}).close()
    path.write_bytes(path.read_bytes() + line + b"\n")
    with pytest.raises(errors.InputError, match=rf"^{path}:2: not a judged unit of this run$"):
        Journal.open(path, run, {"a"})
