"""The recompute check: fresh KV states against the stored ones, bit for bit and within the noise bound."""

from __future__ import annotations

import functools
from typing import Any

from rich.console import Console, RenderableType

from kvgraft.audit.checks.kind import CheckKind, Ran
from kvgraft.audit.context import Context
from kvgraft.errors import InputError
from kvgraft.render.figures import Face
from kvgraft.render.html import badge, esc, heatmap_svg, kv_html, table
from kvgraft.render.terminal import heatmap_text
from kvgraft.render.text import hanging, num, styled
from kvgraft.render.text import table as text_table
from kvgraft.render.views import Row, recompute_rows
from kvgraft.results.base import JsonObject
from kvgraft.results.recompute import TYPED, Cost, EntryData, RecomputeData, RecomputeResult, largest


def run(ctx: Context, rc: dict[str, Any]) -> Ran:
    """Under a plan's `[checks.recompute]` (require, entries, sample or target_fraction, nonce, prefix), and what
    `audit recompute` sets beyond a plan: probe (text), force, schedule, overrides, journal (a path, or None for
    none; without it, one under the output folder, removed when the result is complete), on_progress."""
    from kvgraft import sampling
    from kvgraft.recompute import audit as recompute

    sample = rc.get("sample")
    if rc.get("target_fraction") is not None:
        if sample is not None:
            raise InputError("checks.recompute: sample and target_fraction exclude each other")
        sample = sampling.sample_size(float(rc["target_fraction"]), ctx.release.release.num_entries)
    ctx.say(f"recomputing fresh KV states and comparing ({f'a sample of {sample}' if sample else 'every entry'})")
    own_journal = "journal" not in rc
    if own_journal:  # each judged entry is journaled as it lands: rerunning an interrupted plan resumes
        journal = ctx.out / f"recompute-{str(ctx.release.manifest['root_digest'])[:16]}.journal"
        from kvgraft.execution.journal import is_journal

        for stale in ctx.out.glob("recompute-*.journal"):
            if stale != journal and is_journal(stale):
                stale.unlink()  # of another release (a rebuilt library): nothing of it can be resumed here
    else:
        journal = rc["journal"]
    if "overrides" in rc:
        overrides = dict(rc["overrides"])
    else:
        from kvgraft.inference.reapply import Conditions

        # the plan's [executor] threads: an override of the record, recorded
        overrides = Conditions(threads=ctx.ex.fixed_threads()).overrides(ctx.release.manifest["environment"])
    audit = recompute.audit_result
    if rc.get("prefix") is not None:  # the entries' prefix grafts too (checks.recompute.prefix)
        from kvgraft.recompute import prefix

        audit = functools.partial(prefix.audit_result, prefix=int(rc["prefix"]))
    result = audit(ctx.release, ctx.lm, entries=rc.get("entries") or None, executor=ctx.ex,
                   require=rc.get("require", "exact"), sample=sample, nonce=rc.get("nonce"), journal=journal,
                   overrides=overrides, probe_text=rc.get("probe"), force=rc.get("force", False),
                   schedule=rc.get("schedule"), on_progress=rc.get("on_progress"))
    if own_journal:
        journal.unlink(missing_ok=True)
    from kvgraft.signing.verify import signature_statement

    result = result.model_copy(update={"release_signature": signature_statement(ctx.release.checked)})  # whose release
    exact = sum(e.byte_exact for e in result.entries)
    ledger = {"recompute": f"{exact}/{len(result.entries)} entries byte-exact, verdict {result.verdict} "
                           f"(required: {result.require}); " + _ledger_cost(result.cost)}
    if result.sample is not None and result.bound is not None:
        ledger["recompute bound"] = sampling.sentence(result.bound.model_dump())
    return Ran(recompute.document(result), "\n".join(result.statements), ledger=ledger)


def _ledger_cost(cost: Cost | None) -> str:
    """The token ledger's words on a recompute's cost: tokens, wall time, tokens/s, the whole release projected."""
    if cost is None:
        return "no cost recorded"
    rate = f", {cost.tokens_per_second:,.0f} tokens/s" if cost.tokens_per_second else ""
    projected = (f"; the whole release ({cost.library_tokens:,} tokens) about "
                 f"{cost.projected_library_seconds / 60:.1f} min on {cost.executor}"
                 if cost.projected_library_seconds else "")
    return f"{cost.tokens_recomputed:,} tokens recomputed in {cost.wall_seconds:.1f} s{rate}{projected}"


