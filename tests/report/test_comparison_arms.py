"""The paired-comparisons table names each row's second arm by its own condition: c in the a-vs-c rows."""

from __future__ import annotations

from rich.console import Console

from kvgraft.render.generalization import comparisons_table


def _row(name: str, cond: str, correct_b: int) -> dict[str, object]:
    return {"name": name, "a": "none", "b": cond, "n": 10, "significant": False, "bootstrap": None,
            "mcnemar": {"n": 10, "correct_a": 3, "correct_b": correct_b, "b": 1, "c": 2, "p_exact": 1.0, "p_midp": 0.5}}


def test_a_vs_c_rows_say_c() -> None:
    console = Console(width=250, record=True)
    console.print(comparisons_table({"comparisons": [_row("replay (a vs b)", "own", 4),
                                                     _row("held-out generalization (a vs c)", "other", 7)]}, console))
    text = console.export_text()
    replay = next(line for line in text.splitlines() if "a vs b" in line)
    held = next(line for line in text.splitlines() if "a vs c" in line)
    assert "b: 4/10" in replay and "c: 7/10" in held and "b: 7/10" not in held, text
