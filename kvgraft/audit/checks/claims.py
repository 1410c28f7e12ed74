"""The claims check: a claims file checked for internal consistency and against this audit's measurements."""

from __future__ import annotations

from typing import Any, NotRequired

from rich.console import Console, RenderableType

from kvgraft.audit.checks.kind import CheckKind, Ran
from kvgraft.audit.context import Context
from kvgraft.render.figures import Face
from kvgraft.render.html import esc
from kvgraft.render.shapes import Claim, Readings
from kvgraft.render.terminal import claims_view
from kvgraft.render.text import hanging, styled
from kvgraft.render.views import readings_lines


class ClaimsData(Readings):
    """What the face, details and HTML read of a report check's `data` ($defs/claims_check of the report schema)."""

    counts: NotRequired[dict[str, int]]
    claims: NotRequired[list[Claim]]


def claim_verdicts(claims_check: dict[str, Any]) -> list[dict[str, Any]]:
    """The report's `claims` list from a claims-check result (kvgraft.claims.checker.check)."""
    return [{"id": c["id"], "text": c["text"], "kind": c["kind"], "claimed": c["claimed"], "verdict": c["verdict"],
             "reason": c["reason"]} for c in claims_check["claims"]]


def run(ctx: Context, cc: dict[str, Any]) -> Ran:
    from kvgraft.claims import checker as claims

    ctx.say("checking the claims file")
    cf = claims.load(ctx.plan.resolve(cc["file"]))
    checked = claims.check(cf, ctx.measured or None, measured_where="this audit's recompute check")
    ctx.claims = claim_verdicts(checked)
    if ctx.natural_kl is not None:
        # Say for which comparison exactness was measured, next to the verdict itself.
        for c in ctx.claims:
            if c.get("kind") == "exactness":
                contrast = "exactly 0" if ctx.natural_kl == 0.0 else f"{ctx.natural_kl:.3g}, not 0"
                c["reason"] += (" (under the release's recorded prefill schedule; against a one-shot prefill of "
                                f"prefix + probe without any cache, max KL = {contrast})")
    return Ran(checked, f"{len(ctx.claims)} claims checked against internal consistency"
                        + (" and this audit's measurements" if ctx.measured else ""))


def status(result: dict[str, Any]) -> str:
    """failed when a claim is contradicted or inconsistent; incomplete when no claim could be judged."""
    if result["failed"]:
        return "failed"
    judged = sum(n for v, n in result["counts"].items() if v != "not-testable")
    return "passed" if judged else "incomplete"


def face(data: ClaimsData) -> Face:
    counts = ", ".join(f"{n} {k}" for k, n in data.get("counts", {}).items() if n)
    claims = data.get("claims", [])
    bad = [c for c in claims if c.get("verdict") in ("contradicted", "inconsistent")]
    verdict = f"{len(claims)} claims: {counts or 'none'}" + ("" if bad else "; none contradicted or inconsistent")
    return Face(verdict, [f"reading: {r['summary']}" for r in data.get("readings", []) if r["figures"]])


def details(data: ClaimsData, console: Console) -> list[RenderableType]:
    out: list[RenderableType] = [styled(hanging("", line, console.width, indent=0)) for line in readings_lines(data)]
    return [*out, claims_view(console, data.get("claims", []))]


def html(data: ClaimsData) -> str:
    return "".join(f"<p>{esc(line)}</p>" for line in readings_lines(data))


KIND = CheckKind(
    name="claims", schema="claims.v1.json", status=status, stamps_status=True, run=run, face=face,
    details=details, html=html,
    known_data=("readings", "claims", "counts", "failed", "status", "format", "format_version", "kvgraft_version"))
