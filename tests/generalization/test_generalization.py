"""The generalization audit: condition (d) reproduces the graft, the query's own entry never serves (c),
the clean/contaminated split, the ledger, the JSON schema, the CLI."""

from __future__ import annotations

import copy
import io
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvgraft.errors import SchemaError
from kvgraft.generalization import audit as gen
from kvgraft.generalization import library
from kvgraft.generalization.conditions import CONDITIONS, LABELS
from kvgraft.generalization.leakage import leakage_for
from kvgraft.generalization.problems import Problem, problem_hash
from kvgraft.inference.runtime import Schedule
from kvgraft.results.generalization import GeneralizationResult, Model, Run
from kvgraft.schema import validate
from kvgraft.signing.policy import OwnOutput
from kvgraft.signing.verify import VerifiedRelease, verified

from sample_problems import PROBLEMS

BUILT = OwnOutput("a library this test built")  # read back in the process that wrote it


def _jsonl(path: Path, problems: list[Problem]) -> Path:
    path.write_text("".join(json.dumps({"id": p.id, "problem": p.problem, "answer": p.answer, "solution": p.solution,
                                        "source": p.source}) + "\n" for p in problems))
    return path


@pytest.fixture(scope="module")
def tiny_library(tiny_lm: Callable[[str], Any], tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, VerifiedRelease, Path]:
    """A tiny Llama and a library of the reference traces of half the problems (chunked capture schedule)."""
    lm = tiny_lm("llama")
    root = tmp_path_factory.mktemp("gen")
    problems_file = _jsonl(root / "problems.jsonl", PROBLEMS)
    probs, rec = library.load_problems(str(problems_file))
    library.build(lm, probs, root / "lib", library_fraction=0.5, salt="t", source=rec,
                  settings=library.BuildSettings(generate=False), schedule=Schedule(chunk_tokens=16))
    return lm, verified(root / "lib", BUILT), problems_file


@pytest.fixture(scope="module")
def tiny_result(tiny_library: tuple[Any, VerifiedRelease, Path]) -> dict[str, Any]:
    lm, rel, _ = tiny_library
    queries, prepared = gen.prepare(rel, synthetic_n=2)
    return _json(gen.audit(lm, rel, queries, gen.Settings(max_new_tokens=6, n_boot=500), prepared=prepared))


def _json(result: GeneralizationResult) -> dict[str, Any]:
    """The result as the check writes it."""
    return result.model_dump(mode="json", exclude_unset=True)


def _data(result: dict[str, Any]) -> dict[str, Any]:
    """A report check's data, less `result`, as the check writes it."""
    from kvgraft.audit.checks.generalization import report_check_data

    return report_check_data(GeneralizationResult.model_validate(result)).model_dump(mode="json", exclude_none=True)


def _runs(result: dict[str, Any], cond: str) -> dict[str, dict[str, Any]]:
    return {r["query_id"]: r for r in result["runs"] if r["condition"] == cond}


# ---------------------------------------------------------------- condition (d) == (b) / (c)


def test_plan_covers_every_condition(tiny_result: dict[str, Any], tiny_library: tuple[Any, VerifiedRelease, Path]) -> None:
    _, rel, _ = tiny_library
    assert tiny_result["plan"]["queries"] == {"library": 4, "held_out": 4, "synthetic": 2}
    lib_ids = {e["meta"]["problem_id"] for e in rel.release.entries}
    assert set(_runs(tiny_result, "none")) == {q["id"] for q in tiny_result["queries"]}
    assert set(_runs(tiny_result, "own")) == set(_runs(tiny_result, "own_text")) == lib_ids
    assert set(_runs(tiny_result, "other")) == set(_runs(tiny_result, "other_text")) == {q["id"] for q in tiny_result["queries"]}


def test_text_condition_reproduces_the_graft_token_for_token(tiny_result: dict[str, Any]) -> None:
    for graft, text in (("own", "own_text"), ("other", "other_text")):
        g, t = _runs(tiny_result, graft), _runs(tiny_result, text)
        assert g and set(g) == set(t)
        for qid in g:
            assert g[qid]["entry_id"] == t[qid]["entry_id"]
            assert [s["token_ids"] for s in g[qid]["samples"]] == [s["token_ids"] for s in t[qid]["samples"]]
            assert g[qid]["samples"][0]["decode_tokens"] > 0
            # the graft restores the prefix; the text condition prefills it
            assert g[qid]["tokens"]["restored"] == t[qid]["tokens"]["prefill"] - t[qid]["tokens"]["prompt"] > 0
            assert g[qid]["tokens"]["prefill"] == g[qid]["tokens"]["prompt"] and t[qid]["tokens"]["restored"] == 0
            assert g[qid]["kv_bytes_restored"] > 0 and t[qid]["kv_bytes_restored"] == 0
        eq = tiny_result["equality"][graft]
        assert eq == {"graft": graft, "text": text, "n": len(g), "equal": len(g), "mismatches": []}


