"""A report's face: each check once, as a verdict line and the few figures that decide it.

Terminal and HTML both show this first; the tables behind each check are details (`report show --detail`).
Each check kind has one face function in FACES; a kind it does not know shows its summary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rich.console import RenderableType
from rich.text import Text

from kvgraft.generalization.conditions import SHORT
from kvgraft.reporting.render import STATUS_MARK, STATUS_STYLE, WORDS, hanging, kn, num, styled


@dataclass(frozen=True)
class Face:
    verdict: str  # the sentence that decides the check's status
    figures: list[str] = field(default_factory=list)  # the few figures behind it


def _dict(x: Any) -> dict[str, Any]:
    return x if isinstance(x, dict) else {}


def points(effect: float) -> str:
    """A difference between two accuracies, in percentage points (not a percentage of anything)."""
    return f"{num(effect * 100, '.0f')} points"


def detectable(det: dict[str, Any]) -> str:
    """What `kvgraft.generalization.stats.detectable_effect` measured, said as what it is."""
    n, power = det.get("n"), det.get("power", 0.8)
    if det.get("effect") is None:
        return f"at n = {n} no difference can be significant"
    return f"smallest difference detectable at n = {n} with {power:.0%} power: {points(det['effect'])}"


def null_meaning(dets: list[dict[str, Any]]) -> str:
    """One line: what the non-significant results among these say, and what they do not."""
    sized = [d for d in dets if d.get("effect") is not None]
    if not sized:
        return "not significant here means nothing: at these sizes no difference could have been significant"
    big = max(sized, key=lambda d: d["effect"])
    at = f"n = {big['n']}" if len({d["n"] for d in sized}) == 1 else f"the smallest n, {min(d['n'] for d in sized)}"
    return (f"not significant means no difference of {points(big['effect'])} or more is likely to have been missed "
            f"(at {at}); smaller differences are not excluded")


def _verify(data: dict[str, Any]) -> Face:
    if not data.get("ok"):
        return Face(f"release refused: {data.get('error') or 'see details'}")
    verdict = (f"release intact: {num(data.get('entries'))} entries, {num(data.get('files'))} files, "
               f"{num(data.get('tensors'))} tensors, {num(data.get('bytes_hashed'))} bytes hashed against its manifest"
               + ("; every tensor re-hashed" if data.get("deep") else ""))
    sig = _dict(data.get("signature"))
    if sig.get("status") == "verified":
        who = (f"key {sig.get('key_id')}" if sig.get("method") == "key"
               else f"{sig.get('identity')} via {sig.get('issuer')} (Sigstore)")
        signed = f"signature verified: {who}"
    else:
        signed = "signature not checked" + ("" if sig.get("bundle") else ": the release is unsigned")
    return Face(verdict, [signed] + [f"warning: {w}" for w in data.get("warnings", [])])


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


def _recompute(data: dict[str, Any]) -> Face:
    from kvgraft.reporting.views import recompute_rows

    entries = [e for e in data.get("entries", []) if isinstance(e, dict)]
    rows = recompute_rows(data)
    word = data.get("verdict") or ("byte-exact" if data.get("all_byte_exact") else "not byte-exact")
    drawn = _dict(data.get("sample"))
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
    drawn = _dict(data.get("sample"))
    if drawn:
        out.append(f"sample: {num(drawn['size'])} of {num(drawn['population'])} entries drawn from the release root and "
                   f"nonce {drawn['nonce']} ({drawn['nonce_source']}; {drawn['method']}, uniform over entries); "
                   "re-derive: kvgraft audit sample RELEASE --check REPORT")
    if drawn and data.get("bound"):
        out.append(f"bound: {sampling.sentence(data['bound'])}")
    line = cost_line(data)
    return out + ([line] if line else [])


def cost_line(data: dict[str, Any]) -> str | None:
    """The recompute's cost ledger in one line: tokens, wall time, tokens/s, the whole release projected."""
    cost = _dict(data.get("cost"))
    if cost.get("tokens_recomputed") is not None:
        rate = f", {num(round(cost['tokens_per_second']))} tokens/s" if cost.get("tokens_per_second") else ""
        resumed = f"; {num(cost['entries_resumed'])} entries resumed from an interrupted run" \
            if cost.get("entries_resumed") else ""
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


def _determinism(data: dict[str, Any]) -> Face:
    conds = [c for c in data.get("conditions", []) if isinstance(c, dict)]
    classes: dict[str, list[str]] = {}
    for c in conds:
        classes.setdefault(str(c.get("class", "?")), []).append(str(c.get("name")))
    env = data.get("environment") or {}
    where = f" on {env.get('device_name')}" if isinstance(env, dict) and env.get("device_name") else ""
    verdict = (f"{len(classes)} distinct KV byte classes among {len(conds)} conditions{where} "
               "(it describes; it fails nothing)")
    baseline = str(data.get("baseline", ""))
    figures = []
    for label, names in classes.items():
        if baseline in names:
            others = len(names) - 1
            figures.append(f"{label}: the baseline ({baseline})" + (f" and {others} more conditions" if others else ""))
        else:
            figures.append(f"{label}: {'; '.join(names)}")
    return Face(verdict, figures)


