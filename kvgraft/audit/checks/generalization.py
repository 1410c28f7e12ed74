"""The generalization check: does a graft help on problems whose solution is not in the cache, or is it replay?

Its report entry's `data` (a short form for renderers written before the whole result was kept, plus the
whole result under `result`) is built here: the generalization audit itself knows nothing of reports.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console, RenderableType

from kvgraft.audit.checks.kind import CheckKind, Ran
from kvgraft.audit.context import Context
from kvgraft.generalization.conditions import LABELS, SHORT
from kvgraft.render.figures import Face, detectable, null_meaning
from kvgraft.render.html import accuracy_html, badge, esc, kv_html, table
from kvgraft.render.terminal import accuracy_view, mapping_view
from kvgraft.render.text import kn, num
from kvgraft.render.text import table as text_table
from kvgraft.results.base import Count, JsonObject, Open
from kvgraft.results.generalization import (
    TYPED,
    Accuracy,
    AccuracySplit,
    Benchmark,
    GeneralizationData,
    GeneralizationResult,
    McNemarRow,
    NamedAccuracy,
)


class _Reproduced(Open):
    """Of a prompt-text condition against its graft (`Equality`): on how many queries the outputs were equal."""

    equal: Count
    n: Count


class _Judged(Open):
    """What the status rule reads of a sealed result: each (d)-vs-graft comparison, and whether any run ran (a
    run's members are not read here: `Run` is the result schema's to check, when the result is sealed)."""

    equality: dict[str, _Reproduced]
    runs: list[JsonObject]


def run(ctx: Context, gc: dict[str, Any]) -> Ran:
    """Under a plan's `[checks.generalization]` (synthetic, policy, max_new_tokens, samples, temperature, preamble), and
    what `audit generalization` sets beyond a plan: source, limit, library_fraction, salt (of the split; default
    the library's), synthetic_seed, seed, force, budget, progress."""
    from kvgraft.generalization import audit as gen

    ctx.say("generalization audit: conditions a-d on library, held-out and synthetic problems")
    settings = gen.Settings(max_new_tokens=gc.get("max_new_tokens", 64), policy=gc.get("policy", "nearest"),
                            samples=gc.get("samples", 1), temperature=gc.get("temperature", 0.0),
                            seed=gc.get("seed", 0), force=gc.get("force", False), budget=gc.get("budget"),
                            preamble=gc.get("preamble", ""))
    # The queries before the model: a source that does not load is refused before anything heavy starts.
    queries, prepared = gen.prepare(ctx.release, source=gc.get("source"), limit=gc.get("limit"),
                                    library_fraction=gc.get("library_fraction"), salt=gc.get("salt"),
                                    synthetic_n=gc.get("synthetic", 0), synthetic_seed=gc.get("synthetic_seed", 1))
    g = gen.audit(ctx.lm, ctx.release, queries, settings, prepared=prepared, progress=gc.get("progress"),
                  executor=ctx.ex)
    from kvgraft.signing.verify import signature_statement

    result = g.model_dump(mode="json", exclude_unset=True)
    result["release_signature"] = signature_statement(ctx.release.checked).model_dump(mode="json")  # whose library
    data = report_check_data(g).model_dump(mode="json", exclude_none=True)
    return Ran(result, "\n".join(g.statements), {**data, "result": result}, ledger=ledger_lines(g))


def status(result: JsonObject) -> str:
    """failed when a prompt-text condition (d) did not reproduce its graft's tokens (the graft is not the same
    computation as its text); incomplete when nothing ran; else passed."""
    judged = _Judged.model_validate(result)
    if any(eq.equal != eq.n for eq in judged.equality.values()):
        return "failed"
    return "passed" if judged.runs else "incomplete"


def report_check_data(result: GeneralizationResult) -> GeneralizationData:
    """The `data` of a report check of kind "generalization" (schemas/audit-report.v1.json), less `result`."""

    def acc(name: str, a: Accuracy) -> NamedAccuracy | None:
        if not a.n:
            return None
        return NamedAccuracy(name=name, k=a.k, n=a.n, interval=a.interval, confidence=0.95)

    conditions = [x for c in result.conditions if (x := acc(c.label, c)) is not None]
    mcnemar = [McNemarRow(a=LABELS[c.a], b=f"{LABELS[c.b]} [{c.scope}]", a_only=c.mcnemar.b, b_only=c.mcnemar.c,
                          p_value=c.mcnemar.p_exact, method="exact McNemar (two-sided)")
               for c in result.comparisons if c.n]
    clean: list[NamedAccuracy] = []
    contaminated: list[NamedAccuracy] = []
    for cond, sp in result.leakage.by_condition.items():
        for rows, part in ((clean, sp.clean), (contaminated, sp.contaminated)):
            for row in (acc(LABELS[cond], part), acc(f"a: no graft, same queries as {SHORT[cond]}", part.baseline)):
                if row is not None:
                    rows.append(row)
    lg = result.ledger
    ledger: JsonObject = {f"{SHORT[c]} decode tokens": v.decode_tokens for c, v in lg.per_condition.items()}
    ledger["library upstream tokens"] = lg.library.upstream_tokens
    q = result.plan.queries
    n = q.library + q.held_out + q.synthetic + sum((q.__pydantic_extra__ or {}).values())
    source = result.plan.source.source if result.plan.source is not None else None
    return GeneralizationData(conditions=conditions, mcnemar=mcnemar,
                              split=AccuracySplit(clean=clean, contaminated=contaminated), ledger=ledger,
                              benchmark=Benchmark(name=str(source), size=n or None))


def ledger_lines(g: GeneralizationResult) -> dict[str, str]:
    """One readable line per condition for the report's ledger; the full ledger stays in the check's data."""
    lines: dict[str, str] = {}
    for cond, v in g.ledger.per_condition.items():
        line = (f"{v.decode_tokens:,} decode, {v.prefill_tokens:,} prefill, {v.restored_tokens:,} restored tokens "
                f"over {v.queries} queries")
        if v.decode_vs_budget is not None:
            line += f"; decode/budget {v.decode_vs_budget:.2f}"
        if v.with_upstream_amortized is not None and v.restored_tokens:
            line += f", {v.with_upstream_amortized:.2f} with the library's upstream cost amortized"
        lines[LABELS.get(cond, cond)] = line
    lib = g.ledger.library
    lines["library upstream"] = (f"{lib.upstream_tokens:,} tokens, {lib.amortized_upstream_tokens_per_query:.1f} per query "
                                 f"over {lib.queries_served} queries")
    if g.energy is not None:
        kind = "ESTIMATE" if g.energy.method == "estimate" else "measured"
        lines["energy"] = f"{g.energy.joules:,.0f} J ({kind}, {g.energy.method})"
    return lines


def face(data: GeneralizationData) -> Face:
    result = data.result
    equality = (result.equality or {}) if result is not None else {}
    if equality:
        same = [f"{SHORT.get(q.text, q.text)} = {SHORT.get(q.graft, q.graft)} on {q.equal}/{q.n}" for q in equality.values()]
        ok = all(q.equal == q.n for q in equality.values())
        verdict = ("the same tokens as prompt text reproduce each graft's output" if ok else
                   "the same tokens as prompt text do NOT reproduce a graft's output") + ": " + ", ".join(same)
    else:
        verdict = "no prompt-text condition to compare with the grafts"
    bench = data.benchmark.name if data.benchmark is not None else None
    accs = ", ".join(f"{a.name.split(':')[0]} {kn(a)}" for a in data.conditions)
    figures = [f"accuracy{' on ' + bench if bench else ''}: {accs}"] if accs else []
    comps = (result.comparisons or []) if result is not None else []
    nulls = []
    for c in comps:
        m = c.mcnemar
        sig = "significant" if c.significant else "not significant"
        det = c.detectable
        power = f"; {detectable(det.n, det.effect, det.power)}" if det else ""
        if det and c.n and not c.significant:
            nulls.append((det.n, det.effect))
        figures.append(f"{c.name}: {SHORT.get(c.b, c.b)} {m.correct_b}/{c.n} vs {SHORT.get(c.a, c.a)} {m.correct_a}/{c.n}, "
                       f"exact McNemar p = {num(m.p_exact)}, {sig} at {m.alpha}{power}")
    if nulls:
        figures.append(null_meaning(nulls))
    if not comps:
        for row in data.mcnemar or []:
            figures.append(f"{row.b} vs {row.a}: exact McNemar p = {num(row.p_value)}")
    leakage = result.leakage if result is not None else None
    for cond, leak in (leakage.by_condition if leakage is not None else {}).items():
        dirty, clean = leak.contaminated, leak.clean
        if dirty.n and not cond.endswith("_text"):  # a text condition shares its graft's entries
            figures.append(f"leakage: {dirty.n} of {dirty.n + clean.n} {SHORT.get(cond, cond)} queries "
                           f"have their answer or text in the grafted entry; right there {kn(dirty)}, "
                           f"on clean ones {kn(clean) if clean.n else 'none to count'}")
    return Face(verdict, figures)


def _splits(data: GeneralizationData) -> list[tuple[str, list[NamedAccuracy]]]:
    split = data.split
    if split is None:
        return []
    return [(part, accs) for part, accs in (("clean", split.clean), ("contaminated", split.contaminated)) if accs]


def _bench(data: GeneralizationData) -> tuple[str | None, int | None]:
    return (data.benchmark.name, data.benchmark.size) if data.benchmark is not None else (None, None)


def details(data: GeneralizationData, console: Console) -> list[RenderableType]:
    # The whole result under `result` is not drawn here: its tables are `kvgraft audit generalization`'s.
    name, _ = _bench(data)
    out = [accuracy_view(console, "accuracy" + (f" on {name}" if name else ""), data.conditions)]
    if data.mcnemar:
        rows = [[m.a, m.b, str(m.a_only), str(m.b_only), f"{m.p_value:.4g}"] for m in data.mcnemar]
        out.append(text_table(console, "paired comparisons (exact McNemar)", ["a", "b", "only a", "only b", "p"], rows))
    for part, accs in _splits(data):
        out.append(accuracy_view(console, f"{part} problems", accs))
    if data.ledger is not None:
        out.append(mapping_view(console, "generalization ledger", data.ledger))
    return out


def html(data: GeneralizationData) -> str:
    name, size = _bench(data)
    title = "accuracy" + (f" on {name}" if name else "")
    title += f" ({size} problems)" if size else ""
    out = accuracy_html(title, data.conditions)
    if data.mcnemar:
        rows = [[esc(m.a), esc(m.b), str(m.a_only), str(m.b_only), f"{m.p_value:.4g}",
                 badge("supported", "significant at 0.05") if m.p_value < 0.05
                 else badge("unsupported", "not significant at 0.05")] for m in data.mcnemar]
        out += "<h3>paired comparisons (exact McNemar)</h3>" + table(["a", "b", "solved only by a", "solved only by b", "p", ""],
                                                                     rows, num=(2, 3, 4))
    for part, accs in _splits(data):
        out += accuracy_html(f"{part} problems", accs)
    if data.ledger is not None:
        out += "<h3>ledger</h3>" + kv_html(data.ledger)
    return out


KIND = CheckKind(
    name="generalization", schema="generalization-result.v1.json", status=status, stamps_status=True, run=run,
    face=face, details=details, html=html, known_data=("benchmark", "conditions", "mcnemar", "split", "ledger"), typed=TYPED)
