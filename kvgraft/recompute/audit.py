"""Recompute audit: fresh KV states under the release's schedule vs the stored ones, and KL on probes."""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

import torch
from pydantic import BaseModel, JsonValue

from kvgraft import __version__, sampling
from kvgraft.errors import InputError, IntegrityError
from kvgraft.inference import reapply
from kvgraft.inference.environment import SENSITIVE, differences
from kvgraft.inference.environment import record as environment
from kvgraft.inference.graft import check_model, restore
from kvgraft.inference.models import LoadedModel
from kvgraft.inference.reapply import Conditions
from kvgraft.inference.runtime import Schedule, encode, every_position_layers, forward, layer_map, new_cache, prefill
from kvgraft.inference.tensors import TORCH_DTYPES, tensor_sha256
from kvgraft.recompute.compare import JUDGED, Judged, TensorDiff, diff_tensors, distributions, fmt_kl
from kvgraft.recompute.noise import VERDICTS, Judgement, NoiseBound, calibrate, judge, worst
from kvgraft.release.format import Release
from kvgraft.release.hashing import read_and_hash
from kvgraft.release.models import Entry, as_json
from kvgraft.release.records import tensor_mismatch
from kvgraft.results import recompute as res
from kvgraft.results.base import JsonObject
from kvgraft.signing.verify import VerifiedRelease

if TYPE_CHECKING:
    from kvgraft.execution.executor import Executor
    from kvgraft.execution.journal import Journal, Unit

RESULT_KIND: Final = "kvgraft-recompute-result"


@dataclass(frozen=True)
class FollowUp:
    """Units an audit judges after its entries, under the same conditions and in the same journal
    (kvgraft.recompute.prefix: each entry's prefix graft), so that an interrupted audit resumes them too.

    `run`: what decides their results beyond the audit's own settings, added to the journal's run.
    `unit(entry)`: the entry's unit id, a tuple (an entry's own unit is its id: the two never meet).
    `check(entry, result)`: why a result read back cannot stand for that entry's unit (None: it can).
    `judge(chosen, journal)`: judges the chosen entries' units the journal (if any) does not hold, records
    each as it lands, and returns what the result holds under `prefix_grafts`.
    """

    run: JsonObject
    unit: Callable[[Entry], Unit]
    check: Callable[[Entry, JsonValue], str | None]
    judge: Callable[[list[Entry], Journal | None], res.PrefixGrafts]


def _stored(fd: int, info: Any, expected: str, where: str) -> tuple[bytearray, str]:
    """One stored tensor's bytes, checked against its commitment.

    Read with pread into a buffer freed after its layer, not memory-mapped: measured here, a
    read-only mapping kept ~6 MB of file pages resident even with MADV_DONTNEED after each tensor,
    while this keeps at most one layer's K/V beside the fresh cache.
    """
    buf = bytearray(info.end - info.start)
    try:
        (actual,) = read_and_hash(fd, [(info.start, info.end)], memoryview(buf))
    except EOFError:
        raise IntegrityError(f"{where} tensor {info.name!r}: file ends inside bytes [{info.start}, {info.end})") from None
    if actual != expected:
        raise IntegrityError(tensor_mismatch(where, info.name, info.start, info.end, actual, expected))
    return buf, actual


def _as_tensor(buf: bytearray, info: Any) -> torch.Tensor:
    return torch.frombuffer(buf, dtype=TORCH_DTYPES[info.dtype]).view(info.shape)


_PARTS: tuple[res.Tensor, ...] = ("keys", "values")


def compare_layers(checked: VerifiedRelease, entry: Entry, lm: LoadedModel, fresh_cache: Any,
                   noise_bound: Callable[[], NoiseBound] | None = None,
                   fresh_digests: dict[str, str] | None = None) -> list[res.LayerResult]:
    """Per layer, per K/V: digest equality, and on a difference its size and first location.

    With `noise_bound` (measured on first use), each differing tensor is also judged against the
    numerical-noise bound: how many elements lie outside it, and the largest excess and where.
    `fresh_digests` (by tensor name) are the fresh tensors' SHA-256 when the caller has them already.
    """
    rel = checked.release
    fresh_layers, fresh_tensors = layer_map(lm, fresh_cache)
    digests = fresh_digests if fresh_digests is not None else {}
    try:
        fd = os.open(rel.entry_file(entry), os.O_RDONLY)
    except OSError as exc:  # gone or changed since it was verified
        raise IntegrityError(f"{rel.entry_file(entry)}: entry {entry['id']!r}: cannot read: {exc.strerror}") from None
    where = f"{rel.entry_file(entry)}: entry {entry['id']!r}"
    rows: list[res.LayerResult] = []
    try:
        layout = rel.tensor_layout(entry, fd)  # the layout checked is the layout read
        for stored_meta, fresh_meta in zip(entry["layers"], fresh_layers, strict=True):
            # a member only where it is: no layout_mismatch where the layouts agree, no K or V of a shared layer
            present: dict[str, str | res.TensorDiff] = {}
            if stored_meta != fresh_meta and stored_meta["kind"] != fresh_meta["kind"]:
                present["layout_mismatch"] = f"stored {stored_meta}, fresh {fresh_meta}"
            if stored_meta["kind"] != "shared":
                offset = stored_meta.get("positions", [0, 0])[0]
                for part in _PARTS:
                    name = stored_meta[part]
                    info = layout[name]
                    stored, stored_sha = _stored(fd, info, entry["tensors"][name]["sha256"], where)
                    fresh = fresh_tensors[fresh_meta[part]] if part in fresh_meta else None
                    if fresh is None:
                        d = TensorDiff(False, "", stored_sha, 0, shape_mismatch="no fresh tensor")
                    else:
                        fresh_sha = digests.get(fresh_meta[part]) or tensor_sha256(fresh)  # each hashed once
                        d = (TensorDiff(True, stored_sha, stored_sha, int(fresh.numel())) if fresh_sha == stored_sha
                             else diff_tensors(_as_tensor(stored, info), fresh, stored_sha256=stored_sha,
                                               fresh_sha256=fresh_sha, position_offset=offset))
                    judged = None
                    if not d.equal and d.shape_mismatch is None and fresh is not None and noise_bound is not None:
                        judged = _judged(judge(_as_tensor(stored, info), fresh, noise_bound().allowed(name, fresh)),
                                         offset)
                    present[part] = d.record(judged)
                    del stored
            row = res.LayerResult(index=stored_meta["index"], kind=stored_meta["kind"])
            rows.append(row.model_copy(update=present))
    finally:
        os.close(fd)
    return rows


