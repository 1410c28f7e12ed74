"""The `report` commands: `report show` renders an audit report, `report verify` checks its signature and binding,
`report compare` reads replications together."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvgraft.cli._base import echo_json, handled, out, report_app, say
from kvgraft.cli.trust import IdentityOpt, IssuerOpt


@report_app.command("show")
@handled
def show_cmd(
    report: Annotated[Path, typer.Argument(metavar="REPORT", help="Audit report JSON (schemas/audit-report.v1.json).")],
    html_out: Annotated[Path | None, typer.Option("--html", help="Write a self-contained HTML page here instead.")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing HTML file.")] = False,
    detail: Annotated[str | None, typer.Option(
        "--detail", help="Show one check's tables and findings (its name in the report), `ledger`, or `all`.")] = None,
) -> None:
    """Render an audit report in the terminal: each check once, as a verdict line and the figures that decide it.

    --detail NAME shows what is behind one check; --html writes everything as one self-contained HTML page.
    """
    from kvgraft.report.document import load_report

    doc = load_report(report)
    if html_out is None:
        from kvgraft.audit.render_report import print_report

        print_report(doc, out, detail=detail, path=str(report))
        return
    from kvgraft._internal.jsonio import refuse_existing, write_atomic
    from kvgraft.audit.render_html import to_html

    refuse_existing(html_out, overwrite)
    write_atomic(html_out, to_html(doc).encode())
    out.print(f"wrote {html_out} ({doc.verdict.status})")


@report_app.command("verify")
@handled
def report_verify_cmd(
    report: Annotated[Path, typer.Argument(
        metavar="REPORT", help="Audit report JSON; its signature is REPORT.sigstore.json beside it.")],
    key: Annotated[Path | None, typer.Option("--key", help="Public key PEM the report must be signed with.")] = None,
    identity: Annotated[str | None, typer.Option("--certificate-identity", help="Sigstore signer identity.")] = None,
    issuer: Annotated[str | None, typer.Option("--certificate-oidc-issuer", help="Sigstore OIDC issuer.")] = None,
    staging: Annotated[bool, typer.Option("--staging", help="Sigstore staging trust root.")] = False,
    offline: Annotated[bool, typer.Option("--offline", help="Use the embedded Sigstore trust root.")] = False,
    trusted_root: Annotated[Path | None, typer.Option("--trusted-root", help="Sigstore trusted root JSON.")] = None,
    release: Annotated[str | None, typer.Option("--release", help="Also check the binding to this release (a folder, or "
                                                                  "an http(s)://, hf:// or s3:// location).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON instead of a sentence.")] = False,
) -> None:
    """Check a report's signature, that the signed digest is this file's, and its binding to the release."""
    from kvgraft.report.signing import verify_report
    from kvgraft.signing.sigstore import SigstoreTrust

    trust = SigstoreTrust(staging=staging, offline=offline, trusted_root=trusted_root)
    result = verify_report(report, key=key, identity=identity, issuer=issuer, trust=trust, release=release)
    if as_json:
        echo_json(result.as_json())
        return
    from kvgraft.audit.face import signature_words

    bound = " and bound to the release" if result.release_checked else ""
    say(f"verified: {report} signed by {result.signer}{bound}; verdict {result.report.verdict.status}; "
        f"release signature {signature_words(result.report)}")


COMPARE_HELP = """Verify each report's signature and binding, group them by release and model, and show the replications side
by side: verdicts per check and per entry, disagreements located and labelled, and the combined sampled bound.

Exit 0 when the trusted replications agree, 9 when an entry's verdicts differ in a way their recorded
conditions do not explain, 1 when a report fails verification (refused, named; or listed with
--allow-unverified), 2 on unusable input (docs/replications.md)."""
ReportsArg = Annotated[list[str], typer.Argument(
    metavar="REPORT", help="Audit reports: files, folders (each */report.json), or http(s)://, hf:// or s3:// locations of "
                           "report files (folders where the location can be listed).")]
ReportKeysOpt = Annotated[list[Path] | None, typer.Option("--key", "-k", metavar="PEM", help="A public key trusted to sign "
                                                                                             "reports (repeatable).")]
AllowUnverifiedOpt = Annotated[bool, typer.Option(
    "--allow-unverified", help="List reports that fail verification as unverified, with why, instead of refusing them; they "
                               "are left out of every comparison.")]
DetailsOpt = Annotated[bool, typer.Option("--details", help="Also each replication's signer, environment, checks and every "
                                                            "entry recomputed by two or more.")]
CompareOutOpt = Annotated[Path | None, typer.Option("--out", metavar="FILE", help="Also write the result as JSON "
                                                                                  "(schemas/report-compare.v1.json).")]


@report_app.command("compare", help=COMPARE_HELP)
@handled
def compare_cmd(
    reports: ReportsArg, key: ReportKeysOpt = None, identity: IdentityOpt = None, issuer: IssuerOpt = None,
    staging: Annotated[bool, typer.Option("--staging", help="Sigstore staging trust root.")] = False,
    offline: Annotated[bool, typer.Option("--offline", help="Use the embedded Sigstore trust root.")] = False,
    trusted_root: Annotated[Path | None, typer.Option("--trusted-root", help="Sigstore trusted root JSON.")] = None,
    allow_unverified: AllowUnverifiedOpt = False, details: DetailsOpt = False,
    html_out: Annotated[Path | None, typer.Option("--html", help="Also write a self-contained HTML page here.")] = None,
    json_out: CompareOutOpt = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace existing --html and --out files.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON instead of rendering it.")] = False,
) -> None:
    """`report compare` (COMPARE_HELP)."""
    from kvgraft._internal.jsonio import check_writable, refuse_existing, write_atomic, write_json
    from kvgraft.audit.render_compare import renderables, to_html
    from kvgraft.errors import EXIT_DISAGREE
    from kvgraft.report.compare import Trust, compare
    from kvgraft.signing.sigstore import SigstoreTrust

    for output in (html_out, json_out):
        if output is not None:
            refuse_existing(output, overwrite)
            check_writable(output)
    trust = Trust(tuple(key or ()), identity, issuer, SigstoreTrust(staging=staging, offline=offline,
                                                                    trusted_root=trusted_root))
    result = compare(reports, trust, allow_unverified=allow_unverified)
    if json_out is not None:
        write_json(json_out, result.as_json())
    if html_out is not None:
        write_atomic(html_out, to_html(result).encode())
    if as_json:
        echo_json(result.as_json())
    else:
        for r in renderables(result, out, details=details):
            out.print(r)
    if result.status == "disagree":
        raise typer.Exit(EXIT_DISAGREE)
