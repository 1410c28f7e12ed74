"""The generalization audit's conditions: their names, labels and short letters (no torch, for renderers too)."""

from __future__ import annotations

from typing import Literal

CONDITIONS = ("none", "own", "other", "own_text", "other_text")
GRAFTED = ("own", "other")
AS_TEXT: dict[Literal["own", "other"], Literal["own_text", "other_text"]] = {"own": "own_text", "other": "other_text"}
LABELS = {
    "none": "a: no graft",
    "own": "b: own solution (replay)",
    "other": "c: nearest other entry",
    "own_text": "d(b): own solution as text",
    "other_text": "d(c): nearest other as text",
}
SHORT = {"none": "a", "own": "b", "other": "c", "own_text": "d(b)", "other_text": "d(c)"}
