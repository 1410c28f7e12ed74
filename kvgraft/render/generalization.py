"""Rich rendering of a generalization audit result and of a library build."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.console import Console, RenderableType

from kvgraft.generalization.conditions import LABELS, SHORT
from kvgraft.render.text import WORDS, hanging, kn, kv_lines, num, pct, plain_tree, styled, table
from kvgraft.results.base import JsonObject
from kvgraft.results.generalization import Accuracy, Comparison, GeneralizationResult, Group

if TYPE_CHECKING:
    from kvgraft.generalization.library import BuildResult  # torch: only to type-check

GROUPS: tuple[Group, ...] = ("library", "held_out", "synthetic")


def _interval(a: Accuracy | None) -> str:
    if a is None or not a.n:
        return "—"
    lo, hi = a.interval
    return f"{lo:.1%}–{hi:.1%}"


def _kn_iv(a: Accuracy | None) -> str:
    if a is None or not a.n:
        return "—"
    lo, hi = a.interval
    return f"{a.k}/{a.n} ({lo * 100:.0f}–{hi * 100:.0f}%)"


def _ratio(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}×"


def accuracy_table(result: GeneralizationResult, console: Console) -> RenderableType:
    samples = result.settings.samples
    headers = ["condition", "k/n", "accuracy", "95% interval", "library", "held-out", "synthetic"]
    if samples > 1:
        headers += ["pass@1 (mean)", f"pass@{samples}"]
    rows = []
    for c in result.conditions:
        row = [c.label, kn(c), pct(c.accuracy), _interval(c)] + [
            _kn_iv(c.groups.get(g)) for g in GROUPS]
        if samples > 1:
            row += [pct(c.pass_at_1_mean), pct(c.pass_at_k.get(str(samples)))]
        rows.append(row)
    title = (f"accuracy per condition ({result.settings.decoding}, max {result.settings.max_new_tokens} "
             "new tokens; Wilson 95% intervals)")
    return table(console, title, headers, rows, right=tuple(range(1, len(headers))))


def comparisons_table(comparisons: Sequence[Comparison], console: Console) -> RenderableType:
    # The second arm is the row's own condition (b or c), named in its cells: a fixed "b" header mislabelled the
    # a-vs-c rows.
    headers = ["comparison", "n", "a", "with a graft", "discordant a-only / graft-only", "p exact (mid-p)",
               "bootstrap 95% CI of graft − a", "verdict at 0.05"]
    rows = []
    for c in comparisons:
        m = c.mcnemar
        if not c.n:
            rows.append([c.name, "0", "—", "—", "—", "—", "—", "no queries to compare"])
            continue
        boot = c.bootstrap
        ci = f"{boot.lo:+.1%} to {boot.hi:+.1%}" if boot else "—"
        rows.append([c.name, str(c.n), f"{m.correct_a}/{m.n}", f"{SHORT[c.b]}: {m.correct_b}/{m.n}",
                     f"{m.b} / {m.c}", f"{m.p_exact:.4g} ({m.p_midp:.4g})", ci,
                     "significant" if c.significant else "not significant"])
    return table(console, "paired comparisons: exact McNemar (two-sided), mid-p and a paired bootstrap as secondary "
                          "figures", headers, rows, right=(1, 2, 3, 4, 5, 6))


def equality_table(result: GeneralizationResult, console: Console) -> RenderableType:
    rows = []
    for eq in result.equality.values():
        mism = ", ".join(f"{m.query_id} (token {m.first_difference})" for m in eq.mismatches[:6]) or "none"
        rows.append([LABELS[eq.graft], LABELS[eq.text], f"{eq.equal}/{eq.n}", mism])
    return table(console, "the same tokens as prompt text (fresh prefill, recorded schedule) vs the graft: equal "
                          "output tokens", ["graft", "as text", "equal / n", "mismatching queries"], rows, right=(2,))


def leakage_table(result: GeneralizationResult, console: Console) -> RenderableType:
    rows = []
    for cond, sp in result.leakage.by_condition.items():
        f = sp.flags
        rows.append([LABELS[cond], _kn_iv(sp.clean), kn(sp.clean.baseline), _kn_iv(sp.contaminated),
                     kn(sp.contaminated.baseline),
                     f"{f.answer_in_entry} / {f.problem_in_entry} / {f.solution_in_entry}"])
    return table(console, "clean vs contaminated queries: does the grafted entry hold the query's answer or text? "
                          "(k/n with Wilson 95%; a = no graft on the same queries)",
                 ["condition", "clean", "a on clean", "contaminated", "a on contaminated",
                  "answer / problem / solution in entry"], rows, right=(1, 2, 3, 4, 5))


def ledger_table(result: GeneralizationResult, console: Console) -> RenderableType:
    rows = [[SHORT[cond], str(v.queries), num(v.decode_tokens), num(v.prefill_tokens),
             num(v.restored_tokens), num(v.upstream_tokens_attributed), num(v.kv_bytes_restored)]
            for cond, v in result.ledger.per_condition.items()]
    return table(console, "ledger per condition: tokens (totals over its runs)",
                 ["condition", "runs", "decode", "prefill", "restored", "upstream (attributed)", "KV bytes restored"],
                 rows, right=(1, 2, 3, 4, 5, 6))


def cost_table(result: GeneralizationResult, console: Console) -> RenderableType:
    lg = result.ledger
    unit = "joules (estimate)" if result.energy is not None and result.energy.is_estimate else "joules"
    rows = [[SHORT[cond], f"{v.seconds:.1f}", f"{v.energy_joules:.0f}", _ratio(v.decode_vs_budget),
             _ratio(v.with_upstream_attributed), _ratio(v.with_upstream_amortized)]
            for cond, v in lg.per_condition.items()]
    return table(console, f"ledger per condition: time, energy, decode tokens vs budget (budget = {lg.budget.source})",
                 ["condition", "seconds", unit, "decode / budget", "+ upstream attributed", "+ upstream amortized"],
                 rows, right=(1, 2, 3, 4, 5))


def per_query_table(result: GeneralizationResult, console: Console) -> RenderableType:
    rows = []
    for cond, v in result.ledger.per_condition.items():
        p = v.per_query
        rows.append([SHORT[cond], num(p.decode_tokens), num(p.prefill_tokens), num(p.restored_tokens),
                     num(p.kv_bytes_restored, ",.0f") if p.kv_bytes_restored is not None else "—",
                     f"{p.restore_seconds:.3f}", f"{p.prefill_seconds:.3f}", f"{p.decode_seconds:.2f}",
                     f"{p.energy_joules:.1f}"])
    return table(console, "per run, mean over the condition's queries",
                 ["condition", "decode", "prefill", "restored", "KV bytes", "restore s", "prefill s", "decode s", "J"],
                 rows, right=(1, 2, 3, 4, 5, 6, 7, 8))


def _kv(console: Console, title: str, rows: list[tuple[str, str]]) -> RenderableType:
    return styled(kv_lines(console.width, title, rows), WORDS)


def library_ledger_table(result: GeneralizationResult, console: Console) -> RenderableType:
    lib = result.ledger.library
    return _kv(console, "library (upstream cost)", [
        ("entries (reference / model traces)", f"{lib.entries} ({lib.reference_traces} / {lib.model_traces})"),
        ("tokens stored in the library", num(lib.entry_tokens)),
        ("upstream tokens (generated + capture prefill)", num(lib.upstream_tokens)),
        ("upstream tokens, everything the model processed", num(lib.upstream_tokens_all)),
        ("generated tokens / failed attempts", f"{num(lib.generated_tokens)} / {lib.failed_attempts}"),
        ("upstream seconds / joules", f"{lib.upstream_seconds:.1f} / {lib.upstream_energy_joules:.0f}"),
        ("queries served by a graft", str(lib.queries_served)),
        ("amortized upstream tokens per served query", num(lib.amortized_upstream_tokens_per_query)),
    ])


def _mib(b: int | None) -> str:
    return "—" if b is None else f"{b / 2**20:,.0f} MiB"


def context_table(result: GeneralizationResult, console: Console) -> RenderableType:
    c = result.context
    fits = "" if c.attended_fits_context is None else (" (fits)" if c.attended_fits_context else " (EXCEEDS the context)")
    return _kv(console, "context accounting", [
        ("tokens in the library", num(c.library_tokens)),
        ("largest grafted prefix", num(c.largest_prefix_tokens)),
        ("attended at once (prefix + query + decode), max", f"{num(c.attended_at_once_max)}{fits}"),
        ("model context length (max_position_embeddings)", num(c.model_context_tokens)),
        ("whole library within one context", "—" if c.library_fits_context is None else
         ("yes" if c.library_fits_context else "no: only one entry is attended at a time")),
        ("peak RSS during grafted runs", _mib(c.peak_rss_bytes_grafted)),
        ("RSS before a run (min)", _mib(c.rss_before_bytes_min)),
        ("memory method", str(c.memory_method)),
    ])


def energy_lines(result: GeneralizationResult, console: Console) -> list[RenderableType]:
    e = result.energy
    if e is None:
        return []
    kind = "ESTIMATE" if e.is_estimate else "measured"
    consts = ", ".join(f"{k} {v:g}" for k, v in sorted(e.constants.items()))
    line = f"energy ({kind}, method {e.method}): {e.joules:.0f} J over {e.seconds:.1f} s for the whole audit"
    if consts:
        line += f"; constants: {consts}"
    return [styled(hanging("", line, console.width, indent=0), style="yellow" if e.is_estimate else "")]


def header(result: GeneralizationResult) -> str:
    q = result.plan.queries
    source = result.plan.source
    src = source.get("source", "?") if isinstance(source, dict) else "?"
    return (f"generalization audit of {result.library.path} ({result.library.entries} entries) with "
            f"{result.model.spec}: {q.library} library + {q.held_out} held-out {src} queries, "
            f"{q.synthetic} synthetic; {result.plan.runs} runs")


def renderables(result: GeneralizationResult | JsonObject, console: Console) -> list[RenderableType]:
    """A generalization result at `console`'s width: tables that fit, else paragraphs; nothing cut."""
    r = result if isinstance(result, GeneralizationResult) else GeneralizationResult.model_validate(plain_tree(result))
    out: list[RenderableType] = [styled(hanging("", header(r), console.width, indent=0), style="bold"),
                                 accuracy_table(r, console)]
    if r.comparisons:
        out.append(comparisons_table(r.comparisons, console))
    if r.equality:
        out.append(equality_table(r, console))
    if r.leakage.by_condition:
        out.append(leakage_table(r, console))
    out += [ledger_table(r, console), cost_table(r, console), per_query_table(r, console),
            library_ledger_table(r, console), context_table(r, console)]
    out += energy_lines(r, console)
    if r.library.missing:
        out.append(styled(hanging("", "library problems without a solved trace: "
                                      + ", ".join(r.library.missing), console.width, indent=0), style="yellow"))
    out += [styled(hanging("•", s, console.width, indent=0)) for s in r.statements]
    return out


