"""The recompute check: fresh KV states against the stored ones, bit for bit and within the noise envelope."""

from __future__ import annotations

from typing import Any

from rich.console import Console, RenderableType

from kvgraft.audit.checks.kind import CheckKind, Ran
from kvgraft.audit.context import Context
from kvgraft.errors import InputError
from kvgraft.render.figures import Face, as_dict
from kvgraft.render.html import badge, esc, heatmap_svg, kv_html, table
from kvgraft.render.terminal import heatmap_text
from kvgraft.render.text import hanging, num, styled
from kvgraft.render.text import table as text_table
from kvgraft.render.views import recompute_rows


def run(ctx: Context, rc: dict[str, Any]) -> Ran:
    from kvgraft import sampling
    from kvgraft.claims.checker import measured_from_recompute
    from kvgraft.recompute import audit as recompute

    sample = rc.get("sample")
    if rc.get("target_fraction") is not None:
        if sample is not None:
            raise InputError("checks.recompute: sample and target_fraction exclude each other")
        sample = sampling.sample_size(float(rc["target_fraction"]), ctx.release.release.num_entries)
    ctx.say(f"recomputing fresh KV states and comparing ({f'a sample of {sample}' if sample else 'every entry'})")
    # Each judged entry is journaled as it lands: rerunning an interrupted plan on the same release resumes.
    journal = ctx.out / f"recompute-{str(ctx.release.manifest['root_digest'])[:16]}.journal"
    for stale in ctx.out.glob("recompute-*.journal"):
        if stale != journal:
            stale.unlink()  # of another release (a rebuilt library): nothing of it can be resumed here
    overrides = {}
    fixed = ctx.ex.fixed_threads()
    if fixed is not None and fixed != ctx.release.manifest["environment"].get("threads"):
        overrides["threads"] = fixed  # the plan's [executor] threads: an override of the record, recorded
    options: dict[str, Any] = {"entries": rc.get("entries") or None, "executor": ctx.ex,
                               "require": rc.get("require", "exact"), "sample": sample, "nonce": rc.get("nonce"),
                               "journal": journal, "overrides": overrides}
    if rc.get("prefix") is None:
        result = recompute.audit(ctx.release, ctx.lm, **options)
    else:  # the entries' prefix grafts too (checks.recompute.prefix)
        from kvgraft.recompute import prefix

        result = prefix.audit(ctx.release, ctx.lm, prefix=int(rc["prefix"]), **options)
    journal.unlink(missing_ok=True)
    exact = sum(e["byte_exact"] for e in result["entries"])
    ctx.measured.update(measured_from_recompute(result))
    ctx.natural_kl = max(abs(e["natural"]["kl_max"]) for e in result["entries"]) if result["entries"] else None
    cost = result["cost"]
    rate = f", {cost['tokens_per_second']:,.0f} tokens/s" if cost["tokens_per_second"] else ""
    projected = (f"; the whole release ({cost['library_tokens']:,} tokens) about "
                 f"{cost['projected_library_seconds'] / 60:.1f} min on {cost['executor']}"
                 if cost["projected_library_seconds"] else "")
    ctx.ledger["recompute"] = (f"{exact}/{len(result['entries'])} entries byte-exact, verdict {result['verdict']} "
                               f"(required: {result['require']}); {cost['tokens_recomputed']:,} tokens recomputed in "
                               f"{cost['wall_seconds']:.1f} s{rate}{projected}")
    if result.get("sample"):
        ctx.ledger["recompute bound"] = sampling.sentence(result["bound"])
    return Ran(result, "\n".join(result["statements"]))


def status(result: dict[str, Any]) -> str:
    """passed when the result's requirement is met (byte-exact, or consistent under `consistent`), else failed."""
    return "passed" if result["passed"] else "failed"