def _judged(j: Judgement, offset: int) -> Judged:
    def absolute(loc: list[int] | None) -> list[int] | None:
        return None if loc is None else [*loc[:2], loc[2] + offset, *loc[3:]] if len(loc) == 4 else loc

    values = None if j.worst_values is None else res.WorstValues.model_validate(j.worst_values)
    return Judged(j.outside, j.max_excess, absolute(j.worst), absolute(j.first), values)


def _named(loc: list[int] | None) -> res.Named | None:
    return None if loc is None or len(loc) != 4 else res.Named(batch=loc[0], head=loc[1], position=loc[2], dim=loc[3])


def _place(loc: list[int] | None) -> dict[str, int]:
    """A location's members (batch, head, position, dim) where it has all four, else none."""
    named = _named(loc)
    return {} if named is None else named.model_dump()


_JUDGED = frozenset(JUDGED)


def _tensors(rows: list[res.LayerResult]) -> list[tuple[int, res.Tensor, res.TensorDiff]]:
    """Each layer's K and V comparison (a shared layer has neither), with its layer and part."""
    return [(r.index, p, t) for r in rows for p in _PARTS if (t := getattr(r, p)) is not None]


def classify(rows: list[res.LayerResult]) -> tuple[res.Verdict, res.Outside | None]:
    """The entry's verdict from judged rows, and where it lies outside the noise bound (None if nowhere)."""
    tensors = _tensors(rows)
    layout = [r for r in rows if r.layout_mismatch is not None]
    if all(t.equal for _, _, t in tensors) and not layout:
        return "byte-exact", None
    shape = [(i, p, t) for i, p, t in tensors if t.shape_mismatch]
    outside = [(i, p, t) for i, p, t in tensors if t.outside]
    if not (layout or shape or outside):
        return "consistent", None
    for i, _, t in outside:
        if not t.model_fields_set >= _JUDGED:  # a fresh judgement states each, null or not
            raise ValueError(f"layer {i}: judged without {', '.join(sorted(_JUDGED - t.model_fields_set))}")
    found = res.Outside(
        elements=sum(t.outside or 0 for _, _, t in outside), tensors=len(outside) + len(shape),
        layers=sorted({i for i, _, _ in outside + shape} | {r.index for r in layout}),
        layout=[f"layer {r.index}: {r.layout_mismatch}" for r in layout],
        shape=[f"layer {i} {p}: {t.shape_mismatch}" for i, p, t in shape])
    if not outside:
        return "inconsistent", found
    i, p, t = outside[0]
    first = res.Where(layer=i, tensor=p, **_place(t.first_outside))
    i, p, t = max(outside, key=lambda x: x[2].max_excess)  # type: ignore[arg-type,return-value]
    values = t.worst_values.model_dump() if t.worst_values is not None else {}
    worst = res.Worst(layer=i, tensor=p, **_place(t.worst), **values, excess=t.max_excess)
    # `first` and `worst` only where some element lies outside, as the result writes them
    return "inconsistent", found.model_copy(update={"first": first, "worst": worst})


def _first_difference(rows: list[res.LayerResult]) -> res.FirstDifference | None:
    for row in rows:
        if row.layout_mismatch is not None:
            return res.FirstDifference(layer=row.index, tensor=None, detail=row.layout_mismatch)
        for i, part, d in _tensors([row]):
            if not d.equal:
                if "shape_mismatch" not in d.model_fields_set:  # a fresh comparison states it, null or not
                    raise ValueError(f"layer {i} {part}: compared without shape_mismatch")
                return res.FirstDifference(layer=i, tensor=part, location=d.first, named=_named(d.first),
                                           max_ulp=d.max_ulp, max_abs=d.max_abs, detail=d.shape_mismatch)
    return None


