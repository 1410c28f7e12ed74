"""Renderings of audit reports and claims checks: rich for the terminal, one self-contained HTML page.

The HTML page has inline CSS and inline SVG only: no scripts, no external resources (a Content-Security-Policy
meta tag forbids them), every string from the report escaped. Both renderings tolerate check data they do not
know: unknown members are shown as JSON, never dropped silently.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterable
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

# --- shared vocabulary -----------------------------------------------------------------------------------------

STATUS_STYLE = {"passed": "bold green", "failed": "bold red", "skipped": "yellow", "incomplete": "bold yellow"}
VERDICT_STYLE = {
    "supported": "green", "consistent": "green", "contradicted": "bold red", "inconsistent": "bold red",
    "unsupported": "yellow", "not-testable": "cyan", "needs-measurement": "cyan",
}
HTML_COLOR = {
    "passed": "#1b7f3b", "supported": "#1b7f3b", "consistent": "#1b7f3b",
    "failed": "#b3261e", "contradicted": "#b3261e", "inconsistent": "#b3261e",
    "skipped": "#8a6d00", "incomplete": "#8a6d00", "unsupported": "#8a6d00",
    "not-testable": "#1f5f8b", "needs-measurement": "#1f5f8b",
}
# Heat-map palette, low to high divergence.
HEAT = ["#fde68a", "#fcbf49", "#f77f00", "#e4572e", "#c1121f", "#780000"]
IDENTICAL_COLOR = "#e6f4ea"
CLASS_COLORS = ["#cfe8ff", "#ffd6a5", "#caffbf", "#ffadad", "#bdb2ff", "#fdffb6", "#9bf6ff", "#ffc6ff"]
MAX_HEAT_ROWS = 200
MAX_HEAT_LAYERS = 1024  # layer indices beyond this are not drawn (no model has that many; a bad report might)


# --- heat-map model --------------------------------------------------------------------------------------------


def _layer_cell(layer: dict[str, Any]) -> dict[str, Any]:
    """Merge a layer's K and V diffs (kvgraft.compare.TensorDiff dicts): identical, differing, max ULP, max abs."""
    parts = [layer[x] for x in ("keys", "values") if isinstance(layer.get(x), dict)]
    differing = sum(int(p.get("differing") or 0) for p in parts)
    ulps = [int(p["max_ulp"]) for p in parts if p.get("max_ulp") is not None]
    absd = [float(p["max_abs"]) for p in parts if p.get("max_abs") is not None]
    known = bool(parts) and "layout_mismatch" not in layer
    identical = known and all(p.get("equal") is True for p in parts)
    mismatch = layer.get("layout_mismatch") or next((p["shape_mismatch"] for p in parts if p.get("shape_mismatch")), None)
    return {"index": layer.get("index"), "kind": layer.get("kind"), "known": known, "identical": identical,
            "differing": differing, "max_ulp": max(ulps) if ulps else None, "max_abs": max(absd) if absd else None,
            "mismatch": mismatch}


def heatmap_model(data: dict[str, Any]) -> dict[str, Any]:
    """Rows = entries, columns = layers; each cell's level 0..len(HEAT)-1 by log10 of max ULP (else max abs diff)."""
    entries = [e for e in data.get("entries", []) if isinstance(e, dict)]
    n_layers = 0
    rows: list[dict[str, Any]] = []
    for e in entries[:MAX_HEAT_ROWS]:
        cells: dict[int, dict[str, Any]] = {}
        for layer in e.get("layers", []):
            if isinstance(layer, dict) and isinstance(layer.get("index"), int) and layer["index"] < MAX_HEAT_LAYERS:
                cells[layer["index"]] = _layer_cell(layer)
                n_layers = max(n_layers, layer["index"] + 1)
        rows.append({"id": str(e.get("id", "?")), "cells": cells, "byte_exact": e.get("byte_exact")})
    metric = "ulp" if any(c["max_ulp"] for r in rows for c in r["cells"].values()) else "abs"
    values = [math.log10(v) for r in rows for c in r["cells"].values()
              if not c["identical"] and (v := (c["max_ulp"] if metric == "ulp" else c["max_abs"])) and v > 0]
    lo = min(values) if values else 0.0
    hi = max(values) if values else 0.0
    if metric == "ulp":
        lo = 0.0
    for r in rows:
        for c in r["cells"].values():
            v = c["max_ulp"] if metric == "ulp" else c["max_abs"]
            if c["identical"] or not v or v <= 0:
                c["level"] = None
                continue
            x = math.log10(v)
            frac = 0.0 if hi <= lo else (x - lo) / (hi - lo)
            c["level"] = min(len(HEAT) - 1, max(0, int(frac * len(HEAT))))
            c["log10"] = x
    return {"rows": rows, "layers": n_layers, "metric": metric, "log_lo": lo, "log_hi": hi,
            "truncated": max(0, len(entries) - MAX_HEAT_ROWS)}


