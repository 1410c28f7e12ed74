"""A report's face: each check once, as a verdict line and the few figures that decide it.

Terminal and HTML both show this first; the tables behind each check are details (`report show --detail`).
Each check kind's face is a part of its module in the check registry (kvgraft.audit.checks); a kind the
registry does not know shows its summary.
"""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text

from kvgraft.audit.checks import kinds, view
from kvgraft.render.figures import Face
from kvgraft.render.text import STATUS_MARK, STATUS_STYLE, WORDS, hanging, styled
from kvgraft.results.report import Check, Report
from kvgraft.signing.verify import signature_sentence


def face(check: Check) -> Face:
    """The face of one check of a report; a skipped check says why, an unknown kind shows its summary."""
    if check.status == "skipped":
        return Face(f"skipped: {check.reason or check.summary}")
    kind = kinds().get(check.kind)
    if kind is None or not check.data:
        return Face(check.summary)
    # The report passed validate_report: its data has every member the kind's face reads (a report that lacks
    # one is refused when it is loaded, naming the member), so no shape error is caught here.
    return kind.face(view(kind, check.data))


def signature_words(report: Report) -> str:
    """The report's `release_signature` in words (kvgraft.signing.verify.signature_sentence)."""
    statement = report.release_signature
    return signature_sentence(None if statement is None else statement.model_dump(mode="json"))


def audited(report: Report) -> list[tuple[str, str]]:
    """What the report is about, as (label, value): names and full digests."""
    model = report.model
    identity = model.identity if model is not None else None
    items = [("plan", report.plan.name), ("plan sha256", report.plan.sha256 or "-"),
             ("model", model.spec if model is not None else "none")]
    if identity is not None and identity.sha256:
        items.append(("model identity", identity.sha256))
    items += [("release root", str(report.release_root_digest)),
              ("attestation", report.binding.release_attestation_digest or "none (unsigned release)"),
              ("release signature", signature_words(report))]
    env = report.environment
    where = ", ".join(str(env[k]) for k in ("device", "device_name", "dtype", "attn_implementation") if env.get(k))
    if where:
        items.append(("environment", where + (f", torch {env['torch']}" if env.get("torch") else "")))
    items.append(("created", f"{report.created} by kvgraft {report.kvgraft_version}"))
    return items


def claim_rows(report: Report) -> list[tuple[str, str, str]]:
    """(id, verdict, what was claimed, plus why when the verdict goes against the claim)."""
    rows: list[tuple[str, str, str]] = []
    for c in report.claims:
        why = f" — {c.reason}" if c.verdict in ("contradicted", "inconsistent", "unsupported") else ""
        rows.append((c.id, c.verdict, (c.claimed or "") + why))
    return rows


def _claim_lines(report: Report, width: int, indent: int) -> list[RenderableType]:
    rows = claim_rows(report)
    if not rows:
        return []
    id_width = max(len(r[0]) for r in rows)
    verdict_width = max(len(r[1]) for r in rows)
    return [styled(hanging(f"{cid.ljust(id_width)}  {verdict.ljust(verdict_width)}", claimed, width, indent=indent), WORDS)
            for cid, verdict, claimed in rows]


def claims_outside_checks(report: Report) -> bool:
    return bool(report.claims) and not any(c.kind == "claims" for c in report.checks)


def detail_names(report: Report) -> list[str]:
    """What --detail accepts: each check's name, the claims when no check holds them, the ledger, all."""
    return ([c.name for c in report.checks] + (["claims"] if claims_outside_checks(report) else [])
            + (["ledger"] if report.ledger else []) + ["all"])


def details_hint(report: Report, path: str) -> str:
    names = detail_names(report)
    return (f"details: kvgraft report show {path} --detail NAME ({', '.join(names)}); "
            "everything on one page: --html FILE")


def claim_counts(report: Report) -> str:
    """The claims' verdicts counted, e.g. '1 contradicted, 2 supported'; 'none' when there are none."""
    counts = report.verdict.claims.model_dump(by_alias=True)
    return ", ".join(f"{n} {k}" for k, n in counts.items() if n) or "none"


def renderables(report: Report, width: int, path: str = "REPORT") -> list[RenderableType]:
    """The face for a terminal `width` columns wide: nothing is cut, long values wrap."""
    v = report.verdict
    model = report.model.spec if report.model is not None else "no model"
    style = STATUS_STYLE.get(v.status, "bold")
    out: list[RenderableType] = [Text(f"kvgraft audit · {report.plan.name} · {model}", style="bold")]
    checks = v.checks
    incomplete = f", {checks.incomplete} incomplete" if checks.incomplete else ""
    headline = styled(hanging(v.status.upper() + ":", v.headline, width, indent=0), WORDS)
    headline.stylize(style, 0, len(v.status))
    out.append(headline)
    out.append(styled(hanging("", f"checks: {checks.passed} passed, {checks.failed} failed{incomplete}, "
                               f"{checks.skipped} skipped; claims: {claim_counts(report)}", width, indent=0)))
    if report.note:
        out.append(Text("\n".join(hanging("note:", report.note, width, indent=0)), style="italic"))
    out.append(Text("\nwhat was audited", style="bold"))
    items = audited(report)
    label_width = max(len(label) for label, _ in items)
    for label, value in items:
        out.append(Text("\n".join(hanging(label, value, width, label_width=label_width))))
    out.append(Text("\nchecks", style="bold"))
    for c in report.checks:
        f = face(c)
        head = Text(f"{STATUS_MARK.get(c.status, '·')} {c.name} ", style="bold")
        head.append(c.status, style=STATUS_STYLE.get(c.status, ""))
        if c.kind != c.name:
            head.append(f" ({c.kind})", style="dim")
        out.append(head)
        out.append(styled(hanging("", f.verdict, width, indent=4), WORDS))
        for fig in f.figures:
            out.append(styled(hanging("·", fig, width, indent=4), WORDS, style="dim"))
        if c.kind == "claims":
            out += _claim_lines(report, width, indent=4)
    if claims_outside_checks(report):
        out += [Text("\nclaims", style="bold"), *_claim_lines(report, width, indent=2)]
    out.append(Text("\n" + "\n".join(hanging("", details_hint(report, path), width, indent=0)), style="dim"))
    return out
