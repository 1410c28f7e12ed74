"""The claims checker: k/N arithmetic, contradictions, exact McNemar, measurements, CLI exit codes."""

from __future__ import annotations

import json
import typing
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvgraft.claims import checker as claims
from kvgraft.claims.kinds import k_of_n, stated_decimals
from kvgraft.cli import app
from kvgraft.errors import InputError, SchemaError
from kvgraft.generalization.stats import mcnemar_exact
from kvgraft.schema import validate

PREPRINT = Path(__file__).resolve().parents[2] / "audit" / "claims" / "kv-grafting-preprint.toml"


@pytest.fixture(scope="module")
def preprint() -> dict[str, Any]:
    return checked(PREPRINT)


def checked(path: Path, measured: Path | None = None) -> dict[str, Any]:
    """The claims-check result as `audit claims --json` prints it."""
    return claims.check_files(path, measured).as_json()


def by_id(result: dict[str, Any], claim_id: str) -> dict[str, Any]:
    return next(c for c in result["claims"] if c["id"] == claim_id)


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# --- arithmetic ------------------------------------------------------------------------------------------------


def test_k_of_n_exact_and_not() -> None:
    assert k_of_n(80.0, 30, 1).ks == [24]
    assert k_of_n(93.3, 30, 1).ks == [28]
    info = k_of_n(89.2, 30, 1)
    assert info.ks == [] and info.nearest_k == 27
    assert info.as_json()["multi_run"] == {"runs": 4, "k": 107, "n": 120, "percent": pytest.approx(89.1667, abs=1e-4)}
    anchor = k_of_n(77.5, 30, 1)
    assert anchor.ks == [] and anchor.nearest_k == 23 and anchor.multi_run is not None and anchor.multi_run.k == 93
    # 2/3 = 66.666..% rounds to 66.7 at one decimal but not to 66.67 at two... and is 66.67 at two decimals.
    assert k_of_n(66.7, 3, 1).ks == [2]
    assert k_of_n(66.7, 3, 2).ks == []
    assert stated_decimals(80.0) == 1 and stated_decimals(6574) == 0 and stated_decimals(0.125) == 3


def test_mcnemar_exact_best_case_is_0_125() -> None:
    assert mcnemar_exact(0, 4) == 0.125
    assert mcnemar_exact(4, 0) == 0.125
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(1, 5) == pytest.approx(0.21875)


# --- the preprint's claims -------------------------------------------------------------------------------------


def test_preprint_result_is_schema_valid_and_passes(preprint: dict[str, Any]) -> None:
    validate(preprint, claims.CLAIMS_SCHEMA, "result")
    # One reading (avg@4) fits every figure, so no accuracy figure and no dependent claim is inconsistent.
    assert preprint["failed"] is False and preprint["counts"]["inconsistent"] == 0
    assert preprint["claims_file"]["sha256"] and len(preprint["claims_file"]["sha256"]) == 64


def test_avg_at_4_is_the_reading_that_fits_all_four_figures(preprint: dict[str, Any]) -> None:
    (aime,) = preprint["readings"]
    assert aime["chosen"]["name"] == "avg@4" and aime["stated"] is None
    assert [r["samples_per_problem"] for r in aime["fits"]] == [4, 8, 12, 16]
    avg4 = next(r for r in aime["considered"] if r["name"] == "avg@4")
    assert {c: f["k"] for c, f in avg4["fractions"].items()} == {
        "aime-12b-anchor": 93, "aime-12b-baseline": 96, "aime-31b": 107, "aime-12b-graft": 112}
    single = next(r for r in aime["considered"] if r["name"] == "single sample")
    assert single["fits_all"] is False
    for text in ("77.5% = 93/120", "80.0% = 96/120", "89.2% ≈ 107/120", "single sample does not fit"):
        assert text in aime["summary"]


def test_80_percent_is_24_of_30_and_96_of_120(preprint: dict[str, Any]) -> None:
    c = by_id(preprint, "aime-12b-baseline")
    assert c["verdict"] == "consistent"
    assert "96/120 under avg@4" in c["reason"] and "24/30 as a single sample" in c["reason"]
    assert by_id(preprint, "aime-12b-graft")["verdict"] == "consistent"
    assert "28/30" in by_id(preprint, "aime-12b-graft")["reason"]


