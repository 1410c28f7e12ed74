"""The paired-comparisons table names each row's second arm by its own condition: c in the a-vs-c rows."""

from __future__ import annotations

from rich.console import Console

from kvgraft.render.generalization import comparisons_table
from kvgraft.results.generalization import Comparison


def _row(name: str, cond: str, correct_b: int) -> Comparison:
    mcnemar = {"n": 10, "correct_a": 3, "correct_b": correct_b, "b": 1, "c": 2, "p_exact": 1.0, "p_midp": 0.5,
               "alpha": 0.05, "significant": False, "verdict": "not significant"}
    return Comparison.model_validate({"name": name, "a": "none", "b": cond, "scope": "held_out", "query_ids": [],
                                      "n": 10, "significant": False, "bootstrap": None, "mcnemar": mcnemar,
                                      "verdict": "not significant"})


def test_a_vs_c_rows_say_c() -> None:
    console = Console(width=250, record=True)
    console.print(comparisons_table([_row("replay (a vs b)", "own", 4), _row("held-out generalization (a vs c)", "other", 7)],
                                    console))
    text = console.export_text()
    replay = next(line for line in text.splitlines() if "a vs b" in line)
    held = next(line for line in text.splitlines() if "a vs c" in line)
    assert "b: 4/10" in replay and "c: 7/10" in held and "b: 7/10" not in held, text
