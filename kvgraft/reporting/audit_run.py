"""`kvgraft audit run PLAN`: every check a plan names, one report, signed and bound to the release."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvgraft import models
from kvgraft.errors import InputError
from kvgraft.executor import Executor
from kvgraft.release.hashing import hash_file
from kvgraft.reporting.plan import Plan
from kvgraft.reporting.report import make_check
from kvgraft.verdict import seal

if TYPE_CHECKING:
    from kvgraft.release.format import Release

Progress = Callable[[str], None]


@dataclass
class Outcome:
    report: dict[str, Any]
    report_path: Path
    bundle_path: Path | None
    public_key: Path | None
    release: Path
    html: Path


def _release(plan: Plan, lm: models.LoadedModel, out: Path, say: Progress) -> tuple[Path, dict[str, Any]]:
    from kvgraft.capture import capture, read_records
    from kvgraft.runtime import Schedule

    spec = plan.doc["release"]
    if "path" in spec:
        path = plan.resolve(spec["path"])
        from kvgraft.release.format import Release

        rel = Release.open(path)
        if spec.get("root_digest") and rel.manifest["root_digest"] != spec["root_digest"]:
            raise InputError(f"{path}: root digest {rel.manifest['root_digest']} is not the plan's {spec['root_digest']}")
        return path, {"kind": "existing", "path": str(path)}
    target = out / "release"
    schedule = Schedule(chunk_tokens=spec.get("chunk"))
    if "records" in spec:
        from kvgraft.determinism import EXAMPLE

        src = EXAMPLE if spec["records"] == "example" else plan.resolve(spec["records"])
        say(f"capturing {src.name}")
        capture(lm, read_records(src), target, schedule=schedule, probe_tokens=spec.get("probe_tokens", 8), overwrite=True)
        return target, {"kind": "records", "records": str(src)}
    from kvgraft.generalization import library

    lib = spec["library"]
    say(f"building a verified-solution library from {lib['source']}")
    problems, source = library.load_problems(lib["source"], lib.get("limit"))
    built = library.build(lm, problems, target, library_fraction=lib.get("library_fraction", 0.5),
                          salt=lib.get("salt", "kvgraft"), source=source, schedule=schedule,
                          settings=library.BuildSettings(attempts=lib.get("attempts", 0), generate=lib.get("attempts", 0) > 0),
                          probe_tokens=spec.get("probe_tokens", 8), overwrite=True)
    return target, {"kind": "library", "build": {k: built[k] for k in ("source", "split", "counts", "totals", "unverified")}}


def _signing_key(plan: Plan, out: Path) -> tuple[Any, Path | None]:
    from kvgraft.signing import keys

    signing = plan.doc.get("signing", {})
    name = signing.get("key")
    if not name:
        return None, None
    if name == "ephemeral":
        private, public = keys.write_keypair(out / "keys" / "ephemeral", overwrite=True)
        return keys.load_private_key(private), public
    path = plan.resolve(name)
    return keys.load_private_key(path), None


def run(plan: Plan, *, out_dir: Path | None = None, device: str | None = None,
        say: Progress = lambda _m: None, executor: dict[str, Any] | None = None) -> Outcome:
    """Run every enabled check of `plan`; write, sign and render the report under the output folder.

    Recompute and generalization run on the executor of the plan's `[executor]` table (kind local|ray,
    address, workers, ship, threads, max_retries), with `executor` (CLI options) overriding it.
    """
    from kvgraft.executor import ModelSpec, from_options, plan_options

    o = plan_options(plan.doc.get("executor"), executor)
    m = plan.doc["model"]
    spec = ModelSpec(m["spec"], device or m.get("device", "auto"), m.get("dtype", "float32"), m.get("attn", "sdpa"),
                     o.get("threads"))
    with from_options(o["kind"], spec, address=o.get("address"), workers=o.get("workers"), ship=o.get("ship", False),
                      max_retries=o.get("max_retries", 2)) as ex:
        return _run(plan, out_dir=out_dir, device=device, say=say, ex=ex)


def _run(plan: Plan, *, out_dir: Path | None, device: str | None, say: Progress, ex: Executor) -> Outcome:
    from kvgraft import signer
    from kvgraft.environment import record as environment
    from kvgraft.reporting.render_html import to_html
    from kvgraft.reporting.report import new_report, write_report
    from kvgraft.signing import attest

    started = time.perf_counter()
    out = plan.out_dir(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("report.json", "report.sigstore.json", "report.html"):
        (out / stale).unlink(missing_ok=True)  # a failed run must not leave an older report looking current
    m = plan.doc["model"]
    say(f"loading {m['spec']}")
    lm = models.load(m["spec"], device=device or m.get("device", "auto"), dtype=m.get("dtype", "float32"),
                     attn=m.get("attn", "sdpa"))
    release, release_info = _release(plan, lm, out, say)
    key, pub = _signing_key(plan, out)
    attestation_digest = None
    if key is not None:
        say("signing the release")
        signer.sign_release(release, key)
    if (release / attest.BUNDLE_NAME).is_file():
        attestation_digest, _ = hash_file(release / attest.BUNDLE_NAME)
    # Opened once under the plan's policy (with its key when it signs): every check below reads the
    # release through it, and each entry's bytes are checked when read; the verify check hashes all.
    from kvgraft.verify import VerifyPolicy, verified

    ctx = Context(plan, lm, out, say, ex, verified(release, VerifyPolicy(key=pub)))
    build = release_info.get("build")
    if build:
        c, t = build["counts"], build["totals"]
        ctx.ledger["library"] = (f"{c['reference'] + c['model']} verified entries, {t['entry_tokens']:,} tokens "
                                 f"({c['reference']} reference traces, {c['model']} model-generated, "
                                 f"{c['unverified']} unverified); upstream cost {t['upstream_tokens']:,} tokens")
    checks: list[dict[str, Any]] = []
    for kind, run_check in CHECKS.items():
        settings = plan.check(kind)
        if settings is not None:
            checks.append(run_check(ctx, settings))
    wall = time.perf_counter() - started
    limit = plan.doc.get("limits", {}).get("max_minutes")
    ctx.ledger["wall time"] = f"{wall / 60:.1f} min" + (f" (plan limit {limit} min)" if limit is not None else "")
    report = new_report(
        plan_name=plan.name, plan_content=plan.doc, environment=environment(lm.device, lm.dtype, lm.attn),
        model={"spec": lm.spec, "architecture": (lm.model.config.architectures or ["?"])[0],
               "model_type": lm.model.config.model_type, "identity": lm.identity.as_dict()},
        release_root_digest=_root(release), checks=checks, ledger=ctx.ledger, claims=ctx.claims,
        release_attestation_digest=attestation_digest)
    report_path = out / "report.json"
    write_report(report_path, report)
    bundle = None
    if key is not None:
        from kvgraft.reporting.signing import sign_report

        say("signing the report")
        bundle = sign_report(report_path, key)
    html = out / "report.html"
    from kvgraft._internal.jsonio import write_atomic

    write_atomic(html, to_html(report).encode())
    return Outcome(report, report_path, bundle, pub, release, html)


@dataclass
class Context:
    """What every check reads, and what checks leave for later ones and for the report."""

    plan: Plan
    lm: models.LoadedModel
    out: Path
    say: Progress
    ex: Executor
    release: Release  # verified once, before any check reads it
    ledger: dict[str, Any] = field(default_factory=dict)
    measured: dict[str, Any] = field(default_factory=dict)  # for the claims check: what recompute measured
    natural_kl: float | None = None  # recompute's largest KL against a one-shot prefill without a cache
    claims: list[dict[str, Any]] = field(default_factory=list)  # the report's claims, from the claims check


# A check reads its plan settings and the context, and returns its report entry (report.make_check).
Check = Callable[[Context, dict[str, Any]], dict[str, Any]]


def _verify(ctx: Context, _settings: dict[str, Any]) -> dict[str, Any]:
    from kvgraft.verify import verify_release

    ctx.say("verifying the release (hashes, statement, signature)")
    # Every byte, as `kvgraft verify` does: opening the release (verified(), above) read none of the
    # entries, and the other checks verify only the entries they read.
    v = verify_release(ctx.release.root, policy=ctx.release.verification.policy)
    return make_check("verify", "verify", "passed", f"{v.files} files, {v.bytes_hashed:,} bytes hashed; "
                      f"signature: {v.signature.describe()}", v.as_dict())


def _recompute(ctx: Context, rc: dict[str, Any]) -> dict[str, Any]:
    from kvgraft import recompute, sampling
    from kvgraft.reporting.claims import measured_from_recompute

    sample = rc.get("sample")
    if rc.get("target_fraction") is not None:
        if sample is not None:
            raise InputError("checks.recompute: sample and target_fraction exclude each other")
        sample = sampling.sample_size(float(rc["target_fraction"]), len(ctx.release.entries))
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
        result = seal("recompute", recompute.audit(ctx.release, ctx.lm, **options))
    else:  # the entries' prefix grafts too (checks.recompute.prefix)
        from kvgraft import prefix_audit

        result = seal("recompute", prefix_audit.audit(ctx.release, ctx.lm, prefix=int(rc["prefix"]), **options))
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
    return make_check("recompute", "recompute", result["status"], "\n".join(result["statements"]), result)


def _determinism(ctx: Context, dc: dict[str, Any]) -> dict[str, Any]:
    from kvgraft import determinism

    ctx.say("running the determinism matrix")
    d = seal("determinism", determinism.matrix(ctx.plan.doc["model"]["spec"], length=dc.get("length", 128),
                                               include_gpu=True))
    return make_check("determinism", "determinism", d["status"], "\n".join(d["notes"]), d)


def _generalization(ctx: Context, gc: dict[str, Any]) -> dict[str, Any]:
    from kvgraft.generalization import audit as gen

    ctx.say("generalization audit: conditions a-d on library, held-out and synthetic problems")
    queries, prepared = gen.prepare(ctx.release, synthetic_n=gc.get("synthetic", 0))
    settings = gen.Settings(max_new_tokens=gc.get("max_new_tokens", 64), policy=gc.get("policy", "nearest"),
                            samples=gc.get("samples", 1), temperature=gc.get("temperature", 0.0))
    g = seal("generalization", gen.audit(ctx.lm, ctx.release, queries, settings, prepared=prepared, executor=ctx.ex))
    ctx.ledger.update(_generalization_ledger(g))
    return make_check("generalization", "generalization", g["status"], "\n".join(g.get("statements", [])),
                      {**gen.report_check_data(g), "result": g})


def _controls(ctx: Context, kc: dict[str, Any]) -> dict[str, Any]:
    from kvgraft.generalization import controls
    from kvgraft.release.format import Release

    n, seed = kc.get("n", 20), kc.get("seed", 0)
    ctx.say(f"controls: a library of {n} generated facts; replay, related-entry and null controls")
    controls.build(ctx.lm, ctx.out / "controls-release", n=n, seed=seed, overwrite=True)
    k = seal("controls", controls.run(ctx.lm, Release.open(ctx.out / "controls-release"), n=n, seed=seed,
                                      max_new_tokens=kc.get("max_new_tokens", 32), executor=ctx.ex))
    shown = sum(c["shows"] for c in k["controls"])
    ctx.ledger["controls"] = (f"{n} generated facts, {k['decode_tokens']:,} decode tokens, {k['seconds']:.1f} s "
                              "(its own release, out/…/controls-release, not signed)")
    return make_check("controls", "controls", k["status"],
                      f"{shown}/{len(k['controls'])} controls show what they expect "
                      f"({', '.join(c['name'] for c in k['controls'] if c['shows']) or 'none'})", k)


def _claims(ctx: Context, cc: dict[str, Any]) -> dict[str, Any]:
    from kvgraft.reporting import claims
    from kvgraft.reporting.report import claim_verdicts

    ctx.say("checking the claims file")
    cf = claims.load(ctx.plan.resolve(cc["file"]))
    checked = seal("claims", claims.check(cf, ctx.measured or None, measured_where="this audit's recompute check"))
    ctx.claims = claim_verdicts(checked)
    if ctx.natural_kl is not None:
        # Say for which comparison exactness was measured, next to the verdict itself.
        for c in ctx.claims:
            if c.get("kind") == "exactness":
                contrast = "exactly 0" if ctx.natural_kl == 0.0 else f"{ctx.natural_kl:.3g}, not 0"
                c["reason"] += (" (under the release's recorded prefill schedule; against a one-shot prefill of "
                                f"prefix + probe without any cache, max KL = {contrast})")
    return make_check("claims", "claims", checked["status"],
                      f"{len(ctx.claims)} claims checked against internal consistency"
                      + (" and this audit's measurements" if ctx.measured else ""), checked)


# Every check a plan can name, in the order they run and appear in the report: claims come after the
# checks whose measurements they read.
CHECKS: dict[str, Check] = {
    "verify": _verify,
    "recompute": _recompute,
    "determinism": _determinism,
    "generalization": _generalization,
    "controls": _controls,
    "claims": _claims,
}


def _generalization_ledger(g: dict[str, Any]) -> dict[str, str]:
    """One readable line per condition; the full ledger stays in the generalization check's data."""
    from kvgraft.generalization.conditions import LABELS

    lines: dict[str, str] = {}
    for cond, v in g["ledger"]["per_condition"].items():
        line = (f"{v['decode_tokens']:,} decode, {v['prefill_tokens']:,} prefill, {v['restored_tokens']:,} restored tokens "
                f"over {v['queries']} queries")
        if v.get("decode_vs_budget") is not None:
            line += f"; decode/budget {v['decode_vs_budget']:.2f}"
        if v.get("with_upstream_amortized") is not None and v["restored_tokens"]:
            line += f", {v['with_upstream_amortized']:.2f} with the library's upstream cost amortized"
        lines[LABELS.get(cond, cond)] = line
    lib = g["ledger"]["library"]
    lines["library upstream"] = (f"{lib['upstream_tokens']:,} tokens, {lib['amortized_upstream_tokens_per_query']:.1f} per query "
                                 f"over {lib['queries_served']} queries")
    energy = g.get("energy") or {}
    if energy:
        kind = "ESTIMATE" if energy.get("method") == "estimate" else "measured"
        lines["energy"] = f"{energy.get('joules', 0):,.0f} J ({kind}, {energy.get('method')})"
    return lines


def _root(release: Path) -> str:
    from kvgraft.release.format import load_manifest

    return str(load_manifest(release)["root_digest"])
