"""The recompute audit of a prefix graft: its rows against their own schedule and against the prefix alone.

A prefix graft of n tokens (kvgraft.inference.graft.restore_prefix, `kvgraft run --prefix`, the vLLM connector)
is rows [0, n) of the entry's recorded prefill of all T tokens. Kernel blocking can depend on T
(bench/prefix_schedule.py measures it), so the audit judges those rows twice, on this machine, under
the recorded conditions:

- under the schedule that made them: rows [0, n) of a fresh prefill of the T tokens: byte-exact
  where they are bit for bit, else judged against the noise bound of that computation
  (kvgraft.recompute.noise): consistent or inconsistent. This is the graft's claim, and its verdict;
- against a fresh prefill of the n tokens alone, what a prefix graft stands in for: byte-exact
  where the schedule makes them byte-identical, else judged against the noise bound of the n-token
  computation. A difference inside it is the schedule's and is recorded, not a failure; one outside
  it makes the verdict inconsistent (the rows are not the prefix's computation).

Judged within an audit (`audit`), each graft is journaled with the audit's entries (unit
["prefix", n, ID]): an interrupted audit resumes and judges no graft twice, and a graft read back is
re-judged from its recorded comparisons (`resumed_problem`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from pydantic import JsonValue

from kvgraft.errors import InputError
from kvgraft.inference import reapply
from kvgraft.inference.graft import (
    check_layout,
    check_model,
    prefix_entry,
    prefix_refusal,
    prefix_rows,
    read_entry_tensors,
)
from kvgraft.inference.models import LoadedModel
from kvgraft.inference.runtime import Schedule, every_position_layers, layer_map, new_cache, prefill
from kvgraft.recompute import audit as recompute
from kvgraft.recompute.compare import diff_tensors
from kvgraft.recompute.noise import NoiseBound, calibrate, judge, worst
from kvgraft.release.models import Entry, ScheduleRecord, as_json
from kvgraft.results import recompute as res
from kvgraft.results.base import JsonObject
from kvgraft.signing.verify import VerifiedRelease

if TYPE_CHECKING:
    from kvgraft.execution.executor import Executor
    from kvgraft.execution.journal import Journal, Unit


def _compare(rows: dict[str, torch.Tensor], fresh: dict[str, torch.Tensor], n: int,
             bound: Callable[[], NoiseBound]) -> res.PrefixComparison:
    """Rows [0, n) against fresh tensors' rows [0, n): bit for bit, then (on a difference) by the noise bound."""
    first: str | None = None
    first_outside: str | None = None
    worst_abs, differing, outside, max_excess = 0.0, 0, 0, 0.0
    for name in sorted(rows, key=lambda s: (int(s.split(".")[1]), s)):
        f = fresh[name][:, :, :n, :]
        d = diff_tensors(rows[name].contiguous(), f.contiguous())
        if d.equal:
            continue
        first = first or name
        worst_abs = max(worst_abs, d.max_abs)
        differing += d.differing
        j = judge(rows[name], f, bound().allowed(name, fresh[name])[:, :, :n, :])
        outside += j.outside
        max_excess = max(max_excess, j.max_excess)
        if j.outside and first_outside is None:
            first_outside = name
    return res.PrefixComparison(verdict=_comparison_verdict(first, outside), byte_exact=first is None,
                                first_differing_tensor=first, max_abs_diff=worst_abs, differing_elements=differing,
                                outside=outside, max_excess=max_excess, first_outside_tensor=first_outside)


def _comparison_verdict(first_differing: str | None, outside: int) -> res.Verdict:
    return "byte-exact" if first_differing is None else "consistent" if outside == 0 else "inconsistent"


def graft_verdict(under: res.PrefixComparison, against: res.PrefixComparison) -> res.Verdict:
    """The graft's verdict from its two comparisons: the recorded schedule's is its claim; a difference from
    the prefix alone inside that noise bound is the schedule's, one outside it is not the prefix's computation.
    The same function judges a fresh graft and re-judges one read back from a journal."""
    return worst([under.verdict, "inconsistent" if against.verdict == "inconsistent" else "byte-exact"])


