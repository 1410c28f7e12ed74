"""`kvgraft audit run PLAN`: every check a plan names, one report, signed and bound to the release.

The checks are the registry's kinds (kvgraft.audit.checks, with the plugins'), run in its order, each through
`run_check` as the single-check commands run theirs: the kind's run, its result sealed once; a check reads the
earlier ones' results (`ctx.results`), and returns what it adds to the report (its entry, ledger lines, claims).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from kvgraft.audit.checks import kinds, make_check, run_check, status
from kvgraft.audit.context import Context, Progress
from kvgraft.audit.plan import Plan, check_paths
from kvgraft.errors import InputError
from kvgraft.execution.executor import Executor, ModelSpec
from kvgraft.inference import models
from kvgraft.release.hashing import hash_file
from kvgraft.results.base import JsonObject
from kvgraft.results.report import Check, Claim, Model, Report

if TYPE_CHECKING:
    from kvgraft.signing.policy import VerifyPolicy
    from kvgraft.signing.verify import VerifiedRelease


@dataclass
class Outcome:
    report: Report
    report_path: Path
    bundle_path: Path | None
    public_key: Path | None
    release: Path
    html: Path


@dataclass(frozen=True)
class Origin:
    """Where the audited release comes from: the plan's existing one, or one this run wrote from records or
    built as a solution library (then `library` is the ledger's line of what building it cost)."""

    kind: Literal["existing", "records", "library"]
    library: str | None = None


@dataclass(frozen=True)
class Existing:
    """A plan's existing release, verified under the plan's trust options."""

    release: VerifiedRelease
    origin: Origin = Origin("existing")


def _existing(plan: Plan) -> Existing | None:
    """A plan's existing release, verified under `[release]`'s trust options before anything loads or runs (a
    wrong signer, a missing or stale signature: verify's error and exit code); None for a release the run writes."""
    from kvgraft.remote import is_remote
    from kvgraft.signing.verify import verified

    spec = plan.doc["release"]
    if "path" not in spec:
        return None
    remote = is_remote(spec["path"])  # a location the release is published at (docs/remote.md)
    policy = plan.release_policy()
    if remote and plan.doc.get("signing", {}).get("key") and not policy.checks_signature:
        raise InputError(f"{plan.path}: a plan that signs its release needs a local folder, not {spec['path']}")
    path = spec["path"] if remote else plan.resolve(spec["path"])
    # The plan's pin, before anything is signed or run, as `kvgraft verify` with the same options checks it.
    rel = verified(path, policy)
    if spec.get("root_digest") and rel.manifest["root_digest"] != spec["root_digest"]:
        rel.close()
        raise InputError(f"{path}: root digest {rel.manifest['root_digest']} is not the plan's {spec['root_digest']}")
    return Existing(rel)


def _release(plan: Plan, lm: models.LoadedModel, out: Path, say: Progress) -> tuple[Path, Origin]:
    """A release the run writes: captured from records, or built as a solution library."""
    from kvgraft.inference.capture import capture, read_records
    from kvgraft.inference.runtime import Schedule

    spec = plan.doc["release"]
    target = out / "release"
    schedule = Schedule(chunk_tokens=spec.get("chunk"))
    if "records" in spec:
        from kvgraft.recompute.determinism import EXAMPLE

        src = EXAMPLE if spec["records"] == "example" else plan.resolve(spec["records"])
        say(f"capturing {src.name}")
        capture(lm, read_records(src), target, schedule=schedule, probe_tokens=spec.get("probe_tokens", 8), overwrite=True,
                sliding=spec.get("sliding_layers", "window"))
        return target, Origin("records")
    from kvgraft.generalization import library

    lib = spec["library"]
    say(f"building a solution library from {lib['source']}")
    problems, source = library.load_problems(lib["source"], lib.get("limit"))
    built = library.build(lm, problems, target, library_fraction=lib.get("library_fraction", 0.5),
                          salt=lib.get("salt", "kvgraft"), source=source, schedule=schedule,
                          settings=library.BuildSettings(attempts=lib.get("attempts", 0), generate=lib.get("attempts", 0) > 0),
                          probe_tokens=spec.get("probe_tokens", 8), overwrite=True)
    c, t = built["counts"], built["totals"]
    return target, Origin("library", f"{c['reference'] + c['model']} solved entries, {t['entry_tokens']:,} tokens "
                                     f"({c['reference']} reference traces, {c['model']} model-generated, "
                                     f"{c['unsolved']} unsolved); upstream cost {t['upstream_tokens']:,} tokens")


def _policy(plan: Plan, origin: Origin, public_key: Path | None) -> VerifyPolicy:
    """The policy the run reads its release under: the ephemeral key it signed with; else, for a release this
    run wrote (captured or built), its own output (digests only); else, a plan's existing release, what its
    `[release]` trust options ask for (none: what `kvgraft verify` checks without a key)."""
    from kvgraft.signing.policy import OwnOutput, SignedWithKeys

    if public_key is not None:
        return SignedWithKeys((public_key,))
    if origin.kind != "existing":
        return OwnOutput(f"kvgraft audit run ({origin.kind})")
    return plan.release_policy()


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
        say: Progress = lambda _m: None, executor: dict[str, str | int | bool | None] | None = None) -> Outcome:
    """Run every enabled check of `plan`; write, sign and render the report under the output folder.

    Recompute and generalization run on the executor of the plan's `[executor]` table (kind local|ray,
    address, workers, ship, threads, max_retries), with `executor` (CLI options) overriding it.
    """
    check_kinds(plan)
    check_paths(plan, plan.out_dir(out_dir))
    signing = plan.doc.get("signing", {}).get("key")
    if signing and signing != "ephemeral":
        from kvgraft.signing import keys

        keys.load_private_key(plan.resolve(signing))  # a bounded regular file, a key: before any model loads
    for stale in ("report.json", "report.sigstore.json", "report.html"):
        # A failed run (a release refused below included) must not leave an older report looking current.
        (plan.out_dir(out_dir) / stale).unlink(missing_ok=True)
    existing = _existing(plan)  # before any model loads, here or on an executor's workers
    with contextlib.ExitStack() as held:
        if existing is not None:
            held.enter_context(existing.release)  # closed when the run ends (a remote release: its folder removed)
        return _run_on(plan, existing, held, out_dir=out_dir, device=device, say=say, executor=executor)


