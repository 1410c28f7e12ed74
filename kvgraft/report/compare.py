"""Replications read together (`kvgraft report compare`): each report verified, grouped by what it audited, its
verdicts lined up with the others', its disagreements located and labelled, and its sample joined to theirs.

Whom to trust is given (keys, or a Sigstore identity and issuer); a report signed by anyone else, unsigned, edited
after signing, or whose sample does not re-derive from its nonce and the release root is refused (VerificationError,
exit 1), or, with `allow_unverified`, listed as unverified and left out of everything else. Trusted reports are
grouped by (release root digest, model identity). Inside a group, an entry two replications both recomputed and
judged differently is a disagreement: *explained* when their recorded conditions (kvgraft.inference.environment's
SENSITIVE keys: CPU or GPU, kernel, dtype, threads, library versions) differ and neither judged it inconsistent
(byte-exact on one machine, inside the noise bound on another); *not explained* otherwise (the same conditions, or
outside the noise bound). The combined bound is kvgraft.sampling's, over the union of distinct entries the group's
replications recomputed, each sample re-derived here (docs/replications.md).
"""

from __future__ import annotations

import itertools
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import JsonValue

from kvgraft import __version__, errors, sampling
from kvgraft._internal import jsonio
from kvgraft.errors import Error, InputError, VerificationError
from kvgraft.inference.environment import SENSITIVE
from kvgraft.report.signing import bundle_path, verify_report
from kvgraft.results import compare as results
from kvgraft.results.base import JsonObject
from kvgraft.results.recompute import RecomputeData
from kvgraft.results.report import Check, Report
from kvgraft.signing.sigstore import SigstoreTrust

SCHEMA = results.FILE
REPORT_NAME = "report.json"
MAX_REPORTS = 256
FAIL_MEANS = "inconsistent (outside the noise bound) in a trusted replication"
POOLING = ("no pooled estimate: replications' generalization runs draw their own problems and settings, and no "
           "stated method pools them")


@dataclass(frozen=True)
class Trust:
    """Whom a report may be signed by: these public keys, or this Sigstore identity and issuer."""

    keys: tuple[Path, ...] = ()
    identity: str | None = None
    issuer: str | None = None
    sigstore: SigstoreTrust | None = None

    def __post_init__(self) -> None:
        if (self.identity is None) != (self.issuer is None):
            raise InputError("--certificate-identity and --certificate-oidc-issuer must be given together")
        if self.keys and self.identity is not None:
            raise InputError("give --key or --certificate-identity/--certificate-oidc-issuer, not both")

    @property
    def given(self) -> bool:
        return bool(self.keys) or self.identity is not None


# ------------------------------------------------------------------------------------------------ reading


def _local(source: str) -> list[tuple[str, Path]]:
    path = Path(source)
    if jsonio.stat_or_none(path, follow=True) is None:
        raise InputError(f"{source}: no such report or folder")
    if not path.is_dir():
        return [(source, path)]
    if (path / REPORT_NAME).is_file():
        return [(str(path / REPORT_NAME), path / REPORT_NAME)]
    found = sorted(p for p in path.glob(f"*/{REPORT_NAME}") if p.is_file())
    if not found:
        raise InputError(f"{source}: holds no {REPORT_NAME}, nor any in a folder inside it (docs/replications.md)")
    return [(str(p), p) for p in found]