def _cell_text(c: dict[str, Any]) -> str:
    if c.get("kind") == "shared" and not c["known"]:
        return "shared layer: stores no states of its own"
    if c.get("mismatch"):
        return f"layout mismatch: {c['mismatch']}"
    if not c["known"]:
        return "no data"
    if c["identical"]:
        return "byte-identical"
    parts = [f"{c['differing']:,} elements differ"]
    if c["max_ulp"] is not None:
        parts.append(f"max {c['max_ulp']:,} ULP")
    if c["max_abs"] is not None:
        parts.append(f"max |diff| {c['max_abs']:.3g}")
    return ", ".join(parts)


def recompute_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """One summary per entry of a recompute check: the table both renderings show."""
    out = []
    for e in data.get("entries", []):
        cells = [_layer_cell(x) for x in e.get("layers", []) if isinstance(x, dict)]
        ulps = [x["max_ulp"] for x in cells if x["max_ulp"] is not None]
        absd = [x["max_abs"] for x in cells if x["max_abs"] is not None]
        matched = e.get("matched") if isinstance(e.get("matched"), dict) else {}
        natural = e.get("natural") if isinstance(e.get("natural"), dict) else {}
        verdict = e.get("verdict") or ("byte-exact" if e.get("byte_exact") else "differs")
        out.append({"id": str(e.get("id")), "tokens": e.get("num_tokens"), "exact": bool(e.get("byte_exact")),
                    "verdict": str(verdict), "excess": e.get("max_excess"),
                    "differing_layers": sum(1 for x in cells if not x["identical"] and (x["known"] or x["mismatch"])),
                    "layers": len(cells), "max_ulp": max(ulps) if ulps else None, "max_abs": max(absd) if absd else None,
                    "first": _first_difference(e), "kl": matched.get("kl_max"), "kl_natural": natural.get("kl_max")})
    return out


def _first_difference(entry: dict[str, Any]) -> str:
    fd = entry.get("first_difference")
    if not isinstance(fd, dict):
        return "-"
    where = f"layer {fd.get('layer')}"
    if fd.get("tensor"):
        where += f" {fd['tensor']}"
    loc = fd.get("location")
    if isinstance(loc, list) and len(loc) == 4:
        where += f" pos {loc[2]} (head {loc[1]}, dim {loc[3]})"
    elif loc:
        where += f" at {loc}"
    if fd.get("detail"):
        where += f": {fd['detail']}"
    return where


def _num(x: Any, spec: str = ".3g") -> str:
    if x is None:
        return "-"
    if isinstance(x, int) and not isinstance(x, bool):
        return f"{x:,}"
    return format(x, spec) if isinstance(x, float) else str(x)