def test_89_2_and_77_5_are_not_k_of_30_but_fit_avg_at_4(preprint: dict[str, Any]) -> None:
    for cid, frac in (("aime-31b", "107/120"), ("aime-12b-anchor", "93/120")):
        c = by_id(preprint, cid)
        assert c["verdict"] == "consistent"
        assert f"{frac} under avg@4" in c["reason"] and "not k/30, so not a single-sample score" in c["reason"]


def test_8_previously_unsolved_gets_a_verdict_per_definition(preprint: dict[str, Any]) -> None:
    c = by_id(preprint, "unsolved-answered")
    assert c["verdict"] == "consistent"
    data = c["findings"][0]["data"]
    assert data["headline_reading"]["name"] == "avg@4"
    avg4, single = data["readings"]
    assert [(d["samples_needed"], d["limit"], d["possible"]) for d in avg4["definitions"]] == [(4, 6, False), (3, 8, True)]
    assert single["verdict"] == "inconsistent" and single["definitions"][0]["limit"] == 6
    assert "impossible if 'unsolved' means wrong in all 4 samples (at most 6)" in c["reason"]
    assert "possible if 'unsolved' means wrong in a majority (3 or more) of the 4 samples (at most 8)" in c["reason"]
    assert c["reason"].startswith("under avg@4 (fits every figure")


def test_token_ratio_6574_2_is_consistent(preprint: dict[str, Any]) -> None:
    c = by_id(preprint, "decode-token-ratio")
    assert c["verdict"] == "consistent"
    assert round(c["findings"][0]["data"]["computed"], 1) == 6574.2
    assert "6,574.2" in c["reason"]


def test_gain_under_each_reading(preprint: dict[str, Any]) -> None:
    c = by_id(preprint, "aime-12b-gain")
    # avg@4: 16 more right samples on 4 to 16 problems; a sign test on problems can only say with per-problem data.
    assert c["verdict"] == "consistent" and "not testable without per-problem data" in c["reason"]
    avg4, single = c["findings"][0]["data"]["readings"]
    assert avg4["test"].startswith("paired sign test on per-problem pass rates")
    assert (avg4["fewest_problems"], avg4["most_problems"], avg4["problems_needed"]) == (4, 16, 6)
    assert avg4["p_concentrated"] == 0.125 and avg4["p_spread"] == pytest.approx(2 / 2**16)
    # single sample: the exact McNemar best case, 4 discordant problems, is not significant.
    assert single["test"] == "paired exact McNemar on problems" and single["verdict"] == "unsupported"
    assert single["best_case_p"] == 0.125 and single["min_discordant"] == 4
    assert "not significant at 0.05" in c["reason"]


def test_context_and_energy_need_measurement(preprint: dict[str, Any]) -> None:
    ctx = by_id(preprint, "context-stretch")
    assert ctx["verdict"] == "not-testable"
    assert ctx["findings"][0]["verdict"] == "needs-measurement"
    assert ctx["findings"][0]["data"]["factor"] == pytest.approx(87.12, abs=0.01)
    assert "attended" in ctx["reason"]
    energy = by_id(preprint, "energy-ratio")
    assert energy["verdict"] == "not-testable" and "no joule or power figures" in energy["reason"]
    assert by_id(preprint, "restore-exact")["verdict"] == "not-testable"


# --- measurements ----------------------------------------------------------------------------------------------