def _remote(source: str, into: Path, shown_as: dict[str, str]) -> list[tuple[str, Path]]:
    """Each report at a remote location, with its signature, read (bounded) into a folder of its own under `into`;
    `shown_as` gains each copy's path and the URL a message names it by."""
    from kvgraft.remote.location import parse
    from kvgraft.remote.mirror import open_store
    from kvgraft.remote.transfer import read_small
    from kvgraft.signing.attest import MAX_BUNDLE_BYTES

    url = source.rstrip("/")
    one = url.endswith(".json")
    folder, name = url.rsplit("/", 1) if one else (url, "")
    loc = parse(folder)
    assert loc is not None
    store, _ = open_store(loc)
    if one:
        names = [name]
    else:
        listed = store.list()
        if listed is None:
            raise InputError(f"{source}: a folder served over HTTP cannot be listed: name each report "
                             f"(…/{REPORT_NAME}) (docs/replications.md)")
        names = sorted(n for n in listed if n == REPORT_NAME or n.endswith(f"/{REPORT_NAME}"))
        if not names:
            raise InputError(f"{source}: holds no {REPORT_NAME} (docs/replications.md)")
    got = []
    for n in names:
        local = into / str(len(list(into.iterdir()))) / Path(n).name
        local.parent.mkdir()
        data = read_small(store, n, jsonio.MAX_JSON_BYTES, "a report")
        if data is None:
            raise InputError(f"{store.shown(n)}: not found")
        local.write_bytes(data)
        signature = bundle_path(Path(n)).as_posix()
        sig = read_small(store, signature, MAX_BUNDLE_BYTES, "a report signature")
        if sig is not None:
            bundle_path(local).write_bytes(sig)
        shown_as[str(local)] = store.shown(n)  # messages name the URL, not the copy
        shown_as[str(bundle_path(local))] = store.shown(signature)
        got.append((store.shown(n), local))
    return got


def _signer(path: Path, shown: str, trust: Trust) -> results.Signer:
    """Verify one report (signature, signed digest, binding) under `trust`; who signed it."""
    from kvgraft.signing import attest, keys

    if not trust.keys:
        verify_report(path, identity=trust.identity, issuer=trust.issuer, trust=trust.sigstore)
        return results.Signer(method="sigstore", key_id=None, identity=trust.identity, issuer=trust.issuer)
    bpath = bundle_path(path)
    if jsonio.stat_or_none(bpath) is None:
        raise VerificationError(f"{shown}: report is unsigned (no {bpath.name})")
    hint = attest.read_bundle(bpath).key_hint
    trusted = {keys.key_id(keys.load_public_key(k)): k for k in trust.keys}
    if hint not in trusted:
        raise VerificationError(f"{shown}: signed by key {hint}, none of the trusted keys ({', '.join(sorted(trusted))})")
    v = verify_report(path, key=trusted[hint])
    return results.Signer(method="key", key_id=v.signer, identity=None, issuer=None)


# ------------------------------------------------------------------------------------------------ one replication


def _recompute(report: Report) -> Check | None:
    """The report's recompute check that ran and judged entries."""
    for c in report.checks:
        if c.kind == "recompute" and c.status != "skipped" and isinstance(c.data.get("entries"), list):
            return c
    return None


def _object(value: JsonValue) -> JsonObject:
    """A member of a check's data read as an object: one that is absent or null reads as empty."""
    return value if isinstance(value, dict) else {}


def _rederived(data: RecomputeData, written: JsonObject, root: str, shown: str) -> int:
    """The population the recompute result judged entries of, its sample re-derived from its nonce and the root
    (not taken from the report); VerificationError naming what differs. `written`: the data as the report holds
    it, whose counts must be integers as written (the model would read 3.0 as 3)."""
    drawn = data.sample
    ids = [e.id for e in data.entries]
    if drawn is None:
        bound = data.bound
        if bound is None or type(_object(written.get("bound")).get("population")) is not int \
                or bound.population != len(ids):
            raise VerificationError(f"{shown}: its recompute judged {len(ids)} entries but records no sample: a chosen "
                                    "subset bounds nothing")
        return bound.population
    size, population = drawn.size, drawn.population
    if drawn.method != sampling.METHOD or drawn.root_digest != root:
        raise VerificationError(f"{shown}: sample method {errors.short_repr(drawn.method)} or root "
                                f"{errors.short_repr(drawn.root_digest)} is not {sampling.METHOD} of {root}")
    sample = _object(written.get("sample"))
    if type(sample.get("size")) is not int or type(sample.get("population")) is not int or not 1 <= size <= population:
        raise VerificationError(f"{shown}: sample size {errors.short_repr(sample.get('size'))} of "
                                f"{errors.short_repr(sample.get('population'))}")
    positions = sampling.draw(root, sampling.check_nonce(drawn.nonce, f"{shown}: the sample's nonce"),
                              population, size)
    if drawn.positions != positions:
        raise VerificationError(f"{shown}: sample not re-derived: recorded positions differ from those the nonce "
                                f"{drawn.nonce!r} and root {root} draw (first: {positions[:5]})")
    if drawn.entries != ids or len(set(ids)) != len(ids):
        raise VerificationError(f"{shown}: the entries recomputed are not the sample's, in its order")
    return population