def determinism_model(data: dict[str, Any]) -> dict[str, Any]:
    """Conditions with their class and colour index, and the optional per-entry rows."""
    conds = [x for x in data.get("conditions", []) if isinstance(x, dict)]
    order = list(dict.fromkeys(str(x["class"]) for x in conds if "class" in x))
    colour = {label: CLASS_COLORS[i % len(CLASS_COLORS)] for i, label in enumerate(order)}
    rows = []
    for row in data.get("rows", []):
        labels = [str(x) for x in row.get("classes", [])]
        row_order = list(dict.fromkeys(labels))
        rows.append({"entry": str(row.get("entry")),
                     "cells": [(lab, CLASS_COLORS[row_order.index(lab) % len(CLASS_COLORS)]) for lab in labels]})
    return {"conditions": conds, "colour": colour, "classes": len(order), "rows": rows}


def verify_lines(data: dict[str, Any]) -> tuple[str, list[str]]:
    """(result, details) of a verify check's data (a verify result)."""
    result = "ok" if data.get("ok") else f"failed: {data.get('error') or 'see details'}"
    details = [str(d) for d in data.get("details", [])]
    for key, label in (("root_digest", "root digest"), ("entries", "entries"), ("files", "files checked"),
                       ("tensors", "tensors"), ("bytes_hashed", "bytes hashed"), ("deep", "deep (every tensor re-hashed)")):
        if key in data:
            details.append(f"{label}: {_num(data[key])}")
    sig = data.get("signature")
    if isinstance(sig, dict):
        who = sig.get("identity") or sig.get("key_id") or ""
        details.append(f"signature: {sig.get('status')} {sig.get('method') or ''} {who}".strip())
    return result, details


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _acc_interval(a: dict[str, Any]) -> tuple[float, float] | None:
    iv = a.get("interval")
    if isinstance(iv, list) and len(iv) == 2:
        return float(iv[0]), float(iv[1])
    try:
        from kvgraft.reporting.report import wilson_interval

        return wilson_interval(int(a["k"]), int(a["n"]), float(a.get("confidence", 0.95)))
    except Exception:
        return None


def _json(x: Any) -> str:
    flat = json.dumps(x, sort_keys=True, ensure_ascii=False)
    return flat if len(flat) <= 100 else json.dumps(x, indent=2, sort_keys=True, ensure_ascii=False)


def _data_rest(data: dict[str, Any], known: Iterable[str]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k not in set(known)}


# --- terminal --------------------------------------------------------------------------------------------------


def verdict_panel(report: dict[str, Any]) -> Panel:
    v = report["verdict"]
    style = STATUS_STYLE.get(v["status"], "bold")
    body = Text()
    body.append(f"{v['status'].upper()}\n", style=style)
    body.append(v["headline"] + "\n")
    checks = v["checks"]
    incomplete = f", {checks['incomplete']} incomplete" if checks.get("incomplete") else ""
    body.append(f"checks: {checks['passed']} passed, {checks['failed']} failed{incomplete}, {checks['skipped']} skipped\n")
    claims = ", ".join(f"{n} {k}" for k, n in v["claims"].items() if n)
    body.append(f"claims: {claims or 'none'}")
    model = (report.get("model") or {}).get("spec", "no model")
    title = f"kvgraft audit · {report['plan']['name']} · {model}"
    return Panel(body, title=title, title_align="left", border_style=style.replace("bold ", ""))


def identity_table(report: dict[str, Any]) -> Table:
    t = Table(title="what was audited", show_header=False, title_justify="left")
    t.add_column("what", style="dim")
    t.add_column("value", overflow="fold")
    model = report.get("model") or {}
    t.add_row("kvgraft", report["kvgraft_version"])
    t.add_row("created", report["created"])
    t.add_row("plan", f"{report['plan']['name']}  {report['plan'].get('sha256', '')}")
    t.add_row("model", str(model.get("spec", "none")))
    if isinstance(model.get("identity"), dict) and model["identity"].get("sha256"):
        t.add_row("model identity", model["identity"]["sha256"])
    t.add_row("release root digest", str(report["release_root_digest"]))
    t.add_row("release attestation", str(report["binding"]["release_attestation_digest"] or "none (unsigned release)"))
    env = report.get("environment") or {}
    summary = ", ".join(f"{k}={env[k]}" for k in ("device", "device_name", "dtype", "attn_implementation", "torch") if k in env)
    if summary:
        t.add_row("environment", summary)
    if report.get("note"):
        t.add_row("note", Text(report["note"], style="italic"))
    return t