def status(result: JsonObject) -> str:
    """passed when the result's requirement is met (byte-exact, or consistent under `consistent`), else failed."""
    return "passed" if result["passed"] else "failed"


def _entry_verdicts(entries: list[EntryData]) -> str:
    counts: dict[str, int] = {}
    for e in entries:
        v = e.verdict or ("byte-exact" if e.byte_exact else "differs")
        counts[v] = counts.get(v, 0) + 1
    if len(counts) == 1:
        return f"all {len(entries)} entries {next(iter(counts))}"
    return ", ".join(f"{n} {v}" for v, n in counts.items()) + f" of {len(entries)} entries"


def difference_size(row: Row) -> str:
    """How far apart stored and fresh are, in units that mean something for every value (views.recompute_rows):
    absolute and relative difference and the share of the noise bound; ULP only among same-sign normal values."""
    parts = [f"max |diff| {num(row['max_abs'])}"]
    if row["max_rel"] is not None:
        parts.append(f"relative {num(row['max_rel'])}")
    if row["excess"]:
        parts.append(f"{num(row['excess'])}x the noise bound")
    if row["max_ulp"]:
        parts.append(f"{num(row['max_ulp'])} ULP between same-sign normal values")
    return ", ".join(parts)


def _resumed_from(data: RecomputeData) -> str | None:
    return None if data.cost is None else data.cost.resumed_from


def face(data: RecomputeData) -> Face:
    rows = recompute_rows(data)
    word = data.verdict or ("byte-exact" if data.all_byte_exact else "not byte-exact")
    drawn = data.sample
    of = f" (a sample of {num(drawn.population)})" if drawn is not None else ""
    verdict = f"{word}: {_entry_verdicts(data.entries)}{of} against a fresh computation"
    if data.require:
        verdict += f"; requirement {data.require}: {'met' if data.passed else 'NOT met'}"
    figures = []
    env = data.environment.current if data.environment is not None else None
    if env is not None and env.model_fields_set:
        where = ", ".join(str(v) for v in (env.device, env.dtype, env.attn_implementation) if v is not None)
        threads = f", {env.threads} threads" if env.threads else ""
        cond = data.conditions
        skipped, changed = (sorted(cond.not_replayed), sorted(cond.overridden)) if cond is not None else ([], [])
        replay = "; ".join(x for x in (f"overridden: {', '.join(changed)}" if changed else "",
                                       f"not replayed: {', '.join(skipped)}" if skipped else "") if x)
        device = env.device_name if "device_name" in env.model_fields_set else "?"
        figures.append(f"on {device} ({where}{threads}); " + (replay or "every recorded condition replayed"))
    kls = [r["kl"] for r in rows if r["kl"] is not None]
    natural = [r["kl_natural"] for r in rows if r["kl_natural"] is not None]
    if kls:
        zero, top = sum(1 for x in kls if x == 0), largest(kls)
        figures.append(f"KL(fresh ‖ grafted) exactly 0 in {zero}/{len(kls)}" + (f", max {num(top)}" if top else "")
                       + (f"; without any cache (one forward pass) max KL {num(largest(natural))}" if natural else ""))
    differing = [r for r in rows if r["verdict"] != "byte-exact"]
    for r in differing[:3]:
        figures.append(f"{r['id']} {r['verdict']}: {difference_size(r)}; first difference {r['first']}")
    if len(differing) > 3:
        figures.append(f"{len(differing) - 3} more entries not byte-exact: --detail lists each")
    figures += _sample_figures(data)
    return Face(verdict, figures)


def _sample_figures(data: RecomputeData) -> list[str]:
    """The sample (how anyone re-derives it), the bound it gives on the whole release, and the cost ledger."""
    from kvgraft import sampling

    out = []
    drawn, bound = data.sample, data.bound
    if drawn is not None:
        out.append(f"sample: {num(drawn.size)} of {num(drawn.population)} entries drawn from the release root and "
                   f"nonce {drawn.nonce} ({sampling.nonce_origin(drawn.model_dump(), _resumed_from(data))}; "
                   f"{drawn.method}, uniform over entries); "
                   "re-derive: kvgraft audit sample RELEASE --check REPORT")
    if drawn is not None and bound is not None:
        out.append(f"bound: {sampling.sentence(bound.model_dump())}")
    line = None if data.cost is None else _cost_sentence(data.cost)
    return out + ([line] if line else [])