def _conditions(data: JsonObject, entry: JsonObject, report: Report) -> JsonObject:
    """The conditions an entry was recomputed under, as recorded: where it was placed, else the run's, else the
    report's environment."""
    env = _object(_object(entry.get("placement")).get("environment")) \
        or _object(_object(data.get("environment")).get("current")) or report.environment
    return {k: env.get(k) for k in SENSITIVE if k in env}


@dataclass(frozen=True)
class _Replicated:
    """One trusted replication: what the result shows of it, what it audited (release root digest and model
    identity: its group), and its recompute entries (as the check's data holds them) and their recorded conditions
    by entry id, which the group's comparison reads."""

    shown: results.Replication
    audited: tuple[str, str]
    model: str | None
    entries: dict[str, JsonObject] = field(default_factory=dict)
    conditions: dict[str, JsonObject] = field(default_factory=dict)

    @property
    def index(self) -> int:
        return self.shown.index


def _condition(a: JsonValue) -> results.Condition:
    return results.Condition.model_validate({k: v for k, v in _object(a).items() if k in ("name", "k", "n", "interval")})


def _replication(index: int, source: str, signer: results.Signer, report: Report) -> _Replicated:
    env = report.environment
    check = _recompute(report)
    data = check.data if check is not None else None
    model = report.model
    identity = model.identity.sha256 if model is not None and model.identity is not None else None
    audited = (str(report.release_root_digest), identity or "unknown")
    spec = model.spec if model is not None else None
    signature = report.release_signature
    shown = {
        "index": index, "source": source, "signer": signer, "created": report.created,
        "plan": report.plan.name, "verdict": report.verdict.status,
        "release_signature": signature.model_dump(mode="json") if signature is not None else None,
        "environment": {k: env.get(k) for k in ("device", "device_name", "cpu_isa", "dtype", "attn_implementation",
                                                "threads", "torch", "transformers", "platform") if k in env},
        "executor": (data or {}).get("executor"),
        "checks": [results.ShownCheck(name=c.name, kind=c.kind, status=c.status, summary=c.summary.splitlines())
                   for c in report.checks],
        "claims": {c.id: c.verdict for c in report.claims},
        "generalization": [_condition(a) for c in report.checks if c.kind == "generalization" and c.status != "skipped"
                           for a in _list(c.data.get("conditions"))],
        "recompute": None,
    }
    if data is None:
        return _Replicated(results.Replication.model_validate(shown), audited, spec)
    typed = RecomputeData.model_validate(data)  # the report passed its schema: the kind's data model builds
    population = _rederived(typed, data, str(report.release_root_digest), source)
    entries = {str(e["id"]): e for e in map(_object, _list(data.get("entries")))}
    failing = sum(1 for e in entries.values() if _verdict(e) == "inconsistent")
    own = typed.bound.max_failing_entries if typed.bound is not None else None
    shown["recompute"] = results.Recomputed(
        require=typed.require, verdict=typed.verdict, population=population, sampled=len(entries),
        nonce=typed.sample.nonce if typed.sample is not None else None,
        byte_exact=sum(1 for e in entries.values() if e["byte_exact"]),
        inconsistent=failing, stated_bound=own, bound=sampling.upper_bound(failing, len(entries), population))
    return _Replicated(results.Replication.model_validate(shown), audited, spec, entries,
                       {i: _conditions(data, e, report) for i, e in entries.items()})


def _list(value: JsonValue) -> list[JsonValue]:
    return value if isinstance(value, list) else []


def _verdict(entry: JsonObject) -> str:
    return str(entry.get("verdict") or ("byte-exact" if entry["byte_exact"] else "differs"))


# ------------------------------------------------------------------------------------------------ a group