def checks_table(report: dict[str, Any]) -> Table:
    t = Table(title="checks", title_justify="left")
    t.add_column("check")
    t.add_column("kind", style="dim")
    t.add_column("status")
    t.add_column("summary", overflow="fold")
    for c in report["checks"]:
        summary = c["summary"] + (f" [skipped: {c['reason']}]" if c["status"] == "skipped" else "")
        t.add_row(c["name"], c["kind"], Text(c["status"], style=STATUS_STYLE.get(c["status"], "")), Text(summary))
    return t


def heatmap_text(data: dict[str, Any]) -> RenderableType:
    m = heatmap_model(data)
    if not m["rows"] or not m["layers"]:
        return Text("(no per-layer data)", style="dim")
    width = max(len(r["id"]) for r in m["rows"])
    width = min(width, 24)
    labels = [" "] * m["layers"]
    for i in range(0, m["layers"], 10):
        for j, ch in enumerate(str(i)):
            if i + j < m["layers"]:
                labels[i + j] = ch
    axis = Text(" " * (width + 1) + "".join(labels), style="dim")
    lines = [axis]
    for r in m["rows"]:
        line = Text(r["id"][:width].ljust(width) + " ")
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


def accuracy_table(title: str, accuracies: list[dict[str, Any]]) -> Table:
    t = Table(title=title, title_justify="left")
    t.add_column("condition")
    t.add_column("k/n", justify="right")
    t.add_column("accuracy", justify="right")
    t.add_column("95% interval", justify="right")
    t.add_column("0% " + " " * 24 + "100%")
    for a in accuracies:
        k, n = int(a["k"]), int(a["n"])
        iv = _acc_interval(a)
        if iv is None:
            t.add_row(str(a["name"]), f"{k}/{n}", "-", "-", "")
            continue
        t.add_row(str(a["name"]), f"{k}/{n}", _pct(k / n), f"{_pct(iv[0])}–{_pct(iv[1])}", interval_bar(k, n, *iv))
    return t


def _recompute_terminal(c: dict[str, Any]) -> list[RenderableType]:
    data = c["data"]
    t = Table(title="entries", title_justify="left")
    for col in ("entry", "tokens", "verdict", "layers differing", "max ULP", "max |diff|", "of envelope",
                "first difference", "KL max", "KL vs no cache"):
        t.add_column(col)
    for r in recompute_rows(data):
        style = {"byte-exact": "green", "consistent": "yellow"}.get(r["verdict"], "red")
        t.add_row(r["id"], _num(r["tokens"]), Text(r["verdict"], style=style),
                  f"{r['differing_layers']}/{r['layers']}", _num(r["max_ulp"]), _num(r["max_abs"]), _num(r["excess"]),
                  r["first"], _num(r["kl"]), _num(r["kl_natural"]))
    out: list[RenderableType] = [t, heatmap_text(data)]
    out += [Text(f"• {st}") for st in data.get("statements", [])]
    return out


def _generalization_terminal(c: dict[str, Any]) -> list[RenderableType]:
    data = c["data"]
    bench = data.get("benchmark", {})
    title = "accuracy" + (f" on {bench.get('name')}" if bench.get("name") else "")
    out: list[RenderableType] = [accuracy_table(title, data.get("conditions", []))]
    if data.get("mcnemar"):
        t = Table(title="paired comparisons (exact McNemar)", title_justify="left")
        for col in ("a", "b", "only a", "only b", "p"):
            t.add_column(col)
        for m in data["mcnemar"]:
            t.add_row(str(m["a"]), str(m["b"]), str(m["a_only"]), str(m["b_only"]), f"{m['p_value']:.4g}")
        out.append(t)
    split = data.get("split") or {}
    for part in ("clean", "contaminated"):
        if split.get(part):
            out.append(accuracy_table(f"{part} problems", split[part]))
    if isinstance(data.get("ledger"), dict):
        out.append(kv_table("generalization ledger", data["ledger"]))
    return out


