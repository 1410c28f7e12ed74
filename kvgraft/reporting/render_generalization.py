"""Rich rendering of a generalization audit result and of a library build."""

from __future__ import annotations

from typing import Any

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from kvgraft.generalization.audit import LABELS, SHORT


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:.1%}"


def _kn(a: dict[str, Any] | None) -> str:
    if not a or not a.get("n"):
        return "—"
    return f"{a['k']}/{a['n']}"


def _interval(a: dict[str, Any] | None) -> str:
    if not a or not a.get("n"):
        return "—"
    lo, hi = a["interval"]
    return f"{lo:.1%}–{hi:.1%}"


def _kn_iv(a: dict[str, Any] | None) -> str:
    if not a or not a.get("n"):
        return "—"
    lo, hi = a["interval"]
    return f"{a['k']}/{a['n']} ({lo * 100:.0f}–{hi * 100:.0f}%)"


def _num(x: Any, fmt: str = ",") -> str:
    if x is None:
        return "—"
    if isinstance(x, float) and fmt == ",":
        return f"{x:,.1f}"
    return format(x, fmt)


def _ratio(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}×"


def accuracy_table(result: dict[str, Any]) -> Table:
    samples = result["settings"]["samples"]
    t = Table(title=f"accuracy per condition ({result['settings']['decoding']}, max {result['settings']['max_new_tokens']} "
                    "new tokens; Wilson 95% intervals)", title_justify="left")
    for col in ("condition", "k/n", "accuracy", "95% interval", "library", "held-out", "synthetic"):
        t.add_column(col, justify="left" if col == "condition" else "right")
    if samples > 1:
        t.add_column("pass@1 (mean)", justify="right")
        t.add_column(f"pass@{samples}", justify="right")
    for c in result["conditions"]:
        groups = c["groups"]
        row = [c["label"], _kn(c), _pct(c["accuracy"]), _interval(c)] + [
            _kn_iv(groups.get(g)) for g in ("library", "held_out", "synthetic")]
        if samples > 1:
            row += [_pct(c["pass_at_1_mean"]), _pct(c["pass_at_k"].get(str(samples)))]
        t.add_row(*row)
    return t


def comparisons_table(result: dict[str, Any]) -> Table:
    t = Table(title="paired comparisons: exact McNemar (two-sided), mid-p and a paired bootstrap as secondary figures",
              title_justify="left")
    for col in ("comparison", "n", "a", "b", "discordant a-only / b-only", "p exact (mid-p)", "bootstrap 95% CI of b − a",
                "verdict at 0.05"):
        t.add_column(col, justify="left" if col in ("comparison", "verdict at 0.05") else "right")
    for c in result["comparisons"]:
        m = c["mcnemar"]
        if not c["n"]:
            t.add_row(c["name"], "0", "—", "—", "—", "—", "—", Text("no queries to compare", style="dim"))
            continue
        boot = c.get("bootstrap")
        ci = f"{boot['lo']:+.1%} … {boot['hi']:+.1%}" if boot else "—"
        verdict = Text("significant", style="bold green") if c["significant"] else Text("not significant", style="yellow")
        t.add_row(c["name"], str(c["n"]), f"{m['correct_a']}/{m['n']}", f"{m['correct_b']}/{m['n']}", f"{m['b']} / {m['c']}",
                  f"{m['p_exact']:.4g} ({m['p_midp']:.4g})", ci, verdict)
    return t


def equality_table(result: dict[str, Any]) -> Table:
    t = Table(title="the same tokens as prompt text (fresh prefill, recorded schedule) vs the graft: equal output tokens",
              title_justify="left")
    for col in ("graft", "as text", "equal / n", "mismatching queries"):
        t.add_column(col, justify="right" if col == "equal / n" else "left")
    for eq in result["equality"].values():
        ok = eq["equal"] == eq["n"]
        style = "green" if ok else "bold red"
        mism = ", ".join(f"{m['query_id']} (token {m['first_difference']})" for m in eq["mismatches"][:6]) or "none"
        t.add_row(LABELS[eq["graft"]], LABELS[eq["text"]], Text(f"{eq['equal']}/{eq['n']}", style=style), mism)
    return t


