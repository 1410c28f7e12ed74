"""The numerical-noise bound of one computation, measured on this machine, and the three verdicts.

(Results, help and reports call it the noise bound too: JSON key `noise_bound`.)

Stored KV states that differ from a fresh recompute in bytes are either the same computation run with
other kernels (another CPU, thread count, chunking, attention kernel, engine) or a different one
(other weights, other tokens, altered values). To tell them apart the audit reruns the entry under
benign perturbations this machine can run and measures, per row (layer, tensor, batch, head,
position), how far each lands from the replayed recompute:

- the same computation at higher precision (float64 for float32 models, float32 for 16-bit ones):
  the rounding error of the replayed run itself, present in every element from layer 0 on; any other
  implementation of the same arithmetic sits within a small multiple of it;
- the other attention kernel, another thread count, another chunking, a padded batch row.

An element is outside the bound when |stored - fresh| > FACTOR * max(noise of its row, one ulp
of the row's largest value). `FACTOR` and its measurement are in docs/cross-machine.md: benign states
left out of the calibration lay up to 16x their row's noise on SmolLM2-135M (eager attention at 300
tokens); 64 leaves a margin of 4 for kernels this machine cannot run (another CPU), while a 1e-2
change of a typical element is still far outside (bench/RESULTS.md).
"""

from __future__ import annotations

import copy
import dataclasses
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from kvgraft._internal.cores import cores
from kvgraft.inference.models import LoadedModel
from kvgraft.inference.runtime import Schedule, attention, layer_map, new_cache, padded_batch_row, prefill, threads
from kvgraft.inference.tensors import tensor_sha256
from kvgraft.results import recompute as res

FACTOR = 64.0
VERDICTS: tuple[res.Verdict, ...] = ("byte-exact", "consistent", "inconsistent")
_HIGHER = {torch.float32: torch.float64, torch.bfloat16: torch.float32, torch.float16: torch.float32}
_COPIES: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def worst(verdicts: list[res.Verdict]) -> res.Verdict:
    """The release's verdict: the worst of its entries' ('byte-exact' for none)."""
    return max(verdicts, key=VERDICTS.index, default="byte-exact")


def _higher_precision(lm: LoadedModel) -> LoadedModel | None:
    """A copy of the model in the next wider float type, made once per model (None if there is none)."""
    param = next(lm.model.parameters())
    wider = _HIGHER.get(param.dtype)
    if wider is None:
        return None
    model = _COPIES.get(lm.model)
    if model is None:
        model = copy.deepcopy(lm.model)
        model.to(wider)  # type: ignore[arg-type]
        _COPIES[lm.model] = model
    if getattr(model.config, "_attn_implementation", lm.attn) != lm.attn:
        model.set_attn_implementation(lm.attn)
    return LoadedModel(lm.spec, model, lm.tokenizer, lm.device, str(wider).removeprefix("torch."), lm.attn,
                       lm._identity)


def perturbations(lm: LoadedModel, ids: list[int], schedule: Schedule, every: frozenset[int] = frozenset(),
                  ) -> list[tuple[str, Callable[[], dict[str, torch.Tensor]]]]:
    """The benign reruns this machine can do for one entry, each returning tensors named like the cache's
    (sliding layers in `every` with every position, as the entry stores them: runtime.new_cache)."""

    def run(model: LoadedModel, sched: Schedule) -> Callable[[], dict[str, torch.Tensor]]:
        return lambda: layer_map(model, prefill(model, ids, sched, new_cache(model, every))[0])[1]

    out: list[tuple[str, Callable[[], dict[str, torch.Tensor]]]] = []
    high = _higher_precision(lm)
    if high is not None:
        out.append((f"{high.dtype} (higher precision)", run(high, schedule)))
    other_attn = "eager" if lm.attn != "eager" else "sdpa"

    def with_attn() -> dict[str, torch.Tensor]:
        with attention(lm, other_attn):
            return run(lm, schedule)()

    out.append((f"{other_attn} attention", with_attn))
    if lm.torch_device.type == "cpu" and cores() > 1:
        n = torch.get_num_threads()
        other = 1 if n > 1 else 2

        def with_threads() -> dict[str, torch.Tensor]:
            with threads(other):
                return run(lm, schedule)()

        out.append((f"{other} thread{'s' if other > 1 else ''}", with_threads))
    if schedule.chunk_tokens is None:
        chunk = 64 if len(ids) > 64 else max(1, len(ids) // 2)
        if chunk < len(ids):
            out.append((f"chunks of {chunk}", run(lm, dataclasses.replace(schedule, chunk_tokens=chunk))))
    else:
        out.append(("one-shot", run(lm, dataclasses.replace(schedule, chunk_tokens=None))))
    out.append(("row 0 of a left-padded batch of 4", lambda: padded_batch_row(lm, ids, every=every)[0]))
    if lm.torch_device.type == "cuda":
        out.append(("reduced-precision matmul switched", lambda: _switched_matmul(lambda: run(lm, schedule)())))
    return out


def _switched_matmul(fn: Callable[[], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """On a GPU: TF32 matmuls for float32, or reduced-precision reductions for 16-bit, flipped for one run."""
    m = torch.backends.cuda.matmul
    saved = (m.allow_tf32, m.allow_bf16_reduced_precision_reduction, m.allow_fp16_reduced_precision_reduction)
    m.allow_tf32 = not saved[0]
    m.allow_bf16_reduced_precision_reduction = not saved[1]
    m.allow_fp16_reduced_precision_reduction = not saved[2]
    try:
        return fn()
    finally:
        m.allow_tf32, m.allow_bf16_reduced_precision_reduction, m.allow_fp16_reduced_precision_reduction = saved


@dataclass
class NoiseBound:
    """Per-row noise of a recompute: the largest benign difference of each row, per tensor."""

    noise: dict[str, torch.Tensor]  # name -> [batch, heads, positions, 1], float64
    runs: list[res.Perturbation] = field(default_factory=list)
    seconds: float = 0.0
    factor: float = FACTOR
    reused: bool = False  # measured earlier for the same computation: no cost this time

    def allowed(self, name: str, fresh: torch.Tensor) -> torch.Tensor:
        """The largest |stored - fresh| each element may have and still be the same computation."""
        scale = fresh.detach().double().abs().amax(-1, keepdim=True)
        ulp = scale * float(torch.finfo(fresh.dtype).eps)
        return self.factor * torch.maximum(self.noise[name].to(fresh.device), ulp)

    def record(self) -> res.NoiseBound:
        return res.NoiseBound(factor=self.factor, perturbations=self.runs, seconds=self.seconds, reused=self.reused)


def calibrate(lm: LoadedModel, ids: list[int], schedule: Schedule, reference: dict[str, torch.Tensor],
              only: set[str] | None = None, skip: set[str] | None = None,
              digests: dict[str, str] | None = None, every: frozenset[int] = frozenset()) -> NoiseBound:
    """Measure the noise bound of `reference` (the replayed recompute) from benign reruns of `ids`.

    Reused for the same model object, conditions, tokens, schedule and reference bytes (the same
    computation gives the same bound; entries of the same length but other tokens do not, since
    the noise is per row). `only`/`skip` choose perturbations by name (leave-one-out studies).
    `digests`: the reference tensors' SHA-256 by name, when the caller hashed them already. `every`:
    the sliding layers the reference holds with every position (`perturbations`).
    """
    digests = digests if digests is not None else {}
    key = (lm.attn, lm.dtype, torch.get_num_threads(), torch.are_deterministic_algorithms_enabled(), tuple(ids),
           schedule, every, None if only is None else frozenset(only), None if skip is None else frozenset(skip),
           tuple((name, digests.get(name) or tensor_sha256(t)) for name, t in reference.items()))
    memo = _MEMO.setdefault(lm.model, {})
    if key not in memo:
        if len(memo) >= 8:
            memo.pop(next(iter(memo)))
        memo[key] = _measure(lm, ids, schedule, reference, only, skip, every)
        return memo[key]
    return dataclasses.replace(memo[key], seconds=0.0, reused=True)


_MEMO: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], NoiseBound]] = weakref.WeakKeyDictionary()


