"""A check's face as data (its verdict line and deciding figures), and the phrases every kind's face shares."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvgraft.render.text import num


@dataclass(frozen=True)
class Face:
    verdict: str  # the sentence that decides the check's status
    figures: list[str] = field(default_factory=list)  # the few figures behind it


def points(effect: float) -> str:
    """A difference between two accuracies, in percentage points (not a percentage of anything)."""
    return f"{num(effect * 100, '.0f')} points"


def detectable(n: int, effect: float | None, power: float | None = None) -> str:
    """What `kvgraft.generalization.stats.detectable_effect` measured (at n, the smallest difference `effect` a test
    finds with `power`, 0.8 when not recorded), said as what it is."""
    if effect is None:
        return f"at n = {n} no difference can be significant"
    return f"smallest difference detectable at n = {n} with {0.8 if power is None else power:.0%} power: {points(effect)}"


def null_meaning(dets: list[tuple[int, float | None]]) -> str:
    """One line: what the non-significant results among these (n, smallest detectable difference) say, and what
    they do not."""
    sized = [(e, n) for n, e in dets if e is not None]
    if not sized:
        return "not significant here means nothing: at these sizes no difference could have been significant"
    effect, n = max(sized, key=lambda d: d[0])
    at = f"n = {n}" if len({m for _, m in sized}) == 1 else f"the smallest n, {min(m for _, m in sized)}"
    return (f"not significant means no difference of {points(effect)} or more is likely to have been missed "
            f"(at {at}); smaller differences are not excluded")