def _entry_verdicts(entries: list[dict[str, Any]]) -> str:
    counts: dict[str, int] = {}
    for e in entries:
        v = str(e.get("verdict") or ("byte-exact" if e.get("byte_exact") else "differs"))
        counts[v] = counts.get(v, 0) + 1
    if len(counts) == 1:
        return f"all {len(entries)} entries {next(iter(counts))}"
    return ", ".join(f"{n} {v}" for v, n in counts.items()) + f" of {len(entries)} entries"


def difference_size(row: dict[str, Any]) -> str:
    """How far apart stored and fresh are, in units that mean something for every value (views.recompute_rows):
    absolute and relative difference and the share of the envelope; ULP only among same-sign normal values."""
    parts = [f"max |diff| {num(row.get('max_abs'))}"]
    if row.get("max_rel") is not None:
        parts.append(f"relative {num(row['max_rel'])}")
    if row.get("excess"):
        parts.append(f"{num(row['excess'])}x the envelope")
    if row.get("max_ulp"):
        parts.append(f"{num(row['max_ulp'])} ULP between same-sign normal values")
    return ", ".join(parts)


def face(data: dict[str, Any]) -> Face:
    entries = [e for e in data.get("entries", []) if isinstance(e, dict)]
    rows = recompute_rows(data)
    word = data.get("verdict") or ("byte-exact" if data.get("all_byte_exact") else "not byte-exact")
    drawn = as_dict(data.get("sample"))
    of = f" (a sample of {num(drawn.get('population'))})" if drawn else ""
    verdict = f"{word}: {_entry_verdicts(entries)}{of} against a fresh computation"
    if data.get("require"):
        verdict += f"; requirement {data['require']}: {'met' if data.get('passed') else 'NOT met'}"
    figures = []
    env = ((data.get("environment") or {}).get("current") or {})
    if env:
        where = ", ".join(str(env[k]) for k in ("device", "dtype", "attn_implementation") if env.get(k) is not None)
        threads = f", {env['threads']} threads" if env.get("threads") else ""
        cond = data.get("conditions") or {}
        skipped, changed = sorted(cond.get("not_replayed") or {}), sorted(cond.get("overridden") or {})
        replay = "; ".join(x for x in (f"overridden: {', '.join(changed)}" if changed else "",
                                       f"not replayed: {', '.join(skipped)}" if skipped else "") if x)
        figures.append(f"on {env.get('device_name', '?')} ({where}{threads}); "
                       + (replay or "every recorded condition replayed"))
    kls = [r["kl"] for r in rows if r["kl"] is not None]
    natural = [r["kl_natural"] for r in rows if r["kl_natural"] is not None]
    if kls:
        zero = sum(1 for x in kls if x == 0)
        figures.append(f"KL(fresh ‖ grafted) exactly 0 in {zero}/{len(kls)}" + (f", max {num(max(kls))}" if max(kls) else "")
                       + (f"; without any cache (one forward pass) max KL {num(max(natural))}" if natural else ""))
    differing = [r for r in rows if r["verdict"] != "byte-exact"]
    for r in differing[:3]:
        figures.append(f"{r['id']} {r['verdict']}: {difference_size(r)}; first difference {r['first']}")
    if len(differing) > 3:
        figures.append(f"{len(differing) - 3} more entries not byte-exact: --detail lists each")
    figures += _sample_figures(data)
    return Face(verdict, figures)


def _sample_figures(data: dict[str, Any]) -> list[str]:
    """The sample (how anyone re-derives it), the bound it gives on the whole release, and the cost ledger."""
    from kvgraft import sampling

    out = []
    drawn = as_dict(data.get("sample"))
    if drawn:
        out.append(f"sample: {num(drawn['size'])} of {num(drawn['population'])} entries drawn from the release root and "
                   f"nonce {drawn['nonce']} ({sampling.nonce_origin(drawn, as_dict(data.get('cost')).get('resumed_from'))}; "
                   f"{drawn['method']}, uniform over entries); "
                   "re-derive: kvgraft audit sample RELEASE --check REPORT")
    if drawn and data.get("bound"):
        out.append(f"bound: {sampling.sentence(data['bound'])}")
    line = cost_line(data)
    return out + ([line] if line else [])