def _generalization(data: dict[str, Any]) -> Face:
    result = _dict(data.get("result"))
    equality = result.get("equality") or {}
    if equality:
        same = [f"{SHORT.get(q['text'], q['text'])} = {SHORT.get(q['graft'], q['graft'])} on {q['equal']}/{q['n']}"
                for q in equality.values()]
        ok = all(q["equal"] == q["n"] for q in equality.values())
        verdict = ("the same tokens as prompt text reproduce each graft's output" if ok else
                   "the same tokens as prompt text do NOT reproduce a graft's output") + ": " + ", ".join(same)
    else:
        verdict = "no prompt-text condition to compare with the grafts"
    bench = (data.get("benchmark") or {}).get("name")
    accs = ", ".join(f"{str(a['name']).split(':')[0]} {kn(a)}" for a in data.get("conditions", []))
    figures = [f"accuracy{' on ' + bench if bench else ''}: {accs}"] if accs else []
    comps = result.get("comparisons") or []
    nulls = []
    for c in comps:
        m = c.get("mcnemar") or {}
        sig = "significant" if c.get("significant") else "not significant"
        det = c.get("detectable") or {}
        n = c.get("n")
        power = f"; {detectable(det)}" if det else ""
        if det and n and not c.get("significant"):
            nulls.append(det)
        figures.append(f"{c['name']}: {SHORT.get(c['b'], c['b'])} {m.get('correct_b')}/{n} vs "
                       f"{SHORT.get(c['a'], c['a'])} {m.get('correct_a')}/{n}, exact McNemar p = {num(m.get('p_exact'))}, "
                       f"{sig} at {m.get('alpha', 0.05)}{power}")
    if nulls:
        figures.append(null_meaning(nulls))
    if not comps:
        for m in data.get("mcnemar", []):
            figures.append(f"{m['b']} vs {m['a']}: exact McNemar p = {num(m['p_value'])}")
    for cond, leak in ((result.get("leakage") or {}).get("by_condition") or {}).items():
        dirty, clean = leak.get("contaminated") or {}, leak.get("clean") or {}
        if dirty.get("n") and not cond.endswith("_text"):  # a text condition shares its graft's entries
            figures.append(f"leakage: {dirty['n']} of {dirty['n'] + clean.get('n', 0)} {SHORT.get(cond, cond)} queries "
                           f"have their answer or text in the grafted entry; right there {kn(dirty)}, "
                           f"on clean ones {kn(clean) if clean.get('n') else 'none to count'}")
    return Face(verdict, figures)


def _controls(data: dict[str, Any]) -> Face:
    controls = [c for c in data.get("controls", []) if isinstance(c, dict)]
    shows = sum(1 for c in controls if c.get("shows"))
    verdict = f"{shows}/{len(controls)} controls show what they expect (an effect where one is planted, none where not)"
    figures = []
    nulls = []
    for c in controls:
        graft = "b" if c.get("condition") == "own" else "c"
        det = c.get("detectable") or {}
        power = f" ({detectable(det)})" if det else ""
        if det and not c.get("significant", True):
            nulls.append(det)
        figures.append(f"{c['name']}: {graft} {kn(c['graft'])} vs a {kn(c['baseline'])}, p = {num(c['mcnemar']['p_exact'])}: "
                       f"{'shows it' if c.get('shows') else 'does NOT show it'}{power}")
    if nulls:
        figures.append(null_meaning(nulls))
    return Face(verdict, figures)


def _claims(data: dict[str, Any]) -> Face:
    counts = ", ".join(f"{n} {k}" for k, n in (data.get("counts") or {}).items() if n)
    claims = [c for c in data.get("claims", []) if isinstance(c, dict)]
    bad = [c for c in claims if c.get("verdict") in ("contradicted", "inconsistent")]
    verdict = f"{len(claims)} claims: {counts or 'none'}" + ("" if bad else "; none contradicted or inconsistent")
    return Face(verdict, [f"reading: {r['summary']}" for r in data.get("readings", []) if r.get("figures")])


FACES: dict[str, Callable[[dict[str, Any]], Face]] = {
    "verify": _verify, "recompute": _recompute, "determinism": _determinism,
    "generalization": _generalization, "controls": _controls, "claims": _claims,
}


def face(check: dict[str, Any]) -> Face:
    """The face of one check of a report; a skipped check says why, an unknown kind shows its summary."""
    if check["status"] == "skipped":
        return Face(f"skipped: {check.get('reason') or check['summary']}")
    fn = FACES.get(check["kind"])
    if fn is None or not check.get("data"):
        return Face(check["summary"])
    try:
        return fn(check["data"])
    except (KeyError, TypeError, ValueError, AttributeError):
        # A report from another version may lack a member a face reads: its summary still says what it found.
        return Face(check["summary"])