@dataclass(frozen=True)
class EntryVerdict:
    """What an entry's result says of its per-layer comparisons: verdict, where it lies outside, the counts."""

    byte_exact: bool
    verdict: res.Verdict
    outside: res.Outside | None
    max_excess: float | res.Infinity
    tensors_equal: int
    tensors: int
    first_difference: res.FirstDifference | None

    def recorded(self) -> dict[str, JsonValue]:
        """Each member as the result writes it (what a result read back is compared with)."""
        return {k: v.model_dump(exclude_unset=True) if isinstance(v, BaseModel) else v
                for k, v in vars(self).items()}


def judged_fields(rows: list[res.LayerResult]) -> EntryVerdict:
    """The entry's verdict and counts from its per-layer comparisons. The same function makes a fresh result's
    fields and re-judges one read back from a journal."""
    verdict, outside = classify(rows)
    tensors = [t for r in rows for t in (r.keys, r.values) if t is not None]
    return EntryVerdict(verdict == "byte-exact", verdict, outside,
                        max((0.0 if t.max_excess is None else t.max_excess for t in tensors), default=0.0),
                        sum(t.equal for t in tensors), len(tensors), _first_difference(rows))


def _real(x: res.Measure | None) -> float:
    """A measure as a number (a non-finite one is written as a string); absent where it must be: ValueError."""
    if x is None:
        raise ValueError("no such measure")
    return float(x)


def resumed_problem(entry: Entry, result: JsonValue) -> str | None:
    """Why `result`, read back from a journal, cannot stand for `entry`'s judgement (None: it can).

    A journal lies in the output folder, where someone else may have planted or edited it. A result read
    back must be a whole entry result (the schema), of this entry, compared against the digests the
    release commits to, and its verdict, counts and first difference must be the ones its own
    comparisons give. (Comparisons forged consistently down to the fresh digests are not caught: only
    recomputing the entry would.)
    """
    from kvgraft.errors import SchemaError
    from kvgraft.schema import validate_part

    try:
        validate_part(result, "recompute-result.v1.json", "$defs/EntryResult", "result")
    except SchemaError as exc:
        return str(exc)
    assert isinstance(result, dict)  # the schema says so
    got = res.EntryResult.model_validate(result)
    if got.id != entry["id"] or got.num_tokens != entry["num_tokens"]:
        return f"result of {got.id!r} ({got.num_tokens} tokens), not of this entry"
    rows, metas = got.layers, entry["layers"]
    if [(r.index, r.kind) for r in rows] != [(m["index"], m["kind"]) for m in metas]:
        return "its layers are not the entry's"
    for row, meta in zip(rows, metas, strict=True):
        for part in _PARTS:
            d: res.TensorDiff | None = getattr(row, part)
            if (d is not None) != (meta["kind"] != "shared"):
                return f"layer {meta['index']}: {part} {'missing' if d is None else 'of a shared layer'}"
            committed = entry["tensors"][meta[part]]["sha256"] if d is not None else None
            if d is not None and (d.sha256_stored != committed or d.equal != (d.sha256_fresh == committed)):
                return f"layer {meta['index']} {part}: its digests disagree with the release's ({committed})"
    try:
        derived = judged_fields(rows)
        worst = derived.outside.worst if derived.outside is not None else None
        if worst is not None:
            _real(worst.abs_diff), _real(worst.excess)  # what the verdict's sentence quotes
    except (KeyError, TypeError, ValueError, IndexError):  # a comparison missing what a fresh one always holds
        return "its comparisons are incomplete"
    for k, v in derived.recorded().items():
        if json.dumps(result[k], sort_keys=True) != json.dumps(v, sort_keys=True):
            return f"its {k} ({json.dumps(result[k])[:80]}) is not what its comparisons give ({json.dumps(v)[:80]})"
    return None


def probe_ids(lm: LoadedModel, entry: Entry, probe_text: str | None) -> list[int]:
    if probe_text:
        return encode(lm, probe_text)
    probe = entry.get("probe")
    recorded = (probe.get("token_ids") if probe is not None else None) or []
    return [int(t) for t in recorded] or [int(entry["next_token"]["argmax"])]


@torch.inference_mode()
def natural_logits(lm: LoadedModel, ids: list[int], keep: int) -> torch.Tensor:
    """What a user computes without any cache: one forward pass over prefix + probe."""
    from kvgraft.inference.runtime import cache_kw

    x = torch.tensor([ids], dtype=torch.long, device=lm.torch_device)
    out = lm.model(input_ids=x, use_cache=True, logits_to_keep=keep, **{cache_kw(lm): new_cache(lm)})
    logits: torch.Tensor = out.logits[0]
    return logits