def leakage_table(result: dict[str, Any]) -> Table:
    t = Table(title="clean vs contaminated queries: does the grafted entry hold the query's answer or text? "
                    "(k/n with Wilson 95%; a = no graft on the same queries)", title_justify="left")
    for col in ("condition", "clean", "a on clean", "contaminated", "a on contaminated", "answer / problem / solution in entry"):
        t.add_column(col, justify="left" if col == "condition" else "right")
    for cond, sp in result["leakage"]["by_condition"].items():
        f = sp["flags"]
        flags = f"{f['answer_in_entry']} / {f['problem_in_entry']} / {f['solution_in_entry']}"
        t.add_row(LABELS[cond], _kn_iv(sp["clean"]), _kn(sp["clean"]["baseline"]), _kn_iv(sp["contaminated"]),
                  _kn(sp["contaminated"]["baseline"]), flags)
    return t


def ledger_table(result: dict[str, Any]) -> Table:
    lg = result["ledger"]
    t = Table(title="ledger per condition: tokens (totals over its runs)", title_justify="left")
    for col in ("condition", "runs", "decode", "prefill", "restored", "upstream (attributed)", "KV bytes restored"):
        t.add_column(col, justify="left" if col == "condition" else "right")
    for cond, v in lg["per_condition"].items():
        t.add_row(SHORT[cond], str(v["queries"]), _num(v["decode_tokens"]), _num(v["prefill_tokens"]),
                  _num(v["restored_tokens"]), _num(v["upstream_tokens_attributed"]), _num(v["kv_bytes_restored"]))
    return t


def cost_table(result: dict[str, Any]) -> Table:
    lg = result["ledger"]
    energy = result.get("energy") or {}
    unit = "joules (estimate)" if energy.get("is_estimate") else "joules"
    t = Table(title=f"ledger per condition: time, energy, decode tokens vs budget (budget = {lg['budget']['source']})",
              title_justify="left")
    for col in ("condition", "seconds", unit, "decode / budget", "+ upstream attributed", "+ upstream amortized"):
        t.add_column(col, justify="left" if col == "condition" else "right")
    for cond, v in lg["per_condition"].items():
        t.add_row(SHORT[cond], f"{v['seconds']:.1f}", f"{v['energy_joules']:.0f}", _ratio(v["decode_vs_budget"]),
                  _ratio(v["with_upstream_attributed"]), _ratio(v["with_upstream_amortized"]))
    return t


def per_query_table(result: dict[str, Any]) -> Table:
    t = Table(title="per run, mean over the condition's queries", title_justify="left")
    for col in ("condition", "decode", "prefill", "restored", "KV bytes", "restore s", "prefill s", "decode s", "J"):
        t.add_column(col, justify="left" if col == "condition" else "right")
    for cond, v in result["ledger"]["per_condition"].items():
        p = v["per_query"]
        t.add_row(SHORT[cond], _num(p["decode_tokens"]), _num(p["prefill_tokens"]), _num(p["restored_tokens"]),
                  _num(p["kv_bytes_restored"], ",.0f") if p["kv_bytes_restored"] is not None else "—",
                  f"{p['restore_seconds']:.3f}", f"{p['prefill_seconds']:.3f}", f"{p['decode_seconds']:.2f}",
                  f"{p['energy_joules']:.1f}")
    return t


def _kv(title: str, rows: list[tuple[str, str]]) -> Table:
    t = Table(title=title, show_header=False, title_justify="left")
    t.add_column("what", style="dim")
    t.add_column("value", overflow="fold")
    for k, v in rows:
        t.add_row(k, v)
    return t


def library_ledger_table(result: dict[str, Any]) -> Table:
    lib = result["ledger"]["library"]
    return _kv("library (upstream cost)", [
        ("entries (reference / model traces)", f"{lib['entries']} ({lib['reference_traces']} / {lib['model_traces']})"),
        ("tokens stored in the library", _num(lib["entry_tokens"])),
        ("upstream tokens (generated + capture prefill)", _num(lib["upstream_tokens"])),
        ("upstream tokens, everything the model processed", _num(lib["upstream_tokens_all"])),
        ("generated tokens / failed attempts", f"{_num(lib['generated_tokens'])} / {lib['failed_attempts']}"),
        ("upstream seconds / joules", f"{lib['upstream_seconds']:.1f} / {lib['upstream_energy_joules']:.0f}"),
        ("queries served by a graft", str(lib["queries_served"])),
        ("amortized upstream tokens per served query", _num(lib["amortized_upstream_tokens_per_query"])),
    ])


def _mib(b: int | None) -> str:
    return "—" if b is None else f"{b / 2**20:,.0f} MiB"


