"""Replications side by side (`kvgraft report compare`): a terminal table that fits 80 columns, the entries and
environments one flag away (`--details`), and one self-contained HTML page with a plot of each replication's bound.

Every string comes from reports: drawn from a `plain_tree` copy in the terminal, escaped in HTML.
"""

from __future__ import annotations

from pydantic import JsonValue
from rich.console import Console, RenderableType

from kvgraft import sampling
from kvgraft.audit.render_html import _CSS
from kvgraft.render.html import HTML_COLOR, badge, esc, table
from kvgraft.render.text import WORDS, hanging, kv_lines, plain_tree, styled
from kvgraft.render.text import table as text_table
from kvgraft.results.compare import Bound, Condition, Group, Location, Recomputed, Replication, ReportCompare, Signer
from kvgraft.signing.verify import signature_sentence

WORD = {"agree": "AGREE", "disagree": "DISAGREE: replications differ beyond what their recorded conditions explain"}


def signer(s: Signer | None) -> str:
    if not s:
        return "-"
    return f"key {s.key_id}" if s.method == "key" else f"{s.identity} via {s.issuer}"


def _short(text: str, n: int = 12) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _machine(r: Replication) -> str:
    shown = ("device_name", "dtype", "attn_implementation")
    return " ".join(str(r.environment[k]) for k in shown if r.environment.get(k)) or "-"


def _recompute_cell(rc: Recomputed | None) -> tuple[str, str]:
    if rc is None:
        return "-", "-"
    exact = f"{rc.byte_exact}/{rc.sampled} exact"
    return exact + (f", {rc.inconsistent} inconsistent" if rc.inconsistent else ""), f"≤{rc.bound:,}/{rc.population:,}"


def bound_sentence(b: Bound, reps: list[Replication]) -> str:
    own = ", ".join(f"#{r.index} ≤{r.recompute.bound:,}" for r in reps if r.recompute)
    return (f"{b.failing} of {b.sampled:,} distinct entries recomputed by {len(b.replications)} replications "
            f"are inconsistent: at most {b.max_failing_entries:,} of {b.population:,} entries "
            f"({sampling.pct(b.max_failing_fraction)}) are, {100 * b.confidence:g}% one-sided, exact "
            f"hypergeometric (each alone: {own})")


def renderables(result: ReportCompare, console: Console, *, details: bool = False) -> list[RenderableType]:
    result = ReportCompare.model_validate(plain_tree(result.as_json()))
    width = console.width
    out: list[RenderableType] = [styled(hanging("kvgraft report compare ·", f"{result.trusted} trusted reports · "
                                                f"{WORD[result.status]}", width, indent=0), WORDS)]
    for g in result.groups:
        reps = g.replications
        out.append(styled(hanging("release", f"{g.release_root_digest} · model {g.model} "
                                             f"(identity {g.model_identity})", width, indent=0)))
        rows = [[str(r.index), _short(signer(r.signer).removeprefix("key "), 13), _short(_machine(r), 18),
                 *_recompute_cell(r.recompute), r.verdict] for r in reps]
        out.append(text_table(console, "", ["#", "signer", "machine", "recompute", "bound", "verdict"], rows))
        lines: list[str] = []
        if g.combined_bound:
            lines += hanging("combined", bound_sentence(g.combined_bound, reps), width, indent=0)
        checks = "; ".join(f"{c.name} {c.passed} of {c.of} passed" for c in g.checks)
        lines += hanging("checks", checks or "-", width, indent=0)
        if g.claims:
            lines += hanging("claims", "; ".join(f"{c.id} supported {c.supported} of {c.of}" for c in g.claims),
                             width, indent=0)
        d = g.disagreements
        lines += hanging("entries", f"{len(g.entries)} recomputed by two or more: "
                                    f"{len(g.entries) - d.explained - d.unexplained} agree, {d.explained} "
                                    f"differ as recorded conditions explain, {d.unexplained} not explained",
                         width, indent=0)
        for e in g.entries:
            if e.status == "unexplained" or (details and e.status == "explained"):
                lines += hanging(f"  {e.id}", f"{e.status}: {e.why}; {_where(e.location)}", width, indent=0)
        out.append(styled(lines, WORDS))
        if details:
            out += _details(g, width)
    for u in result.unverified:
        out.append(styled(hanging("UNVERIFIED", f"{u.source}: {u.reason}", width, indent=0), {"UNVERIFIED": "bold red"}))
    if not details:
        out.append(styled(["details (signers, environments, every entry, release signatures): --details"], style="dim"))
    return out


def _where(loc: Location | None) -> str:
    if not loc:
        return "no location recorded"
    element = loc.element
    at = ", ".join(f"{k} {v}" for k, v in element.items()) if isinstance(element, dict) else str(element)
    differing, elements = loc.differing_elements, loc.elements
    count = (f"; {differing:,} of {elements:,} elements differ"
             if isinstance(differing, int) and isinstance(elements, int) else "")
    return (f"replication {loc.replication}: layers {loc.layers}, first at layer {loc.layer} "
            f"{loc.tensor} ({at}){count}")


def _interval(a: Condition) -> str:
    match a.interval:
        case [int() | float() as lo, int() | float() as hi, *_]:
            return f" [{100 * lo:.1f}%, {100 * hi:.1f}%]"
    return ""


def _executor(ex: JsonValue) -> str:
    if isinstance(ex, dict):
        return ", ".join(f"{k} {v}" for k, v in ex.items() if v is not None) or "-"
    return "-" if ex is None else str(ex)


