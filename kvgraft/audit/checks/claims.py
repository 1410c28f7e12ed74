"""The claims check: a claims file checked for internal consistency and against this audit's measurements."""

from __future__ import annotations

from pathlib import Path

from pydantic import TypeAdapter
from rich.console import Console, RenderableType

from kvgraft.audit.checks.kind import CheckKind, Ran
from kvgraft.audit.context import Context
from kvgraft.render.figures import Face
from kvgraft.render.html import esc
from kvgraft.render.terminal import claims_view
from kvgraft.render.text import hanging, styled
from kvgraft.render.views import readings_lines
from kvgraft.results.base import JsonObject, Open
from kvgraft.results.claims import TYPED, ClaimsCheck, ClaimsData


class _Natural(Open):
    kl_max: float


class _Entry(Open):
    """What this check reads of a recompute entry: the KL against a one-shot prefill without any cache."""

    natural: _Natural


_ENTRIES = TypeAdapter(list[_Entry])


class ClaimsSettings(Open):
    """A plan's `[checks.claims]`: the claims file; `audit claims` sets `measured` (a measurements file, or None)
    instead of reading this audit's recompute check."""

    file: str
    measured: str | None = None


class _Judged(Open):
    """What the status rule reads of a sealed result (kvgraft.results.claims.ClaimsCheck)."""

    failed: bool
    counts: dict[str, int]


def claim_verdicts(claims_check: ClaimsCheck) -> list[JsonObject]:
    """The report's `claims` list from a claims-check result (kvgraft.claims.checker.check)."""
    return [{"id": c.id, "text": c.text, "kind": c.kind, "claimed": c.claimed, "verdict": c.verdict,
             "reason": c.reason} for c in claims_check.claims]


def run(ctx: Context, cc: JsonObject) -> Ran:
    """Under a plan's `[checks.claims]` (file), against what this audit's recompute check measured (its sealed
    result, when it ran); `audit claims` sets `measured` (a measurements file, or None) instead."""
    from kvgraft.claims import checker as claims

    ctx.say("checking the claims file")
    s = ClaimsSettings.model_validate(cc)
    path = ctx.plan.resolve(s.file)
    recomputed = ctx.results.get("recompute") if "measured" not in s.model_fields_set else None
    if recomputed is None:
        checked = claims.check_files(path, Path(s.measured) if s.measured else None)
        return Ran(checked.as_json(), f"{len(checked.claims)} claims checked against internal consistency"
                            + (" and the measurements file" if s.measured else ""),
                   claims=claim_verdicts(checked))
    measured = claims.measured_from_recompute(recomputed)
    checked = claims.check(claims.load(path), measured or None, measured_where="this audit's recompute check")
    verdicts = claim_verdicts(checked)
    entries = _ENTRIES.validate_python(recomputed["entries"])
    natural_kl = max(abs(e.natural.kl_max) for e in entries) if entries else None
    if natural_kl is not None:
        # Say for which comparison exactness was measured, next to the verdict itself.
        for c in verdicts:
            if c.get("kind") == "exactness":
                contrast = "exactly 0" if natural_kl == 0.0 else f"{natural_kl:.3g}, not 0"
                c["reason"] = (f"{c['reason']} (under the release's recorded prefill schedule; against a one-shot "
                               f"prefill of prefix + probe without any cache, max KL = {contrast})")
    return Ran(checked.as_json(), f"{len(verdicts)} claims checked against internal consistency"
                        + (" and this audit's measurements" if measured else ""), claims=verdicts)


def status(result: JsonObject) -> str:
    """failed when a claim is contradicted or inconsistent; incomplete when no claim could be judged."""
    read = _Judged.model_validate(result)
    if read.failed:
        return "failed"
    judged = sum(n for v, n in read.counts.items() if v != "not-testable")
    return "passed" if judged else "incomplete"


def face(data: ClaimsData) -> Face:
    counts = ", ".join(f"{n} {k}" for k, n in (data.counts or {}).items() if n)
    claims = data.claims or []
    bad = [c for c in claims if c.verdict in ("contradicted", "inconsistent")]
    verdict = f"{len(claims)} claims: {counts or 'none'}" + ("" if bad else "; none contradicted or inconsistent")
    return Face(verdict, readings_lines(data))


def details(data: ClaimsData, console: Console) -> list[RenderableType]:
    out: list[RenderableType] = [styled(hanging("", line, console.width, indent=0)) for line in readings_lines(data)]
    return [*out, claims_view(console, data.claims or [])]


def html(data: ClaimsData) -> str:
    return "".join(f"<p>{esc(line)}</p>" for line in readings_lines(data))


KIND = CheckKind(
    name="claims", schema="claims.v1.json", status=status, stamps_status=True, run=run, face=face,
    details=details, html=html,
    known_data=("readings", "claims", "counts", "failed", "status", "format", "format_version", "kvgraft_version"),
    typed=TYPED)
