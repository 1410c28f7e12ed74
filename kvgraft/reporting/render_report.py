"""Terminal renderings of audit reports: the face (kvgraft.reporting.face), and each check's details.

Details tables show at their natural width when it fits the terminal, else as one paragraph per row: ids and
verdicts are wrapped, never cut. Data members a renderer does not know are named, never dropped silently.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from kvgraft.errors import InputError
from kvgraft.reporting import face
from kvgraft.reporting.render import STATUS_STYLE, WORDS, fitted, hanging, kv_lines, num, pct, plain_tree, styled, table
from kvgraft.reporting.views import (
    CONTROLS_HEAD,
    HEAT,
    KNOWN_DATA,
    acc_interval,
    controls_rows,
    determinism_model,
    heatmap_model,
    readings_lines,
    recompute_rows,
    verify_lines,
)


def heatmap_text(data: dict[str, Any], columns: int = 80) -> RenderableType:
    """Rows: entries, columns: layers. Ids that leave no room for the layers go on a line of their own."""
    m = heatmap_model(data)
    if not m["rows"] or not m["layers"]:
        return Text("(no per-layer data)", style="dim")
    width = max(len(r["id"]) for r in m["rows"])
    own_line = width + 1 + m["layers"] > columns
    if own_line:
        width = 2
    labels = [" "] * m["layers"]
    for i in range(0, m["layers"], 10):
        for j, ch in enumerate(str(i)):
            if i + j < m["layers"]:
                labels[i + j] = ch
    axis = Text(" " * (width + 1) + "".join(labels), style="dim")
    lines = [axis]
    for r in m["rows"]:
        if own_line:
            lines.append(Text(r["id"]))
        line = Text(" " * (width + 1) if own_line else r["id"].ljust(width) + " ")
        for i in range(m["layers"]):
            c = r["cells"].get(i)
            if c is not None and c["mismatch"]:
                line.append("!", style="bold red")
            elif c is None or not c["known"]:
                line.append(" ")
            elif c["identical"]:
                line.append("·", style="green")
            else:
                level = c.get("level")
                ch = str(min(9, int(c["log10"]))) if m["metric"] == "ulp" and "log10" in c else "■"
                color = HEAT[level] if level is not None else HEAT[0]
                line.append(ch, style=f"black on {color}")
        lines.append(line)
    legend = Text("· byte-identical   ! layout mismatch   ", style="dim")
    if m["metric"] == "ulp":
        legend.append("digit d = max ULP ~ 10^d (K and V): ", style="dim")
    else:
        legend.append(f"max |diff| 10^{m['log_lo']:.1f} ", style="dim")
    for color in HEAT:
        legend.append("  ", style=f"on {color}")
    if m["metric"] != "ulp":
        legend.append(f" 10^{m['log_hi']:.1f}", style="dim")
    lines.append(legend)
    if m["truncated"]:
        lines.append(Text(f"... {m['truncated']} more entries not shown", style="dim"))
    return Group(Text("per-layer divergence (rows: entries, columns: layers)", style="bold"), *lines)


def interval_bar(k: int, n: int, lo: float, hi: float, width: int = 30) -> Text:
    """░ outside the interval, ▓ inside it, █ at the point estimate; 0% at the left, 100% at the right."""
    p = k / n
    point = min(width - 1, int(p * width))
    bar = Text()
    for i in range(width):
        left, right = i / width, (i + 1) / width
        if i == point:
            bar.append("█", style="bold")
        elif right > lo and left < hi:
            bar.append("▓", style="cyan")
        else:
            bar.append("░", style="dim")
    return bar



def accuracy_view(console: Console, title: str, accuracies: list[dict[str, Any]]) -> RenderableType:
    headers = ["condition", "k/n", "accuracy", "95% interval"]
    t = Table(title=title, title_justify="left")
    for i, h in enumerate([*headers, "0% " + " " * 24 + "100%"]):
        t.add_column(h, justify="right" if i in (1, 2, 3) else "left")
    rows = []
    for a in accuracies:
        k, n = int(a["k"]), int(a["n"])
        iv = acc_interval(a) if n else None
        row = [str(a["name"]), f"{k}/{n}", pct(k / n) if n else "-", f"{pct(iv[0])}–{pct(iv[1])}" if iv else "-"]
        rows.append(row)
        t.add_row(*row, interval_bar(k, n, *iv) if iv else "")
    return fitted(console, t, headers, rows)


def _recompute(data: dict[str, Any], console: Console) -> list[RenderableType]:
    headers = ["entry", "tokens", "verdict", "layers differing", "max |diff|", "max relative", "of envelope",
               "max ULP (same-sign normals)", "first difference", "KL max", "KL vs no cache"]
    rows = [[r["id"], num(r["tokens"]), r["verdict"], f"{r['differing_layers']}/{r['layers']}", num(r["max_abs"]),
             num(r["max_rel"]), num(r["excess"]), num(r["max_ulp"]), r["first"], num(r["kl"]), num(r["kl_natural"])]
            for r in recompute_rows(data)]
    out = [table(console, "entries", headers, rows, right=(1, 3, 4, 5, 6, 7, 9, 10)), heatmap_text(data, console.width)]
    return out + [styled(hanging("•", st, console.width, indent=0)) for st in data.get("statements", [])]


def _generalization(data: dict[str, Any], console: Console) -> list[RenderableType]:
    result = data.get("result")
    if isinstance(result, dict) and result.get("kind") == "generalization":
        from kvgraft.reporting.render_generalization import renderables

        return renderables(result, console)
    bench = data.get("benchmark", {})
    out = [accuracy_view(console, "accuracy" + (f" on {bench['name']}" if bench.get("name") else ""),
                         data.get("conditions", []))]
    if data.get("mcnemar"):
        rows = [[str(m["a"]), str(m["b"]), str(m["a_only"]), str(m["b_only"]), f"{m['p_value']:.4g}"]
                for m in data["mcnemar"]]
        out.append(table(console, "paired comparisons (exact McNemar)", ["a", "b", "only a", "only b", "p"], rows))
    for part in ("clean", "contaminated"):
        if (data.get("split") or {}).get(part):
            out.append(accuracy_view(console, f"{part} problems", data["split"][part]))
    if isinstance(data.get("ledger"), dict):
        out.append(mapping_view(console, "generalization ledger", data["ledger"]))
    return out


def _determinism(data: dict[str, Any], console: Console) -> list[RenderableType]:
    m = determinism_model(data)
    out: list[RenderableType] = []
    if m["conditions"]:
        rows = [[str(x["name"]), str(x.get("class", "?")), num(x.get("max_ulp")), num(x.get("max_abs")), num(x.get("kl"))]
                for x in m["conditions"]]
        out.append(table(console, f"KV byte classes: {m['classes']} among {len(m['conditions'])} conditions "
                                  "(same class = same bytes)", ["condition", "class", "max ULP", "max |diff|", "KL"], rows))
    if m["rows"]:
        headers = ["entry"] + [str(x["name"]) for x in m["conditions"]]
        rows = [[row["entry"]] + [lab for lab, _ in row["cells"]] for row in m["rows"]]
        out.append(table(console, "per entry (same letter in a row = same bytes)", headers, rows))
    return out + [styled(hanging("•", n, console.width, indent=0)) for n in data.get("notes", [])]


def _verify(data: dict[str, Any], console: Console) -> list[RenderableType]:
    result, details = verify_lines(data)
    lines: list[RenderableType] = [Text(f"result: {result}", style="green" if data.get("ok") else "red")]
    return lines + [Text("\n".join(hanging("", d, console.width))) for d in details]


def mapping_view(console: Console, title: str, mapping: dict[str, Any]) -> RenderableType:
    """`key value` lines; a nested value is named by its size (it is in the JSON), never dumped."""
    rows = [(str(k), f"({len(v)} items, in the report JSON)" if isinstance(v, (dict, list)) else num(v))
            for k, v in mapping.items()]
    return styled(kv_lines(console.width, title, rows), WORDS)


def claims_view(console: Console, claims: list[dict[str, Any]], title: str = "claims") -> RenderableType:
    """One paragraph per claim: id, verdict, what was claimed, and each finding behind the verdict."""
    lines = [title]
    for c in claims:
        lines.append("")
        lines += hanging(f"{c['id']}  {c['verdict']}", str(c.get("claimed", "")), console.width, indent=0)
        for f in c.get("findings", []) or [{"check": "reason", "verdict": c["verdict"], "detail": c.get("reason", "")}]:
            lines += hanging("", f"· {f['check']} ({f['verdict']}): {f['detail']}", console.width)
    return styled(lines, WORDS)


def claims_check_renderables(result: dict[str, Any], console: Console) -> list[RenderableType]:
    """The terminal rendering of a claims-check result (`audit claims`, kvgraft.reporting.claims.check)."""
    result = plain_tree(result)
    title = f"claims of {result['source'].get('title', result['claims_file']['path'])}"
    out: list[RenderableType] = [styled(hanging("", line, console.width, indent=0)) for line in readings_lines(result)]
    out.append(claims_view(console, result["claims"], title))
    counts = ", ".join(f"{n} {k}" for k, n in result["counts"].items() if n)
    status = result.get("status", "failed" if result["failed"] else "passed")
    out.append(Text(f"{status.upper()}: {counts}", style=STATUS_STYLE.get(status, "bold")))
    if result["unused_measurements"]:
        out.append(Text("measurements no claim uses: " + ", ".join(result["unused_measurements"]), style="yellow"))
    return out


def _controls(data: dict[str, Any], console: Console) -> list[RenderableType]:
    rows = controls_rows(data)
    out = [table(console, "controls: planted effects on a generated fact library", CONTROLS_HEAD, rows)]
    return out + [styled(hanging("•", s, console.width, indent=0)) for s in data.get("statements", [])]


def _claims(data: dict[str, Any], console: Console) -> list[RenderableType]:
    return [styled(hanging("", line, console.width, indent=0)) for line in readings_lines(data)] + [
        claims_view(console, [c for c in data.get("claims", []) if isinstance(c, dict)])]


DETAILS: dict[str, Callable[[dict[str, Any], Console], list[RenderableType]]] = {
    "recompute": _recompute, "generalization": _generalization, "determinism": _determinism, "verify": _verify,
    "claims": _claims, "controls": _controls,
}


def check_renderables(kind: str, data: dict[str, Any], console: Console) -> list[RenderableType]:
    """One check's details: the view `audit recompute` and `audit determinism` print on their own, and
    `report show --detail NAME` prints for a check of a report."""
    renderer = DETAILS.get(kind)
    return renderer(plain_tree(data), console) if renderer is not None else []


def _check_details(c: dict[str, Any], console: Console) -> list[RenderableType]:
    head = Text(f"{c['name']} ", style="bold")
    head.append(c["status"], style=STATUS_STYLE.get(c["status"], ""))
    head.append(f" ({c['kind']})", style="dim")
    out: list[RenderableType] = [head, styled(hanging("", c["summary"], console.width, indent=0))]
    if c["status"] == "skipped":
        out.append(Text(f"skipped: {c['reason']}", style="yellow"))
    if c["data"]:
        out += check_renderables(c["kind"], c["data"], console)
        rest = {k: v for k, v in c["data"].items() if k not in KNOWN_DATA.get(c["kind"], ())}
        if rest:
            out.append(mapping_view(console, "other data", rest))
    return out


def detail_renderables(report: dict[str, Any], name: str, console: Console) -> list[RenderableType]:
    """`report show --detail NAME`: one check's details, the token ledger, or (`all`) everything."""
    if name not in face.detail_names(report):
        raise InputError(f"no check named {name!r} in this report (one of: {', '.join(face.detail_names(report))})")
    out: list[RenderableType] = []
    for c in report["checks"]:
        if name in (c["name"], "all"):
            out += [*_check_details(c, console), Text("")]
    if name in ("claims", "all") and face.claims_outside_checks(report):
        out += [claims_view(console, report["claims"]), Text("")]
    if name in ("ledger", "all") and report.get("ledger"):
        out.append(mapping_view(console, "token ledger", report["ledger"]))
    return out


def print_report(report: dict[str, Any], console: Console, *, detail: str | None = None, path: str = "REPORT") -> None:
    """The face of a report, or with `detail` the details of one check (see detail_renderables)."""
    report = plain_tree(report)  # every field it shows as text: ids, names, environment strings
    shown = face.renderables(report, console.width, path) if detail is None else detail_renderables(report, detail, console)
    for r in shown:
        console.print(r)

