"""An audit report as one self-contained HTML page: the face first, then each check's details.

Inline CSS and inline SVG only: no scripts, no external resources (a Content-Security-Policy meta tag forbids
them), every string from the report escaped. Data members the page does not know are shown in a collapsed block,
never dropped silently.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterable
from typing import Any

from kvgraft.reporting import face, views
from kvgraft.reporting.render import num as _num
from kvgraft.reporting.render import pct as _pct

_DIGEST = re.compile(r"[0-9a-f]{64}")
HTML_COLOR = {
    "passed": "#1b7f3b", "supported": "#1b7f3b", "consistent": "#1b7f3b",
    "failed": "#b3261e", "contradicted": "#b3261e", "inconsistent": "#b3261e",
    "skipped": "#8a6d00", "incomplete": "#8a6d00", "unsupported": "#8a6d00",
    "not-testable": "#1f5f8b", "needs-measurement": "#1f5f8b",
}


def _json(x: Any) -> str:
    flat = json.dumps(x, sort_keys=True, ensure_ascii=False)
    return flat if len(flat) <= 100 else json.dumps(x, indent=2, sort_keys=True, ensure_ascii=False)


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


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _badge(word: str, label: str | None = None) -> str:
    return f'<span class="badge" style="background:{HTML_COLOR.get(word, "#555")}">{_e(label or word)}</span>'


def _table(headers: list[str], rows: list[list[str]], num: Iterable[int] = ()) -> str:
    numcols = set(num)
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f'<td class="num">{c}</td>' if i in numcols else f"<td>{c}</td>" for i, c in enumerate(r))
                   + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def heatmap_svg(data: dict[str, Any]) -> str:
    m = views.heatmap_model(data)
    if not m["rows"] or not m["layers"]:
        return '<p class="muted">(no per-layer data)</p>'
    label_w, top = 170, 28
    cell = max(6.0, min(18.0, 880 / m["layers"]))
    width = label_w + cell * m["layers"] + 10
    height = top + 16 * len(m["rows"]) + 46
    parts = [f'<svg width="{width:.0f}" height="{height}" '
             f'viewBox="0 0 {width:.0f} {height}" role="img" aria-label="per-layer divergence heat map">']
    for i in range(0, m["layers"], 5):
        x = label_w + cell * i + cell / 2
        parts.append(f'<text x="{x:.1f}" y="{top - 8}" font-size="10" text-anchor="middle" fill="#555">{i}</text>')
    parts.append(f'<text x="{label_w - 6}" y="{top - 8}" font-size="10" text-anchor="end" fill="#555">layer →</text>')
    for j, r in enumerate(m["rows"]):
        y = top + 16 * j
        parts.append(f'<text x="{label_w - 6}" y="{y + 11}" font-size="11" text-anchor="end">{_e(r["id"][:26])}</text>')
        for i in range(m["layers"]):
            c = r["cells"].get(i)
            x = label_w + cell * i
            if c is None or (not c["known"] and not c["mismatch"]):
                tip = f"{r['id']} layer {i}: {views.cell_text(c) if c else 'no data'}"
                parts.append(f'<rect x="{x:.1f}" y="{y}" width="{cell - 1:.1f}" height="15" fill="#fff" stroke="#ddd">'
                             f"<title>{_e(tip)}</title></rect>")
                continue
            if c["mismatch"]:
                tip = f"{r['id']} layer {i}: {views.cell_text(c)}"
                parts.append(f'<rect x="{x:.1f}" y="{y}" width="{cell - 1:.1f}" height="15" '
                             f'fill="{views.HEAT[-1]}" stroke="#000">'
                             f"<title>{_e(tip)}</title></rect>")
                continue
            fill = views.IDENTICAL_COLOR if c["identical"] else views.HEAT[c["level"] if c.get("level") is not None else 0]
            tip = f"{r['id']} layer {i}: {views.cell_text(c)}"
            parts.append(f'<rect x="{x:.1f}" y="{y}" width="{cell - 1:.1f}" height="15" fill="{fill}">'
                         f"<title>{_e(tip)}</title></rect>")
            if c["identical"]:
                parts.append(f'<circle cx="{x + (cell - 1) / 2:.1f}" cy="{y + 7.5}" r="1.5" fill="#4a7c59"/>')
    ly = top + 16 * len(m["rows"]) + 14
    parts.append(f'<rect x="{label_w}" y="{ly}" width="14" height="12" fill="{views.IDENTICAL_COLOR}"/>'
                 f'<text x="{label_w + 18}" y="{ly + 10}" font-size="11">byte-identical</text>')
    lx = label_w + 120
    lo_label = "1 ULP" if m["metric"] == "ulp" else f"|diff| 10^{m['log_lo']:.1f}"
    hi_label = (f"{10 ** m['log_hi']:,.0f} ULP" if m["metric"] == "ulp" else f"10^{m['log_hi']:.1f}")
    parts.append(f'<text x="{lx}" y="{ly + 10}" font-size="11">{_e(lo_label)}</text>')
    lx += 8 + 7 * len(lo_label)
    for k, color in enumerate(views.HEAT):
        parts.append(f'<rect x="{lx + 18 * k}" y="{ly}" width="18" height="12" fill="{color}"/>')
    parts.append(f'<text x="{lx + 18 * len(views.HEAT) + 6}" y="{ly + 10}" font-size="11">'
                 f"{_e(hi_label)} (log scale, max of K and V)</text>")
    parts.append("</svg>")
    more = f'<p class="muted">{m["truncated"]} more entries not shown.</p>' if m["truncated"] else ""
    return "".join(parts) + more


def intervals_svg(accuracies: list[dict[str, Any]]) -> str:
    rows = [(a, views.acc_interval(a)) for a in accuracies]
    label_w, plot_w, right_w, row_h, top = 190, 560, 190, 26, 24
    width = label_w + plot_w + right_w
    height = top + row_h * len(rows) + 10
    parts = [f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
             'role="img" aria-label="accuracy with 95% intervals">']
    for t in range(0, 101, 10):
        x = label_w + plot_w * t / 100
        parts.append(f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{height - 6}" stroke="#e5e5e5"/>'
                     f'<text x="{x:.1f}" y="{top - 8}" font-size="10" text-anchor="middle" fill="#555">{t}%</text>')
    for j, (a, iv) in enumerate(rows):
        y = top + row_h * j + row_h / 2
        k, n = int(a["k"]), int(a["n"])
        parts.append(f'<text x="{label_w - 8}" y="{y + 4:.1f}" font-size="12" text-anchor="end">{_e(a["name"])}</text>')
        if iv is not None:
            x0, x1 = label_w + plot_w * iv[0], label_w + plot_w * iv[1]
            parts.append(f'<rect x="{x0:.1f}" y="{y - 6:.1f}" width="{max(1.0, x1 - x0):.1f}" height="12" rx="3" fill="#9ecae1">'
                         f'<title>{_e(a["name"])}: 95% interval {_pct(iv[0])}–{_pct(iv[1])}</title></rect>')
        px = label_w + plot_w * k / n
        parts.append(f'<circle cx="{px:.1f}" cy="{y:.1f}" r="5" fill="#08519c"/>')
        right = f"{k}/{n} = {_pct(k / n)}" + (f" [{_pct(iv[0])}, {_pct(iv[1])}]" if iv else "")
        parts.append(f'<text x="{label_w + plot_w + 10}" y="{y + 4:.1f}" font-size="12">{_e(right)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _accuracy_html(title: str, accuracies: list[dict[str, Any]]) -> str:
    rows = []
    for a in accuracies:
        k, n = int(a["k"]), int(a["n"])
        iv = views.acc_interval(a)
        rows.append([_e(a["name"]), f"{k}/{n}", _pct(k / n), "-" if iv is None else f"{_pct(iv[0])}–{_pct(iv[1])}"])
    return f"<h3>{_e(title)}</h3>" + intervals_svg(accuracies) + _table(["condition", "k/n", "accuracy", "95% Wilson interval"],
                                                                      rows, num=(1, 2, 3))


def _recompute_html(c: dict[str, Any]) -> str:
    data = c["data"]
    rows = []
    for r in views.recompute_rows(data):
        state = _badge("passed" if r["verdict"] in ("byte-exact", "consistent") else "failed", r["verdict"])
        rows.append([_e(r["id"]), _num(r["tokens"]), state, f"{r['differing_layers']}/{r['layers']}", _num(r["max_abs"]),
                     _num(r["max_rel"]), _num(r["excess"]), _num(r["max_ulp"]), _e(r["first"]), _num(r["kl"]),
                     _num(r["kl_natural"])])
    out = ""
    if data.get("reference"):
        out += f'<p class="muted">compared with: {_e(data["reference"])}</p>'
    out += _table(["entry", "tokens", "verdict", "layers differing", "max |diff|", "max relative", "of envelope",
                   "max ULP (same-sign normals)", "first difference", "KL max", "KL vs no cache"], rows,
                  num=(1, 3, 4, 5, 6, 7, 9, 10))
    out += "<h3>per-layer divergence (rows: entries, columns: layers)</h3>" + heatmap_svg(data)
    drawn, bound = data.get("sample"), data.get("bound")
    if isinstance(drawn, dict) and isinstance(bound, dict):
        from kvgraft import sampling

        out += "<h3>sample and bound</h3>" + _kv_html({
            "sample": f"{drawn['size']:,} of {drawn['population']:,} entries ({drawn['weighting']})",
            "drawn by": f"{drawn['method']}: root {drawn['root_digest']}, nonce {drawn['nonce']} ({drawn['nonce_source']})",
            "re-derive": "kvgraft audit sample RELEASE --check REPORT.json",
            "bound": sampling.sentence(bound), "method": bound["method"], "tokens": bound["token_method"]})
    if data.get("statements"):
        out += "<ul>" + "".join(f"<li>{_e(st)}</li>" for st in data["statements"]) + "</ul>"
    return out


def _generalization_html(c: dict[str, Any]) -> str:
    data = c["data"]
    bench = data.get("benchmark", {})
    title = "accuracy" + (f" on {bench.get('name')}" if bench.get("name") else "")
    title += f" ({bench['size']} problems)" if bench.get("size") else ""
    out = _accuracy_html(title, data.get("conditions", []))
    if data.get("mcnemar"):
        rows = [[_e(m["a"]), _e(m["b"]), str(m["a_only"]), str(m["b_only"]), f"{m['p_value']:.4g}",
                 _badge("supported", "significant at 0.05") if m["p_value"] < 0.05
                 else _badge("unsupported", "not significant at 0.05")] for m in data["mcnemar"]]
        out += "<h3>paired comparisons (exact McNemar)</h3>" + _table(["a", "b", "solved only by a", "solved only by b", "p", ""],
                                                                      rows, num=(2, 3, 4))
    split = data.get("split") or {}
    for part in ("clean", "contaminated"):
        if split.get(part):
            out += _accuracy_html(f"{part} problems", split[part])
    if isinstance(data.get("ledger"), dict):
        out += "<h3>ledger</h3>" + _kv_html(data["ledger"])
    return out


def _determinism_html(c: dict[str, Any]) -> str:
    m = views.determinism_model(c["data"])
    out = ""

    def chip(label: str, colour: str) -> str:
        return f'<span class="mono" style="background:{colour};padding:1px 8px;border-radius:3px">{_e(label)}</span>'

    if m["conditions"]:
        rows = [[_e(x["name"]), chip(str(x.get("class", "?")), m["colour"].get(str(x.get("class", "?")), "#ddd")),
                 _num(x.get("max_ulp")), _num(x.get("max_abs")), _num(x.get("kl")),
                 f'<code>{_e(json.dumps(x.get("condition", {}), sort_keys=True))}</code>' if x.get("condition") else ""]
                for x in m["conditions"]]
        out += (f'<p class="muted">{m["classes"]} KV byte classes among {len(m["conditions"])} conditions; '
                "same class = byte-identical states.</p>")
        out += _table(["condition", "class", "max ULP", "max |diff|", "KL", "settings"], rows, num=(2, 3, 4))
    if m["rows"]:
        headers = ["entry"] + [str(x["name"]) for x in m["conditions"]]
        out += "<h3>per entry (same label in a row = same bytes)</h3>" + _table(
            headers, [[_e(row["entry"])] + [chip(lab, col) for lab, col in row["cells"]] for row in m["rows"]])
    notes = c["data"].get("notes", [])
    if notes:
        out += "<ul>" + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>"
    return out


def _verify_html(c: dict[str, Any]) -> str:
    result, details = views.verify_lines(c["data"])
    out = f"<p>result: <b>{_e(result)}</b></p>"
    if details:
        out += "<ul>" + "".join(f"<li>{_e(d)}</li>" for d in details) + "</ul>"
    return out


def _kv_html(mapping: dict[str, Any]) -> str:
    rows = [[_e(k), _e(f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else
                      (json.dumps(v) if isinstance(v, (dict, list)) else v))] for k, v in mapping.items()]
    return _table(["what", "value"], rows)


def _controls_html(check: dict[str, Any]) -> str:
    notes = "".join(f"<li>{_e(x)}</li>" for x in check["data"].get("statements", []))
    return _table(views.CONTROLS_HEAD, [[_e(x) for x in row] for row in views.controls_rows(check["data"])]) + f"<ul>{notes}</ul>"


def _claims_html(check: dict[str, Any]) -> str:
    return "".join(f"<p>{_e(line)}</p>" for line in views.readings_lines(check["data"]))


_HTML_RENDERERS = {"recompute": _recompute_html, "generalization": _generalization_html, "determinism": _determinism_html,
                   "verify": _verify_html, "claims": _claims_html,
                   "controls": _controls_html}


def claims_html(claims: list[dict[str, Any]]) -> str:
    rows = [[f"<b>{_e(c['id'])}</b>", _e(c.get("text", "")), _e(c.get("claimed", "")), _badge(c["verdict"]), _e(c["reason"])]
            for c in claims]
    return _table(["claim", "text", "claimed", "verdict", "reason"], rows)


def to_html(report: dict[str, Any]) -> str:
    """One self-contained HTML page with the content of the terminal rendering."""
    v = report["verdict"]
    title = f"kvgraft audit: {report['plan']['name']} — {v['status']}"
    claims_counts = ", ".join(f"{n} {k}" for k, n in v["claims"].items() if n) or "none"
    body = [f"<h1>kvgraft audit report: {_e(report['plan']['name'])}</h1>"]
    if report.get("note"):
        body.append(f'<div class="note">{_e(report["note"])}</div>')
    body.append(f'<div class="verdict" style="background:{HTML_COLOR.get(v["status"], "#555")}">'
                f'<div class="status">{_e(v["status"].upper())}</div><div class="headline">{_e(v["headline"])}</div>'
                f'<div class="counts">checks: {v["checks"]["passed"]} passed, {v["checks"]["failed"]} failed, '
                + (f'{v["checks"]["incomplete"]} incomplete, ' if v["checks"].get("incomplete") else "")
                + f'{v["checks"]["skipped"]} skipped · claims: {_e(claims_counts)}</div></div>')
    # The same list the terminal shows (face.audited); digests in a monospace face.
    ident = [[_e(label), f"<code>{_e(value)}</code>" if _DIGEST.fullmatch(value) else _e(value)]
             for label, value in face.audited(report)]
    body.append("<h2>What was audited</h2>" + _table(["what", "value"], ident))
    items = []
    for c in report["checks"]:
        f = face.face(c)
        figures = "".join(f"<li>{_e(x)}</li>" for x in f.figures)
        items.append(f'<li><b>{_e(c["name"])}</b> {_badge(c["status"])} <span class="muted">{_e(c["kind"])}</span>'
                     f'<div>{_e(f.verdict)}</div>' + (f'<ul class="muted">{figures}</ul>' if figures else "") + "</li>")
    body.append('<h2>Checks</h2><ul class="face">' + "".join(items) + "</ul>")
    if report["claims"]:
        body.append("<h2>Claims</h2>" + claims_html(report["claims"]))
    body.append("<h2>Details</h2>")
    for c in report["checks"]:
        section = [f'<div class="check"><h3>{_e(c["name"])} {_badge(c["status"])} '
                   f'<span class="muted">{_e(c["kind"])}</span></h3>', f"<p>{_e(c['summary'])}</p>"]
        renderer = _HTML_RENDERERS.get(c["kind"])
        if renderer is not None and c["data"]:
            section.append(renderer(c))
        rest = {k: v for k, v in c["data"].items() if k not in views.KNOWN_DATA.get(c["kind"], ())}
        if rest:
            section.append(f"<details><summary>more data</summary><pre>{_e(_json(rest))}</pre></details>")
        section.append("</div>")
        body.append("".join(section))
    if report.get("ledger"):
        body.append("<h2>Token ledger</h2>" + _kv_html(report["ledger"]))
    if report.get("environment"):
        body.append("<h2>Environment</h2>" + _kv_html(report["environment"]))
    content = report["plan"]["content"]
    body.append(f"<h2>Plan</h2><pre>{_e(content if isinstance(content, str) else _json(content))}</pre>")
    binding = report["binding"]
    binding_rows = [[_e(k), f"<code>{_e(val)}</code>"] for k, val in binding.items()]
    body.append("<h2>Binding</h2>" + _table(["member", "digest"], binding_rows))
    csp = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