def audit_entry(checked: VerifiedRelease, entry: Entry, lm: LoadedModel, *, probe_text: str | None = None,
                force: bool = False, schedule: Schedule | None = None) -> res.EntryResult:
    """One entry → its result. A pure function of (entry, model, settings); holds one cache at a time."""
    rel = checked.release
    t0 = time.perf_counter()
    # Where this entry ran (on Ray, each worker): what it could not replay of the record.
    differing = sorted(differences(rel.manifest["environment"], environment(lm.device, lm.dtype, lm.attn)))
    if schedule is not None and schedule.as_dict() != rel.manifest["schedule"]:
        differing.append("schedule")
    schedule = schedule or Schedule.from_dict(rel.manifest["schedule"])
    # Sliding layers the entry stores with every position are recomputed keeping every position
    # (the same computation: runtime.new_cache), so each stored position is compared.
    every = every_position_layers(entry)
    fresh_cache, next_logits = prefill(lm, entry["token_ids"], schedule, new_cache(lm, every))
    t_prefill = time.perf_counter() - t0
    measured: list[NoiseBound] = []
    reference = layer_map(lm, fresh_cache)[1]
    # Hashed once here: the comparison and the noise bound's memo key both need them.
    digests = {name: tensor_sha256(t) for name, t in reference.items()}

    def noise_bound() -> NoiseBound:  # measured only when some tensor differs
        if not measured:
            measured.append(calibrate(lm, entry["token_ids"], schedule, reference, digests=digests, every=every))
        return measured[0]

    rows = compare_layers(checked, entry, lm, fresh_cache, noise_bound, fresh_digests=digests)
    reference.clear()
    t_compare = time.perf_counter() - t0 - t_prefill - (measured[0].seconds if measured else 0.0)
    judged = judged_fields(rows)
    probe = probe_ids(lm, entry, probe_text)
    # Distributions after each probe token: positions n .. n+k-1 of the full sequence.
    fresh_logits = forward(lm, fresh_cache, probe)
    del fresh_cache
    # The graft goes through the real restore path (and re-hashes what it reads) on purpose: the
    # distribution check audits what a user's graft does, not a cache assembled by the comparison.
    grafted = restore(checked, entry["id"], lm, force=force)
    grafted_logits = forward(lm, grafted.cache, probe)
    del grafted
    natural = natural_logits(lm, entry["token_ids"] + probe, len(probe))
    matched = distributions(fresh_logits, grafted_logits)
    contrast = distributions(natural, grafted_logits)
    return res.EntryResult(
        id=entry["id"], num_tokens=entry["num_tokens"], byte_exact=judged.byte_exact, verdict=judged.verdict,
        conditions_differ=differing, outside=judged.outside,
        noise_bound=measured[0].record() if measured else None, max_excess=judged.max_excess,
        tensors_equal=judged.tensors_equal, tensors=judged.tensors,
        next_token_logits_equal=tensor_sha256(next_logits) == entry["next_token"]["logits_sha256"],
        first_difference=judged.first_difference, layers=rows, probe_token_ids=probe,
        matched=matched.record(), natural=contrast.record(),
        seconds=res.Seconds(prefill=t_prefill, compare=t_compare, noise_bound=measured[0].seconds if measured else 0.0,
                            total=time.perf_counter() - t0))


def entry_unit(lm: LoadedModel, checked: VerifiedRelease, entry: Entry, *, probe_text: str | None = None,
               force: bool = False, schedule: Schedule | None = None) -> JsonObject:
    """`audit_entry` as an executor work unit: (model, verified release, entry) → its result as JSON (an executor
    adds its placement, a journal records it, Ray ships it)."""
    return audit_entry(checked, entry, lm, probe_text=probe_text, force=force, schedule=schedule).model_dump(
        exclude_unset=True)


def statements(result: res.RecomputeResult) -> list[str]:
    """Plain sentences saying for which comparison byte-exactness and zero KL hold."""
    entries = result.entries
    n = len(entries)
    exact = sum(e.byte_exact for e in entries)
    kl0 = sum(e.matched.kl_max == 0.0 and e.matched.logits_equal for e in entries)
    nat_max = max((abs(float(e.natural.kl_max)) for e in entries), default=0.0)
    nat0 = sum(e.natural.logits_equal for e in entries)
    chunk = result.schedule["chunk_tokens"]
    mode = "one-shot" if chunk is None else f"chunks of {chunk}"
    diffs = result.environment.differences
    env = "same recorded environment" if not diffs else "environment differs in " + ", ".join(sorted(diffs))
    label = "Recomputed with an overridden schedule" if result.schedule_overridden else "Matched schedule"
    out = [
        f"{label} ({mode}, {env}): KV bytes identical (SHA-256 equal) in {exact}/{n} entries; "
        f"KL(fresh ‖ grafted) exactly 0.0 in {kl0}/{n}.",
        f"Natural contrast (one forward pass over prefix + probe, no cache): logits identical in {nat0}/{n} entries; "
        f"max KL(natural ‖ grafted) = {fmt_kl(nat_max)}"
        + ("." if nat0 == n else "; byte-exactness and zero KL do not hold for this comparison."),
    ]
    if result.model.forced:
        out.append("The model's identity differs from the release's (forced): differences are expected.")
    drawn = result.sample
    if drawn is not None:  # before the verdict, which stays the last statement
        origin = sampling.nonce_origin(drawn.model_dump(), result.cost.resumed_from if result.cost is not None else None)
        out.append(f"Sample: {drawn.size:,} of {drawn.population:,} entries drawn by {drawn.method} from the "
                   f"root digest and nonce {drawn.nonce!r} ({origin}), {drawn.weighting}; "
                   "re-derive: kvgraft audit sample RELEASE --check RESULT.json.")
        if result.bound is not None:
            out.append(f"Bound: {sampling.sentence(result.bound.model_dump())}.")
    resumed = resumed_statement(result.cost) if result.cost is not None else None
    if resumed:
        out.append(resumed)
    if result.prefix_grafts is not None:
        out.append(prefix_statement(result.prefix_grafts))
    out.append(verdict_statement(result))
    return out


