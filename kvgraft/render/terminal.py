"""Terminal building blocks the check kinds draw their details with: heat map, accuracy bars, key-value and claims views."""

from __future__ import annotations

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from kvgraft.render.text import WORDS, fitted, hanging, kv_lines, num, pct, styled
from kvgraft.render.views import HEAT, acc_interval, heatmap_model
from kvgraft.results.base import JsonObject
from kvgraft.results.claims import ClaimVerdict, ShownFinding
from kvgraft.results.generalization import NamedAccuracy
from kvgraft.results.recompute import RecomputeData


def heatmap_text(data: RecomputeData, columns: int = 80) -> RenderableType:
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



def accuracy_view(console: Console, title: str, accuracies: list[NamedAccuracy]) -> RenderableType:
    headers = ["condition", "k/n", "accuracy", "95% interval"]
    t = Table(title=title, title_justify="left")
    for i, h in enumerate([*headers, "0% " + " " * 24 + "100%"]):
        t.add_column(h, justify="right" if i in (1, 2, 3) else "left")
    rows = []
    for a in accuracies:
        k, n = a.k, a.n
        iv = acc_interval(a) if n else None
        row = [a.name, f"{k}/{n}", pct(k / n) if n else "-", f"{pct(iv[0])}–{pct(iv[1])}" if iv else "-"]
        rows.append(row)
        t.add_row(*row, interval_bar(k, n, *iv) if iv else "")
    return fitted(console, t, headers, rows)




def mapping_view(console: Console, title: str, mapping: JsonObject) -> RenderableType:
    """`key value` lines; a nested value is named by its size (it is in the JSON), never dumped."""
    rows = [(str(k), f"({len(v)} items, in the report JSON)" if isinstance(v, (dict, list)) else num(v))
            for k, v in mapping.items()]
    return styled(kv_lines(console.width, title, rows), WORDS)


def claims_view(console: Console, claims: list[ClaimVerdict], title: str = "claims") -> RenderableType:
    """One paragraph per claim: id, verdict, what was claimed, and each finding behind the verdict."""
    lines = [title]
    for c in claims:
        lines.append("")
        lines += hanging(f"{c.id}  {c.verdict}", c.claimed or "", console.width, indent=0)
        for f in c.findings or [ShownFinding(check="reason", verdict=c.verdict, detail=c.reason or "")]:
            lines += hanging("", f"· {f.check} ({f.verdict}): {f.detail}", console.width)
    return styled(lines, WORDS)


