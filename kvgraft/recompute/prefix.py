"""The recompute audit of a prefix graft: its rows against their own schedule and against the prefix alone.

A prefix graft of n tokens (kvgraft.inference.graft.restore_prefix, `kvgraft run --prefix`, the vLLM connector)
is rows [0, n) of the entry's recorded prefill of all T tokens. Kernel blocking can depend on T
(bench/prefix_schedule.py measures it), so the audit judges those rows twice, on this machine, under
the recorded conditions:

- under the schedule that made them: rows [0, n) of a fresh prefill of the T tokens: byte-exact
  where they are bit for bit, else judged against the noise envelope of that computation
  (kvgraft.recompute.noise): consistent or inconsistent. This is the graft's claim, and its verdict;
- against a fresh prefill of the n tokens alone, what a prefix graft stands in for: byte-exact
  where the schedule makes them byte-identical, else judged against the envelope of the n-token
  computation. A difference inside it is the schedule's and is recorded, not a failure; one outside
  it makes the verdict inconsistent (the rows are not the prefix's computation).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from kvgraft.errors import InputError
from kvgraft.inference import reapply
from kvgraft.inference.graft import check_model, prefix_entry, prefix_refusal, prefix_rows, read_entry_tensors
from kvgraft.inference.models import LoadedModel
from kvgraft.inference.runtime import Schedule, every_position_layers, layer_map, new_cache, prefill
from kvgraft.recompute import audit as recompute
from kvgraft.recompute.compare import diff_tensors
from kvgraft.recompute.noise import NoiseBound, calibrate, judge, worst
from kvgraft.release.format import Release
from kvgraft.signing.policy import VerifyPolicy
from kvgraft.signing.verify import VerifiedRelease, verified

if TYPE_CHECKING:
    from kvgraft.execution.executor import Executor


def _compare(rows: dict[str, torch.Tensor], fresh: dict[str, torch.Tensor], n: int,
             envelope: Callable[[], NoiseBound]) -> dict[str, Any]:
    """Rows [0, n) against fresh tensors' rows [0, n): bit for bit, then (on a difference) by envelope."""
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
        j = judge(rows[name], f, envelope().allowed(name, fresh[name])[:, :, :n, :])
        outside += j.outside
        max_excess = max(max_excess, j.max_excess)
        if j.outside and first_outside is None:
            first_outside = name
    verdict = "byte-exact" if first is None else "consistent" if outside == 0 else "inconsistent"
    return {"verdict": verdict, "byte_exact": first is None, "first_differing_tensor": first,
            "max_abs_diff": worst_abs, "differing_elements": differing, "outside": outside,
            "max_excess": max_excess, "first_outside_tensor": first_outside}


def judge_prefix(rel: Release, entry: dict[str, Any], n: int, lm: LoadedModel,
                 schedule: Schedule | None = None) -> dict[str, Any]:
    """Judge a graft of `entry`'s first n tokens (module docstring), under the conditions in force.

    `schedule`: the prefill schedule to recompute with (default: the recorded one).
    """
    stored, _ = read_entry_tensors(rel, entry)
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
    envelopes: dict[str, NoiseBound] = {}

    def measured(key: str, tokens: list[int], reference: dict[str, torch.Tensor]) -> Callable[[], NoiseBound]:
        def get() -> NoiseBound:  # measured only when some row differs
            if key not in envelopes:
                envelopes[key] = calibrate(lm, tokens, schedule, reference, every=every)
            return envelopes[key]
        return get

    under = _compare(rows, fresh_whole, n, measured("whole", ids, fresh_whole))
    against = _compare(rows, fresh_alone, n, measured("alone", ids[:n], fresh_alone))
    # The graft's claim is the recorded schedule's; a difference from the prefix alone inside its
    # envelope is the schedule's, one outside it is not the prefix's computation.
    verdict = worst([under["verdict"], "inconsistent" if against["verdict"] == "inconsistent" else "byte-exact"])
    return {
        "entry": entry["id"], "tokens": n, "of": entry["num_tokens"], "schedule": dict(recorded_schedule),
        "rows": prefix_rows(recorded_schedule, n, int(entry["num_tokens"])),
        "sliding_layers_every_position": sorted(every),
        "verdict": verdict, "byte_exact": under["byte_exact"],
        "under_recorded_schedule": under,
        "against_prefix_alone": against,
        "envelopes": {k: e.as_dict() for k, e in envelopes.items()},
    }