@pytest.mark.parametrize("family", ["gemma3", "qwen3"])
def test_text_condition_equals_graft_with_sampling(family: str, tiny_lm: Callable[[str], Any], tmp_path: Path) -> None:
    lm = tiny_lm(family)
    library.build(lm, PROBLEMS[:4], tmp_path / "lib", library_fraction=1.0, settings=library.BuildSettings(generate=False),
                  schedule=Schedule(chunk_tokens=7))
    rel = verified(tmp_path / "lib", BUILT)
    lib = gen.Library(rel)
    settings = gen.Settings(max_new_tokens=5, samples=3, temperature=1.0, seed=11)
    q = gen.Query(PROBLEMS[1], "library")
    tasks = [t for t in gen.plan(lib, [q], settings) if t.condition != "none"]
    assert [t.condition for t in tasks] == ["own", "own_text", "other", "other_text"]
    out = {t.condition: gen.run_query(lm, rel, t, settings) for t in tasks}
    for graft, text in (("own", "own_text"), ("other", "other_text")):
        a = [s["token_ids"] for s in out[graft]["samples"]]
        b = [s["token_ids"] for s in out[text]["samples"]]
        assert len(a) == 3 and a == b
    # different samples of one run draw different random numbers
    assert len({tuple(s["token_ids"]) for s in out["own"]["samples"]}) > 1


def test_no_graft_starts_the_sequence_as_every_entry_does(tiny_lm: Callable[[str], Any], tiny_dir: Callable[[str], Path],
                                                          tmp_path: Path) -> None:
    """(a) has no prefix, so its query starts the sequence with the tokens the release's schedule puts there: a
    tokenizer that adds a beginning-of-sequence token (Gemma's does; without it a Gemma produces noise) gets it in
    (a) as in every entry that (b), (c) and (d) start from, so that the graft is what differs between them."""
    from tokenizers.processors import TemplateProcessing
    from transformers import AutoTokenizer

    from kvgraft.inference.models import wrap
    from kvgraft.inference.runtime import encode, new_cache, prefill

    tok = AutoTokenizer.from_pretrained(str(tiny_dir("llama")))
    tok._tokenizer.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.bos_token_id)])
    lm = wrap(tiny_lm("llama").model, tok, "tiny llama, a tokenizer adding <s>")
    library.build(lm, PROBLEMS[:2], tmp_path / "lib", library_fraction=1.0, settings=library.BuildSettings(generate=False))
    rel = verified(tmp_path / "lib", BUILT)
    assert all(e["token_ids"][0] == tok.bos_token_id for e in rel.release.entries)
    q = gen.Query(PROBLEMS[1], "library")
    (task,) = [t for t in gen.plan(gen.Library(rel), [q], gen.Settings()) if t.condition == "none"]
    run = gen.run_query(lm, rel, task, gen.Settings(max_new_tokens=4, track_memory=False))
    ids = [tok.bos_token_id, *encode(lm, gen.query_text(q.problem.problem))]
    assert run["tokens"]["prompt"] == len(ids)
    cache, logits = prefill(lm, ids, Schedule(), new_cache(lm))
    assert run["samples"][0]["token_ids"] == library.decode(lm, cache, logits, max_new_tokens=4).token_ids


PREAMBLE = "Problem: Tom has 3 cups and buys 4 more. How many cups does he have?\nSolution: 3 + 4 = 7.\nAnswer: 7\n\n"


