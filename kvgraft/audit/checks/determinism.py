"""The determinism check: which conditions (threads, chunking, batching, dtype, kernel, device) change KV bytes."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console, RenderableType

from kvgraft.audit.checks.kind import CheckKind, Ran
from kvgraft.audit.context import Context
from kvgraft.render.figures import Face
from kvgraft.render.html import esc, table
from kvgraft.render.text import hanging, num, styled
from kvgraft.render.text import table as text_table
from kvgraft.render.views import determinism_model
from kvgraft.results.base import JsonObject
from kvgraft.results.determinism import TYPED, DeterminismData


def run(ctx: Context, dc: dict[str, Any]) -> Ran:
    """Under a plan's `[checks.determinism]` (length), and what `audit determinism` sets beyond a plan: gpu
    (whether CUDA conditions run when a GPU is present), progress. Loads its own models: not the Context's."""
    from kvgraft.recompute import determinism

    ctx.say("running the determinism matrix")
    d = determinism.matrix(ctx.plan.doc["model"]["spec"], length=dc.get("length", 128),
                           include_gpu=dc.get("gpu", True), progress=dc.get("progress"))
    # by alias: each condition's class is written `class`
    return Ran(d.model_dump(by_alias=True, exclude_unset=True), "\n".join(d.notes))


def status(result: JsonObject) -> str:
    """The matrix describes; it fails nothing. Incomplete when fewer than two conditions were compared."""
    conditions = result["conditions"]
    return "passed" if isinstance(conditions, list) and len(conditions) >= 2 else "incomplete"


def face(data: DeterminismData) -> Face:
    conds = data.conditions
    classes: dict[str, list[str]] = {}
    for c in conds:
        classes.setdefault(c.class_ or "?", []).append(c.name)
    device = data.environment.device_name if data.environment is not None else None
    where = f" on {device}" if device else ""
    verdict = (f"{len(classes)} distinct KV byte classes among {len(conds)} conditions{where} "
               "(it describes; it fails nothing)")
    baseline = data.baseline or ""
    figures = []
    for label, names in classes.items():
        if baseline in names:
            others = len(names) - 1
            figures.append(f"{label}: the baseline ({baseline})" + (f" and {others} more conditions" if others else ""))
        else:
            figures.append(f"{label}: {'; '.join(names)}")
    return Face(verdict, figures)


def details(data: DeterminismData, console: Console) -> list[RenderableType]:
    m = determinism_model(data)
    out: list[RenderableType] = []
    if m["conditions"]:
        rows = [[x.name, x.class_ or "?", num(x.max_ulp), num(x.max_abs), num(x.kl)] for x in m["conditions"]]
        out.append(text_table(console, f"KV byte classes: {m['classes']} among {len(m['conditions'])} conditions "
                                       "(same class = same bytes)", ["condition", "class", "max ULP", "max |diff|", "KL"],
                              rows))
    if m["rows"]:
        headers = ["entry"] + [x.name for x in m["conditions"]]
        rows = [[row["entry"]] + [lab for lab, _ in row["cells"]] for row in m["rows"]]
        out.append(text_table(console, "per entry (same letter in a row = same bytes)", headers, rows))
    return out + [styled(hanging("•", n, console.width, indent=0)) for n in data.notes or []]


def html(data: DeterminismData) -> str:
    m = determinism_model(data)
    out = ""

    def chip(label: str, colour: str) -> str:
        return f'<span class="mono" style="background:{colour};padding:1px 8px;border-radius:3px">{esc(label)}</span>'

    if m["conditions"]:
        rows = [[esc(x.name), chip(x.class_ or "?", m["colour"].get(x.class_ or "?", "#ddd")),
                 num(x.max_ulp), num(x.max_abs), num(x.kl),
                 f'<code>{esc(json.dumps(x.condition, sort_keys=True))}</code>' if x.condition else ""]
                for x in m["conditions"]]
        out += (f'<p class="muted">{m["classes"]} KV byte classes among {len(m["conditions"])} conditions; '
                "same class = byte-identical states.</p>")
        out += table(["condition", "class", "max ULP", "max |diff|", "KL", "settings"], rows, num=(2, 3, 4))
    if m["rows"]:
        headers = ["entry"] + [x.name for x in m["conditions"]]
        out += "<h3>per entry (same label in a row = same bytes)</h3>" + table(
            headers, [[esc(row["entry"])] + [chip(lab, col) for lab, col in row["cells"]] for row in m["rows"]])
    notes = data.notes or []
    if notes:
        out += "<ul>" + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>"
    return out


KIND = CheckKind(
    name="determinism", schema="determinism-result.v1.json", status=status, stamps_status=True, run=run, face=face,
    details=details, html=html, known_data=("conditions", "rows", "notes", "baseline", "length"), typed=TYPED)