def build_renderables(build: BuildResult, console: Console) -> list[RenderableType]:
    """A library build result: what was solved, how, at what cost; what was not."""
    build = plain_tree(build)
    counts, totals = build["counts"], build["totals"]
    how = "ESTIMATE, not a measurement" if build["energy"]["is_estimate"] else f"measured: {build['energy']['method']}"
    rows = [[v["problem_id"], str(v["trace"]), str(v["num_tokens"]), str(v["upstream"]["attempts"]),
             str(v["upstream"]["failed_attempts"]), str(v["upstream"]["generated_tokens"]), str(v["upstream"]["tokens"])]
            for v in build["solved"]]
    rows += [[u["problem_id"], "unsolved", "—", str(len(u["attempts"])), str(u["failed_attempts"]),
              str(u["generated_tokens"]), "—"] for u in build["unsolved"]]
    t = table(console, f"library {build['release']['path']}",
              ["problem", "trace", "tokens", "attempts", "failed", "generated", "upstream tokens"], rows,
              right=(2, 3, 4, 5, 6))
    summary = _kv(console, "summary", [
        ("split", f"{build['library']} library / {build['held_out']} held out (salt {build['split']['salt']!r}, "
                  f"fraction {build['split']['library_fraction']:g})"),
        ("solved traces", f"{counts['reference'] + counts['model']} ({counts['reference']} reference, "
                            f"{counts['model']} model-generated)"),
        ("without a solved trace", str(counts["unsolved"])),
        ("tokens stored", num(totals["entry_tokens"])),
        ("upstream tokens (generated + capture prefill)", num(totals["upstream_tokens"])),
        ("generated tokens, unsolved problems included", num(totals["generated_tokens"])),
        ("failed attempts", str(totals["failed_attempts"])),
        ("seconds", f"{totals['seconds']:.1f}"),
        ("energy", f"{build['energy']['joules']:.0f} J ({how})"),
        ("root digest", build["release"]["root_digest"]),
    ])
    out: list[RenderableType] = [t, summary]
    if build["unsolved"]:
        out.append(styled(hanging("", "no solved trace (not in the library): "
                                      + ", ".join(u["problem_id"] for u in build["unsolved"]), console.width, indent=0),
                          style="yellow"))
    return out
