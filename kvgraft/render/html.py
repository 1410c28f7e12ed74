"""HTML building blocks the check kinds draw their sections with: escaping, badges, tables, heat map, intervals."""

from __future__ import annotations

import html
import json
from collections.abc import Iterable
from typing import Any

from kvgraft.render.text import pct
from kvgraft.render.views import HEAT, IDENTICAL_COLOR, acc_interval, cell_text, heatmap_model
from kvgraft.results.base import JsonObject
from kvgraft.results.generalization import NamedAccuracy
from kvgraft.results.recompute import RecomputeData

HTML_COLOR = {
    "passed": "#1b7f3b", "supported": "#1b7f3b", "consistent": "#1b7f3b",
    "failed": "#b3261e", "contradicted": "#b3261e", "inconsistent": "#b3261e",
    "skipped": "#8a6d00", "incomplete": "#8a6d00", "unsupported": "#8a6d00",
    "not-testable": "#1f5f8b", "needs-measurement": "#1f5f8b",
}


def as_json(x: Any) -> str:
    flat = json.dumps(x, sort_keys=True, ensure_ascii=False)
    return flat if len(flat) <= 100 else json.dumps(x, indent=2, sort_keys=True, ensure_ascii=False)


def esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def badge(word: str, label: str | None = None) -> str:
    return f'<span class="badge" style="background:{HTML_COLOR.get(word, "#555")}">{esc(label or word)}</span>'


def table(headers: list[str], rows: list[list[str]], num: Iterable[int] = ()) -> str:
    numcols = set(num)
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f'<td class="num">{c}</td>' if i in numcols else f"<td>{c}</td>" for i, c in enumerate(r))
                   + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def heatmap_svg(data: RecomputeData) -> str:
    m = heatmap_model(data)
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
        parts.append(f'<text x="{label_w - 6}" y="{y + 11}" font-size="11" text-anchor="end">{esc(r["id"][:26])}</text>')
        for i in range(m["layers"]):
            c = r["cells"].get(i)
            x = label_w + cell * i
            if c is None or (not c["known"] and not c["mismatch"]):
                tip = f"{r['id']} layer {i}: {cell_text(c) if c else 'no data'}"
                parts.append(f'<rect x="{x:.1f}" y="{y}" width="{cell - 1:.1f}" height="15" fill="#fff" stroke="#ddd">'
                             f"<title>{esc(tip)}</title></rect>")
                continue
            if c["mismatch"]:
                tip = f"{r['id']} layer {i}: {cell_text(c)}"
                parts.append(f'<rect x="{x:.1f}" y="{y}" width="{cell - 1:.1f}" height="15" '
                             f'fill="{HEAT[-1]}" stroke="#000">'
                             f"<title>{esc(tip)}</title></rect>")
                continue
            level = c.get("level")
            fill = IDENTICAL_COLOR if c["identical"] else HEAT[level if level is not None else 0]
            tip = f"{r['id']} layer {i}: {cell_text(c)}"
            parts.append(f'<rect x="{x:.1f}" y="{y}" width="{cell - 1:.1f}" height="15" fill="{fill}">'
                         f"<title>{esc(tip)}</title></rect>")
            if c["identical"]:
                parts.append(f'<circle cx="{x + (cell - 1) / 2:.1f}" cy="{y + 7.5}" r="1.5" fill="#4a7c59"/>')
    ly = top + 16 * len(m["rows"]) + 14
    parts.append(f'<rect x="{label_w}" y="{ly}" width="14" height="12" fill="{IDENTICAL_COLOR}"/>'
                 f'<text x="{label_w + 18}" y="{ly + 10}" font-size="11">byte-identical</text>')
    lx = label_w + 120
    lo_label = "1 ULP" if m["metric"] == "ulp" else f"|diff| 10^{m['log_lo']:.1f}"
    hi_label = (f"{10 ** m['log_hi']:,.0f} ULP" if m["metric"] == "ulp" else f"10^{m['log_hi']:.1f}")
    parts.append(f'<text x="{lx}" y="{ly + 10}" font-size="11">{esc(lo_label)}</text>')
    lx += 8 + 7 * len(lo_label)
    for k, color in enumerate(HEAT):
        parts.append(f'<rect x="{lx + 18 * k}" y="{ly}" width="18" height="12" fill="{color}"/>')
    parts.append(f'<text x="{lx + 18 * len(HEAT) + 6}" y="{ly + 10}" font-size="11">'
                 f"{esc(hi_label)} (log scale, max of K and V)</text>")
    parts.append("</svg>")
    more = f'<p class="muted">{m["truncated"]} more entries not shown.</p>' if m["truncated"] else ""
    return "".join(parts) + more


def intervals_svg(accuracies: list[NamedAccuracy]) -> str:
    rows = [(a, acc_interval(a)) for a in accuracies]
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
        k, n = a.k, a.n
        parts.append(f'<text x="{label_w - 8}" y="{y + 4:.1f}" font-size="12" text-anchor="end">{esc(a.name)}</text>')
        if iv is not None:
            x0, x1 = label_w + plot_w * iv[0], label_w + plot_w * iv[1]
            parts.append(f'<rect x="{x0:.1f}" y="{y - 6:.1f}" width="{max(1.0, x1 - x0):.1f}" height="12" rx="3" fill="#9ecae1">'
                         f'<title>{esc(a.name)}: 95% interval {pct(iv[0])}–{pct(iv[1])}</title></rect>')
        px = label_w + plot_w * k / n
        parts.append(f'<circle cx="{px:.1f}" cy="{y:.1f}" r="5" fill="#08519c"/>')
        right = f"{k}/{n} = {pct(k / n)}" + (f" [{pct(iv[0])}, {pct(iv[1])}]" if iv else "")
        parts.append(f'<text x="{label_w + plot_w + 10}" y="{y + 4:.1f}" font-size="12">{esc(right)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def accuracy_html(title: str, accuracies: list[NamedAccuracy]) -> str:
    rows = []
    for a in accuracies:
        k, n = a.k, a.n
        iv = acc_interval(a)
        rows.append([esc(a.name), f"{k}/{n}", pct(k / n), "-" if iv is None else f"{pct(iv[0])}–{pct(iv[1])}"])
    return f"<h3>{esc(title)}</h3>" + intervals_svg(accuracies) + table(["condition", "k/n", "accuracy", "95% Wilson interval"],
                                                                      rows, num=(1, 2, 3))


def kv_html(mapping: JsonObject) -> str:
    rows = [[esc(k), esc(f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else
                      (json.dumps(v) if isinstance(v, (dict, list)) else v))] for k, v in mapping.items()]
    return table(["what", "value"], rows)
