"""The controls check: planted effects on a generated fact library show that the audit finds what is there."""

from __future__ import annotations

from rich.console import Console, RenderableType

from kvgraft.audit.checks.kind import CheckKind, Ran
from kvgraft.audit.context import Context
from kvgraft.render.figures import Face, detectable, null_meaning
from kvgraft.render.html import esc, table
from kvgraft.render.text import hanging, num, ratio, styled
from kvgraft.render.text import table as text_table
from kvgraft.render.views import CONTROLS_HEAD, controls_rows
from kvgraft.results.base import JsonObject, Open
from kvgraft.results.controls import TYPED, ControlsData


class ControlsSettings(Open):
    """A plan's `[checks.controls]`: how many facts, the generator's seed, the decode budget per query."""

    n: int = 20
    seed: int = 0
    max_new_tokens: int = 32


class _Shows(Open):
    shows: bool


class _Judged(Open):
    """What the status rule reads of a sealed result."""

    controls: list[_Shows]


def run(ctx: Context, kc: JsonObject) -> Ran:
    from kvgraft.generalization import controls
    from kvgraft.signing.policy import OwnOutput
    from kvgraft.signing.verify import verified

    s = ControlsSettings.model_validate(kc)
    n, seed = s.n, s.seed
    ctx.say(f"controls: a library of {n} generated facts; replay, related-entry and null controls")
    controls.build(ctx.lm, ctx.out / "controls-release", n=n, seed=seed, overwrite=True)
    # Written here, read back here: verified as this run's own output (manifest, digests), not as a signed release.
    library = verified(ctx.out / "controls-release", OwnOutput("the controls check of kvgraft audit run"))
    k = controls.run(ctx.lm, library, n=n, seed=seed, max_new_tokens=s.max_new_tokens, executor=ctx.ex)
    shown = sum(c.shows for c in k.controls)
    ledger = {"controls": f"{n} generated facts, {k.decode_tokens:,} decode tokens, {k.seconds:.1f} s "
                          "(its own release, out/…/controls-release, not signed)"}
    return Ran(k.model_dump(mode="json", exclude_unset=True),
               f"{shown}/{len(k.controls)} controls show what they expect "
               f"({', '.join(c.name for c in k.controls if c.shows) or 'none'})", ledger=ledger)


def status(result: JsonObject) -> str:
    """passed when every control shows what it expects; incomplete when one does not (the audit could not
    show its power, or reported a difference where none was planted); failed is left to the checks that
    judge the graft itself."""
    return "passed" if all(c.shows for c in _Judged.model_validate(result).controls) else "incomplete"


def face(data: ControlsData) -> Face:
    controls = data.controls
    shows = sum(1 for c in controls if c.shows)
    verdict = f"{shows}/{len(controls)} controls show what they expect (an effect where one is planted, none where not)"
    figures = []
    nulls: list[tuple[int, float | None]] = []
    for c in controls:
        graft = "b" if c.condition == "own" else "c"
        det = c.detectable
        power = f" ({detectable(det.n, det.effect, det.power)})"
        if c.significant is False:
            nulls.append((det.n, det.effect))
        figures.append(f"{c.name}: {graft} {ratio(c.graft.k, c.graft.n)} vs a {ratio(c.baseline.k, c.baseline.n)}, "
                       f"p = {num(c.mcnemar.p_exact)}: {'shows it' if c.shows else 'does NOT show it'}{power}")
    if nulls:
        figures.append(null_meaning(nulls))
    return Face(verdict, figures)


def details(data: ControlsData, console: Console) -> list[RenderableType]:
    rows = controls_rows(data)
    out = [text_table(console, "controls: planted effects on a generated fact library", CONTROLS_HEAD, rows)]
    return out + [styled(hanging("•", s, console.width, indent=0)) for s in data.statements or []]


def html(data: ControlsData) -> str:
    notes = "".join(f"<li>{esc(x)}</li>" for x in data.statements or [])
    return table(CONTROLS_HEAD, [[esc(x) for x in row] for row in controls_rows(data)]) + f"<ul>{notes}</ul>"


KIND = CheckKind(
    name="controls", schema="controls-result.v1.json", status=status, stamps_status=True, run=run, face=face,
    details=details, html=html,
    known_data=("controls", "statements", "status", "kind", "format_version", "kvgraft_version", "model", "library",
                "generator", "settings", "seconds", "decode_tokens"), typed=TYPED)