def _determinism_terminal(c: dict[str, Any]) -> list[RenderableType]:
    m = determinism_model(c["data"])
    out: list[RenderableType] = []
    if m["conditions"]:
        t = Table(title=f"KV byte classes: {m['classes']} among {len(m['conditions'])} conditions (same class = same bytes)",
                  title_justify="left")
        for col in ("condition", "class", "max ULP", "max |diff|", "KL"):
            t.add_column(col)
        for x in m["conditions"]:
            label = str(x.get("class", "?"))
            t.add_row(str(x["name"]), Text(f" {label} ", style=f"black on {m['colour'].get(label, '#dddddd')}"),
                      _num(x.get("max_ulp")), _num(x.get("max_abs")), _num(x.get("kl")))
        out.append(t)
    if m["rows"]:
        t = Table(title="per entry (same letter in a row = same bytes)", title_justify="left")
        t.add_column("entry")
        for x in m["conditions"]:
            t.add_column(str(x["name"]), justify="center")
        for row in m["rows"]:
            t.add_row(row["entry"], *[Text(f" {lab} ", style=f"black on {col}") for lab, col in row["cells"]])
        out.append(t)
    out += [Text(f"• {n}") for n in c["data"].get("notes", [])]
    return out


def _verify_terminal(c: dict[str, Any]) -> list[RenderableType]:
    result, details = verify_lines(c["data"])
    return [Text(f"result: {result}", style="green" if c["data"].get("ok") else "red"), *[Text(f"  {d}") for d in details]]


def kv_table(title: str, mapping: dict[str, Any]) -> Table:
    t = Table(title=title, show_header=False, title_justify="left")
    t.add_column("what", style="dim")
    t.add_column("value", overflow="fold")
    for k, v in mapping.items():
        t.add_row(str(k), f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else
                  (json.dumps(v) if isinstance(v, (dict, list)) else str(v)))
    return t


def claims_table(claims: list[dict[str, Any]], *, findings: bool = False, title: str = "claims") -> Table:
    """One row per claim with its verdict; with findings=True (a claims-check result) the findings behind it."""
    t = Table(title=title, title_justify="left", show_lines=findings)
    t.add_column("claim", no_wrap=True)
    t.add_column("claimed", ratio=1)
    t.add_column("verdict", no_wrap=True)
    t.add_column("findings" if findings else "reason", ratio=3)
    for c in claims:
        if findings:
            why = Text()
            for i, f in enumerate(c.get("findings", [])):
                if i:
                    why.append("\n")
                why.append(f"{f['check']} ", style="dim")
                why.append(f"({f['verdict']})", style=VERDICT_STYLE.get(f["verdict"], ""))
                why.append(f": {f['detail']}")
        else:
            why = Text(c["reason"])
        t.add_row(Text(c["id"], style="bold"), Text(c.get("claimed", "")),
                  Text(c["verdict"], style=VERDICT_STYLE.get(c["verdict"], "")), why)
    return t


def claims_check_renderables(result: dict[str, Any]) -> list[RenderableType]:
    """The terminal rendering of a claims-check result (kvgraft.reporting.claims.check)."""
    title = f"claims of {result['source'].get('title', result['claims_file']['path'])}"
    out: list[RenderableType] = [Text(line) for line in readings_lines(result)]
    out.append(claims_table(result["claims"], findings=True, title=title))
    counts = ", ".join(f"{n} {k}" for k, n in result["counts"].items() if n)
    status = result.get("status", "failed" if result["failed"] else "passed")
    out.append(Text(f"{status.upper()}: {counts}", style=STATUS_STYLE.get(status, "bold")))
    if result["unused_measurements"]:
        out.append(Text("measurements no claim uses: " + ", ".join(result["unused_measurements"]), style="yellow"))
    return out