def test_a_preamble_is_asked_before_every_query_in_every_condition(
        tiny_library: tuple[Any, VerifiedRelease, Path]) -> None:
    """A base model that writes no answer line is shown worked examples before the query: the same text in every
    condition (so it moves none against another), recorded in the result, and (d) still reproduces the graft."""
    from kvgraft.inference.runtime import encode, new_cache, prefill

    lm, rel, _ = tiny_library
    q = gen.Query(PROBLEMS[1], "library")
    settings = gen.Settings(max_new_tokens=4, track_memory=False, n_boot=100, preamble=PREAMBLE)
    asked = encode(lm, gen.query_text(q.problem.problem, PREAMBLE))
    assert len(asked) > len(encode(lm, gen.query_text(q.problem.problem))) + 10
    for task in gen.plan(gen.Library(rel), [q], settings):
        run = gen.run_query(lm, rel, task, settings)
        assert run["tokens"]["prompt"] == len(asked), task.condition
        if task.condition == "none":
            cache, logits = prefill(lm, asked, Schedule(), new_cache(lm))
            assert run["samples"][0]["token_ids"] == library.decode(lm, cache, logits, max_new_tokens=4).token_ids
    result = _json(gen.audit(lm, rel, [q], settings))
    assert result["settings"]["preamble"] == PREAMBLE
    assert all(eq["equal"] == eq["n"] for eq in result["equality"].values())
    assert any("after the same preamble of" in s for s in result["statements"])
    validate(result, gen.SCHEMA, "result with a preamble")


def test_a_preamble_holding_a_query_s_problem_is_refused(tiny_library: tuple[Any, VerifiedRelease, Path]) -> None:
    from kvgraft.errors import InputError

    lm, rel, _ = tiny_library
    q = gen.Query(PROBLEMS[1], "library")
    shown = f"Problem: {q.problem.problem.upper()}\nSolution: {q.problem.solution}\nAnswer: {q.problem.answer}\n\n"
    with pytest.raises(InputError, match=f"holds the problem of query {q.problem.id!r}"):
        gen.audit(lm, rel, [q], gen.Settings(max_new_tokens=2, preamble=PREAMBLE + shown))


def test_text_condition_equals_graft_on_smollm2(smollm2: Any, tmp_path: Path) -> None:
    short = [Problem("s-pens", "A box holds 8 pens. How many pens are in 7 boxes?", "56", "7 * 8 = 56 pens.", "test"),
             Problem("s-apples", "Mia has 12 apples and gives away 5. How many are left?", "7", "12 - 5 = 7 apples.", "test")]
    library.build(smollm2, short, tmp_path / "lib", library_fraction=1.0, settings=library.BuildSettings(generate=False))
    rel = verified(tmp_path / "lib", BUILT)
    queries = [gen.Query(p, "library") for p in short]
    result = _json(gen.audit(smollm2, rel, queries[:1], gen.Settings(max_new_tokens=8, n_boot=200)))
    for graft in ("own", "other"):
        assert result["equality"][graft]["n"] == 1
        assert result["equality"][graft]["equal"] == 1, result["equality"][graft]["mismatches"]
        g, t = _runs(result, graft), _runs(result, gen.AS_TEXT[graft])
        assert g and g.keys() == t.keys(), (graft, sorted(g), sorted(t))
        for qid in g:
            assert g[qid]["samples"][0]["token_ids"] == t[qid]["samples"][0]["token_ids"]
    validate(result, gen.SCHEMA, "smollm2 result")


# ---------------------------------------------------------------- exclusion of the query's own entry from (c)


def test_own_entry_is_never_used_for_the_other_condition(tiny_result: dict[str, Any],
                                                         tiny_library: tuple[Any, VerifiedRelease, Path]) -> None:
    _, rel, _ = tiny_library
    meta = {e["id"]: e["meta"] for e in rel.release.entries}
    hashes = {q["id"]: q["problem_hash"] for q in tiny_result["queries"]}
    for cond in ("other", "other_text"):
        runs = _runs(tiny_result, cond)
        assert runs, f"no {cond} runs to check"
        for qid, run in runs.items():
            assert run["entry_id"] != qid
            assert meta[run["entry_id"]]["problem_id"] != qid
            assert meta[run["entry_id"]]["problem_hash"] != hashes[qid]
            assert qid in run["selection"]["excluded"] or qid not in meta


