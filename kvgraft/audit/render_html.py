"""An audit report as one self-contained HTML page: the face first, then each check's details.

Inline CSS and inline SVG only: no scripts, no external resources (a Content-Security-Policy meta tag forbids
them), every string from the report escaped. Data members the page does not know are shown in a collapsed block,
never dropped silently. Each kind's section comes from its module in the check registry (kvgraft.audit.checks).
"""

from __future__ import annotations

import re

from kvgraft.audit import face
from kvgraft.audit.checks import kinds, view
from kvgraft.render.html import HTML_COLOR, as_json, badge, esc, kv_html, table
from kvgraft.results.report import Claim, Report

_DIGEST = re.compile(r"[0-9a-f]{64}")


_CSS = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:24px auto;max-width:1120px;color:#1d1d1f;
padding:0 16px;background:#fff}
h1{font-size:22px;margin:0 0 8px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
h3{font-size:15px;margin:18px 0 6px}
table{border-collapse:collapse;margin:6px 0 12px;font-size:13px}
th,td{border:1px solid #d9d9d9;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f3f4f6}
td.num{text-align:right;font-variant-numeric:tabular-nums}
code,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px;word-break:break-all}
.verdict{border-radius:8px;padding:16px 20px;color:#fff;margin:12px 0 20px}
.verdict .status{font-size:28px;font-weight:700;letter-spacing:.04em}
.verdict .headline{font-size:16px;margin-top:4px}
.verdict .counts{margin-top:8px;font-size:13px;opacity:.95}
.badge{display:inline-block;border-radius:4px;padding:1px 7px;color:#fff;font-size:12px;font-weight:600}
.note{background:#fff8e1;border-left:4px solid #f0b400;padding:8px 12px;margin:8px 0}
.check{border:1px solid #ddd;border-radius:8px;padding:4px 16px 12px;margin:14px 0}
.muted{color:#666}
.face>li{margin:8px 0}
pre{background:#f6f8fa;padding:8px;overflow:auto;font-size:12px;max-height:420px}
svg{display:block;margin:6px 0 10px}
"""


def claims_html(claims: list[Claim]) -> str:
    rows = [[f"<b>{esc(c.id)}</b>", esc(c.text), esc(c.claimed or ""), badge(c.verdict), esc(c.reason)] for c in claims]
    return table(["claim", "text", "claimed", "verdict", "reason"], rows)


def to_html(report: Report) -> str:
    """One self-contained HTML page with the content of the terminal rendering."""
    v = report.verdict
    title = f"kvgraft audit: {report.plan.name} — {v.status}"
    body = [f"<h1>kvgraft audit report: {esc(report.plan.name)}</h1>"]
    if report.note:
        body.append(f'<div class="note">{esc(report.note)}</div>')
    body.append(f'<div class="verdict" style="background:{HTML_COLOR.get(v.status, "#555")}">'
                f'<div class="status">{esc(v.status.upper())}</div><div class="headline">{esc(v.headline)}</div>'
                f'<div class="counts">checks: {v.checks.passed} passed, {v.checks.failed} failed, '
                + (f'{v.checks.incomplete} incomplete, ' if v.checks.incomplete else "")
                + f'{v.checks.skipped} skipped · claims: {esc(face.claim_counts(report))}</div></div>')
    # The same list the terminal shows (face.audited); digests in a monospace face.
    ident = [[esc(label), f"<code>{esc(value)}</code>" if _DIGEST.fullmatch(value) else esc(value)]
             for label, value in face.audited(report)]
    body.append("<h2>What was audited</h2>" + table(["what", "value"], ident))
    items = []
    for c in report.checks:
        f = face.face(c)
        figures = "".join(f"<li>{esc(x)}</li>" for x in f.figures)
        items.append(f'<li><b>{esc(c.name)}</b> {badge(c.status)} <span class="muted">{esc(c.kind)}</span>'
                     f'<div>{esc(f.verdict)}</div>' + (f'<ul class="muted">{figures}</ul>' if figures else "") + "</li>")
    body.append('<h2>Checks</h2><ul class="face">' + "".join(items) + "</ul>")
    if report.claims:
        body.append("<h2>Claims</h2>" + claims_html(report.claims))
    body.append("<h2>Details</h2>")
    for c in report.checks:
        section = [f'<div class="check"><h3>{esc(c.name)} {badge(c.status)} '
                   f'<span class="muted">{esc(c.kind)}</span></h3>', f"<p>{esc(c.summary)}</p>"]
        kind = kinds().get(c.kind)
        if kind is not None and c.data:
            section.append(kind.html(view(kind, c.data)))
        rest = {k: v for k, v in c.data.items() if k not in (kind.known_data if kind is not None else ())}
        if rest:
            section.append(f"<details><summary>more data</summary><pre>{esc(as_json(rest))}</pre></details>")
        section.append("</div>")
        body.append("".join(section))
    if report.ledger:
        body.append("<h2>Token ledger</h2>" + kv_html(report.ledger))
    if report.environment:
        body.append("<h2>Environment</h2>" + kv_html(report.environment))
    content = report.plan.content
    body.append(f"<h2>Plan</h2><pre>{esc(content if isinstance(content, str) else as_json(content))}</pre>")
    binding_rows = [[esc(k), f"<code>{esc(val)}</code>"] for k, val in report.binding.model_dump().items()]
    body.append("<h2>Binding</h2>" + table(["member", "digest"], binding_rows))
    csp = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