def cost_line(result: RecomputeResult) -> str | None:
    """The cost line of a sealed recompute result (`audit recompute` prints it): None when it has no cost ledger."""
    return None if result.cost is None else _cost_sentence(result.cost)


def _cost_sentence(cost: Cost) -> str:
    """The recompute's cost ledger in one line: tokens, wall time, tokens/s, the whole release projected."""
    per_second = cost.tokens_per_second
    rate = f", {num(round(per_second))} tokens/s" if per_second else ""
    n, journal = cost.entries_resumed, cost.resumed_from
    resumed = f"; {num(n)} entries resumed from {journal or 'an interrupted run'}" if n or journal else ""
    projected = cost.projected_library_seconds
    whole = (f"; the whole release ({num(cost.library_entries)} entries, {num(cost.library_tokens)} tokens) "
             f"about {_duration(projected)} on {cost.executor}"
             f" ({cost.workers} worker{'' if cost.workers == 1 else 's'})"
             if projected else "")
    return f"cost: {num(cost.tokens_recomputed)} tokens recomputed in {cost.wall_seconds:.1f} s{rate}{resumed}{whole}"


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


HEADERS = ["entry", "tokens", "verdict", "layers differing", "max |diff|", "max relative", "of noise bound",
           "max ULP (same-sign normals)", "first difference", "KL max", "KL vs no cache"]
NUMERIC = (1, 3, 4, 5, 6, 7, 9, 10)


def details(data: RecomputeData, console: Console) -> list[RenderableType]:
    rows = [[r["id"], num(r["tokens"]), r["verdict"], f"{r['differing_layers']}/{r['layers']}", num(r["max_abs"]),
             num(r["max_rel"]), num(r["excess"]), num(r["max_ulp"]), r["first"], num(r["kl"]), num(r["kl_natural"])]
            for r in recompute_rows(data)]
    out = [text_table(console, "entries", HEADERS, rows, right=NUMERIC), heatmap_text(data, console.width)]
    return out + [styled(hanging("•", st, console.width, indent=0)) for st in data.statements or []]


def html(data: RecomputeData) -> str:
    rows = []
    for r in recompute_rows(data):
        state = badge("passed" if r["verdict"] in ("byte-exact", "consistent") else "failed", r["verdict"])
        rows.append([esc(r["id"]), num(r["tokens"]), state, f"{r['differing_layers']}/{r['layers']}", num(r["max_abs"]),
                     num(r["max_rel"]), num(r["excess"]), num(r["max_ulp"]), esc(r["first"]), num(r["kl"]),
                     num(r["kl_natural"])])
    out = ""
    if data.reference:
        out += f'<p class="muted">compared with: {esc(data.reference)}</p>'
    out += table(HEADERS, rows, num=NUMERIC)
    out += "<h3>per-layer divergence (rows: entries, columns: layers)</h3>" + heatmap_svg(data)
    drawn, bound = data.sample, data.bound
    if drawn is not None and bound is not None:
        from kvgraft import sampling

        out += "<h3>sample and bound</h3>" + kv_html({
            "sample": f"{drawn.size:,} of {drawn.population:,} entries ({drawn.weighting})",
            "drawn by": f"{drawn.method}: root {drawn.root_digest}, nonce {drawn.nonce} "
                        f"({sampling.nonce_origin(drawn.model_dump(), _resumed_from(data))})",
            "re-derive": "kvgraft audit sample RELEASE --check REPORT.json",
            "bound": sampling.sentence(bound.model_dump()), "method": bound.method, "tokens": bound.token_method})
    if data.statements:
        out += "<ul>" + "".join(f"<li>{esc(st)}</li>" for st in data.statements) + "</ul>"
    return out


KIND = CheckKind(
    name="recompute", schema="recompute-result.v1.json", status=status, stamps_status=True, run=run, face=face,
    details=details, html=html, known_data=("entries", "reference", "all_byte_exact", "statements"), typed=TYPED)