def _details(g: Group, width: int) -> list[RenderableType]:
    out: list[RenderableType] = []
    for r in g.replications:
        rc = r.recompute
        rows = [("source", r.source), ("signer", signer(r.signer)), ("plan", r.plan), ("created", r.created),
                ("release signature", signature_sentence(r.release_signature)),
                ("environment", ", ".join(f"{k} {v}" for k, v in r.environment.items())),
                ("executor", _executor(r.executor)),
                *[(f"check {c.name}", f"{c.status}: {(c.summary or [''])[-1]}") for c in r.checks]]
        if rc:
            rows.append(("sample", f"{rc.sampled:,} of {rc.population:,}, nonce {rc.nonce}; the report's own "
                                   f"bound {rc.stated_bound}"))
        rows += [(f"generalization {a.name}", f"{a.k}/{a.n}" + _interval(a)) for a in r.generalization]
        out.append(styled(kv_lines(width, f"replication {r.index}", rows), WORDS))
    if any(r.generalization for r in g.replications):
        out.append(styled(hanging("pooled", g.pooling, width, indent=0)))
    for e in g.entries:
        verdicts = ", ".join(f"#{i} {v}" for i, v in e.verdicts.items())
        out.append(styled(hanging(f"entry {e.id}", f"{e.status}: {verdicts}", width, indent=0), WORDS))
    return out


# ------------------------------------------------------------------------------------------------ HTML


def bounds_svg(g: Group) -> str:
    """Each replication's bound and the combined one, as bars of the fraction of entries they allow."""
    reps = [(r, r.recompute) for r in g.replications if r.recompute]
    b = g.combined_bound
    if b is None:
        return '<p class="muted">(no recompute check to plot)</p>'
    rows = [(f"#{r.index} {_short(signer(r.signer), 24)}", rc.bound / rc.population,
             f"≤{rc.bound:,} of {rc.population:,} ({rc.sampled} recomputed)") for r, rc in reps]
    rows.append(("combined", b.max_failing_fraction,
                 f"≤{b.max_failing_entries:,} of {b.population:,} ({b.sampled} distinct recomputed)"))
    label_w, plot_w, right_w, row_h, top = 230, 480, 260, 24, 24
    width, height = label_w + plot_w + right_w, top + row_h * len(rows) + 8
    parts = [f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
             f'aria-label="upper bounds on inconsistent entries">']
    for t in range(0, 101, 20):
        x = label_w + plot_w * t / 100
        parts.append(f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{height - 4}" stroke="#e5e5e5"/>'
                     f'<text x="{x:.1f}" y="{top - 8}" font-size="10" text-anchor="middle" fill="#555">{t}%</text>')
    for j, (label, frac, right) in enumerate(rows):
        y = top + row_h * j
        colour = "#08519c" if label == "combined" else "#9ecae1"
        parts.append(f'<text x="{label_w - 8}" y="{y + 15}" font-size="12" text-anchor="end">{esc(label)}</text>'
                     f'<rect x="{label_w}" y="{y + 4}" width="{max(1.0, plot_w * frac):.1f}" height="14" fill="{colour}">'
                     f'<title>{esc(label)}: {esc(right)}</title></rect>'
                     f'<text x="{label_w + plot_w + 8}" y="{y + 15}" font-size="12">{esc(right)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def to_html(result: ReportCompare) -> str:
    status = result.status
    body = [f"<h1>kvgraft report compare: {result.trusted} trusted reports</h1>",
            f'<div class="verdict" style="background:{HTML_COLOR["passed" if status == "agree" else "failed"]}">'
            f'<div class="status">{esc(WORD[status])}</div></div>']
    for g in result.groups:
        reps = g.replications
        body.append(f"<h2>Release <code>{esc(g.release_root_digest)}</code></h2>"
                    f"<p>model {esc(g.model)}, identity <code>{esc(g.model_identity)}</code></p>")
        rows = [[str(r.index), f"<code>{esc(signer(r.signer))}</code>", esc(_machine(r)),
                 esc(r.environment.get("torch", "-")), esc(signature_sentence(r.release_signature)),
                 *[esc(x) for x in _recompute_cell(r.recompute)], badge(r.verdict)] for r in reps]
        body.append(table(["#", "signer", "machine", "torch", "release signature", "recompute", "bound", "verdict"], rows))
        body.append("<h3>Bounds on inconsistent entries</h3>" + bounds_svg(g))
        if g.combined_bound:
            body.append(f"<p>{esc(bound_sentence(g.combined_bound, reps))}</p>")
        body.append(table(["check", "passed"], [[esc(c.name), f"{c.passed} of {c.of}"] for c in g.checks]))
        if g.claims:
            body.append(table(["claim", "supported"], [[esc(c.id), f"{c.supported} of {c.of}"] for c in g.claims]))
        if g.entries:
            body.append("<h3>Entries recomputed by two or more</h3>" + table(
                ["entry", "verdicts", "status", "why", "where"],
                [[esc(e.id), esc(", ".join(f"#{i} {v}" for i, v in e.verdicts.items())), badge(
                    "passed" if e.status == "agree" else "consistent" if e.status == "explained" else "failed",
                    e.status), esc(e.why or ""), esc(_where(e.location) if e.location else "")]
                 for e in g.entries]))
        body.append(f'<p class="muted">{esc(g.pooling)}</p>')
    if result.unverified:
        body.append("<h2>Unverified</h2>" + table(["report", "reason"], [[esc(u.source), esc(u.reason)]
                                                                         for u in result.unverified]))
    csp = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
            f"<title>kvgraft report compare — {esc(status)}</title><style>{_CSS}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")