def test_exclusion_by_problem_hash_as_well_as_id(tiny_library: tuple[Any, VerifiedRelease, Path]) -> None:
    _, rel, _ = tiny_library
    lib = gen.Library(rel)
    entry = rel.release.entries[0]
    original = entry["meta"]["problem"]
    # the same problem under another id, differing only in case and spacing: same problem hash
    copy = Problem("renamed-copy", "  " + original.upper().replace(" ", "   "), "0", None, "elsewhere")
    assert problem_hash(copy.problem) == entry["meta"]["problem_hash"]
    # without exclusion the nearest entry is the problem itself
    assert lib.index.select(copy.problem, "nearest").id == entry["id"]
    assert lib.own_ids(copy) == [entry["id"]]
    own = lib.own(copy)
    assert own is not None and own.id == entry["id"] and own.matched_by == "problem_hash"
    other = lib.other(copy, "nearest")
    assert other.id is not None and other.id != entry["id"] and entry["id"] in (other.excluded or [])
    # and by id: a query with the library problem's id but reworded text
    reworded = Problem(entry["meta"]["problem_id"], "Completely different wording about trains and apples.", "1")
    assert lib.other(reworded, "bm25").id != entry["id"]
    settings = gen.Settings(max_new_tokens=2)
    tasks = gen.plan(lib, [gen.Query(copy, "held_out"), gen.Query(reworded, "held_out")], settings)
    for t in tasks:
        if t.condition in ("other", "other_text"):
            assert t.entry_id != entry["id"]
    assert {t.condition for t in tasks if t.entry_id == entry["id"]} == {"own", "own_text"}


def test_policy_controls_the_conditions(tiny_library: tuple[Any, VerifiedRelease, Path]) -> None:
    _, rel, _ = tiny_library
    lib = gen.Library(rel)
    q = [gen.Query(PROBLEMS[0], "held_out")]
    assert {t.condition for t in gen.plan(lib, q, gen.Settings(policy="none"))} == {"none"}
    own_exists = lib.own(PROBLEMS[0]) is not None
    exact = {t.condition for t in gen.plan(lib, q, gen.Settings(policy="exact"))}
    assert exact == ({"none", "own", "own_text"} if own_exists else {"none"})
    nearest = [t for t in gen.plan(lib, q, gen.Settings(policy="nearest")) if t.condition == "other"]
    assert len(nearest) == 1 and nearest[0].selection is not None
    assert nearest[0].selection.score is not None and 0 < nearest[0].selection.score <= 1
    with pytest.raises(Exception, match="--policy"):
        gen.Settings(policy="closest")
    with pytest.raises(Exception, match="--temperature"):
        gen.Settings(samples=2)


def test_library_problems_without_a_trace_are_reported(tiny_lm: Callable[[str], Any], tmp_path: Path) -> None:
    from kvgraft.generalization import answers
    from kvgraft.generalization.problems import split

    lm = tiny_lm("llama")
    problems_file = _jsonl(tmp_path / "p.jsonl", PROBLEMS)
    probs, rec = library.load_problems(str(problems_file))
    _, _, split_rec = split(probs, 0.5, "m")
    rejected = split_rec["library_ids"][0]
    rejected_prompt = library.prompt_text(next(p.problem for p in probs if p.id == rejected))

    def check(text: str, gold: str) -> bool:  # the checker refuses one problem's reference trace
        return not text.startswith(rejected_prompt) and answers.check(text, gold)

    build = library.build(lm, probs, tmp_path / "lib", library_fraction=0.5, salt="m", source=rec,
                          settings=library.BuildSettings(generate=False), check=check)
    assert [u["problem_id"] for u in build["unsolved"]] == [rejected]
    rel = verified(tmp_path / "lib", BUILT)
    queries, prepared = gen.prepare(rel)
    assert prepared.split is not None and prepared.split["library_ids"] == split_rec["library_ids"]  # reproduced
    assert prepared.library_missing == [rejected]
    assert any(rejected in n for n in prepared.notes)
    result = _json(gen.audit(lm, rel, queries[:4], gen.Settings(max_new_tokens=2, n_boot=100), prepared=prepared))
    assert result["library"]["missing"] == [rejected]
    assert rejected not in _runs(result, "own") and rejected in _runs(result, "none")
    assert any(rejected in s for s in result["statements"])


# ---------------------------------------------------------------- leakage split