def _location(replication: int, entry: JsonObject) -> results.Location:
    """Where a replication found the entry's fresh bytes differ from the stored ones: layers, first tensor, element."""
    rows = [_object(row) for row in _list(entry.get("layers"))]
    layers = [row["index"] for row in rows
              if any(not (_object(row.get(p)) or {"equal": True})["equal"] for p in ("keys", "values"))
              or "layout_mismatch" in row]
    first = _object(entry.get("first_difference"))
    out: JsonObject = {"replication": replication, "layers": layers, "layer": first.get("layer"),
                       "tensor": first.get("tensor"), "element": first.get("named") or first.get("location")}
    tensor = next((row.get(str(first.get("tensor") or "")) for row in rows if row["index"] == first.get("layer")),
                  None)
    if isinstance(tensor, dict) and isinstance(tensor.get("differing"), int):
        out["differing_elements"] = tensor["differing"]
        out["elements"] = tensor.get("elements")
    return results.Location.model_validate(out)


def _entries(reps: list[_Replicated]) -> list[results.Entry]:
    """Each entry two or more replications recomputed: their verdicts, and a disagreement located and labelled."""
    from kvgraft.inference.environment import differences

    ids = sorted({i for r in reps for i in r.entries})
    rows = []
    for eid in ids:
        had = [r for r in reps if eid in r.entries]
        if len(had) < 2:
            continue
        verdicts = {str(r.index): _verdict(r.entries[eid]) for r in had}
        status, why, location = "agree", None, None
        for a, b in itertools.combinations(had, 2):
            va, vb = _verdict(a.entries[eid]), _verdict(b.entries[eid])
            if va == vb:
                continue
            diff = differences(a.conditions[eid], b.conditions[eid])
            odd = b if vb != "byte-exact" else a
            pair = f"replication {a.index} {va}, replication {b.index} {vb}"
            if diff and "inconsistent" not in (va, vb):
                found, said = "explained", f"{pair}: recorded conditions differ (" + "; ".join(
                    f"{k}: {x} vs {y}" for k, (x, y) in diff.items()) + ")"
            else:
                found = "unexplained"
                said = f"{pair}: " + ("under the same recorded conditions" if not diff else
                                      "outside the noise bound, which no recorded condition explains")
            if status != "unexplained":
                status, why, location = found, said, _location(odd.index, odd.entries[eid])
        rows.append(results.Entry.model_validate({"id": eid, "verdicts": verdicts, "status": status, "why": why,
                                                  "location": location}))
    return rows


def _combined(reps: list[_Replicated], confidence: float) -> results.Bound | None:
    """The bound from the union of distinct entries the group's replications recomputed (each sample re-derived)."""
    with_rc = [(r, r.shown.recompute) for r in reps if r.shown.recompute is not None]
    if not with_rc:
        return None
    populations = {rc.population for _, rc in with_rc}
    if len(populations) != 1:
        raise VerificationError(f"replications of one release state different entry counts: {sorted(populations)}")
    population = populations.pop()
    union = {i for r, _ in with_rc for i in r.entries}
    failing = {i for r, _ in with_rc for i, e in r.entries.items() if _verdict(e) == "inconsistent"}
    d = sampling.upper_bound(len(failing), len(union), population, confidence)
    return results.Bound(confidence=confidence, population=population, sampled=len(union), failing=len(failing),
                         fail_means=FAIL_MEANS, max_failing_entries=d, max_failing_fraction=d / population,
                         method=sampling.BOUND_METHOD, replications=[r.index for r, _ in with_rc])


def _tally(reps: list[_Replicated]) -> tuple[list[results.CheckTally], list[results.ClaimTally]]:
    """Each check's and each claim's verdict as k of N (N: the replications that ran it)."""
    shown = [r.shown for r in reps]
    names = list(dict.fromkeys(c.name for r in shown for c in r.checks))
    checks = []
    for name in names:
        ran = [c.status for r in shown for c in r.checks if c.name == name]
        checks.append(results.CheckTally(name=name, passed=ran.count("passed"), of=len(ran)))
    ids = list(dict.fromkeys(cid for r in shown for cid in r.claims))
    claims = []
    for cid in ids:
        said = [r.claims[cid] for r in shown if cid in r.claims]
        claims.append(results.ClaimTally(id=cid, supported=sum(v in ("supported", "consistent") for v in said),
                                         of=len(said), verdicts={str(r.index): r.claims[cid] for r in shown
                                                                 if cid in r.claims}))
    return checks, claims