def judge_prefix(checked: VerifiedRelease, entry: Entry, n: int, lm: LoadedModel,
                 schedule: Schedule | None = None) -> res.PrefixGraft:
    """Judge a graft of `entry`'s first n tokens (module docstring), under the conditions in force.

    `schedule`: the prefill schedule to recompute with (default: the recorded one).
    """
    rel = checked.release
    check_layout(lm, entry, str(rel.root))
    stored, _ = read_entry_tensors(checked, entry)
    _, rows = prefix_entry(entry, stored, n, str(rel.root))
    recorded_schedule = rel.manifest["schedule"]
    schedule = schedule or Schedule.from_dict(recorded_schedule)
    ids = [int(t) for t in entry["token_ids"]]
    every = every_position_layers(entry)  # sliding layers stored in full are recomputed in full
    with torch.no_grad():
        whole, _ = prefill(lm, ids, schedule, new_cache(lm, every))
        _, fresh_whole = layer_map(lm, whole)
        alone, _ = prefill(lm, ids[:n], schedule, new_cache(lm, every))
        _, fresh_alone = layer_map(lm, alone)
    bounds: dict[str, NoiseBound] = {}

    def measured(key: str, tokens: list[int], reference: dict[str, torch.Tensor]) -> Callable[[], NoiseBound]:
        def get() -> NoiseBound:  # measured only when some row differs
            if key not in bounds:
                bounds[key] = calibrate(lm, tokens, schedule, reference, every=every)
            return bounds[key]
        return get

    under = _compare(rows, fresh_whole, n, measured("whole", ids, fresh_whole))
    against = _compare(rows, fresh_alone, n, measured("alone", ids[:n], fresh_alone))
    verdict = graft_verdict(under, against)
    return res.PrefixGraft(
        entry=entry["id"], tokens=n, of=entry["num_tokens"], schedule=as_json(recorded_schedule.copy()),
        rows=prefix_rows(recorded_schedule, n, int(entry["num_tokens"])), sliding_layers_every_position=sorted(every),
        verdict=verdict, byte_exact=under.byte_exact, under_recorded_schedule=under, against_prefix_alone=against,
        noise_bounds={k: e.record() for k, e in bounds.items()})


def prefix_unit(lm: LoadedModel, checked: VerifiedRelease, entry: Entry, *, tokens: int,
                schedule: Schedule | None = None) -> JsonObject:
    """`judge_prefix` as an executor work unit (kvgraft.execution.executor): (model, verified release, entry) → its
    result as JSON (an executor adds its placement, a journal records it, Ray ships it)."""
    return judge_prefix(checked, entry, tokens, lm, schedule).model_dump(exclude_unset=True)


def check_tokens(tokens: int) -> None:
    if tokens < 1:
        raise InputError(f"--prefix {tokens}: a prefix graft has at least one token")


def audit_prefix(checked: VerifiedRelease, entry_id: str, n: int, lm: LoadedModel, *,
                 force: bool = False) -> dict[str, JsonValue]:
    """Judge a graft of entry `entry_id`'s first n tokens under the recorded conditions (module docstring), as JSON,
    with whether the model was forced."""
    forced = check_model(checked, lm, force=force)
    entry = checked.release.entry(entry_id)
    with reapply.applied(lm, checked.manifest["environment"], {}):
        result = judge_prefix(checked, entry, n, lm)
    return {**result.model_dump(exclude_unset=True), "forced_model": forced}


def unit_id(tokens: int, entry_id: str) -> Unit:
    """A prefix graft's unit in an audit's journal: a list, which no entry id (a string) can equal."""
    return ("prefix", tokens, entry_id)


def resumed_problem(entry: Entry, tokens: int, schedule: ScheduleRecord, result: JsonValue) -> str | None:
    """Why `result`, read back from a journal, cannot stand for the graft of `entry`'s first `tokens` tokens
    (None: it can). As recompute.audit.resumed_problem: a whole graft result (the schema), of this entry,
    these tokens and this recorded schedule, whose verdicts are the ones its own comparisons give."""
    from kvgraft.errors import SchemaError
    from kvgraft.schema import validate_part

    try:
        validate_part(result, "recompute-result.v1.json", "$defs/PrefixGraft", "result")
    except SchemaError as exc:
        return str(exc)
    got = res.PrefixGraft.model_validate(result)
    if (got.entry, got.tokens, got.of) != (entry["id"], tokens, entry["num_tokens"]):
        return f"graft of {got.tokens} of {got.entry!r}'s {got.of} tokens, not of this entry's first {tokens}"
    if got.schedule != schedule or got.rows != prefix_rows(schedule, tokens, int(entry["num_tokens"])):
        return "its schedule or rows are not the recorded ones"
    if got.sliding_layers_every_position != sorted(every_position_layers(entry)):
        return "its sliding layers are not the entry's"
    for part, c in (("under_recorded_schedule", got.under_recorded_schedule),
                    ("against_prefix_alone", got.against_prefix_alone)):
        first, outside = c.first_differing_tensor, c.outside
        if (c.verdict != _comparison_verdict(first, outside) or c.byte_exact != (first is None)
                or (c.first_outside_tensor is None) != (outside == 0)):
            return f"its {part} verdict ({c.verdict}) is not what its comparison gives"
    under = got.under_recorded_schedule
    if got.verdict != graft_verdict(under, got.against_prefix_alone) or got.byte_exact != under.byte_exact:
        return f"its verdict ({got.verdict}) is not what its comparisons give"
    return None