def test_leakage_split_matches_the_per_query_audit(tiny_result: dict[str, Any],
                                                   tiny_library: tuple[Any, VerifiedRelease, Path]) -> None:
    _, rel, _ = tiny_library
    by_id = {p.id: p for p in PROBLEMS}
    texts = {e["id"]: e["source"]["text"] for e in rel.release.entries}
    baseline = _runs(tiny_result, "none")
    for cond in ("own", "other"):
        runs = _runs(tiny_result, cond)
        expected = {qid: leakage_for(texts[r["entry_id"]], by_id[qid]).contaminated for qid, r in runs.items() if qid in by_id}
        for qid, flag in expected.items():
            assert runs[qid]["leakage"]["contaminated"] is flag
        sp = tiny_result["leakage"]["by_condition"][cond]
        dirty = [q for q, r in runs.items() if r["leakage"]["contaminated"]]
        clean = [q for q, r in runs.items() if not r["leakage"]["contaminated"]]
        assert sorted(sp["contaminated"]["query_ids"]) == sorted(dirty)
        assert sorted(sp["clean"]["query_ids"]) == sorted(clean)
        for part, ids in (("clean", clean), ("contaminated", dirty)):
            assert sp[part]["n"] == len(ids)
            assert sp[part]["k"] == sum(runs[q]["correct"] for q in ids)
            assert sp[part]["baseline"]["n"] == len(ids)
            assert sp[part]["baseline"]["k"] == sum(baseline[q]["correct"] for q in ids)
        for flag in ("answer_in_entry", "problem_in_entry", "solution_in_entry"):
            assert sp["flags"][flag] == sum(r["leakage"][flag] for r in runs.values()), flag
    # the own solution holds the query's problem text and answer: every replay is contaminated
    own = tiny_result["leakage"]["by_condition"]["own"]
    assert own["clean"]["n"] == 0 and own["contaminated"]["n"] == 4 and own["flags"]["problem_in_entry"] == 4
    # answers 36 are shared by three problems: an entry of one leaks the answer of the others
    p36 = [e for e in rel.release.entries if e["answer"] == "36"]
    if p36:
        q = next(p for p in PROBLEMS if p.answer == "36" and p.id != p36[0]["meta"]["problem_id"])
        assert leakage_for(p36[0]["source"]["text"], q).answer_in_entry


def _fake_run(qid: str, group: str, cond: str, correct: bool, contaminated: bool | None, decode: int,
              upstream: int = 0) -> dict[str, Any]:
    leak = None if contaminated is None else {"answer_in_entry": contaminated, "problem_in_entry": False,
                                              "solution_in_entry": False, "contaminated": contaminated}
    return {"query_id": qid, "group": group, "condition": cond, "entry_id": None if cond == "none" else "e",
            "entry_problem_id": None, "selection": None, "gold": "1",
            "samples": [{"token_ids": [1] * decode, "text": "", "extracted": None, "correct": correct, "stop": "eos",
                         "decode_tokens": decode, "seconds": 0.0}],
            "correct": correct, "n_correct": int(correct), "n_samples": 1,
            "tokens": {"decode": decode, "prompt": 3, "prefill": 3, "restored": 0 if cond == "none" else 10,
                       "prefix": 0 if cond == "none" else 10, "attended_max": 3 + decode + (0 if cond == "none" else 10)},
            "kv_bytes_restored": 0, "upstream_tokens": upstream, "upstream_tokens_all": upstream,
            "seconds": {"restore": 0.0, "prefill": 0.0, "decode": 0.0, "total": 1.0},
            "energy": {"joules": 2.0, "method": "estimate", "is_estimate": True},
            "memory": {"peak_rss_bytes": None, "rss_before_bytes": None, "note": "not tracked"}, "leakage": leak}