# ------------------------------------------------------------------------------------------------ compare


def compare(sources: list[str], trust: Trust, *, allow_unverified: bool = False,
            confidence: float = sampling.CONFIDENCE) -> results.ReportCompare:
    """Verify, group and compare the reports `sources` name (files, folders, http(s)://, hf://, s3:// locations).

    A report that fails verification raises VerificationError (exit 1) naming it, unless `allow_unverified`; then it
    is listed with its reason and left out of every comparison. InputError (exit 2) for unusable input."""
    if not sources:
        raise InputError("name at least one report, folder or location")
    if not trust.given and not allow_unverified:
        raise InputError("report compare needs whom to trust: --key PUB.pem (repeatable) or "
                         "--certificate-identity/--certificate-oidc-issuer (or --allow-unverified to list them unverified)")
    from kvgraft.remote.location import is_remote
    from kvgraft.report.document import load_report

    shown_as: dict[str, str] = {}  # copies of remote reports -> their URLs

    def said(exc: Error) -> str:
        for copy, url in shown_as.items():
            exc.named(copy, url)
        return exc.diagnostics()

    with tempfile.TemporaryDirectory(prefix="kvgraft-compare-") as tmp:
        try:
            found: list[tuple[str, Path]] = []
            for s in sources:
                found += _remote(s, Path(tmp), shown_as) if is_remote(s) else _local(s)
                if len(found) > MAX_REPORTS:
                    raise InputError(f"more than {MAX_REPORTS} reports named")
            trusted: list[tuple[str, results.Signer, Report]] = []
            unverified: list[results.Unverified] = []
            for shown, path in found:
                try:
                    if not trust.given:
                        raise VerificationError(f"{shown}: no trusted key or identity given")
                    signer = _signer(path, shown, trust)
                    report = load_report(path)
                    trusted.append((shown, signer, report))
                except VerificationError as exc:
                    if not allow_unverified:
                        raise
                    unverified.append(results.Unverified(source=shown, reason=said(exc)))
            reps: list[_Replicated] = []
            for shown, signer, report in trusted:
                try:
                    reps.append(_replication(len(reps) + 1, shown, signer, report))
                except VerificationError as exc:
                    if not allow_unverified:
                        raise
                    unverified.append(results.Unverified(source=shown, reason=said(exc)))
        except Error as exc:
            exc.args = (said(exc),)  # named by the location given while the copies' names are known
            raise
    return _result(reps, unverified, confidence)


def _result(reps: list[_Replicated], unverified: list[results.Unverified], confidence: float) -> results.ReportCompare:
    keyed: dict[tuple[str, str], list[_Replicated]] = {}
    for rep in reps:
        keyed.setdefault(rep.audited, []).append(rep)
    groups: list[results.Group] = []
    for (root, identity), group_reps in sorted(keyed.items(), key=lambda kv: -len(kv[1])):
        entries = _entries(group_reps)
        checks, claims = _tally(group_reps)
        groups.append(results.Group(
            release_root_digest=root, model_identity=identity, model=group_reps[0].model,
            replications=[r.shown for r in group_reps], entries=entries,
            disagreements=results.Disagreements(explained=sum(e.status == "explained" for e in entries),
                                                unexplained=sum(e.status == "unexplained" for e in entries)),
            checks=checks, claims=claims, combined_bound=_combined(group_reps, confidence),
            pooled_generalization=None, pooling=POOLING))
    status: Literal["agree", "disagree"] = "disagree" if any(g.disagreements.unexplained for g in groups) else "agree"
    result = results.ReportCompare(format="kvgraft-report-compare", format_version=1, kvgraft_version=__version__,
                                   status=status, trusted=len(reps), unverified=unverified, groups=groups)
    from kvgraft.schema import validate

    validate(result.as_json(), SCHEMA, "report compare result")  # the schema is generated from the model
    return result