def audited(report: dict[str, Any]) -> list[tuple[str, str]]:
    """What the report is about, as (label, value): names and full digests."""
    model = report.get("model") or {}
    items = [("plan", str(report["plan"]["name"])), ("plan sha256", str(report["plan"].get("sha256", "-"))),
             ("model", str(model.get("spec", "none")))]
    if isinstance(model.get("identity"), dict) and model["identity"].get("sha256"):
        items.append(("model identity", str(model["identity"]["sha256"])))
    items += [("release root", str(report["release_root_digest"])),
              ("attestation", str(report["binding"]["release_attestation_digest"] or "none (unsigned release)"))]
    env = report.get("environment") or {}
    where = ", ".join(str(env[k]) for k in ("device", "device_name", "dtype", "attn_implementation") if env.get(k))
    if where:
        items.append(("environment", where + (f", torch {env['torch']}" if env.get("torch") else "")))
    items.append(("created", f"{report['created']} by kvgraft {report['kvgraft_version']}"))
    return items


def claim_rows(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(id, verdict, what was claimed, plus why when the verdict goes against the claim)."""
    rows = []
    for c in report.get("claims", []):
        why = f" — {c['reason']}" if c["verdict"] in ("contradicted", "inconsistent", "unsupported") else ""
        rows.append((str(c["id"]), str(c["verdict"]), str(c.get("claimed", "")) + why))
    return rows


def _claim_lines(report: dict[str, Any], width: int, indent: int) -> list[RenderableType]:
    rows = claim_rows(report)
    if not rows:
        return []
    id_width = max(len(r[0]) for r in rows)
    verdict_width = max(len(r[1]) for r in rows)
    return [styled(hanging(f"{cid.ljust(id_width)}  {verdict.ljust(verdict_width)}", claimed, width, indent=indent), WORDS)
            for cid, verdict, claimed in rows]


def claims_outside_checks(report: dict[str, Any]) -> bool:
    return bool(report.get("claims")) and not any(c["kind"] == "claims" for c in report["checks"])


def detail_names(report: dict[str, Any]) -> list[str]:
    """What --detail accepts: each check's name, the claims when no check holds them, the ledger, all."""
    return ([c["name"] for c in report["checks"]] + (["claims"] if claims_outside_checks(report) else [])
            + (["ledger"] if report.get("ledger") else []) + ["all"])


def details_hint(report: dict[str, Any], path: str) -> str:
    names = detail_names(report)
    return (f"details: kvgraft report show {path} --detail NAME ({', '.join(names)}); "
            "everything on one page: --html FILE")





def renderables(report: dict[str, Any], width: int, path: str = "REPORT") -> list[RenderableType]:
    """The face for a terminal `width` columns wide: nothing is cut, long values wrap."""
    v = report["verdict"]
    model = (report.get("model") or {}).get("spec", "no model")
    style = STATUS_STYLE.get(v["status"], "bold")
    out: list[RenderableType] = [Text(f"kvgraft audit · {report['plan']['name']} · {model}", style="bold")]
    checks = v["checks"]
    incomplete = f", {checks['incomplete']} incomplete" if checks.get("incomplete") else ""
    claims = ", ".join(f"{n} {k}" for k, n in v["claims"].items() if n) or "none"
    headline = styled(hanging(v["status"].upper() + ":", v["headline"], width, indent=0), WORDS)
    headline.stylize(style, 0, len(v["status"]))
    out.append(headline)
    out.append(styled(hanging("", f"checks: {checks['passed']} passed, {checks['failed']} failed{incomplete}, "
                               f"{checks['skipped']} skipped; claims: {claims}", width, indent=0)))
    if report.get("note"):
        out.append(Text("\n".join(hanging("note:", report["note"], width, indent=0)), style="italic"))
    out.append(Text("\nwhat was audited", style="bold"))
    items = audited(report)
    label_width = max(len(label) for label, _ in items)
    for label, value in items:
        out.append(Text("\n".join(hanging(label, value, width, label_width=label_width))))
    out.append(Text("\nchecks", style="bold"))
    for c in report["checks"]:
        f = face(c)
        head = Text(f"{STATUS_MARK.get(c['status'], '·')} {c['name']} ", style="bold")
        head.append(c["status"], style=STATUS_STYLE.get(c["status"], ""))
        if c["kind"] != c["name"]:
            head.append(f" ({c['kind']})", style="dim")
        out.append(head)
        out.append(styled(hanging("", f.verdict, width, indent=4), WORDS))
        for fig in f.figures:
            out.append(styled(hanging("·", fig, width, indent=4), WORDS, style="dim"))
        if c["kind"] == "claims":
            out += _claim_lines(report, width, indent=4)
    if claims_outside_checks(report):
        out += [Text("\nclaims", style="bold"), *_claim_lines(report, width, indent=2)]
    out.append(Text("\n" + "\n".join(hanging("", details_hint(report, path), width, indent=0)), style="dim"))
    return out