def controls_rows(result: dict[str, Any]) -> list[list[str]]:
    """One row per control: what it expects, a vs graft, p, the leakage split, the detectable effect, shows?"""
    rows = []
    for o in result.get("controls", []):
        d = o["detectable"]
        sp = o["split"]
        split = (f"clean {sp['clean']['k']}/{sp['clean']['n']}, "
                 f"contaminated {sp['contaminated']['k']}/{sp['contaminated']['n']}")
        rows.append([o["name"], o["expect"], f"{o['baseline']['k']}/{o['n']}",
                     f"{'b' if o['condition'] == 'own' else 'c'} {o['graft']['k']}/{o['n']}", f"{o['mcnemar']['p_exact']:.3g}",
                     split, "-" if d["effect"] is None else f"{d['effect']:.0%}", "yes" if o["shows"] else "NO"])
    return rows


_CONTROLS_HEAD = ["control", "expected", "a: no graft", "graft", "McNemar p", "wins: leakage split",
                  "detectable (80% power)", "shows it"]


def _controls_terminal(check: dict[str, Any]) -> list[RenderableType]:
    t = Table(title="controls: planted effects on a generated fact library", title_justify="left")
    for col in _CONTROLS_HEAD:
        t.add_column(col)
    for row in controls_rows(check["data"]):
        t.add_row(*row[:-1], Text(row[-1], style="green" if row[-1] == "yes" else "bold red"))
    out: list[RenderableType] = [t]
    return out + [Text(f"• {s}") for s in check["data"].get("statements", [])]


def readings_lines(result: dict[str, Any]) -> list[str]:
    """One line per benchmark: the reading of its accuracy figures the claims are judged under."""
    return [f"reading: {r['summary']}" for r in result.get("readings", []) if r["figures"]]


def _claims_terminal(check: dict[str, Any]) -> list[RenderableType]:
    return [Text(line) for line in readings_lines(check["data"])]


_CHECK_RENDERERS = {"recompute": _recompute_terminal, "generalization": _generalization_terminal,
                    "determinism": _determinism_terminal, "verify": _verify_terminal, "claims": _claims_terminal,
                    "controls": _controls_terminal}
_KNOWN_DATA = {"recompute": ("entries", "reference", "all_byte_exact", "statements"),
               "generalization": ("benchmark", "conditions", "mcnemar", "split", "ledger"),
               "determinism": ("conditions", "rows", "notes", "baseline", "length"),
               "verify": ("ok", "error", "details", "root_digest", "entries", "files", "tensors", "bytes_hashed", "deep",
                          "signature", "format", "format_version", "kvgraft_version", "exit_code", "release"),
               "claims": ("readings", "claims", "counts", "failed", "status", "format", "format_version", "kvgraft_version"),
               "controls": ("controls", "statements", "status", "kind", "format_version", "kvgraft_version", "model",
                            "library", "generator", "settings", "seconds", "decode_tokens")}


def check_renderables(kind: str, data: dict[str, Any]) -> list[RenderableType]:
    """The terminal rendering of one check's result: the same view `audit recompute` and
    `audit determinism` print on their own and a report shows inside its check panel."""
    renderer = _CHECK_RENDERERS.get(kind)
    return renderer({"kind": kind, "data": data}) if renderer is not None else []


