"""Commands on claims and audit reports: `audit claims`, `report show`.

(`report verify`, checking a report's signature, belongs to the signing commands, not here.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from kvgraft.cli._base import audit_app, exit_with, handled, out, report_app


@audit_app.command("claims")
@handled
def claims_cmd(
    claims_file: Annotated[Path, typer.Argument(help="Claims TOML (format kvgraft-claims), e.g. audit/claims/*.toml.")],
    measured: Annotated[Path | None, typer.Option(
        "--measured", help="Measured-results JSON: keys named by each claim's `measure`.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON (schemas/claims.v1.json).")] = False,
) -> None:
    """Check claims for internal consistency and, with --measured, against measurements.

    Exit 0 when passed, 4 when failed (a claim is contradicted or inconsistent), 6 when incomplete (no claim
    could be judged), 2 on unusable input.
    """
    from kvgraft.audit import claims
    from kvgraft.audit.checks import seal

    result = seal("claims", claims.check_files(claims_file, measured), "claims check result")
    if as_json:
        typer.echo(json.dumps(result, indent=2, ensure_ascii=False))
    else:
        from kvgraft.reporting.render_report import claims_check_renderables

        for r in claims_check_renderables(result, out):
            out.print(r)
    exit_with(result["status"])


@report_app.command("show")
@handled
def show_cmd(
    report: Annotated[Path, typer.Argument(help="Audit report JSON (schemas/audit-report.v1.json).")],
    html_out: Annotated[Path | None, typer.Option("--html", help="Write a self-contained HTML page here instead.")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing HTML file.")] = False,
    detail: Annotated[str | None, typer.Option(
        "--detail", help="Show one check's tables and findings (its name in the report), `ledger`, or `all`.")] = None,
) -> None:
    """Render an audit report in the terminal: each check once, as a verdict line and the figures that decide it.

    --detail NAME shows what is behind one check; --html writes everything as one self-contained HTML page.
    """
    from kvgraft.reporting.report import load_report

    doc = load_report(report)
    if html_out is None:
        from kvgraft.reporting.render_report import print_report

        print_report(doc, out, detail=detail, path=str(report))
        return
    from kvgraft._internal.jsonio import refuse_existing, write_atomic
    from kvgraft.reporting.render_html import to_html

    refuse_existing(html_out, overwrite)
    write_atomic(html_out, to_html(doc).encode())
    out.print(f"wrote {html_out} ({doc['verdict']['status']})")