def resumed_statement(cost: res.Cost | JsonObject) -> str | None:
    """Which results were not computed by this run: read back from a journal, and which one. `cost`: a result's
    cost ledger, or the JSON a result file holds of it."""
    ledger = cost if isinstance(cost, res.Cost) else res.Cost.model_validate(cost)
    if not ledger.resumed_from:
        return None
    n, grafts = ledger.entries_resumed, ledger.prefix_grafts_resumed or 0
    also = f" and {grafts} prefix graft{'' if grafts == 1 else 's'}" if grafts else ""
    return (f"{n} result{'' if n == 1 else 's'}{also} resumed from {ledger.resumed_from} (judged by an earlier run "
            f"and read back, each re-judged from its recorded comparisons; {ledger.entries_recomputed} recomputed "
            f"now).")


def prefix_statement(grafts: res.PrefixGrafts) -> str:
    """One sentence on the prefix grafts judged: under their recorded schedule, and against the prefix alone."""
    judged = grafts.entries
    counts = {v: sum(g.verdict == v for g in judged) for v in VERDICTS}
    alone = {v: sum(g.against_prefix_alone.verdict == v for g in judged) for v in VERDICTS}
    skipped = f"; {len(grafts.skipped)} entries skipped (no such prefix graft)" if grafts.skipped else ""
    return (f"Prefix grafts of {grafts.tokens} tokens (rows [0, {grafts.tokens}) of each entry's recorded "
            f"prefill), judged under that schedule: {counts['byte-exact']} byte-exact, {counts['consistent']} "
            f"consistent, {counts['inconsistent']} inconsistent of {len(judged)}; against a prefill of the prefix "
            f"alone: {alone['byte-exact']} byte-identical, {alone['consistent']} inside its noise bound, "
            f"{alone['inconsistent']} outside{skipped}.")


def verdict_statement(result: res.RecomputeResult) -> str:
    """The release's verdict, for which comparison it holds, and whether the requirement is met."""
    entries = result.entries
    counts = {v: sum(e.verdict == v for e in entries) for v in VERDICTS}
    env = result.environment.current
    machine = f"{env.get('device_name')} ({env.get('device')}, {env.get('dtype')}, {env.get('attn_implementation')}, " \
              f"{env.get('threads')} threads)"
    cond = result.conditions
    parts = []
    if cond.not_replayed:
        parts.append("not replayed: " + ", ".join(f"{k} {v[0]!r} -> {v[1]!r}" for k, v in sorted(cond.not_replayed.items())))
    if cond.overridden:
        parts.append("overridden: " + ", ".join(f"{k} {v.recorded!r} -> {v.used!r}"
                                                 for k, v in sorted(cond.overridden.items())))
    where = "; ".join(parts) if parts else "every recorded condition replayed"
    verdict = result.verdict
    meaning = {"byte-exact": "every SHA-256 equal",
               "consistent": "bytes differ, every difference inside the measured noise bound of the same computation",
               "inconsistent": "some difference lies outside the noise bound: not the same computation"}[verdict]
    located = []
    for e in entries:
        w = e.outside.worst if e.outside is not None else None
        if w is not None:
            at = ", ".join(f"{k} {v}" for k, v in (("head", w.head), ("position", w.position), ("dim", w.dim))
                           if v is not None)
            located.append(f"{e.id}: layer {w.layer} {w.tensor} ({at}) |diff| {_real(w.abs_diff):.3g} is "
                           f"{_real(w.excess):.3g}x the noise bound")
        elif e.outside is not None:
            located.append(f"{e.id}: " + "; ".join(e.outside.layout + e.outside.shape))
    return (f"Verdict {verdict} ({meaning}) on {machine}, {where}: {counts['byte-exact']} byte-exact, "
            f"{counts['consistent']} consistent, {counts['inconsistent']} inconsistent of {len(entries)} entries; "
            f"requirement {result.require}: {'met' if result.passed else 'NOT met'}."
            + (" Outside the noise bound: " + "; ".join(located) + "." if located else ""))


REQUIREMENTS: tuple[res.Require, ...] = ("exact", "consistent")


def check_requirement(require: str) -> res.Require:
    """`require` as a requirement (InputError if it is none)."""
    for known in REQUIREMENTS:
        if require == known:
            return known
    raise InputError(f"--require {require}: expected one of {', '.join(REQUIREMENTS)}")


def passes(verdict: str, require: str) -> bool:
    """Whether a verdict meets a requirement: `exact` needs byte-exact, `consistent` also takes consistent."""
    check_requirement(require)
    return verdict == "byte-exact" or (require == "consistent" and verdict == "consistent")