def cost_line(data: dict[str, Any]) -> str | None:
    """The recompute's cost ledger in one line: tokens, wall time, tokens/s, the whole release projected."""
    cost = as_dict(data.get("cost"))
    if cost.get("tokens_recomputed") is not None:
        rate = f", {num(round(cost['tokens_per_second']))} tokens/s" if cost.get("tokens_per_second") else ""
        n, journal = cost.get("entries_resumed") or 0, cost.get("resumed_from")
        resumed = f"; {num(n)} entries resumed from {journal or 'an interrupted run'}" if n or journal else ""
        whole = (f"; the whole release ({num(cost['library_entries'])} entries, {num(cost['library_tokens'])} tokens) "
                 f"about {_duration(cost['projected_library_seconds'])} on {cost.get('executor')}"
                 f" ({cost.get('workers')} worker{'' if cost.get('workers') == 1 else 's'})"
                 if cost.get("projected_library_seconds") else "")
        return f"cost: {num(cost['tokens_recomputed'])} tokens recomputed in {cost['wall_seconds']:.1f} s{rate}{resumed}{whole}"
    return None


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


HEADERS = ["entry", "tokens", "verdict", "layers differing", "max |diff|", "max relative", "of envelope",
           "max ULP (same-sign normals)", "first difference", "KL max", "KL vs no cache"]
NUMERIC = (1, 3, 4, 5, 6, 7, 9, 10)


def details(data: dict[str, Any], console: Console) -> list[RenderableType]:
    rows = [[r["id"], num(r["tokens"]), r["verdict"], f"{r['differing_layers']}/{r['layers']}", num(r["max_abs"]),
             num(r["max_rel"]), num(r["excess"]), num(r["max_ulp"]), r["first"], num(r["kl"]), num(r["kl_natural"])]
            for r in recompute_rows(data)]
    out = [text_table(console, "entries", HEADERS, rows, right=NUMERIC), heatmap_text(data, console.width)]
    return out + [styled(hanging("•", st, console.width, indent=0)) for st in data.get("statements", [])]


def html(data: dict[str, Any]) -> str:
    rows = []
    for r in recompute_rows(data):
        state = badge("passed" if r["verdict"] in ("byte-exact", "consistent") else "failed", r["verdict"])
        rows.append([esc(r["id"]), num(r["tokens"]), state, f"{r['differing_layers']}/{r['layers']}", num(r["max_abs"]),
                     num(r["max_rel"]), num(r["excess"]), num(r["max_ulp"]), esc(r["first"]), num(r["kl"]),
                     num(r["kl_natural"])])
    out = ""
    if data.get("reference"):
        out += f'<p class="muted">compared with: {esc(data["reference"])}</p>'
    out += table(HEADERS, rows, num=NUMERIC)
    out += "<h3>per-layer divergence (rows: entries, columns: layers)</h3>" + heatmap_svg(data)
    drawn, bound = data.get("sample"), data.get("bound")
    if isinstance(drawn, dict) and isinstance(bound, dict):
        from kvgraft import sampling

        out += "<h3>sample and bound</h3>" + kv_html({
            "sample": f"{drawn['size']:,} of {drawn['population']:,} entries ({drawn['weighting']})",
            "drawn by": f"{drawn['method']}: root {drawn['root_digest']}, nonce {drawn['nonce']} "
                        f"({sampling.nonce_origin(drawn, as_dict(data.get('cost')).get('resumed_from'))})",
            "re-derive": "kvgraft audit sample RELEASE --check REPORT.json",
            "bound": sampling.sentence(bound), "method": bound["method"], "tokens": bound["token_method"]})
    if data.get("statements"):
        out += "<ul>" + "".join(f"<li>{esc(st)}</li>" for st in data["statements"]) + "</ul>"
    return out


KIND = CheckKind(
    name="recompute", schema="recompute-result.v1.json", status=status, stamps_status=True, run=run, face=face,
    details=details, html=html, known_data=("entries", "reference", "all_byte_exact", "statements"))