def test_measured_supported_and_contradicted(tmp_path: Path) -> None:
    good = write(tmp_path, "good.json", json.dumps({
        "restore_byte_identical": True, "kl_max": 0.0, "accuracy.12b.baseline": {"k": 24, "n": 30},
        "discordant.12b.baseline_vs_graft": {"baseline_only": 0, "treated_only": 10}, "token_ratio": 7000.5,
        "typo.key": 1, "note": "test"}))
    r = checked(PREPRINT, good)
    validate(r, claims.CLAIMS_SCHEMA, "result")
    assert by_id(r, "restore-exact")["verdict"] == "supported"
    assert by_id(r, "aime-12b-baseline")["verdict"] == "supported"
    assert "24/30" in by_id(r, "aime-12b-baseline")["reason"]
    gain = by_id(r, "aime-12b-gain")
    assert gain["verdict"] == "supported" and gain["findings"][-1]["data"]["p_value"] == pytest.approx(2 / 1024)
    assert by_id(r, "decode-token-ratio")["verdict"] == "supported"
    assert r["unused_measurements"] == ["typo.key"]
    assert r["measured_file"]["path"] == str(good)

    bad = write(tmp_path, "bad.json", json.dumps({
        "restore_byte_identical": False, "kl_max": 0.003, "accuracy.12b.baseline": {"k": 12, "n": 30},
        "discordant.12b.baseline_vs_graft": {"baseline_only": 3, "treated_only": 2}, "token_ratio": 25.0,
        "context.attended_tokens": 32768}))
    r = checked(PREPRINT, bad)
    exact = by_id(r, "restore-exact")
    assert exact["verdict"] == "contradicted" and "0.003" in exact["reason"]
    acc = by_id(r, "aime-12b-baseline")
    assert acc["verdict"] == "contradicted" and "12/30" in acc["reason"] and "80.0%" in acc["reason"]
    assert by_id(r, "aime-12b-gain")["verdict"] == "contradicted"
    assert by_id(r, "decode-token-ratio")["verdict"] == "contradicted"
    assert by_id(r, "context-stretch")["verdict"] == "contradicted"
    assert by_id(r, "energy-ratio")["verdict"] == "not-testable"


def test_measured_from_recompute() -> None:
    exact = {"entries": [{"byte_exact": True, "matched": {"kl_max": 0.0}}, {"byte_exact": True, "matched": {"kl_max": 0.0}}]}
    assert claims.measured_from_recompute(exact) == {"restore_byte_identical": True, "kl_max": 0.0}
    off = {"entries": [{"byte_exact": True, "matched": {"kl_max": 0.0}}, {"byte_exact": False, "matched": {"kl_max": 1e-6}}]}
    assert claims.measured_from_recompute(off) == {"restore_byte_identical": False, "kl_max": 1e-6}
    r = claims.check(claims.load(PREPRINT), claims.measured_from_recompute(off)).as_json()
    assert by_id(r, "restore-exact")["verdict"] == "contradicted"
    with pytest.raises(InputError):
        claims.measured_from_recompute({"entries": []})


def test_measured_wrong_type_is_input_error(tmp_path: Path) -> None:
    p = write(tmp_path, "m.json", json.dumps({"accuracy.12b.baseline": 0.8}))
    with pytest.raises(InputError, match=r"accuracy\.12b\.baseline.*\"k\""):
        checked(PREPRINT, p)
    p = write(tmp_path, "m2.json", "[1, 2]")
    with pytest.raises(InputError, match="JSON object"):
        checked(PREPRINT, p)


# --- generic: driven by the file, not by the paper ---------------------------------------------------------------

GENERIC = """
format = "kvgraft-claims"
format_version = 1
[source]
title = "synthetic"
[benchmarks.b40]
size = 40
[[claims]]
id = "base"
kind = "accuracy"
text = "62.5% without"
benchmark = "b40"
percent = 62.5
[[claims]]
id = "treated"
kind = "accuracy"
text = "90% with"
benchmark = "b40"
percent = 90
[[claims]]
id = "gain"
kind = "gain"
text = "62.5% -> 90%"
baseline = "base"
treated = "treated"
[[claims]]
id = "newly"
kind = "count"
text = "11 newly solved"
benchmark = "b40"
count = 11
bounds = [{ relation = "unsolved-by", claim = "base" }, { relation = "solved-by", claim = "treated" }]
[[claims]]
id = "ratio"
kind = "ratio"
text = "100 / 3 = 33.3x"
stated = 33.3
numerator = 100
denominator = 3
"""


def test_generic_file_is_consistent(tmp_path: Path) -> None:
    r = checked(write(tmp_path, "c.toml", GENERIC))
    assert r["failed"] is False
    assert {c["id"]: c["verdict"] for c in r["claims"]} == {
        "base": "consistent", "treated": "consistent", "gain": "consistent", "newly": "consistent", "ratio": "consistent"}
    assert "25/40" in by_id(r, "base")["reason"] and "36/40" in by_id(r, "treated")["reason"]
    # 25 -> 36 of 40: best case 11 discordant pairs all one way, p = 2 / 2**11
    assert by_id(r, "gain")["findings"][0]["data"]["readings"][0]["best_case_p"] == pytest.approx(2 / 2**11)
    assert [x["chosen"]["name"] for x in r["readings"]] == ["single sample"]