def choose(rel: Release, *, entries: list[str] | None = None, sample: int | None = None,
           nonce: str | None = None, nonce_source: str | None = None) -> tuple[list[Entry], res.Sample | None]:
    """The entries to audit: the named ones, a sample (kvgraft.sampling: root digest + nonce), or all."""
    if sample is None:
        if nonce is not None:
            raise InputError("--nonce draws a sample: pass --sample N (or --target-fraction F) too")
        return rel.records(entries) if entries else rel.entries, None
    if entries:
        raise InputError("--sample and --entry exclude each other: a chosen subset bounds nothing")
    source = nonce_source or ("given" if nonce is not None else "drawn")
    nonce = sampling.check_nonce(nonce) if nonce is not None else sampling.new_nonce()
    # Drawn from the ids and token counts the manifest lists: only the sampled entries' records are read.
    ids = rel.entry_ids()
    drawn = res.Sample.model_validate(sampling.sample_record(str(rel.manifest["root_digest"]), nonce, ids,
                                                             rel.token_counts(), sample, nonce_source=source))
    return rel.records([ids[i] for i in drawn.positions]), drawn


def failing(entry: res.EntryResult | JsonObject, require: str) -> bool:
    """Whether an entry fails the requirement: not byte-exact under `exact`, inconsistent under `consistent`.
    `entry`: an entry's result, or the JSON a result file holds of it."""
    return not passes(entry.verdict if isinstance(entry, res.EntryResult) else str(entry["verdict"]), require)


FAIL_MEANS: dict[res.Require, Literal["not byte-exact", "inconsistent"]] = {
    "exact": "not byte-exact", "consistent": "inconsistent"}


def bound(entries: Sequence[res.EntryResult], require: res.Require, ids: Sequence[str],
          tokens: Sequence[int]) -> res.Bound:
    """The one-sided 95% bound on failing entries and tokens of the whole release (kvgraft.sampling) from its judged
    `entries`, the release's entries having these ids and token counts (in release order)."""
    judged = {e.id for e in entries}
    rest = [n for i, n in zip(ids, tokens, strict=True) if i not in judged]
    b = sampling.bound([failing(e, require) for e in entries], [e.num_tokens for e in entries], rest)
    return res.Bound.model_validate(b.as_dict(FAIL_MEANS[require]))


@dataclass(frozen=True)
class Conclusion:
    """The release's verdict and whether it meets the requirement."""

    all_byte_exact: bool
    verdict: res.Verdict
    passed: bool


def conclude(entries: Sequence[res.EntryResult], grafts: res.PrefixGrafts | None, require: str) -> Conclusion:
    """The release's verdict and whether it meets the requirement: the worst of its entries' verdicts and of its
    prefix grafts' (kvgraft.recompute.prefix)."""
    verdict = worst([e.verdict for e in entries] + [g.verdict for g in (grafts.entries if grafts else [])])
    return Conclusion(all(e.byte_exact for e in entries), verdict, passes(verdict, require))


