"""The face and the HTML say what the power figure is (a difference in points at a sample size) and what a null means."""

from __future__ import annotations

import copy
import html
import io
import json
from pathlib import Path
from typing import Any

from rich.console import Console

from kvgraft.audit.checks import KINDS, view
from kvgraft.audit.render_html import to_html
from kvgraft.audit.render_report import print_report
from kvgraft.generalization import stats
from kvgraft.render.figures import Face
from kvgraft.results.report import Report

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "report-example.json"


def _control(name: str, k_graft: int, k_base: int, p: float, significant: bool, n: int = 20) -> dict[str, Any]:
    split = {"clean": {"k": 0, "n": 0}, "contaminated": {"k": k_graft, "n": n}}
    return {"name": name, "expect": "x", "condition": "own" if name == "replay" else "nearest", "n": n,
            "graft": {"k": k_graft, "n": n}, "baseline": {"k": k_base, "n": n}, "mcnemar": {"p_exact": p},
            "significant": significant, "shows": True, "detectable": stats.detectable_effect(n), "split": split}


def controls_data() -> dict[str, Any]:
    return {"controls": [_control("replay", 20, 0, 1.9e-6, True), _control("null", 17, 17, 1.0, False)],
            "statements": []}


def expected(n: int) -> tuple[str, str]:
    det = stats.detectable_effect(n)
    pts = f"{det['effect'] * 100:.0f} points"
    return (f"smallest difference detectable at n = {n} with {det['power']:.0%} power: {pts}",
            f"not significant means no difference of {pts} or more is likely to have been missed")


def test_controls_face_words_the_power_figure_and_the_null() -> None:
    face = KINDS["controls"].face(view(KINDS["controls"], controls_data()))
    text = " ".join(face.figures)
    power, null = expected(20)
    assert text.count(power) == 2
    assert sum(null in f for f in face.figures) == 1  # one line, once
    assert "detectable at n = 20: " not in text and "%)" not in text


def test_generalization_face_words_the_power_figure_and_the_null() -> None:
    def comp(name: str, significant: bool, n: int) -> dict[str, Any]:
        p = 1.0 if not significant else 0.01
        mcnemar = {"n": n, "correct_a": 1, "correct_b": 1, "b": 0, "c": 0, "p_exact": p, "p_midp": p, "alpha": 0.05,
                   "significant": significant, "verdict": "v"}
        return {"name": name, "a": "none", "b": "own", "scope": "held_out", "query_ids": [], "n": n,
                "significant": significant, "mcnemar": mcnemar, "bootstrap": None, "verdict": "v",
                "detectable": stats.detectable_effect(n)}

    def face(*comps: dict[str, Any]) -> Face:
        kind = KINDS["generalization"]
        return kind.face(view(kind, {"result": {"kind": "kvgraft-generalization-result", "comparisons": list(comps)},
                                     "conditions": []}))

    face_ = face(comp("replay", False, 6), comp("held-out", True, 6))
    power, null = expected(6)
    assert sum(power in f for f in face_.figures) == 2 and sum(null in f for f in face_.figures) == 1
    # Nothing non-significant: no null line.
    assert not any(null in f for f in face(comp("held-out", True, 6)).figures)


def test_terminal_and_html_show_the_same_words() -> None:
    doc: dict[str, Any] = copy.deepcopy(json.loads(FIXTURE.read_text()))
    doc["checks"].append({"name": "controls", "kind": "controls", "status": "passed", "summary": "controls",
                          "data": controls_data()})
    report = Report.model_validate(doc)  # its stored verdict no longer counts every check: only the model is read
    power, null = expected(20)
    buf = io.StringIO()
    print_report(report, Console(file=buf, width=400, color_system=None))
    assert power in buf.getvalue() and null in buf.getvalue()
    page = html.unescape(to_html(report))
    assert power in page and null in page
    det = stats.detectable_effect(20)
    assert f"{det['effect'] * 100:.0f} points</td>" in page  # the details table, in points too