def prefix_grafts(checked: VerifiedRelease, lm: LoadedModel, ex: Executor, chosen: list[Entry], tokens: int,
                  schedule: Schedule | None, journal: Journal | None = None) -> res.PrefixGrafts:
    """Each chosen entry's prefix graft of `tokens` tokens judged (`judge_prefix`) on the executor; an
    entry no longer than that, or with a layer that does not hold every position, is listed as skipped.
    With `journal`, a graft it holds is read back, not judged again, and each one judged is recorded as it lands."""
    todo, skipped = [], []
    for e in chosen:
        why = f"{e['num_tokens']} tokens, not more than {tokens}" if int(e["num_tokens"]) <= tokens \
            else prefix_refusal(e)
        if why:
            skipped.append(res.Skipped(entry=e["id"], reason=why))
        else:
            todo.append(e)
    done = journal.done if journal is not None else {}
    fresh = [e for e in todo if unit_id(tokens, e["id"]) not in done]

    def landed(i: int, r: JsonObject) -> None:
        assert journal is not None
        journal.record(unit_id(tokens, fresh[i]["id"]), r)

    judged = ex.map(functools.partial(prefix_unit, tokens=tokens, schedule=schedule), checked, fresh, lm=lm,
                    labels=[str(e["id"]) for e in fresh],
                    on_result=landed if journal is not None else None) if fresh else []
    by_id = {str(e["id"]): res.PrefixGraft.model_validate(r) for e, r in zip(fresh, judged, strict=True)}
    for e in todo:
        if str(e["id"]) not in by_id:
            read = res.PrefixGraft.model_validate(done[unit_id(tokens, e["id"])])
            # judged by the interrupted run, read back
            by_id[str(e["id"])] = read.model_copy(update={"placement": {**(read.placement or {}), "resumed": True}})
    return res.PrefixGrafts(tokens=tokens, entries=[by_id[str(e["id"])] for e in todo], skipped=skipped)


def audit_result(checked: VerifiedRelease, lm: LoadedModel, *, prefix: int, executor: Executor | None = None,
                 overrides: JsonObject | None = None, schedule: Schedule | None = None,
                 **options: Any) -> res.RecomputeResult:
    """`kvgraft.recompute.audit` of the release, then a graft of each audited entry's first `prefix`
    tokens judged under the same conditions (`prefix_grafts` in the result); its verdicts count in the
    release's verdict and requirement. With `journal` (in `options`, recompute.audit's) the grafts are
    journaled with the entries. `options` are recompute.audit_result's."""
    from kvgraft.execution.executor import LocalExecutor

    check_tokens(prefix)
    recompute.check_requirement(options.get("require", "exact"))
    ex = executor or LocalExecutor()
    recorded = checked.manifest["schedule"]
    grafts = recompute.FollowUp(
        run={"prefix_tokens": prefix},
        unit=lambda e: unit_id(prefix, e["id"]),
        check=lambda e, r: resumed_problem(e, prefix, recorded, r),
        judge=lambda chosen, journal: prefix_grafts(checked, lm, ex, chosen, prefix, schedule, journal))
    # recompute.audit judges them under its conditions (reapply.applied), in its journal, and concludes with them.
    return recompute.audit_result(checked, lm, executor=ex, overrides=overrides, schedule=schedule, then=grafts,
                                  **options)


def audit(checked: VerifiedRelease, lm: LoadedModel, **options: Any) -> JsonObject:
    """`audit_result` (its options) as the JSON document its file holds."""
    return recompute.document(audit_result(checked, lm, **options))