def audit_result(checked: VerifiedRelease, lm: LoadedModel, *, entries: list[str] | None = None,
                 probe_text: str | None = None, force: bool = False, schedule: Schedule | None = None,
                 progress: Callable[[int, int], None] | None = None, executor: Executor | None = None,
                 overrides: JsonObject | None = None, require: str = "exact", sample: int | None = None,
                 nonce: str | None = None, journal: Path | None = None,
                 on_progress: Callable[[dict[str, int]], None] | None = None,
                 then: FollowUp | None = None) -> res.RecomputeResult:
    """Recompute and compare every (or the named, or a sample of the) entries of a release.

    The recorded conditions are replayed: attention kernel, threads and deterministic flags are set
    for the run (dtype and device are the loaded model's: `Conditions.load_options` picks them; a Ray
    executor sizes and starts its actors with the recorded thread count). `overrides` (environment
    names → values) are explicit departures, recorded as such; `schedule` overrides the recorded
    prefill schedule. Each entry gets a verdict (byte-exact, consistent, inconsistent); `require` says
    which verdicts pass. `sample` entries are drawn from the root digest and `nonce` (kvgraft.sampling;
    a fresh nonce when None, or the one `journal` records); the result then bounds how many entries of
    the release fail. `executor` runs the per-entry work (kvgraft.execution.executor; default: in this process);
    each entry records its placement. With `journal`, each judged entry is appended as it lands and an
    interrupted audit resumes from it (the caller removes the journal once it has written the result).
    `on_progress({done, total, tokens_done, tokens_total, resumed, tokens_resumed})` after each entry.
    `then`: units judged after the entries, journaled with them (kvgraft.recompute.prefix.audit: the
    entries' prefix grafts), their result the result's `prefix_grafts`.
    """
    from kvgraft.execution.executor import LocalExecutor
    from kvgraft.execution.journal import header

    required = check_requirement(require)  # before any work
    rel = checked.release  # verified under its policy by whoever turned a path into it (the CLI, a plan's run)
    forced = check_model(checked, lm, force=force)
    nonce_source = None
    if journal is not None and sample is not None and nonce is None:
        earlier = (header(journal) or {}).get("sample")
        if isinstance(earlier, dict) and earlier.get("nonce") is not None:
            # Resuming: the sample is the one the interrupted run drew. The nonce was read from a file, not
            # drawn here, and is reported so ("from the journal FILE"): whoever wrote the file chose it.
            nonce = sampling.check_nonce(earlier["nonce"], f"{journal}:1: the journal's nonce")
            nonce_source = "journal"
    chosen, drawn = choose(rel, entries=entries, sample=sample, nonce=nonce, nonce_source=nonce_source)
    ex = executor or LocalExecutor()
    recorded = rel.manifest["environment"]
    overrides = dict(overrides or {})
    threads = overrides.get("threads")
    wanted_threads = Conditions(threads=threads if isinstance(threads, int) else None).thread_count(recorded, lm.device)
    if wanted_threads is not None:
        ex.reapply_threads(wanted_threads)
    recorded_schedule = rel.manifest["schedule"]
    used_schedule = as_json(schedule.as_dict() if schedule else recorded_schedule)
    with reapply.applied(lm, recorded, overrides):
        current = ex.environment(lm)
        ids: list[JsonValue] = [str(e["id"]) for e in chosen]
        # What decides each entry's verdict: a journal of any other run is refused, never mixed in.
        run: JsonObject = {
            "release_root_digest": rel.manifest["root_digest"], "entries": ids,
            "sample": {"method": drawn.method, "nonce": drawn.nonce, "size": drawn.size} if drawn else None,
            "schedule": used_schedule, "probe_text": probe_text, "force": force, "overrides": overrides,
            "model_identity": lm.identity.sha256,
            "environment": {k: current.get(k) for k in sorted(SENSITIVE)}, **(then.run if then else {})}
        jr = _open_journal(journal, run, chosen, then) if journal is not None else None
        grafts, grafts_resumed = None, None
        try:
            judged, tally = _judge(checked, lm, ex, chosen, jr, progress, on_progress,
                                   functools.partial(entry_unit, probe_text=probe_text, force=force, schedule=schedule))
            if then is not None:
                grafts = then.judge(chosen, jr)
                grafts_resumed = sum(then.unit(e) in jr.done for e in chosen) if jr else 0
        finally:
            if jr is not None:
                jr.close()
    described = ex.describe()
    workers = described.get("workers")
    cost = res.Cost(entries_recomputed=tally.entries_recomputed, entries_resumed=tally.entries_resumed,
                    tokens_recomputed=tally.tokens_recomputed, tokens_resumed=tally.tokens_resumed,
                    wall_seconds=tally.wall_seconds, tokens_per_second=tally.tokens_per_second,
                    library_entries=tally.library_entries, library_tokens=tally.library_tokens,
                    projected_library_seconds=tally.projected_library_seconds,
                    resumed_from=str(journal) if jr is not None and jr.resumed else None, executor=ex.kind,
                    workers=len(workers) if ex.kind == "ray" and isinstance(workers, list) else 1)
    concluded = conclude(judged, grafts, required)
    result = res.RecomputeResult(
        kind=RESULT_KIND, format_version=1, kvgraft_version=__version__,
        release=res.Release(path=str(rel.root), root_digest=rel.manifest["root_digest"]),
        model=res.Model(spec=lm.spec, identity=lm.identity.as_dict(),
                        release_identity=rel.manifest["model"]["identity"]["sha256"], forced=forced),
        schedule=used_schedule, schedule_overridden=schedule is not None and used_schedule != recorded_schedule,
        environment=res.Environment(recorded=recorded, current=current,
                                    differences={k: list(v) for k, v in differences(recorded, current).items()}),
        conditions=res.Conditions.model_validate(reapply.describe(recorded, current, overrides)),
        require=required, entries=judged, cost=cost, executor=described, all_byte_exact=concluded.all_byte_exact,
        verdict=concluded.verdict, passed=concluded.passed, statements=[])
    # Each optional member only where it is: absent, not null, where there is none.
    if grafts is not None:
        result = result.model_copy(update={"prefix_grafts": grafts,
                                           "cost": cost.model_copy(update={"prefix_grafts_resumed": grafts_resumed})})
    if drawn is not None:
        result = result.model_copy(update={"sample": drawn})
    if drawn is not None or not entries:  # a sample, or the whole release; a chosen subset bounds nothing
        result = result.model_copy(update={"bound": bound(judged, required, rel.entry_ids(), rel.token_counts())})
    return result.model_copy(update={"statements": statements(result)})


def document(result: res.RecomputeResult) -> JsonObject:
    """A recompute result as its file holds it (schemas/recompute-result.v1.json), each member only where it is.

    Python's floats kept as they are, an infinity or NaN among them (write_json writes each as the schema's string):
    a JSON-mode dump would write null for one in a list."""
    return result.model_dump(exclude_unset=True)


def audit(checked: VerifiedRelease, lm: LoadedModel, **options: Any) -> JsonObject:
    """`audit_result` (its options) as the JSON document its file holds."""
    return document(audit_result(checked, lm, **options))


def _open_journal(path: Path, run: JsonObject, chosen: list[Entry], then: FollowUp | None) -> Journal:
    """The journal of this run: each chosen entry's unit (its id), and its follow-up unit; every result read
    back is checked against the entry it stands for."""
    from kvgraft.execution.journal import Journal

    by_id = {str(e["id"]): e for e in chosen}
    more = {then.unit(e): e for e in chosen} if then is not None else {}

    def check(unit: Unit, r: JsonObject) -> str | None:
        if isinstance(unit, str):
            return resumed_problem(by_id[unit], r)
        assert then is not None  # a tuple unit is a follow-up's: the units allowed say so
        return then.check(more[unit], r)

    return Journal.open(path, run, {*by_id, *more}, check=check)