def test_aggregate_split_statistics_and_ledger_arithmetic(tiny_library: tuple[Any, VerifiedRelease, Path]) -> None:
    _, rel, _ = tiny_library
    queries = [gen.Query(Problem(f"q{i}", f"problem {i}", "1"), "held_out") for i in range(6)]
    # a: right on q0 only; c: right on q0..q3 (q1..q3 contaminated), wrong on q4, q5 (clean)
    runs = [_fake_run(f"q{i}", "held_out", "none", i == 0, None, 10) for i in range(6)]
    runs += [_fake_run(f"q{i}", "held_out", "other", i < 4, 1 <= i <= 3, 4, upstream=100) for i in range(6)]
    runs[-3]["leakage"]["solution_in_entry"] = True  # q3: its entry also holds the query's solution
    settings = gen.Settings(n_boot=300)
    model = Model(spec="x", identity="0" * 64, release_identity="0" * 64, forced=False)
    result = _json(gen.aggregate(model, rel, queries, [Run.model_validate(r) for r in runs], settings, context_length=512))
    sp = result["leakage"]["by_condition"]["other"]
    assert (sp["contaminated"]["k"], sp["contaminated"]["n"]) == (3, 3)
    assert (sp["contaminated"]["baseline"]["k"], sp["contaminated"]["baseline"]["n"]) == (0, 3)
    assert (sp["clean"]["k"], sp["clean"]["n"]) == (1, 3)
    assert (sp["clean"]["baseline"]["k"], sp["clean"]["baseline"]["n"]) == (1, 3)
    assert sp["flags"] == {"answer_in_entry": 3, "problem_in_entry": 0, "solution_in_entry": 1}
    held = next(c for c in result["comparisons"] if c["scope"] == "held_out")
    assert (held["mcnemar"]["b"], held["mcnemar"]["c"]) == (0, 3)
    assert held["mcnemar"]["p_exact"] == pytest.approx(0.25) and not held["significant"]
    assert "not significant" in held["verdict"]
    cond = {c["condition"]: c for c in result["conditions"]}
    assert (cond["other"]["k"], cond["other"]["n"]) == (4, 6)
    lo, hi = cond["other"]["interval"]
    assert lo < 4 / 6 < hi
    led = result["ledger"]["per_condition"]["other"]
    assert led["decode_tokens"] == 24 and led["budget_tokens"] == 60
    assert led["decode_vs_budget"] == pytest.approx(24 / 60)
    assert led["with_upstream_attributed"] == pytest.approx((24 + 600) / 60)
    lib_up = result["ledger"]["library"]["upstream_tokens"]
    assert lib_up == sum(e["meta"]["upstream"]["tokens"] for e in rel.release.entries)
    assert result["ledger"]["library"]["queries_served"] == 6
    assert led["with_upstream_amortized"] == pytest.approx((24 + lib_up) / 60)
    assert result["ledger"]["per_condition"]["none"]["decode_vs_budget"] == pytest.approx(1.0)
    assert result["context"]["attended_at_once_max"] == 3 + 4 + 10 and result["context"]["model_context_tokens"] == 512
    # a fixed budget replaces condition a's decode tokens
    fixed = _json(gen.aggregate(model, rel, queries, [Run.model_validate(r) for r in runs], gen.Settings(budget=8, n_boot=300)))
    assert fixed["ledger"]["per_condition"]["other"]["decode_vs_budget"] == pytest.approx(24 / 48)


# ---------------------------------------------------------------- result document, report data, CLI


def test_result_is_valid_against_the_schema(tiny_result: dict[str, Any]) -> None:
    validate(tiny_result, gen.SCHEMA, "result")
    json.dumps(tiny_result)
    broken = {k: v for k, v in tiny_result.items() if k != "runs"}
    with pytest.raises(SchemaError, match="runs"):
        validate(broken, gen.SCHEMA, "broken")
    bad_run = json.loads(json.dumps(tiny_result))
    bad_run["runs"][0]["condition"] = "sideways"
    with pytest.raises(SchemaError):
        validate(bad_run, gen.SCHEMA, "bad run")


def test_report_check_data_fits_the_audit_report_schema(tiny_result: dict[str, Any]) -> None:
    from kvgraft.schema import validate_part

    # The report's rule for a generalization check refers to this part of the kind's schema file (tests/results).
    data = _data(tiny_result)
    validate_part(data, gen.SCHEMA, "$defs/data", "report data")
    with pytest.raises(SchemaError, match="p_value"):
        validate_part({**data, "mcnemar": [{**data["mcnemar"][0], "p_value": 2}]}, gen.SCHEMA, "$defs/data", "bad")
    assert len(data["conditions"]) == len(tiny_result["conditions"])
    assert all(m["p_value"] <= 1 for m in data["mcnemar"])


@pytest.mark.parametrize("width", [220, 80])
def test_render_shows_every_part(tiny_result: dict[str, Any], width: int) -> None:
    from rich.console import Console

    from kvgraft.render.generalization import renderables

    console = Console(record=True, width=width)
    for r in renderables(tiny_result, console):
        console.print(r)
    text = console.export_text()
    for label in LABELS.values():
        assert label in " ".join(text.split()), label
    for needle in ("Wilson", "McNemar", "mid-p", "not significant", "clean", "contaminated", "ledger", "upstream",
                   "context accounting", "ESTIMATE", "decode / budget"):
        assert needle in text, needle
    assert "…" not in text and max(map(len, text.splitlines())) <= width  # wrapped, not cut
    from kvgraft.audit.checks import KINDS, view

    # A report's face of this result: its check's data as the audit run writes it (the report schema requires
    # `conditions` beside `result`).
    kind = KINDS["generalization"]
    face = kind.face(view(kind, {**_data(tiny_result), "result": tiny_result}))
    assert "reproduce each graft's output" in face.verdict and any(f.startswith("replay") for f in face.figures)


# ---------------------------------------------------------------- every schema-valid result renders

