"""What the renderings show, as plain data: the heat map, per-entry rows, byte classes, controls rows.

Terminal (render_report) and HTML (render_html) draw these; neither computes a figure of its own.
"""

from __future__ import annotations

import math
from typing import Any

from kvgraft.render.text import num as _num

# Heat-map palette, low to high divergence.
HEAT = ["#fde68a", "#fcbf49", "#f77f00", "#e4572e", "#c1121f", "#780000"]
IDENTICAL_COLOR = "#e6f4ea"
CLASS_COLORS = ["#cfe8ff", "#ffd6a5", "#caffbf", "#ffadad", "#bdb2ff", "#fdffb6", "#9bf6ff", "#ffc6ff"]
MAX_HEAT_ROWS = 200
MAX_HEAT_LAYERS = 1024  # layer indices beyond this are not drawn (no model has that many; a bad report might)


def _layer_cell(layer: dict[str, Any]) -> dict[str, Any]:
    """Merge a layer's K and V diffs (kvgraft.recompute.compare.TensorDiff dicts): identical, differing, max ULP, max abs."""
    parts = [layer[x] for x in ("keys", "values") if isinstance(layer.get(x), dict)]
    differing = sum(int(p.get("differing") or 0) for p in parts)
    # A ULP figure only where some differing element had one (finite same-sign normals: kvgraft.recompute.compare); reports
    # from before `ulp_pairs` counted every element.
    ulps = [int(p["max_ulp"]) for p in parts if p.get("max_ulp") is not None
            and (p.get("ulp_pairs") is None or int(p["ulp_pairs"]) > 0)]
    pairs = [int(p["ulp_pairs"]) if p.get("ulp_pairs") is not None else int(p.get("differing") or 0) for p in parts]
    absd = [float(p["max_abs"]) for p in parts if p.get("max_abs") is not None]
    rel = [float(p["max_rel"]) for p in parts if p.get("max_rel") is not None]
    known = bool(parts) and "layout_mismatch" not in layer
    identical = known and all(p.get("equal") is True for p in parts)
    mismatch = layer.get("layout_mismatch") or next((p["shape_mismatch"] for p in parts if p.get("shape_mismatch")), None)
    return {"index": layer.get("index"), "kind": layer.get("kind"), "known": known, "identical": identical,
            "differing": differing, "max_ulp": max(ulps) if ulps else None, "max_abs": max(absd) if absd else None,
            "max_rel": max(rel) if rel else None, "ulp_pairs": sum(pairs), "mismatch": mismatch}


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
    # ULP digits only when every differing element of every cell has a ULP distance that means something.
    diffs = [c for r in rows for c in r["cells"].values() if c["differing"]]
    metric = "ulp" if diffs and all(c["max_ulp"] and c["ulp_pairs"] == c["differing"] for c in diffs) else "abs"
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


def cell_text(c: dict[str, Any]) -> str:
    if c.get("kind") == "shared" and not c["known"]:
        return "shared layer: stores no states of its own"
    if c.get("mismatch"):
        return f"layout mismatch: {c['mismatch']}"
    if not c["known"]:
        return "no data"
    if c["identical"]:
        return "byte-identical"
    parts = [f"{c['differing']:,} elements differ"]
    if c["max_abs"] is not None:
        parts.append(f"max |diff| {c['max_abs']:.3g}")
    if c.get("max_rel") is not None:
        parts.append(f"relative {c['max_rel']:.3g}")
    if c["max_ulp"] is not None:
        among = "" if c["ulp_pairs"] == c["differing"] else f" among the {c['ulp_pairs']:,} same-sign normal pairs"
        parts.append(f"max {c['max_ulp']:,} ULP{among}")
    return ", ".join(parts)


def recompute_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """One summary per entry of a recompute check: the table both renderings show."""
    out = []
    for e in data.get("entries", []):
        cells = [_layer_cell(x) for x in e.get("layers", []) if isinstance(x, dict)]
        ulps = [x["max_ulp"] for x in cells if x["max_ulp"] is not None]
        absd = [x["max_abs"] for x in cells if x["max_abs"] is not None]
        rel = [x["max_rel"] for x in cells if x["max_rel"] is not None]
        matched = e.get("matched") if isinstance(e.get("matched"), dict) else {}
        natural = e.get("natural") if isinstance(e.get("natural"), dict) else {}
        verdict = e.get("verdict") or ("byte-exact" if e.get("byte_exact") else "differs")
        out.append({"id": str(e.get("id")), "tokens": e.get("num_tokens"), "exact": bool(e.get("byte_exact")),
                    "verdict": str(verdict), "excess": e.get("max_excess"),
                    "differing_layers": sum(1 for x in cells if not x["identical"] and (x["known"] or x["mismatch"])),
                    "layers": len(cells), "max_ulp": max(ulps) if ulps else None, "max_abs": max(absd) if absd else None,
                    "max_rel": max(rel) if rel else None,
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

def acc_interval(a: dict[str, Any]) -> tuple[float, float] | None:
    iv = a.get("interval")
    if isinstance(iv, list) and len(iv) == 2:
        return float(iv[0]), float(iv[1])
    try:
        from kvgraft.generalization.stats import wilson_interval

        return wilson_interval(int(a["k"]), int(a["n"]), float(a.get("confidence", 0.95)))
    except Exception:
        return None

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
                     split, "-" if d["effect"] is None else f"{d['effect'] * 100:.0f} points", "yes" if o["shows"] else "NO"])
    return rows


CONTROLS_HEAD = ["control", "expected", "a: no graft", "graft", "McNemar p", "wins: leakage split",
                 "smallest difference detectable (80% power)", "shows it"]


def readings_lines(result: dict[str, Any]) -> list[str]:
    """One line per benchmark: the reading of its accuracy figures the claims are judged under."""
    return [f"reading: {r['summary']}" for r in result.get("readings", []) if r["figures"]]