@dataclass(frozen=True)
class _Tally:
    """The cost ledger's counts and timing (`res.Cost` without the executor's members)."""

    entries_recomputed: int
    entries_resumed: int
    tokens_recomputed: int
    tokens_resumed: int
    wall_seconds: float
    tokens_per_second: float | None
    library_entries: int
    library_tokens: int
    projected_library_seconds: float | None


def _judge(checked: VerifiedRelease, lm: LoadedModel, ex: Executor, chosen: list[Entry], jr: Journal | None,
           progress: Callable[[int, int], None] | None, on_progress: Callable[[dict[str, int]], None] | None,
           unit: Callable[[LoadedModel, VerifiedRelease, Entry], JsonObject]) -> tuple[list[res.EntryResult], _Tally]:
    """Each chosen entry's result: from the journal where an earlier run judged it, else recomputed now."""
    rel = checked.release
    # The entries' own units (a follow-up's are tuples, read back by it).
    done = {u: r for u, r in jr.done.items() if isinstance(u, str)} if jr is not None else {}
    todo = [e for e in chosen if e["id"] not in done]
    tokens = {str(e["id"]): int(e["num_tokens"]) for e in chosen}
    state = {"done": len(done), "total": len(chosen), "tokens_done": sum(tokens[i] for i in done),
             "tokens_total": sum(tokens.values()), "resumed": len(done), "tokens_resumed": sum(tokens[i] for i in done)}
    if on_progress:
        on_progress(dict(state))

    def landed(i: int, r: JsonObject) -> None:
        if jr is not None:
            jr.record(str(todo[i]["id"]), r)
        state["done"] += 1
        state["tokens_done"] += tokens[str(todo[i]["id"])]
        if on_progress:
            on_progress(dict(state))

    t0 = time.perf_counter()
    fresh = ex.map(unit, checked, todo, lm=lm, labels=[e["id"] for e in todo], on_result=landed,
                   progress=(lambda i, n, _label: progress(i, n)) if progress else None) if todo else []
    wall = time.perf_counter() - t0
    by_id = {str(e["id"]): res.EntryResult.model_validate(r) for e, r in zip(todo, fresh, strict=True)}
    for i, r in done.items():
        read = res.EntryResult.model_validate(r)
        # judged by the interrupted run, read back
        by_id[i] = read.model_copy(update={"placement": {**(read.placement or {}), "resumed": True}})
    recomputed = sum(tokens[str(e["id"])] for e in todo)
    rate = recomputed / wall if recomputed and wall > 0 else None
    library = sum(rel.token_counts())  # from the manifest: no index shard read for the ledger
    tally = _Tally(entries_recomputed=len(todo), entries_resumed=len(done), tokens_recomputed=recomputed,
                   tokens_resumed=state["tokens_resumed"], wall_seconds=wall, tokens_per_second=rate,
                   library_entries=rel.num_entries, library_tokens=library,
                   projected_library_seconds=library / rate if rate else None)
    return [by_id[str(e["id"])] for e in chosen], tally


@dataclass(frozen=True)
class DigestMismatch:
    """A fresh tensor whose SHA-256 is not the one the manifest records."""

    layer: int
    tensor: str
    expected: str
    actual: str


@dataclass(frozen=True)
class DigestCheck:
    """One entry recomputed against a manifest's digests alone: the tensors that differ (the first of them), whether
    the next-token logits and the model identity are the recorded ones, and the recorded vs current environment."""

    entry: str
    mismatches: list[DigestMismatch]
    first: DigestMismatch | None
    next_token_logits_equal: bool
    identity_equal: bool
    recorded_environment: JsonObject
    current_environment: JsonObject
    differences: dict[str, list[JsonValue]]


def digest_check(manifest: dict[str, Any], entry_id: str, lm: LoadedModel) -> DigestCheck:
    """Recompute one entry and compare per-tensor SHA-256 with a manifest alone (no stored tensors).

    Returns the first differing layer (if any) and the recorded vs current environment, so that
    drift between machines is named rather than hidden.
    """
    entry = next((e for e in manifest["entries"] if e["id"] == entry_id), None)
    if entry is None:
        raise IntegrityError(f"manifest has no entry {entry_id!r}")
    cache, logits = prefill(lm, entry["token_ids"], Schedule.from_dict(manifest["schedule"]),
                            new_cache(lm, every_position_layers(entry)))
    _, fresh = layer_map(lm, cache)
    mismatches = []
    for meta in entry["layers"]:
        for part in _PARTS:
            if part in meta:
                actual = tensor_sha256(fresh[meta[part]])
                expected = entry["tensors"][meta[part]]["sha256"]
                if actual != expected:
                    mismatches.append(DigestMismatch(meta["index"], part, expected, actual))
    current = environment(lm.device, lm.dtype, lm.attn)
    return DigestCheck(entry_id, mismatches, mismatches[0] if mismatches else None,
                       tensor_sha256(logits) == entry["next_token"]["logits_sha256"],
                       lm.identity.sha256 == manifest["model"]["identity"]["sha256"], manifest["environment"], current,
                       {k: list(v) for k, v in differences(manifest["environment"], current).items()})