def renderables(report: dict[str, Any]) -> list[RenderableType]:
    out: list[RenderableType] = [verdict_panel(report), identity_table(report), checks_table(report)]
    for c in report["checks"]:
        style = STATUS_STYLE.get(c["status"], "")
        body: list[RenderableType] = [Text(c["summary"])]
        if c["status"] == "skipped":
            body.append(Text(f"skipped: {c['reason']}", style="yellow"))
        renderer = _CHECK_RENDERERS.get(c["kind"])
        if renderer is not None and c["data"]:
            body += renderer(c)
        rest = _data_rest(c["data"], _KNOWN_DATA.get(c["kind"], ()))
        scalars = {k: v for k, v in rest.items() if not isinstance(v, (dict, list))}
        if scalars:
            body.append(Text(_json(scalars), style="dim"))
        nested = sorted(k for k, v in rest.items() if isinstance(v, (dict, list)))
        if nested:
            # The full data is in the report JSON; a terminal gets the summary, not a dump.
            body.append(Text(f"more in the report JSON: {', '.join(nested)}", style="dim"))
        out.append(Panel(Group(*body), title=f"{c['name']} · {c['kind']} · {c['status']}", title_align="left",
                         border_style=style.replace("bold ", "") or "white"))
    if report["claims"]:
        out.append(claims_table(report["claims"]))
    if report.get("ledger"):
        out.append(kv_table("token ledger", report["ledger"]))
    return out


def print_report(report: dict[str, Any], console: Console) -> None:
    for r in renderables(report):
        console.print(r)


# --- HTML ------------------------------------------------------------------------------------------------------

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
        parts.append(f'<text x="{label_w - 6}" y="{y + 11}" font-size="11" text-anchor="end">{_e(r["id"][:26])}</text>')
        for i in range(m["layers"]):
            c = r["cells"].get(i)
            x = label_w + cell * i
            if c is None or (not c["known"] and not c["mismatch"]):
                tip = f"{r['id']} layer {i}: {_cell_text(c) if c else 'no data'}"
                parts.append(f'<rect x="{x:.1f}" y="{y}" width="{cell - 1:.1f}" height="15" fill="#fff" stroke="#ddd">'
                             f"<title>{_e(tip)}</title></rect>")
                continue
            if c["mismatch"]:
                tip = f"{r['id']} layer {i}: {_cell_text(c)}"
                parts.append(f'<rect x="{x:.1f}" y="{y}" width="{cell - 1:.1f}" height="15" fill="{HEAT[-1]}" stroke="#000">'
                             f"<title>{_e(tip)}</title></rect>")
                continue
            fill = IDENTICAL_COLOR if c["identical"] else HEAT[c["level"] if c.get("level") is not None else 0]
            tip = f"{r['id']} layer {i}: {_cell_text(c)}"
            parts.append(f'<rect x="{x:.1f}" y="{y}" width="{cell - 1:.1f}" height="15" fill="{fill}">'
                         f"<title>{_e(tip)}</title></rect>")
            if c["identical"]:
                parts.append(f'<circle cx="{x + (cell - 1) / 2:.1f}" cy="{y + 7.5}" r="1.5" fill="#4a7c59"/>')
    ly = top + 16 * len(m["rows"]) + 14
    parts.append(f'<rect x="{label_w}" y="{ly}" width="14" height="12" fill="{IDENTICAL_COLOR}"/>'
                 f'<text x="{label_w + 18}" y="{ly + 10}" font-size="11">byte-identical</text>')
    lx = label_w + 120
    lo_label = "1 ULP" if m["metric"] == "ulp" else f"|diff| 10^{m['log_lo']:.1f}"
    hi_label = (f"{10 ** m['log_hi']:,.0f} ULP" if m["metric"] == "ulp" else f"10^{m['log_hi']:.1f}")
    parts.append(f'<text x="{lx}" y="{ly + 10}" font-size="11">{_e(lo_label)}</text>')
    lx += 8 + 7 * len(lo_label)
    for k, color in enumerate(HEAT):
        parts.append(f'<rect x="{lx + 18 * k}" y="{ly}" width="18" height="12" fill="{color}"/>')
    parts.append(f'<text x="{lx + 18 * len(HEAT) + 6}" y="{ly + 10}" font-size="11">'
                 f"{_e(hi_label)} (log scale, max of K and V)</text>")
    parts.append("</svg>")
    more = f'<p class="muted">{m["truncated"]} more entries not shown.</p>' if m["truncated"] else ""
    return "".join(parts) + more