def context_table(result: dict[str, Any]) -> Table:
    c = result["context"]
    ctx = c["model_context_tokens"]
    fits = "" if c["attended_fits_context"] is None else (" (fits)" if c["attended_fits_context"] else " (EXCEEDS the context)")
    return _kv("context accounting", [
        ("tokens in the library", _num(c["library_tokens"])),
        ("largest grafted prefix", _num(c["largest_prefix_tokens"])),
        ("attended at once (prefix + query + decode), max", f"{_num(c['attended_at_once_max'])}{fits}"),
        ("model context length (max_position_embeddings)", _num(ctx)),
        ("whole library within one context", "—" if c["library_fits_context"] is None else
         ("yes" if c["library_fits_context"] else "no: only one entry is attended at a time")),
        ("peak RSS during grafted runs", _mib(c["peak_rss_bytes_grafted"])),
        ("RSS before a run (min)", _mib(c["rss_before_bytes_min"])),
        ("memory method", c["memory_method"]),
    ])


def energy_lines(result: dict[str, Any]) -> list[RenderableType]:
    e = result.get("energy")
    if not e:
        return []
    kind = "ESTIMATE" if e["is_estimate"] else "measured"
    consts = ", ".join(f"{k} {v:g}" for k, v in sorted(e.get("constants", {}).items()))
    line = f"energy ({kind}, method {e['method']}): {e['joules']:.0f} J over {e['seconds']:.1f} s for the whole audit"
    if consts:
        line += f"; constants: {consts}"
    return [Text(line, style="yellow" if e["is_estimate"] else "")]


def header(result: dict[str, Any]) -> Text:
    q = result["plan"]["queries"]
    src = (result["plan"].get("source") or {}).get("source", "?")
    return Text(f"generalization audit of {result['library']['path']} ({result['library']['entries']} entries) with "
                f"{result['model']['spec']}: {q['library']} library + {q['held_out']} held-out {src} queries, "
                f"{q['synthetic']} synthetic; {result['plan']['runs']} runs", style="bold")


def renderables(result: dict[str, Any]) -> list[RenderableType]:
    out: list[RenderableType] = [header(result), accuracy_table(result)]
    if result["comparisons"]:
        out.append(comparisons_table(result))
    if result["equality"]:
        out.append(equality_table(result))
    if result["leakage"]["by_condition"]:
        out.append(leakage_table(result))
    out += [ledger_table(result), cost_table(result), per_query_table(result), library_ledger_table(result),
            context_table(result)]
    out += energy_lines(result)
    if result["library"]["missing"]:
        out.append(Text(f"library problems without a verified trace: {', '.join(result['library']['missing'])}",
                        style="yellow"))
    out += [Text(f"• {s}") for s in result["statements"]]
    return out


def build_renderables(build: dict[str, Any]) -> list[RenderableType]:
    """A library build result: what was verified, how, at what cost; what was not."""
    counts, totals = build["counts"], build["totals"]
    how = "ESTIMATE, not a measurement" if build["energy"]["is_estimate"] else f"measured: {build['energy']['method']}"
    t = Table(title=f"library {build['release']['path']}", title_justify="left")
    for col in ("problem", "trace", "tokens", "attempts", "failed", "generated", "upstream tokens"):
        t.add_column(col, justify="left" if col in ("problem", "trace") else "right")
    for v in build["verified"]:
        u = v["upstream"]
        t.add_row(v["problem_id"], v["trace"], str(v["num_tokens"]), str(u["attempts"]), str(u["failed_attempts"]),
                  str(u["generated_tokens"]), str(u["tokens"]))
    for u in build["unverified"]:
        t.add_row(Text(u["problem_id"], style="red"), Text("unverified", style="red"), "—", str(len(u["attempts"])),
                  str(u["failed_attempts"]), str(u["generated_tokens"]), "—")
    summary = _kv("summary", [
        ("split", f"{build['library']} library / {build['held_out']} held out (salt {build['split']['salt']!r}, "
                  f"fraction {build['split']['library_fraction']:g})"),
        ("verified traces", f"{counts['reference'] + counts['model']} ({counts['reference']} reference, "
                            f"{counts['model']} model-generated)"),
        ("without a verified trace", str(counts["unverified"])),
        ("tokens stored", _num(totals["entry_tokens"])),
        ("upstream tokens (generated + capture prefill)", _num(totals["upstream_tokens"])),
        ("generated tokens, unverified problems included", _num(totals["generated_tokens"])),
        ("failed attempts", str(totals["failed_attempts"])),
        ("seconds", f"{totals['seconds']:.1f}"),
        ("energy", f"{build['energy']['joules']:.0f} J ({how})"),
        ("root digest", build["release"]["root_digest"]),
    ])
    out: list[RenderableType] = [t, summary]
    if build["unverified"]:
        out.append(Text("no verified trace (not in the library): " + ", ".join(u["problem_id"] for u in build["unverified"]),
                        style="yellow"))
    return out
