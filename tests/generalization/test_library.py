"""The solution library: traces checked against the answer, upstream cost counted, failures listed."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from kvgraft.errors import InputError
from kvgraft.generalization import answers, library
from kvgraft.generalization.problems import Problem, arithmetic, problem_hash
from kvgraft.inference import runtime
from kvgraft.release.format import Release

from sample_problems import PROBLEMS as ALL_PROBLEMS

PROBLEMS = ALL_PROBLEMS[:4]
NO_SOLUTION = Problem("p-open", "Ann has 30 stamps and buys 12 more. How many stamps does she have?", "42", None, "test")


class CountingChecker:
    """answers.check, except that model attempts are accepted only from the `accept_at`-th one (1-based)."""

    def __init__(self, accept_at: int | None) -> None:
        self.accept_at = accept_at
        self.model_calls = 0

    def __call__(self, text: str, gold: str) -> bool:
        if text.startswith("Problem: "):  # a reference trace
            return answers.check(text, gold)
        self.model_calls += 1
        return self.accept_at is not None and self.model_calls >= self.accept_at


def _prompt_ids(lm: Any, problem: Problem) -> list[int]:
    return [int(t) for t in lm.tokenizer(library.prompt_text(problem.problem), add_special_tokens=True)["input_ids"]]


def _replay_attempt(lm: Any, problem: Problem, settings: library.BuildSettings, index: int) -> list[int]:
    """Decode attempt `index` again, independently of `solve`, to know how many tokens it generated."""
    cache, logits = runtime.prefill(lm, _prompt_ids(lm, problem), runtime.Schedule())
    gen = None
    if index > 0:
        gen = torch.Generator().manual_seed(library.sample_seed(settings.seed, "library", problem.id, index))
    out = library.decode(lm, cache, logits, max_new_tokens=settings.max_new_tokens,
                         temperature=settings.temperature if index else 0.0, generator=gen, eos=runtime.eos_ids(lm))
    return out.token_ids


def test_reference_trace_is_solved_and_captured(tiny_lm: Any, tmp_path: Path) -> None:
    lm = tiny_lm("llama")
    result = library.build(lm, PROBLEMS, tmp_path / "lib", library_fraction=1.0, salt="s",
                           settings=library.BuildSettings(generate=False))
    rel = Release.open(tmp_path / "lib")
    assert [e["id"] for e in rel.entries] == [p.id for p in PROBLEMS]
    assert result["counts"] == {"reference": 4, "model": 0, "unsolved": 0}
    for p, e in zip(PROBLEMS, rel.entries, strict=True):
        text = e["source"]["text"]
        assert text == f"Problem: {p.problem}\nSolution: {p.solution}\nAnswer: {p.answer}"
        assert answers.check(text, p.answer)
        assert e["answer"] == p.answer
        meta = e["meta"]
        assert meta["problem_id"] == p.id and meta["problem_hash"] == problem_hash(p.problem) and meta["source"] == "test"
        assert meta["trace"] == "reference"
        up = meta["upstream"]
        assert up["generated_tokens"] == 0 and up["failed_attempts"] == 0 and up["attempts"] == 1
        # the capture's prefill tokens are the entry's tokens, counted before the capture ran
        assert up["capture_prefill_tokens"] == e["num_tokens"] == len(lm.tokenizer(text)["input_ids"])
        assert up["tokens"] == e["num_tokens"]
        assert meta["split"]["salt"] == "s" and meta["split"]["library_fraction"] == 1.0
    assert result["totals"]["upstream_tokens"] == sum(e["num_tokens"] for e in rel.entries)


def test_failed_attempts_are_counted_until_one_is_accepted(tiny_lm: Any, tmp_path: Path) -> None:
    lm = tiny_lm("llama")
    settings = library.BuildSettings(attempts=3, temperature=1.0, seed=7, max_new_tokens=12)
    checker = CountingChecker(accept_at=3)  # greedy fails, sample 1 fails, sample 2 is accepted
    solved = library.solve(lm, NO_SOLUTION, settings, check=checker)
    assert solved.solved and solved.trace_kind == "model"
    assert [a["kind"] for a in solved.attempts] == ["greedy", "sample", "sample"]
    assert [a["correct"] for a in solved.attempts] == [False, False, True]
    assert solved.failed_attempts == 2
    expected = [len(_replay_attempt(lm, NO_SOLUTION, settings, i)) for i in range(3)]
    assert [a["generated_tokens"] for a in solved.attempts] == expected
    assert solved.generated_tokens == sum(expected)  # the failed attempts' tokens are included
    assert solved.generation_prefill_tokens == 3 * len(_prompt_ids(lm, NO_SOLUTION))
    assert solved.trace is not None and solved.trace.startswith(library.prompt_text(NO_SOLUTION.problem))

    result = library.build(lm, [NO_SOLUTION], tmp_path / "lib", library_fraction=1.0, settings=settings,
                           check=CountingChecker(accept_at=3))
    entry = Release.open(tmp_path / "lib").entries[0]
    up = entry["meta"]["upstream"]
    assert entry["meta"]["trace"] == "model"
    assert up["generated_tokens"] == sum(expected) and up["failed_attempts"] == 2 and up["attempts"] == 3
    assert up["capture_prefill_tokens"] == entry["num_tokens"]
    assert up["tokens"] == sum(expected) + entry["num_tokens"]
    assert up["tokens_all"] == up["tokens"] + up["generation_prefill_tokens"]
    assert result["totals"]["failed_attempts"] == 2


def test_reference_failing_the_check_falls_back_to_generation(tiny_lm: Any) -> None:
    lm = tiny_lm("llama")
    settings = library.BuildSettings(attempts=2, temperature=1.0, max_new_tokens=6)
    solved = library.solve(lm, PROBLEMS[0], settings, check=lambda _text, _gold: False)
    assert not solved.solved and solved.trace is None
    assert [a["kind"] for a in solved.attempts] == ["reference", "greedy", "sample", "sample"]
    assert solved.failed_attempts == 4
    assert solved.generated_tokens == sum(a["generated_tokens"] for a in solved.attempts) > 0


def test_unsolved_problems_are_listed_not_dropped(tiny_lm: Any, tmp_path: Path) -> None:
    lm = tiny_lm("llama")
    settings = library.BuildSettings(attempts=1, temperature=1.0, max_new_tokens=5)
    result = library.build(lm, [*PROBLEMS[:2], NO_SOLUTION], tmp_path / "lib", library_fraction=1.0, settings=settings,
                           check=CountingChecker(accept_at=None))
    assert [u["problem_id"] for u in result["unsolved"]] == [NO_SOLUTION.id]
    missing = result["unsolved"][0]
    assert missing["failed_attempts"] == 2
    assert missing["generated_tokens"] == sum(a["generated_tokens"] for a in missing["attempts"])
    assert result["totals"]["generated_tokens"] == missing["generated_tokens"]  # unsolved work is still upstream work
    assert [e["id"] for e in Release.open(tmp_path / "lib").entries] == [p.id for p in PROBLEMS[:2]]
    json.dumps(result)  # a plain JSON document

    with pytest.raises(InputError, match="no library problem has a solved trace"):
        library.build(lm, [NO_SOLUTION], tmp_path / "none", library_fraction=1.0, settings=settings,
                      check=CountingChecker(accept_at=None))
    assert not (tmp_path / "none").exists()


def test_split_takes_only_the_library_half(tiny_lm: Any, tmp_path: Path) -> None:
    lm = tiny_lm("llama")
    result = library.build(lm, PROBLEMS, tmp_path / "lib", library_fraction=0.5, salt="x",
                           settings=library.BuildSettings(generate=False))
    ids = {e["meta"]["problem_id"] for e in Release.open(tmp_path / "lib").entries}
    assert ids == set(result["split"]["library_ids"]) and len(ids) == 2
    assert not ids & set(result["split"]["held_out_ids"])


def test_decode_greedy_matches_an_explicit_argmax_loop_and_sampling_is_seeded(tiny_lm: Any) -> None:
    lm = tiny_lm("llama")
    ids = _prompt_ids(lm, PROBLEMS[0])
    cache, logits = runtime.prefill(lm, ids, runtime.Schedule())
    expected: list[int] = []
    for _ in range(10):  # written out here, independently of runtime.decode
        expected.append(int(torch.argmax(logits)))
        logits = runtime.forward(lm, cache, [expected[-1]])[-1]
    cache, logits = runtime.prefill(lm, ids, runtime.Schedule())
    got = library.decode(lm, cache, logits, max_new_tokens=10, stop_at_answer=False)
    assert got.token_ids == expected and got.stop == "max_new_tokens"

    def sampled(seed: int) -> list[int]:
        c, lg = runtime.prefill(lm, ids, runtime.Schedule())
        gen = torch.Generator().manual_seed(seed)
        return library.decode(lm, c, lg, max_new_tokens=10, temperature=1.5, generator=gen, stop_at_answer=False).token_ids

    assert sampled(3) == sampled(3)
    assert any(sampled(s) != expected for s in range(4))


def test_answer_line_stop_rule() -> None:
    assert library.answer_line_complete("12 - 5 = 7\nAnswer: 7\n")
    assert library.answer_line_complete("so the final answer is: 7\n")
    assert not library.answer_line_complete("12 - 5 = 7\nAnswer: 7")  # the line may still grow
    assert not library.answer_line_complete("Answer:\n")
    assert not library.answer_line_complete("no answer here\n")


def test_load_problems(tmp_path: Path) -> None:
    probs, rec = library.load_problems("synthetic", 3, synthetic_seed=5)
    assert len(probs) == 3 and rec == {"source": "synthetic", "limit": 3, "synthetic_seed": 5, "synthetic_version": 1}
    with pytest.raises(InputError, match="needs --limit"):
        library.load_problems("synthetic")
    probs, rec = library.load_problems("arithmetic", 4, synthetic_seed=2)
    assert [p.id for p in probs] == [p.id for p in arithmetic(4, 2)]
    assert rec == {"source": "arithmetic", "limit": 4, "synthetic_seed": 2, "synthetic_version": 1}
    with pytest.raises(InputError, match="--source arithmetic needs --limit"):
        library.load_problems("arithmetic")
    with pytest.raises(InputError, match="expected one of"):
        library.load_problems("nonsense")
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"id": p.id, "problem": p.problem, "answer": p.answer}) + "\n" for p in PROBLEMS))
    probs, rec = library.load_problems(str(path), 2)
    assert [p.id for p in probs] == ["p-apples", "p-pens"] and rec["limit"] == 2


def test_cli_build_json_prints_only_the_result(tiny_dir: Callable[[str], Path], tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from kvgraft.cli import app

    source = tmp_path / "problems.jsonl"
    source.write_text("".join(json.dumps({"id": p.id, "problem": p.problem, "answer": p.answer, "solution": p.solution})
                              + "\n" for p in PROBLEMS))
    args = ["library", "build", "--source", str(source), "--library-fraction", "1", "--out", str(tmp_path / "lib"),
            "--model", str(tiny_dir("llama")), "--no-generate", "--json"]
    bad = CliRunner().invoke(app, [*args, "--threads", "0"])
    assert bad.exit_code == 2 and "--threads must be >= 1" in bad.stderr and not (tmp_path / "lib").exists()
    torch_threads = torch.get_num_threads()
    r = CliRunner().invoke(app, [*args, "--threads", "1"])
    assert r.exit_code == 0, r.output
    assert torch.get_num_threads() == torch_threads  # --threads held for the build only
    doc = json.loads(r.stdout)  # stdout holds the document and nothing else
    assert doc["kind"] == library.BUILD_KIND
    assert doc["counts"] == {"reference": len(PROBLEMS), "model": 0, "unsolved": 0}
    assert [v["problem_id"] for v in doc["solved"]] == [p.id for p in PROBLEMS]
    assert doc["release"]["root_digest"] == Release.open(tmp_path / "lib").manifest["root_digest"]
