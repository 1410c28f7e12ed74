"""What the renderings show, as plain data: the heat map, per-entry rows, byte classes, controls rows.

Terminal (render_report) and HTML (render_html) draw these; neither computes a figure of its own.
"""

from __future__ import annotations

import math
from typing import NotRequired, TypedDict

from kvgraft.render.text import num as _num
from kvgraft.results.claims import ClaimsData
from kvgraft.results.controls import ControlsData
from kvgraft.results.determinism import Condition, DeterminismData
from kvgraft.results.generalization import NamedAccuracy
from kvgraft.results.recompute import EntryData, LayerData, Measure, RecomputeData
from kvgraft.results.verify import VerifyData

# Heat-map palette, low to high divergence.
HEAT = ["#fde68a", "#fcbf49", "#f77f00", "#e4572e", "#c1121f", "#780000"]
IDENTICAL_COLOR = "#e6f4ea"
CLASS_COLORS = ["#cfe8ff", "#ffd6a5", "#caffbf", "#ffadad", "#bdb2ff", "#fdffb6", "#9bf6ff", "#ffc6ff"]
MAX_HEAT_ROWS = 200
MAX_HEAT_LAYERS = 1024  # layer indices beyond this are not drawn (no model has that many; a bad report might)


class Cell(TypedDict):
    """One layer of one entry: its K and V diffs merged; `level` and `log10` once the heat map has placed it."""

    index: int
    kind: str | None
    known: bool
    identical: bool
    differing: int
    max_ulp: int | None
    max_abs: float | None
    max_rel: float | None
    ulp_pairs: int
    mismatch: str | None
    level: NotRequired[int | None]
    log10: NotRequired[float]


class HeatRow(TypedDict):
    id: str
    cells: dict[int, Cell]
    byte_exact: bool


class Heatmap(TypedDict):
    rows: list[HeatRow]
    layers: int
    metric: str  # ulp | abs
    log_lo: float
    log_hi: float
    truncated: int  # entries not drawn


class Row(TypedDict):
    """One entry of a recompute check, as both renderings' tables show it."""

    id: str
    tokens: int | None
    exact: bool
    verdict: str
    excess: float | str | None
    differing_layers: int
    layers: int
    max_ulp: int | None
    max_abs: float | None
    max_rel: float | None
    first: str
    kl: float | None  # a non-finite KL (written as a string) as the float it is
    kl_natural: float | None


class ClassCells(TypedDict):
    entry: str
    cells: list[tuple[str, str]]  # (class label, colour) per condition


class ByteClassView(TypedDict):
    conditions: list[Condition]
    colour: dict[str, str]
    classes: int
    rows: list[ClassCells]


def _layer_cell(layer: LayerData) -> Cell:
    """Merge a layer's K and V diffs (kvgraft.recompute.compare.TensorDiff): identical, differing, max ULP, max abs."""
    parts = [p for p in (layer.keys, layer.values) if p is not None]
    differing = sum(p.differing for p in parts)
    # A ULP figure only where some differing element had one (finite same-sign normals: kvgraft.recompute.compare); reports
    # from before `ulp_pairs` counted every element.
    ulps = [p.max_ulp for p in parts if p.max_ulp is not None and (p.ulp_pairs is None or p.ulp_pairs > 0)]
    pairs = [p.differing if p.ulp_pairs is None else p.ulp_pairs for p in parts]
    absd = [float(p.max_abs) for p in parts if p.max_abs is not None]
    rel = [p.max_rel for p in parts if p.max_rel is not None]
    known = bool(parts) and layer.layout_mismatch is None
    identical = known and all(p.equal for p in parts)
    mismatch = layer.layout_mismatch or next((p.shape_mismatch for p in parts if p.shape_mismatch), None)
    return {"index": layer.index, "kind": layer.kind, "known": known, "identical": identical,
            "differing": differing, "max_ulp": max(ulps) if ulps else None, "max_abs": max(absd) if absd else None,
            "max_rel": max(rel) if rel else None, "ulp_pairs": sum(pairs), "mismatch": mismatch}


def heatmap_model(data: RecomputeData) -> Heatmap:
    """Rows = entries, columns = layers; each cell's level 0..len(HEAT)-1 by log10 of max ULP (else max abs diff)."""
    entries = data.entries
    n_layers = 0
    rows: list[HeatRow] = []
    for e in entries[:MAX_HEAT_ROWS]:
        cells: dict[int, Cell] = {}
        for layer in e.layers:
            if layer.index < MAX_HEAT_LAYERS:
                cells[layer.index] = _layer_cell(layer)
                n_layers = max(n_layers, layer.index + 1)
        rows.append({"id": e.id, "cells": cells, "byte_exact": e.byte_exact})
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


def cell_text(c: Cell) -> str:
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


def _measure(x: Measure | None) -> float | None:
    return None if x is None else float(x)  # float("NaN"), float("Infinity"): what the string stands for