def intervals_svg(accuracies: list[dict[str, Any]]) -> str:
    rows = [(a, _acc_interval(a)) for a in accuracies]
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
        iv = _acc_interval(a)
        rows.append([_e(a["name"]), f"{k}/{n}", _pct(k / n), "-" if iv is None else f"{_pct(iv[0])}–{_pct(iv[1])}"])
    return f"<h3>{_e(title)}</h3>" + intervals_svg(accuracies) + _table(["condition", "k/n", "accuracy", "95% Wilson interval"],
                                                                      rows, num=(1, 2, 3))


def _recompute_html(c: dict[str, Any]) -> str:
    data = c["data"]
    rows = []
    for r in recompute_rows(data):
        state = _badge("passed" if r["verdict"] in ("byte-exact", "consistent") else "failed", r["verdict"])
        rows.append([_e(r["id"]), _num(r["tokens"]), state, f"{r['differing_layers']}/{r['layers']}", _num(r["max_ulp"]),
                     _num(r["max_abs"]), _num(r["excess"]), _e(r["first"]), _num(r["kl"]), _num(r["kl_natural"])])
    out = ""
    if data.get("reference"):
        out += f'<p class="muted">compared with: {_e(data["reference"])}</p>'
    out += _table(["entry", "tokens", "verdict", "layers differing", "max ULP", "max |diff|", "of envelope",
                   "first difference", "KL max", "KL vs no cache"], rows, num=(1, 3, 4, 5, 6, 8, 9))
    out += "<h3>per-layer divergence (rows: entries, columns: layers)</h3>" + heatmap_svg(data)
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
    m = determinism_model(c["data"])
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
    result, details = verify_lines(c["data"])
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
    return _table(_CONTROLS_HEAD, [[_e(x) for x in row] for row in controls_rows(check["data"])]) + f"<ul>{notes}</ul>"


def _claims_html(check: dict[str, Any]) -> str:
    return "".join(f"<p>{_e(line)}</p>" for line in readings_lines(check["data"]))


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
    model = report.get("model") or {}
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
    ident = [["kvgraft", _e(report["kvgraft_version"])], ["created", _e(report["created"])],
             ["plan", f"{_e(report['plan']['name'])} <code>{_e(report['plan'].get('sha256', ''))}</code>"],
             ["model", _e(model.get("spec", "none"))]]
    if isinstance(model.get("identity"), dict) and model["identity"].get("sha256"):
        ident.append(["model identity", f"<code>{_e(model['identity']['sha256'])}</code>"])
    ident += [["release root digest", f"<code>{_e(report['release_root_digest'])}</code>"],
              ["release attestation",
               f"<code>{_e(report['binding']['release_attestation_digest'] or 'none (unsigned release)')}</code>"]]
    body.append("<h2>What was audited</h2>" + _table(["what", "value"], ident))
    rows = [[_e(c["name"]), _e(c["kind"]), _badge(c["status"]),
             _e(c["summary"]) + (f'<br><span class="muted">skipped: {_e(c["reason"])}</span>'
                                 if c["status"] == "skipped" else "")]
            for c in report["checks"]]
    body.append("<h2>Checks</h2>" + _table(["check", "kind", "status", "summary"], rows))
    for c in report["checks"]:
        section = [f'<div class="check"><h3>{_e(c["name"])} {_badge(c["status"])} '
                   f'<span class="muted">{_e(c["kind"])}</span></h3>', f"<p>{_e(c['summary'])}</p>"]
        if c["status"] == "skipped":
            section.append(f'<p class="muted">skipped: {_e(c["reason"])}</p>')
        renderer = _HTML_RENDERERS.get(c["kind"])
        if renderer is not None and c["data"]:
            section.append(renderer(c))
        rest = _data_rest(c["data"], _KNOWN_DATA.get(c["kind"], ()))
        if rest:
            section.append(f"<details><summary>more data</summary><pre>{_e(_json(rest))}</pre></details>")
        section.append("</div>")
        body.append("".join(section))
    if report["claims"]:
        body.append("<h2>Claims</h2>" + claims_html(report["claims"]))
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
