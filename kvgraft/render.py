"""Rich renderings shared by commands."""

from __future__ import annotations

from typing import Any

from rich.table import Table


def ledger_table(ledger: dict[str, Any]) -> Table:
    t = Table(title="token ledger", show_header=False, title_justify="left")
    t.add_column("what")
    t.add_column("value", justify="right")
    t.add_row("tokens restored from the graft", str(ledger["restored_tokens"]))
    t.add_row("prompt tokens prefilled", str(ledger["prompt_tokens"]))
    t.add_row("decode tokens", str(ledger["decode_tokens"]))
    t.add_row("KV bytes restored (verified)", f"{ledger['kv_bytes_restored']:,}")
    t.add_row("restore / prefill / decode s",
              f"{ledger['restore_seconds']:.4f} / {ledger['prefill_seconds']:.4f} / {ledger['decode_seconds']:.4f}")
    if ledger.get("forced_model"):
        t.add_row("[red]model identity[/]", "[red]differs (forced)[/]")
    for key, (was, now) in ledger.get("conditions_differing", {}).items():
        t.add_row(f"[yellow]{key}[/] differs", f"release {was} / now {now}")
    return t


def recompute_table(result: dict[str, Any]) -> Table:
    from kvgraft.compare import fmt_kl

    t = Table(title=f"recompute audit of {result['release']['path']}", title_justify="left")
    for col in ("entry", "tokens", "K/V equal", "first difference", "max ULP", "KL matched (max)",
                "KL natural (max)", "greedy agree"):
        t.add_column(col, justify="right" if col not in ("entry", "first difference") else "left")
    for e in result["entries"]:
        fd = e["first_difference"]
        where = "—"
        if fd:
            named = fd.get("named")
            where = (f"layer {fd['layer']} {fd['tensor']} head {named['head']} pos {named['position']} dim {named['dim']}"
                     if named else f"layer {fd['layer']}: {fd.get('detail')}")
        ok = "[green]" if e["byte_exact"] else "[red]"
        max_ulp = max((r[p]["max_ulp"] for r in e["layers"] for p in ("keys", "values") if p in r), default=0)
        t.add_row(e["id"], str(e["num_tokens"]), f"{ok}{e['tensors_equal']}/{e['tensors']}[/]", where, str(max_ulp),
                  fmt_kl(e["matched"]["kl_max"]), fmt_kl(e["natural"]["kl_max"]),
                  f"{e['matched']['greedy_agreement']:.0%}")
    return t


def determinism_table(result: dict[str, Any]) -> Table:
    from kvgraft.compare import fmt_kl

    t = Table(title=f"determinism matrix: {result['length']} tokens, baseline = {result['baseline']}",
              title_justify="left")
    for col in ("condition", "KV class", "same bytes as baseline", "KV max ULP", "KV max |Δ|", "next-token KL"):
        t.add_column(col, justify="left" if col == "condition" else "right")
    for row in result["conditions"]:
        same = "[green]yes[/]" if row["identical_to_baseline"] else "[red]no[/]"
        ulp = "—" if row["max_ulp"] is None else str(row["max_ulp"])
        t.add_row(row["name"], row["class"], same, ulp, f"{row['max_abs']:.3g}", fmt_kl(row["kl"]))
    return t
