"""A report's face: each check once, as a verdict line and the few figures that decide it.

Terminal and HTML both show this first; the tables behind each check are details (`report show --detail`).
Each check kind's face is a part of its module in the check registry (kvgraft.audit.checks); a kind the
registry does not know shows its summary.
"""

from __future__ import annotations

from typing import Any

from rich.console import RenderableType
from rich.text import Text

from kvgraft.audit.checks import kinds, view
from kvgraft.render.figures import Face
from kvgraft.render.text import STATUS_MARK, STATUS_STYLE, WORDS, hanging, styled
from kvgraft.signing.verify import signature_sentence


def face(check: dict[str, Any]) -> Face:
    """The face of one check of a report; a skipped check says why, an unknown kind shows its summary."""
    if check["status"] == "skipped":
        return Face(f"skipped: {check.get('reason') or check['summary']}")
    kind = kinds().get(check["kind"])
    if kind is None or not check.get("data"):
        return Face(check["summary"])
    # The report passed validate_report: its data has every member the kind's face reads (a report that lacks
    # one is refused when it is loaded, naming the member), so no shape error is caught here.
    return kind.face(view(kind, check["data"]))


def audited(report: dict[str, Any]) -> list[tuple[str, str]]:
    """What the report is about, as (label, value): names and full digests."""
    model = report.get("model") or {}
    items = [("plan", str(report["plan"]["name"])), ("plan sha256", str(report["plan"].get("sha256", "-"))),
             ("model", str(model.get("spec", "none")))]
    if isinstance(model.get("identity"), dict) and model["identity"].get("sha256"):
        items.append(("model identity", str(model["identity"]["sha256"])))
    items += [("release root", str(report["release_root_digest"])),
              ("attestation", str(report["binding"]["release_attestation_digest"] or "none (unsigned release)")),
              ("release signature", signature_sentence(report.get("release_signature")))]
    env = report.get("environment") or {}
    where = ", ".join(str(env[k]) for k in ("device", "device_name", "dtype", "attn_implementation") if env.get(k))
    if where:
        items.append(("environment", where + (f", torch {env['torch']}" if env.get("torch") else "")))
    items.append(("created", f"{report['created']} by kvgraft {report['kvgraft_version']}"))
    return items


def claim_rows(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(id, verdict, what was claimed, plus why when the verdict goes against the claim)."""
    rows = []
    for c in report.get("claims", []):
        why = f" — {c['reason']}" if c["verdict"] in ("contradicted", "inconsistent", "unsupported") else ""
        rows.append((str(c["id"]), str(c["verdict"]), str(c.get("claimed", "")) + why))
    return rows


def _claim_lines(report: dict[str, Any], width: int, indent: int) -> list[RenderableType]:
    rows = claim_rows(report)
    if not rows:
        return []
    id_width = max(len(r[0]) for r in rows)
    verdict_width = max(len(r[1]) for r in rows)
    return [styled(hanging(f"{cid.ljust(id_width)}  {verdict.ljust(verdict_width)}", claimed, width, indent=indent), WORDS)
            for cid, verdict, claimed in rows]


def claims_outside_checks(report: dict[str, Any]) -> bool:
    return bool(report.get("claims")) and not any(c["kind"] == "claims" for c in report["checks"])


def detail_names(report: dict[str, Any]) -> list[str]:
    """What --detail accepts: each check's name, the claims when no check holds them, the ledger, all."""
    return ([c["name"] for c in report["checks"]] + (["claims"] if claims_outside_checks(report) else [])
            + (["ledger"] if report.get("ledger") else []) + ["all"])


def details_hint(report: dict[str, Any], path: str) -> str:
    names = detail_names(report)
    return (f"details: kvgraft report show {path} --detail NAME ({', '.join(names)}); "
            "everything on one page: --html FILE")


def renderables(report: dict[str, Any], width: int, path: str = "REPORT") -> list[RenderableType]:
    """The face for a terminal `width` columns wide: nothing is cut, long values wrap."""
    v = report["verdict"]
    model = (report.get("model") or {}).get("spec", "no model")
    style = STATUS_STYLE.get(v["status"], "bold")
    out: list[RenderableType] = [Text(f"kvgraft audit · {report['plan']['name']} · {model}", style="bold")]
    checks = v["checks"]
    incomplete = f", {checks['incomplete']} incomplete" if checks.get("incomplete") else ""
    claims = ", ".join(f"{n} {k}" for k, n in v["claims"].items() if n) or "none"
    headline = styled(hanging(v["status"].upper() + ":", v["headline"], width, indent=0), WORDS)
    headline.stylize(style, 0, len(v["status"]))
    out.append(headline)
    out.append(styled(hanging("", f"checks: {checks['passed']} passed, {checks['failed']} failed{incomplete}, "
                               f"{checks['skipped']} skipped; claims: {claims}", width, indent=0)))
    if report.get("note"):
        out.append(Text("\n".join(hanging("note:", report["note"], width, indent=0)), style="italic"))
    out.append(Text("\nwhat was audited", style="bold"))
    items = audited(report)
    label_width = max(len(label) for label, _ in items)
    for label, value in items:
        out.append(Text("\n".join(hanging(label, value, width, label_width=label_width))))
    out.append(Text("\nchecks", style="bold"))
    for c in report["checks"]:
        f = face(c)
        head = Text(f"{STATUS_MARK.get(c['status'], '·')} {c['name']} ", style="bold")
        head.append(c["status"], style=STATUS_STYLE.get(c["status"], ""))
        if c["kind"] != c["name"]:
            head.append(f" ({c['kind']})", style="dim")
        out.append(head)
        out.append(styled(hanging("", f.verdict, width, indent=4), WORDS))
        for fig in f.figures:
            out.append(styled(hanging("·", fig, width, indent=4), WORDS, style="dim"))
        if c["kind"] == "claims":
            out += _claim_lines(report, width, indent=4)
    if claims_outside_checks(report):
        out += [Text("\nclaims", style="bold"), *_claim_lines(report, width, indent=2)]
    out.append(Text("\n" + "\n".join(hanging("", details_hint(report, path), width, indent=0)), style="dim"))
    return out