def test_generic_file_catches_bad_ratio(tmp_path: Path) -> None:
    r = checked(write(tmp_path, "c.toml", GENERIC.replace("stated = 33.3", "stated = 34.0")))
    assert by_id(r, "ratio")["verdict"] == "inconsistent" and r["failed"] is True


def test_numbers_keep_how_they_were_written(tmp_path: Path) -> None:
    """A number written as an integer is stated to no decimals, shown and recorded as one; 90.0 to one decimal."""
    r = checked(write(tmp_path, "c.toml", GENERIC))
    assert by_id(r, "gain")["claimed"] == "62.5% -> 90%"
    ratio = by_id(r, "ratio")
    assert ratio["claimed"] == "≈33.3x (100 / 3)"
    data = ratio["findings"][0]["data"]
    assert type(data["numerator"]) is int and type(data["denominator"]) is int and type(data["stated"]) is float
    r = checked(write(tmp_path, "d.toml", GENERIC.replace("percent = 90", "percent = 90.0")))
    assert by_id(r, "gain")["claimed"] == "62.5% -> 90.0%"


def test_stated_samples_per_problem_is_the_only_reading(tmp_path: Path) -> None:
    r = checked(write(tmp_path, "c.toml", GENERIC.replace("size = 40", "size = 40\nsamples_per_problem = 4")))
    (b40,) = r["readings"]
    assert b40["stated"]["name"] == "avg@4" and [x["name"] for x in b40["considered"]] == ["avg@4"]
    assert "100/160 under avg@4" in by_id(r, "base")["reason"]
    gain = by_id(r, "gain")["findings"][0]["data"]["readings"]
    assert len(gain) == 1 and gain[0]["test"].startswith("paired sign test")
    assert r["failed"] is False


TWO_FIGURES = """
format = "kvgraft-claims"
format_version = 1
[source]
title = "synthetic"
[benchmarks.b30]
size = 30
{extra}
[[claims]]
id = "low"
kind = "accuracy"
text = "low"
benchmark = "b30"
percent = {low}
[[claims]]
id = "high"
kind = "accuracy"
text = "80.0%"
benchmark = "b30"
percent = 80.0
[[claims]]
id = "gain"
kind = "gain"
text = "gain"
baseline = "low"
treated = "high"
"""


def test_inconsistent_only_when_no_reading_rescues(tmp_path: Path) -> None:
    # A stated single-sample reading: 77.5% is not k/30, and nothing else is tried.
    r = checked(write(tmp_path, "a.toml", TWO_FIGURES.format(extra="samples_per_problem = 1", low=77.5)))
    low = by_id(r, "low")
    assert low["verdict"] == "inconsistent" and "under the stated single sample" in low["reason"]
    assert by_id(r, "high")["verdict"] == "consistent" and r["failed"] is True
    # The same figures without a stated reading: avg@4 rescues 77.5%.
    r = checked(write(tmp_path, "b.toml", TWO_FIGURES.format(extra="", low=77.5)))
    assert r["readings"][0]["chosen"]["name"] == "avg@4" and r["failed"] is False
    # 50.1% is k/(30 s) for no s up to 16: inconsistent, and the gain is judged on the nearest single-sample fractions.
    r = checked(write(tmp_path, "c.toml", TWO_FIGURES.format(extra="", low=50.1)))
    assert r["readings"][0]["chosen"] is None
    low = by_id(r, "low")
    assert low["verdict"] == "inconsistent" and "no reading up to avg@16" in low["reason"]
    assert "nearest fractions" in by_id(r, "gain")["reason"]


def test_count_beyond_every_definition_is_inconsistent(tmp_path: Path) -> None:
    text = PREPRINT.read_text().replace("count = 8\n", "count = 9\n", 1)
    c = by_id(checked(write(tmp_path, "p.toml", text)), "unsolved-answered")
    assert c["verdict"] == "inconsistent"
    assert all(not d["possible"] for d in c["findings"][0]["data"]["readings"][0]["definitions"])


@pytest.mark.parametrize(("edit", "message"), [
    (('kind = "ratio"', 'kind = "vibes"'), "schema error"),
    (('treated = "treated"', 'treated = "nope"'), "unknown claim 'nope'"),
    (('benchmark = "b40"\npercent = 62.5', 'benchmark = "b41"\npercent = 62.5'), "unknown benchmark 'b41'"),
    (('id = "gain"', 'id = "base"'), "appears twice"),
    (('baseline = "base"', 'baseline = "ratio"'), "not an accuracy claim"),
])
def test_bad_claims_files(tmp_path: Path, edit: tuple[str, str], message: str) -> None:
    with pytest.raises(InputError, match=message):
        checked(write(tmp_path, "c.toml", GENERIC.replace(*edit, 1)))