def _run_on(plan: Plan, existing: Existing | None, held: contextlib.ExitStack, *, out_dir: Path | None,
            device: str | None, say: Progress, executor: dict[str, str | int | bool | None] | None) -> Outcome:
    from kvgraft.execution.executor import from_options, plan_options
    from kvgraft.inference.reapply import Conditions

    o = plan_options(plan.doc.get("executor"), executor)
    spec = ModelSpec(plan.doc["model"]["spec"], Conditions.from_plan(plan.doc["model"], o, device))
    with from_options(o["kind"], spec, address=o.get("address"), workers=o.get("workers"), ship=o.get("ship", False),
                      max_retries=o.get("max_retries", 2)) as ex:
        return _run(plan, existing, held, out_dir=out_dir, spec=spec, say=say, ex=ex)


def check_kinds(plan: Plan) -> None:
    """Refuse a plan naming a check kind this installation has not registered, before anything loads."""
    from kvgraft.audit.checks import ENTRY_POINTS

    known = kinds()
    unknown = [name for name in plan.doc["checks"] if name not in known]
    if unknown:
        raise InputError(f"{plan.path}: no check kind {', '.join(map(repr, unknown))} is registered (registered: "
                         f"{', '.join(known)}; a third-party kind registers through the entry-point group "
                         f"{ENTRY_POINTS})")


def _run(plan: Plan, existing: Existing | None, held: contextlib.ExitStack, *, out_dir: Path | None,
         spec: ModelSpec, say: Progress, ex: Executor) -> Outcome:
    from kvgraft.audit.render_html import to_html
    from kvgraft.inference.environment import record as environment
    from kvgraft.report.document import new_report, typed, write_report
    from kvgraft.signing import attest, sign

    started = time.perf_counter()
    out = plan.out_dir(out_dir)
    say(f"loading {spec.spec}")
    device, dtype, attn = spec.conditions.load_options({})  # the plan's, every one set
    lm = models.load(spec.spec, device=device, dtype=dtype, attn=attn)
    out.mkdir(parents=True, exist_ok=True)  # once the model loaded: a plan refused before leaves no folder
    release, origin = (existing.release.root, existing.origin) if existing else _release(plan, lm, out, say)
    key, pub = _signing_key(plan, out)
    # A release whose signer the plan names is the author's: [signing] signs the report, never the release again.
    resign = key is not None and not (existing and existing.release.policy.checks_signature)
    attestation_digest = None
    if resign:
        say("signing the release")
        sign.sign_release(release, key)
    if (release / attest.BUNDLE_NAME).is_file():
        attestation_digest, _ = hash_file(release / attest.BUNDLE_NAME)
    # Opened once under the run's policy (with the key it signed with, when ephemeral): every check below reads
    # the release through it, and each entry's bytes are checked when read; the verify check hashes all.
    from kvgraft.signing.verify import signature_statement, verified

    checked = (existing.release if existing and not resign
               else held.enter_context(verified(release, _policy(plan, origin, pub))))
    ctx = Context(plan, lm, out, say, ex, checked)
    ledger: JsonObject = {"library": origin.library} if origin.library else {}
    checks: list[Check] = []
    claims: list[Claim] = []
    for name in list(kinds()):  # in the registry's order: claims read what recompute measured
        settings = plan.check(name)
        if settings is not None:
            ran = run_check(ctx, name, settings)
            checks.append(typed(Check, make_check(name, name, status(name, ran.result), ran.summary,
                                                  ran.data if ran.data is not None else ran.result), f"check {name!r}"))
            ledger.update(ran.ledger)
            claims += [typed(Claim, c, f"check {name!r}: a claim") for c in ran.claims]
    wall = time.perf_counter() - started
    limit = plan.doc.get("limits", {}).get("max_minutes")
    ledger["wall time"] = f"{wall / 60:.1f} min" + (f" (plan limit {limit} min)" if limit is not None else "")
    report = new_report(
        plan_name=plan.name, plan_content=plan.doc, environment=environment(lm.device, lm.dtype, lm.attn),
        model=typed(Model, {"spec": lm.spec, "architecture": (lm.model.config.architectures or ["?"])[0],
                            "model_type": lm.model.config.model_type, "identity": lm.identity.as_dict()}, "model"),
        release_root_digest=str(ctx.release.manifest["root_digest"]),
        release_signature=signature_statement(ctx.release.checked), checks=checks, ledger=ledger,
        claims=claims,
        release_attestation_digest=attestation_digest)
    report_path = out / "report.json"
    bundle = None
    if key is None:
        write_report(report_path, report)
    else:
        from kvgraft.report.signing import write_signed_report

        say("signing the report")
        bundle = write_signed_report(report_path, report, key)
    html = out / "report.html"
    from kvgraft._internal.jsonio import write_atomic

    write_atomic(html, to_html(report).encode())
    return Outcome(report, report_path, bundle, pub, release, html)

