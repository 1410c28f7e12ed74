"""Terminal renderings of audit reports: the face (kvgraft.audit.face), and each check's details.

Details tables show at their natural width when it fits the terminal, else as one paragraph per row: ids and
verdicts are wrapped, never cut. Data members a renderer does not know are named, never dropped silently.
Each kind's details come from its module in the check registry (kvgraft.audit.checks).
"""

from __future__ import annotations

from rich.console import Console, RenderableType
from rich.text import Text

from kvgraft.audit import face
from kvgraft.audit.checks import kinds, view
from kvgraft.errors import InputError
from kvgraft.render.terminal import claims_view, mapping_view
from kvgraft.render.text import STATUS_STYLE, hanging, plain_model, plain_tree, styled
from kvgraft.render.views import readings_lines
from kvgraft.results.base import JsonObject
from kvgraft.results.claims import ClaimsCheck, ClaimsData, ClaimVerdict
from kvgraft.results.report import Check, Report


def claims_check_renderables(result: JsonObject, console: Console) -> list[RenderableType]:
    """The terminal rendering of a claims-check result (`audit claims`, kvgraft.claims.checker.check)."""
    plain = plain_tree(result)
    checked = ClaimsCheck.model_validate(plain)  # sealed by the CLI: valid against schemas/claims.v1.json
    shown = ClaimsData.model_validate(plain)
    title = f"claims of {checked.source.get('title', checked.claims_file.path)}"  # the claims file's source, as written
    out: list[RenderableType] = [styled(hanging("", line, console.width, indent=0)) for line in readings_lines(shown)]
    out.append(claims_view(console, shown.claims or [], title))
    counts = ", ".join(f"{n} {k}" for k, n in checked.counts.model_dump(by_alias=True).items() if n)
    status = checked.status or ("failed" if checked.failed else "passed")
    out.append(Text(f"{status.upper()}: {counts}", style=STATUS_STYLE.get(status, "bold")))
    if checked.unused_measurements:
        out.append(Text("measurements no claim uses: " + ", ".join(checked.unused_measurements), style="yellow"))
    return out


def check_renderables(kind: str, data: JsonObject, console: Console) -> list[RenderableType]:
    """One check's details: the view `audit recompute` and `audit determinism` print on their own, and
    `report show --detail NAME` prints for a check of a report."""
    k = kinds().get(kind)
    return k.details(view(k, plain_tree(data)), console) if k is not None else []


def _check_details(c: Check, console: Console) -> list[RenderableType]:
    head = Text(f"{c.name} ", style="bold")
    head.append(c.status, style=STATUS_STYLE.get(c.status, ""))
    head.append(f" ({c.kind})", style="dim")
    out: list[RenderableType] = [head, styled(hanging("", c.summary, console.width, indent=0))]
    if c.status == "skipped":
        out.append(Text(f"skipped: {c.reason}", style="yellow"))
    if c.data:
        out += check_renderables(c.kind, c.data, console)
        k = kinds().get(c.kind)
        known = k.known_data if k is not None else ()
        rest = {k: v for k, v in c.data.items() if k not in known}
        if rest:
            out.append(mapping_view(console, "other data", rest))
    return out


def detail_renderables(report: Report, name: str, console: Console) -> list[RenderableType]:
    """`report show --detail NAME`: one check's details, the token ledger, or (`all`) everything."""
    if name not in face.detail_names(report):
        raise InputError(f"no check named {name!r} in this report (one of: {', '.join(face.detail_names(report))})")
    out: list[RenderableType] = []
    for c in report.checks:
        if name in (c.name, "all"):
            out += [*_check_details(c, console), Text("")]
    if name in ("claims", "all") and face.claims_outside_checks(report):
        shown = [ClaimVerdict(id=c.id, verdict=c.verdict, claimed=c.claimed, reason=c.reason) for c in report.claims]
        out += [claims_view(console, shown), Text("")]
    if name in ("ledger", "all") and report.ledger:
        out.append(mapping_view(console, "token ledger", report.ledger))
    return out


def print_report(report: Report, console: Console, *, detail: str | None = None, path: str = "REPORT") -> None:
    """The face of a report, or with `detail` the details of one check (see detail_renderables)."""
    report = plain_model(report)  # every field it shows as text: ids, names, environment strings
    shown = face.renderables(report, console.width, path) if detail is None else detail_renderables(report, detail, console)
    for r in shown:
        console.print(r)