def _measure(lm: LoadedModel, ids: list[int], schedule: Schedule, reference: dict[str, torch.Tensor],
             only: set[str] | None, skip: set[str] | None, every: frozenset[int] = frozenset()) -> NoiseBound:
    t0 = time.perf_counter()
    noise = {name: torch.zeros((*t.shape[:-1], 1), dtype=torch.float64) for name, t in reference.items()}
    runs: list[res.Perturbation] = []
    for label, rerun in perturbations(lm, ids, schedule, every):
        if (only is not None and label not in only) or (skip is not None and label in skip):
            continue
        t = time.perf_counter()
        got = rerun()
        differing, max_abs = 0, 0.0
        for name, ref in reference.items():
            other = got[name].to(ref.device)
            if other.shape != ref.shape:
                raise ValueError(f"perturbation {label!r} gave {name} of shape {list(other.shape)}, "
                                 f"expected {list(ref.shape)}")
            d = (other.double() - ref.double()).abs().amax(-1, keepdim=True).cpu()
            d = torch.nan_to_num(d, nan=0.0, posinf=0.0)  # a benign run that overflows says nothing
            torch.maximum(noise[name], d, out=noise[name])
            differing += int(bool((d > 0).any()))
            max_abs = max(max_abs, float(d.max()))
        del got
        runs.append(res.Perturbation(name=label, seconds=time.perf_counter() - t, tensors_differing=differing,
                                     max_abs=max_abs))
    return NoiseBound(noise, runs, time.perf_counter() - t0)


@dataclass
class Judgement:
    """How far one stored tensor lies from the fresh one, measured in noise bounds."""

    outside: int
    max_excess: float
    worst: list[int] | None  # (batch, head, position, dim) of the largest excess
    first: list[int] | None  # the first element outside, in C order
    worst_values: dict[str, float] | None


def judge(stored: torch.Tensor, fresh: torch.Tensor, allowed: torch.Tensor) -> Judgement:
    """Elements outside the bound; a non-finite stored value where the fresh one is finite is outside."""
    s, f = stored.double(), fresh.double().to(stored.device)
    diff = (s - f).abs()
    bad = ~torch.isfinite(s) & torch.isfinite(f)
    excess = torch.where(bad, torch.full_like(diff, float("inf")), diff / allowed.to(diff.device))
    # NaN where both are NaN: same computation. posinf stated: the default would write 1.797e308.
    excess = torch.nan_to_num(excess, nan=0.0, posinf=float("inf"))
    outside_mask = excess > 1.0
    outside = int(outside_mask.sum())
    flat = excess.reshape(-1)
    at = int(torch.argmax(flat))
    max_excess = float(flat[at])
    if max_excess == 0.0:
        return Judgement(0, 0.0, None, None, None)
    import numpy as np

    shape = tuple(stored.shape)
    where = [int(i) for i in np.unravel_index(at, shape)]
    first = None
    if outside:
        first = [int(i) for i in np.unravel_index(int(torch.nonzero(outside_mask.reshape(-1))[0, 0]), shape)]
    values = {"stored": float(s.reshape(-1)[at]), "fresh": float(f.reshape(-1)[at]),
              "abs_diff": float(diff.reshape(-1)[at]), "allowed": float(allowed.expand_as(diff).reshape(-1)[at])}
    return Judgement(outside, max_excess, where, first, values)