def _members(obj: Any, path: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    """One path per kind of member: dict keys; of a list, its first item; of a map keyed by condition, its first
    condition (the others have the same shape)."""
    found: list[tuple[str | int, ...]] = []
    if isinstance(obj, dict):
        keyed_by_condition = bool(obj) and set(obj) <= set(CONDITIONS)
        for key, value in list(obj.items())[:1] if keyed_by_condition else obj.items():
            found += [(*path, key), *_members(value, (*path, key))]
    elif isinstance(obj, list) and obj:
        found += _members(obj[0], (*path, 0))
    return found


def _without(doc: Any, path: tuple[str | int, ...]) -> Any:
    """`doc` less the member at `path`: the containers on the path copied, the rest shared."""
    copied = copy.copy(doc)
    if len(path) == 1:
        del copied[path[0]]
    else:
        copied[path[0]] = _without(doc[path[0]], path[1:])
    return copied


def test_a_result_the_schema_accepts_renders_whatever_member_it_lacks(tiny_result: dict[str, Any]) -> None:
    """The generalization renderer reads what generalization-result.v1.json requires: a result lacking any one
    member is refused by the schema or drawn whole (a renderer never meets a KeyError)."""
    from rich.console import Console

    from kvgraft import schema
    from kvgraft.render.generalization import renderables

    result = json.loads(json.dumps(tiny_result))  # as written and read back
    validate(result, "generalization-result.v1.json", "result")
    accepts = schema._fast("generalization-result.v1.json").is_valid
    drawn, refused, broke = 0, 0, []
    for path in _members(result):
        doc = _without(result, path)
        if not accepts(doc):  # what `validate` refuses (it then asks the reference validator for its message)
            refused += 1
            continue
        console = Console(record=True, width=160, file=io.StringIO())
        try:
            for part in renderables(doc, console):
                console.print(part)
            drawn += 1
        except (KeyError, TypeError, IndexError, AttributeError) as exc:
            broke.append(f"{'.'.join(map(str, path))}: {type(exc).__name__}: {exc}")
    assert refused > 50 and drawn > 10, (refused, drawn)  # the control: both outcomes are reached
    assert not broke, f"{len(broke)} members the renderer reads but the schema does not require: {broke[:20]}"


def test_cli_build_and_audit(tiny_dir: Callable[[str], Path], tmp_path: Path) -> None:
    from kvgraft.cli import app

    problems_file = _jsonl(tmp_path / "problems.jsonl", PROBLEMS)
    model = str(tiny_dir("llama"))
    runner = CliRunner()
    r = runner.invoke(app, ["library", "build", "--source", str(problems_file), "--library-fraction", "0.5", "--salt", "c",
                            "--out", str(tmp_path / "lib"), "--model", model, "--no-generate"])
    assert r.exit_code == 0, r.output
    assert "4 reference" in r.output
    out_json = tmp_path / "result.json"
    r = runner.invoke(app, ["audit", "generalization", "--library", str(tmp_path / "lib"), "--synthetic", "2",
                            "--max-new-tokens", "4", "--model", model, "--out", str(out_json)])
    assert r.exit_code == 0, r.output
    doc = json.loads(out_json.read_text())
    validate(doc, gen.SCHEMA, str(out_json))
    assert doc["plan"]["split"]["salt"] == "c"  # taken from the library's record
    assert doc["plan"]["queries"] == {"library": 4, "held_out": 4, "synthetic": 2}
    for needle in ("McNemar", "Wilson", "clean", "ledger", "context accounting"):  # the CLI runner's console is 80 wide
        assert needle in r.output

    r = runner.invoke(app, ["audit", "generalization", "--library", str(tmp_path / "lib"), "--samples", "2", "--model", model])
    assert r.exit_code == 2 and "--temperature" in r.output
    r = runner.invoke(app, ["audit", "generalization", "--library", str(tmp_path / "lib"), "--model",
                            str(tiny_dir("qwen3")), "--max-new-tokens", "2", "--quiet"])
    assert r.exit_code == 3  # another model's identity


def test_cli_audit_checks_the_librarys_signature_as_verify_does(tiny_dir: Callable[[str], Path], tmp_path: Path) -> None:
    """`audit generalization --key` verifies the library's signature before any model loads, with the exit code and
    line `kvgraft verify` gives for the same options; the signer's own key lets the audit run (the control)."""
    from kvgraft.cli import app

    problems_file = _jsonl(tmp_path / "problems.jsonl", PROBLEMS)
    model = str(tiny_dir("llama"))
    runner = CliRunner()
    lib = str(tmp_path / "lib")
    assert runner.invoke(app, ["library", "build", "--source", str(problems_file), "--library-fraction", "0.5",
                               "--out", lib, "--model", model, "--no-generate"]).exit_code == 0
    for name in ("signer", "other"):
        assert runner.invoke(app, ["keygen", "--out", str(tmp_path / name)]).exit_code == 0
    base = ["audit", "generalization", "--library", lib, "--max-new-tokens", "2", "--model", model, "--quiet"]
    unsigned = runner.invoke(app, [*base, "--key", str(tmp_path / "signer.pub.pem"), "--require-signature"])
    verify = runner.invoke(app, ["verify", lib, "--key", str(tmp_path / "signer.pub.pem"), "--require-signature"])
    assert unsigned.exit_code == verify.exit_code != 0, unsigned.output
    assert runner.invoke(app, ["sign", lib, "--key", str(tmp_path / "signer.key.pem")]).exit_code == 0
    wrong = runner.invoke(app, [*base, "--key", str(tmp_path / "other.pub.pem")])
    verify = runner.invoke(app, ["verify", lib, "--key", str(tmp_path / "other.pub.pem")])
    assert wrong.exit_code == verify.exit_code == 1, wrong.output
    assert "signature" in wrong.output and "loading" not in wrong.output
    right = runner.invoke(app, [*base, "--key", str(tmp_path / "signer.pub.pem"), "--require-signature",
                                "--out", str(tmp_path / "g.json")])
    assert right.exit_code == 0, right.output
    from kvgraft.signing import keys

    # The result states whose library it audited, as `audit run`'s report does.
    stated = json.loads((tmp_path / "g.json").read_text())["release_signature"]
    assert stated["checked"] and stated["key_ids"] == [keys.key_id(keys.load_public_key(tmp_path / "signer.pub.pem"))]


@pytest.mark.slow
def test_acceptance_plan_on_smollm2_within_ten_minutes(tmp_path: Path) -> None:
    """12 library + 12 held-out GSM8K problems and 12 synthetic ones, library build + audit, on CPU, as a user runs it."""
    import subprocess
    import sys

    kvgraft = Path(sys.executable).parent / "kvgraft"
    t0 = time.perf_counter()
    build = subprocess.run([str(kvgraft), "library", "build", "--source", "gsm8k", "--limit", "24", "--library-fraction",
                            "0.5", "--out", str(tmp_path / "lib"), "--device", "cpu"], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(kvgraft), "audit", "generalization", "--library", str(tmp_path / "lib"), "--source", "gsm8k",
                          "--limit", "24", "--synthetic", "12", "--device", "cpu", "--out", str(tmp_path / "g.json")],
                         capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
    elapsed = time.perf_counter() - t0
    assert run.returncode == 0, run.stderr
    doc = json.loads((tmp_path / "g.json").read_text())
    validate(doc, gen.SCHEMA, "acceptance result")
    assert doc["plan"]["queries"] == {"library": 12, "held_out": 12, "synthetic": 12}
    assert all(eq["equal"] == eq["n"] for eq in doc["equality"].values())
    for label in LABELS.values():
        assert label in run.stdout
    for needle in ("McNemar", "clean", "contaminated", "ledger", "context accounting"):
        assert needle in run.stdout
    assert elapsed < 600, elapsed


@pytest.mark.parametrize("meta", [None, {"kind": "other", "problem_id": "p", "problem_hash": "h", "problem": "x"},
                                  {"kind": library.ENTRY_KIND, "problem_id": 7, "problem_hash": "h", "problem": "x"}])
def test_a_release_whose_entries_carry_no_library_metadata_is_refused_naming_the_entry(
        tmp_path: Path, meta: dict[str, Any] | None) -> None:
    """The generalization audit reads a library: an entry without what `library build` writes (no meta, another
    kind, a problem id that is not a string) is refused naming the release and the entry."""
    from kvgraft.errors import InputError

    from release_factory import make_release

    make_release(tmp_path / "rel", entries=2, seed=3)
    rel = verified(tmp_path / "rel", OwnOutput("a release this test built"))
    if meta is not None:  # each entry given this meta, its digests recommitted
        import rewrite

        rewrite.manifest(tmp_path / "rel", lambda m: [e.update(meta=meta) for e in m["entries"]])
        rel = verified(tmp_path / "rel", OwnOutput("a release this test built"))
    with pytest.raises(InputError, match=r"rel: entry 'rec-000' carries no library metadata .*`kvgraft library build`"):
        gen.Library(rel)