def prefix_unit(lm: LoadedModel, rel: Release, entry: dict[str, Any], *, tokens: int,
                schedule: Schedule | None = None) -> dict[str, Any]:
    """`judge_prefix` as an executor work unit (kvgraft.execution.executor): (model, release, entry) → result."""
    return judge_prefix(rel, entry, tokens, lm, schedule)


def check_tokens(tokens: int) -> None:
    if tokens < 1:
        raise InputError(f"--prefix {tokens}: a prefix graft has at least one token")


def audit_prefix(release: VerifiedRelease | Release | Path | str, entry_id: str, n: int, lm: LoadedModel, *,
                 force: bool = False, policy: VerifyPolicy | None = None) -> dict[str, Any]:
    """Judge a graft of entry `entry_id`'s first n tokens under the recorded conditions (module docstring)."""
    rel = verified(release, policy).release
    forced = check_model(rel, lm, force=force)
    entry = rel.entry(entry_id)
    with reapply.applied(lm, rel.manifest["environment"], {}):
        result = judge_prefix(rel, entry, n, lm)
    return {**result, "forced_model": forced}


def prefix_grafts(rel: Release, lm: LoadedModel, ex: Executor, chosen: list[dict[str, Any]], tokens: int,
                  schedule: Schedule | None) -> dict[str, Any]:
    """Each chosen entry's prefix graft of `tokens` tokens judged (`judge_prefix`) on the executor; an
    entry no longer than that, or with a layer that does not hold every position, is listed as skipped."""
    todo, skipped = [], []
    for e in chosen:
        why = f"{e['num_tokens']} tokens, not more than {tokens}" if int(e["num_tokens"]) <= tokens \
            else prefix_refusal(e)
        if why:
            skipped.append({"entry": e["id"], "reason": why})
        else:
            todo.append(e)
    judged = ex.map(functools.partial(prefix_unit, tokens=tokens, schedule=schedule), rel, todo, lm=lm,
                    labels=[str(e["id"]) for e in todo]) if todo else []
    return {"tokens": tokens, "entries": judged, "skipped": skipped}


def audit(release: VerifiedRelease | Release | Path | str, lm: LoadedModel, *, prefix: int, executor: Executor | None = None,
          overrides: dict[str, Any] | None = None, schedule: Schedule | None = None,
          policy: VerifyPolicy | None = None, **options: Any) -> dict[str, Any]:
    """`kvgraft.recompute.audit` of the release, then a graft of each audited entry's first `prefix`
    tokens judged under the same conditions (`prefix_grafts` in the result); its verdicts count in the
    release's verdict and requirement. `options` are recompute.audit's."""
    from kvgraft.execution.executor import LocalExecutor

    check_tokens(prefix)
    recompute.check_requirement(options.get("require", "exact"))
    checked = verified(release, policy)
    rel = checked.release
    ex = executor or LocalExecutor()
    result = recompute.audit(checked, lm, executor=ex, overrides=overrides, schedule=schedule, **options)
    chosen = [rel.entry(str(e["id"])) for e in result["entries"]]
    with reapply.applied(lm, rel.manifest["environment"], dict(overrides or {})):
        result["prefix_grafts"] = prefix_grafts(rel, lm, ex, chosen, prefix, schedule)
    recompute.conclude(result)
    result["statements"] = recompute.statements(result)
    return result