def recompute_rows(data: RecomputeData) -> list[Row]:
    """One summary per entry of a recompute check: the table both renderings show."""
    out: list[Row] = []
    for e in data.entries:
        cells = [_layer_cell(x) for x in e.layers]
        ulps = [x["max_ulp"] for x in cells if x["max_ulp"] is not None]
        absd = [x["max_abs"] for x in cells if x["max_abs"] is not None]
        rel = [x["max_rel"] for x in cells if x["max_rel"] is not None]
        verdict = e.verdict or ("byte-exact" if e.byte_exact else "differs")
        out.append({"id": e.id, "tokens": e.num_tokens, "exact": e.byte_exact,
                    "verdict": verdict, "excess": e.max_excess,
                    "differing_layers": sum(1 for x in cells if not x["identical"] and (x["known"] or x["mismatch"])),
                    "layers": len(cells), "max_ulp": max(ulps) if ulps else None, "max_abs": max(absd) if absd else None,
                    "max_rel": max(rel) if rel else None,
                    "first": _first_difference(e), "kl": _measure(e.matched.kl_max if e.matched is not None else None),
                    "kl_natural": _measure(e.natural.kl_max if e.natural is not None else None)})
    return out


def _first_difference(entry: EntryData) -> str:
    fd = entry.first_difference
    if fd is None:
        return "-"
    where = f"layer {fd.layer}"
    if fd.tensor:
        where += f" {fd.tensor}"
    loc = fd.location
    if loc is not None and len(loc) == 4:
        where += f" pos {loc[2]} (head {loc[1]}, dim {loc[3]})"
    elif loc:
        where += f" at {loc}"
    if fd.detail:
        where += f": {fd.detail}"
    return where

def determinism_model(data: DeterminismData) -> ByteClassView:
    """Conditions with their class and colour index, and the optional per-entry rows."""
    conds = data.conditions
    order = list(dict.fromkeys(x.class_ for x in conds if x.class_ is not None))
    colour = {label: CLASS_COLORS[i % len(CLASS_COLORS)] for i, label in enumerate(order)}
    rows: list[ClassCells] = []
    for row in data.rows or []:
        labels = [str(x) for x in row.classes]
        row_order = list(dict.fromkeys(labels))
        rows.append({"entry": row.entry,
                     "cells": [(lab, CLASS_COLORS[row_order.index(lab) % len(CLASS_COLORS)]) for lab in labels]})
    return {"conditions": conds, "colour": colour, "classes": len(order), "rows": rows}


def verify_lines(data: VerifyData) -> tuple[str, list[str]]:
    """(result, details) of a verify check's data (a verify result)."""
    result = "ok" if data.ok else f"failed: {data.error or 'see details'}"
    details = list(data.details or [])
    for label, value in (("root digest", data.root_digest), ("entries", data.entries), ("files checked", data.files),
                         ("tensors", data.tensors), ("bytes hashed", data.bytes_hashed),
                         ("deep (every tensor re-hashed)", data.deep)):
        if value is not None:  # the schema gives none of them null: present and not None are one
            details.append(f"{label}: {_num(value)}")
    sig = data.signature
    if sig is not None:
        who = sig.identity or sig.key_id or ""
        details.append(f"signature: {sig.status} {sig.method or ''} {who}".strip())
    return result, details

def acc_interval(a: NamedAccuracy) -> tuple[float, float] | None:
    """The accuracy's interval as recorded, else the Wilson interval of k of n; None when there is no n."""
    iv = a.interval
    if iv is not None:
        return iv[0], iv[1]  # the schema gives it exactly two members
    if not a.n:
        return None
    from kvgraft.generalization.stats import wilson_interval  # scipy: imported when an interval is drawn

    return wilson_interval(a.k, a.n, 0.95 if a.confidence is None else a.confidence)

def controls_rows(result: ControlsData) -> list[list[str]]:
    """One row per control: what it expects, a vs graft, p, the leakage split, the detectable effect, shows?"""
    rows = []
    for o in result.controls:
        d, sp = o.detectable, o.split
        split = f"clean {sp.clean.k}/{sp.clean.n}, contaminated {sp.contaminated.k}/{sp.contaminated.n}"
        rows.append([o.name, o.expect, f"{o.baseline.k}/{o.n}", f"{'b' if o.condition == 'own' else 'c'} {o.graft.k}/{o.n}",
                     f"{o.mcnemar.p_exact:.3g}", split, "-" if d.effect is None else f"{d.effect * 100:.0f} points",
                     "yes" if o.shows else "NO"])
    return rows


CONTROLS_HEAD = ["control", "expected", "a: no graft", "graft", "McNemar p", "wins: leakage split",
                 "smallest difference detectable (80% power)", "shows it"]


def readings_lines(result: ClaimsData) -> list[str]:
    """One line per benchmark: the reading of its accuracy figures the claims are judged under."""
    return [f"reading: {r.summary}" for r in result.readings or [] if r.figures]