def _one_step_edits(text: str) -> list[str]:
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        out.append("\n".join(lines[:i] + lines[i + 1:]))
        if "=" in line and not line.startswith("["):
            key = line.split("=", 1)[0]
            for value in ("0", "-1", "1e9", "2.5", "true", '"x"', '"x\\n"', '""', "[]", "{}"):
                out.append("\n".join([*lines[:i], f"{key}= {value}", *lines[i + 1:]]))
    return out


def test_the_model_accepts_what_the_schema_accepts() -> None:
    """The claims file's models are the schema's source, and `parse` validates by the schema, then reads the
    document as the models: on the suite's file and every one-step edit of it, what the schema accepts the models
    accept too (so a file is refused by the schema's message, never by a model's)."""
    import tomllib

    from pydantic import ValidationError

    from kvgraft.results.claims import ClaimsFile

    compared = 0
    for text in [GENERIC, *_one_step_edits(GENERIC)]:
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError:
            continue
        try:
            validate(doc, claims.CLAIMS_SCHEMA, "doc")
            by_schema = True
        except SchemaError:
            by_schema = False
        try:
            ClaimsFile.model_validate(doc)
            by_model = True
        except ValidationError:
            by_model = False
        assert by_model or not by_schema, text
        compared += by_schema
    assert compared > 50


def test_schema_error_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(SchemaError) as info:
        checked(write(tmp_path, "c.toml", GENERIC.replace("percent = 62.5", "percent = 162.5")))
    assert "c.toml" in str(info.value) and "claims[0]" in info.value.path


# --- CLI -------------------------------------------------------------------------------------------------------


def test_cli_exit_codes(tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(app, ["audit", "claims", str(PREPRINT)])
    assert res.exit_code == 0, res.output
    assert "avg@4" in res.stdout and "24/30" in res.stdout

    bad = write(tmp_path, "bad.toml", GENERIC.replace("stated = 33.3", "stated = 34.0"))
    res = runner.invoke(app, ["audit", "claims", str(bad)])
    assert res.exit_code == 4, res.output  # the exit code `audit run` gives a failed verdict
    assert "inconsistent" in res.stdout

    res = runner.invoke(app, ["audit", "claims", str(write(tmp_path, "ok.toml", GENERIC))])
    assert res.exit_code == 0, res.output

    broken = write(tmp_path, "broken.toml", 'format = "kvgraft-claims"\nformat_version = 1\n[source\ntitle = "x"\n')
    res = runner.invoke(app, ["audit", "claims", str(broken)])
    assert res.exit_code == 2
    assert "broken.toml" in res.stderr and "line 3" in res.stderr

    res = runner.invoke(app, ["audit", "claims", str(tmp_path / "missing.toml")])
    assert res.exit_code == 2 and "missing.toml" in res.stderr


def test_cli_json_is_schema_valid(tmp_path: Path) -> None:
    m = write(tmp_path, "m.json", json.dumps({"restore_byte_identical": True, "kl_max": 0.0}))
    res = CliRunner().invoke(app, ["audit", "claims", str(PREPRINT), "--measured", str(m), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    validate(doc, claims.CLAIMS_SCHEMA, "stdout")
    assert by_id(doc, "restore-exact")["verdict"] == "supported"
    assert doc["counts"]["inconsistent"] == 0 and doc["readings"][0]["chosen"]["name"] == "avg@4"


def test_every_kind_in_the_schema_has_one_table_entry() -> None:
    from kvgraft.claims.kinds import KINDS
    from kvgraft.results.claims import Claim
    from kvgraft.schema import schema_dir

    schema = json.loads((schema_dir() / claims.CLAIMS_SCHEMA).read_text())
    assert list(KINDS) == schema["$defs"]["Claim"]["properties"]["kind"]["enum"]  # generated from the model's kinds
    assert list(KINDS) == list(typing.get_args(Claim.model_fields["kind"].annotation))
    assert all(name == kind.name for name, kind in KINDS.items())
