"""The recompute check: fresh KV states against the stored ones, per layer and per K/V tensor, with the noise bound,
the sample and its bound, and the prefix grafts; its result and its report data, typed.

The result's entries are open objects, as a journal reads them back (kvgraft.recompute.audit.resumed_problem
validates each against `EntryResult`'s part of the schema before trusting it). The report data takes any subset
of a result's members: a member that is present has the shape the renderers draw.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, JsonValue

from kvgraft.results.base import Closed, Count, Fraction, JsonObject, Open, Sha256, Typed, nullable
from kvgraft.results.stats import Draw
from kvgraft.results.verify import ReleaseSignature

Verdict = Literal["byte-exact", "consistent", "inconsistent"]
Require = Literal["exact", "consistent"]
# A non-finite value is written as a string: JSON has no infinity.
Infinity = Literal["Infinity"]
Real = float | Infinity
NonNegative = Annotated[float, Field(ge=0)] | Infinity
Value = float | Literal["Infinity", "-Infinity", "NaN"]
# A measure taken over values that may be non-finite: infinite, or NaN where it is undefined (|NaN - x|, a KL whose
# logits hold an infinity). Never -Infinity: each such measure is a magnitude or a divergence.
Measure = float | Literal["Infinity", "NaN"]


def largest(xs: Sequence[float]) -> float:
    """The largest of measures, a NaN above any number (max() keeps a NaN only when it comes first)."""
    return max(xs, key=lambda x: (math.isnan(x), 0.0 if math.isnan(x) else x))
Tensor = Literal["keys", "values"]


# --- one tensor, one layer -------------------------------------------------------------------------------------------


class WorstValues(Open):
    """The stored and fresh values of the element furthest outside the noise bound, their difference, and what
    the bound allowed there."""

    stored: Value
    fresh: Value
    abs_diff: Measure
    allowed: Real


class TensorDiff(Open):
    """Stored vs fresh states of one tensor (K or V of one layer), as kvgraft.recompute.compare.TensorDiff holds it;
    judged against the noise bound (outside .. worst_values) when they differ."""

    equal: bool
    sha256_fresh: str
    sha256_stored: str
    elements: Count
    differing: Count
    max_abs: Real
    max_ulp: Count = Field(description="Largest distance in units in the last place among the ulp_pairs differing "
                           "elements whose stored and fresh values are finite, normal and of the same sign (0 when "
                           "there are none): across zero or among subnormals a ULP count is no useful figure; max_abs "
                           "and max_rel hold for every element.")
    first: list[int] | None = Field(description="Index of the first differing element (batch, head, absolute "
                                    "position, dim).")
    shape_mismatch: str | None = nullable()
    max_rel: Annotated[float, Field(ge=0)] | None = Field(
        None, description="Largest |stored - fresh| / max(|stored|, |fresh|) over elements where both are finite and "
        "not both zero.")
    ulp_pairs: Count | None = Field(None, description="Differing elements max_ulp is taken over.")
    fraction: float
    outside: Count | None = None
    max_excess: Real | None = None
    worst: list[int] | None = nullable()
    first_outside: list[int] | None = nullable()
    worst_values: WorstValues | None = nullable()


class LayerResult(Open):
    """One layer's comparison: its K and V (a shared layer stores neither), or why its layout differs."""

    index: Count
    kind: str
    layout_mismatch: str | None = None
    keys: TensorDiff | None = None
    values: TensorDiff | None = None


class Distribution(Open):
    """Next-token distributions compared on probe positions (kvgraft.recompute.compare.distributions); a KL or logit
    difference over logits that hold a non-finite value is itself one."""

    kl_per_position: Sequence[Measure]
    kl_max: Measure
    kl_mean: Measure
    greedy_agreement: float
    topk: int
    topk_overlap_mean: float
    max_abs_logit_diff: Measure
    logits_equal: bool


class Where(Open):
    """An element of the entry outside the noise bound: its layer and tensor, and its place in the tensor."""

    layer: int
    tensor: Tensor
    batch: int | None = None
    head: int | None = None
    position: int | None = None
    dim: int | None = None


class Worst(Where):
    """The element furthest outside the noise bound, with its values."""

    stored: Value | None = None
    fresh: Value | None = None
    abs_diff: Measure | None = None
    allowed: Real | None = None
    excess: Real | None = None


class Outside(Open):
    """Where an entry lies outside the noise bound: counts, layers, layout and shape mismatches, first and worst."""

    elements: Count
    tensors: Count
    layers: list[int]
    layout: list[str]
    shape: list[str]
    first: Where | None = None
    worst: Worst | None = None


class Named(Open):
    batch: int
    head: int
    position: int
    dim: int


class FirstDifference(Open):
    """The first layer and tensor whose bytes differ, where, and by how much."""

    layer: int
    tensor: Tensor | None
    location: list[int] | None = None
    named: Named | None = nullable()
    max_ulp: Count | None = None
    max_abs: Real | None = None
    detail: str | None = nullable()


class Perturbation(Open):
    """One benign rerun of the noise bound's calibration (kvgraft.recompute.noise.perturbations)."""

    name: str
    seconds: float
    tensors_differing: Count
    max_abs: float


class NoiseBound(Open):
    """The noise bound an entry was judged against: FACTOR times the per-row noise of the benign reruns."""

    factor: float = Field(gt=0)
    perturbations: list[Perturbation]
    seconds: float
    reused: bool | None = None


class Seconds(Open):
    prefill: float
    compare: float
    noise_bound: float
    total: float


class EntryResult(Open):
    """One entry recomputed and compared: its verdict, its layers, and the next-token distributions on its probe."""

    id: str
    num_tokens: Count
    byte_exact: bool
    verdict: Verdict
    conditions_differ: list[str] | None = None
    outside: Outside | None
    noise_bound: NoiseBound | None
    max_excess: NonNegative = Field(description="Largest |stored - fresh| / allowed over all elements (0 when "
                                    "byte-exact; > 1 means outside the noise bound).")
    tensors_equal: Count
    tensors: Count
    next_token_logits_equal: bool
    first_difference: FirstDifference | None
    layers: list[LayerResult]
    probe_token_ids: list[int]
    matched: Distribution
    natural: Distribution
    seconds: Seconds
    placement: JsonObject | None = None


# --- the run: release, model, conditions, sample, bound, cost --------------------------------------------------------


class Release(Open):
    path: str
    root_digest: Sha256


class Model(Open):
    spec: str
    identity: JsonObject
    release_identity: str
    forced: bool


class Environment(Open):
    """The release's recorded environment, this run's, and how they differ (name: [recorded, current])."""

    recorded: JsonObject
    current: JsonObject
    differences: dict[str, list[JsonValue]]


class Overridden(Open):
    recorded: JsonValue
    used: JsonValue


class Conditions(Closed):
    """Which recorded conditions were replayed, which overridden (recorded, used), which could not be (recorded,
    current)."""

    replayed: list[str]
    overridden: dict[str, Overridden]
    not_replayed: dict[str, Annotated[list[JsonValue], Field(min_length=2, max_length=2)]]


class Sample(Draw):
    """The entries audited, drawn without replacement by kvgraft.sampling (method sha256-rank-v1): each entry at
    position i of the release's entry list gets the key SHA-256("kvgraft-sample-v1" 0x00 root_digest 0x00 nonce 0x00
    decimal(i)); the sample is the `size` entries with the smallest keys, in key order. Uniform over entries (not
    weighted by tokens). Re-derive with `kvgraft audit sample RELEASE --check RESULT.json`."""

    model_config = ConfigDict(extra="forbid")

    nonce: str = Field(pattern=r"^[\x21-\x7e]{1,256}$")
    nonce_source: Literal["given", "drawn", "journal"] = Field(
        description="given: the auditor's (--nonce or the plan); drawn: at random by this run; journal: read from the "
        "journal of an earlier run that this run resumed (cost.resumed_from names it): whoever wrote that file chose "
        "it.")


class Bound(Closed):
    """One-sided upper bound, at `confidence`, on how many entries of the whole release fail the requirement
    (`fail_means`), from `failing` of `sampled` judged entries out of `population`: the largest D with P(X <= failing)
    > 1 - confidence for X hypergeometric (population, D, sampled), computed exactly in integer arithmetic; the token
    bound adds the D - failing longest unsampled entries' tokens to the failing sampled ones. Present for a sample or
    the whole release; absent for entries named with --entry (a chosen subset bounds nothing)."""

    confidence: float
    failing: Count
    sampled: Count
    population: int = Field(ge=1)
    fail_means: Literal["not byte-exact", "inconsistent"]
    max_failing_entries: Count
    max_failing_fraction: Fraction
    method: str
    population_tokens: Count
    failing_sampled_tokens: Count
    max_failing_tokens: Count
    max_failing_token_fraction: Fraction
    token_method: str


class Cost(Open):
    """The cost ledger of this run: entries and tokens recomputed now (entries_resumed were read back from the journal
    of an interrupted run), wall time of the recomputation, tokens per second, and the projected time to recompute
    the whole release (library_tokens / tokens_per_second) on this executor. Timing: dropped by
    kvgraft.execution.executor.comparable."""

    entries_recomputed: Count
    entries_resumed: Count
    tokens_recomputed: Count
    tokens_resumed: Count
    wall_seconds: float
    tokens_per_second: float | None
    library_entries: Count
    library_tokens: Count
    projected_library_seconds: float | None
    prefix_grafts_resumed: Count | None = None
    resumed_from: str | None = nullable(description="The journal this run resumed (its results read back and "
                                        "re-judged from their recorded comparisons), or null when it resumed none.")
    executor: str
    workers: int = Field(ge=1)


# --- prefix grafts ---------------------------------------------------------------------------------------------------


class PrefixComparison(Open):
    """A prefix graft's rows against fresh ones: bit for bit, then (on a difference) by the noise bound."""

    verdict: Verdict
    byte_exact: bool
    first_differing_tensor: str | None
    max_abs_diff: NonNegative
    differing_elements: Count
    outside: Count
    max_excess: NonNegative
    first_outside_tensor: str | None = nullable()


class PrefixGraft(Open):
    """A graft of an entry's first `tokens` tokens, judged under the recorded schedule (its verdict) and against a
    prefill of the prefix alone."""

    entry: str
    tokens: int = Field(ge=1)
    of: int = Field(ge=1)
    schedule: JsonObject
    rows: str
    sliding_layers_every_position: list[int] | None = None
    verdict: Verdict
    byte_exact: bool
    under_recorded_schedule: PrefixComparison
    against_prefix_alone: PrefixComparison
    noise_bounds: dict[str, NoiseBound] | None = None
    placement: JsonObject | None = None


class Skipped(Open):
    entry: str
    reason: str


class PrefixGrafts(Closed):
    """With --prefix N: a graft of each audited entry's first N tokens (rows [0, N) of its recorded prefill of all its
    tokens), judged under that schedule (the verdict; it counts in the release's) and against a fresh prefill of the
    N tokens alone (byte-identical, inside that computation's noise bound, or outside it, which makes the verdict
    inconsistent)."""

    tokens: int = Field(ge=1)
    entries: list[PrefixGraft]
    skipped: list[Skipped]


class RecomputeResult(Closed):
    """Fresh KV states recomputed under a release's recorded schedule, compared per layer and per K/V tensor with the
    stored ones; KL(fresh || grafted) on probe positions under the matched schedule, and KL(natural || grafted)
    against a one-shot prefill of prefix + probe without any cache. KL values are float64 and not clamped: 0.0 means
    exactly zero. Each entry has a verdict: byte-exact (every SHA-256 equal), consistent (bytes differ, every element
    within FACTOR times the per-row noise measured on the auditing machine from benign reruns of the same entry:
    higher precision, the other attention kernel, another thread count, another chunking, a padded batch row), or
    inconsistent (some element outside, located). Recorded conditions are replayed unless overridden; `conditions`
    says which were replayed, overridden or could not be."""

    kind: Literal["kvgraft-recompute-result"]
    format_version: Literal[1]
    kvgraft_version: str
    release: Release
    model: Model
    schedule: JsonObject
    schedule_overridden: bool | None = None
    environment: Environment
    conditions: Conditions
    require: Require
    entries: list[EntryResult]
    cost: Cost | None = None
    prefix_grafts: PrefixGrafts | None = None
    executor: JsonObject | None = None
    all_byte_exact: bool
    verdict: Verdict
    passed: bool
    sample: Sample | None = None
    bound: Bound | None = None
    statements: list[str]
    release_signature: ReleaseSignature | None = None
    status: Literal["passed", "failed", "incomplete"] | None = Field(
        default=None, description="passed: the --require is met; failed: it is not (kvgraft/verdict.py maps it to the exit "
        "code).")


# --- what a report's check holds -------------------------------------------------------------------------------------


class TensorDiffData(Open):
    """Stored vs recomputed states of one tensor (K or V of one layer), as kvgraft.recompute.compare.TensorDiff
    writes it."""

    equal: bool = Field(description="The tensors' bytes are equal (same SHA-256).")
    elements: Count | None = Field(None, description="Elements compared.")
    differing: Count = Field(description="Elements whose bits differ; equal elements = elements - differing.")
    fraction: Fraction | None = None
    max_abs: NonNegative | None = Field(None, description="Largest absolute difference.")
    max_ulp: Count | None = nullable(description="Largest distance in units in the last place, among the ulp_pairs "
                                     "differing elements whose values are finite, normal and of the same sign "
                                     "(reports before ulp_pairs: among all).")
    max_rel: Annotated[float, Field(ge=0)] | None = Field(
        None, description="Largest |stored - fresh| / max(|stored|, |fresh|) over elements where both are finite and "
        "not both zero.")
    ulp_pairs: Count | None = Field(None, description="Differing elements max_ulp is taken over.")
    first: list[Count] | None = nullable(description="Index of the first differing element (batch, head, absolute "
                                         "position, dim), or null.")
    sha256_fresh: str | None = None
    sha256_stored: str | None = None
    shape_mismatch: str | None = nullable()


class LayerData(Open):
    index: Count
    kind: str | None = None
    keys: TensorDiffData | None = None
    values: TensorDiffData | None = None
    layout_mismatch: str | None = None


class FirstDifferenceData(Open):
    layer: Count | None = None
    tensor: str | None = nullable()
    location: list[Count] | None = nullable()
    detail: str | None = nullable()


class DistributionData(Open):
    """Next-token distributions compared on probe positions (kvgraft.recompute.compare.distributions); KL in float64,
    not clamped."""

    kl_max: Measure | None = None
    kl_mean: Measure | None = None
    kl_per_position: list[Measure] | None = None
    greedy_agreement: float | None = None
    logits_equal: bool | None = None
    max_abs_logit_diff: Measure | None = None


class EntryData(Open):
    id: str = Field(min_length=1)
    num_tokens: Count | None = None
    byte_exact: bool
    layers: list[LayerData]
    first_difference: FirstDifferenceData | None = nullable()
    matched: DistributionData | None = Field(None, description="Fresh prefill vs graft under the release schedule.")
    natural: DistributionData | None = Field(None, description="One-shot prefill of prefix + probe without a cache vs "
                                             "graft.")
    verdict: str | None = None
    max_excess: NonNegative | None = Field(None, description="Largest |stored - fresh| / allowed over all elements (0 "
                                           "when byte-exact; > 1 means outside the noise bound).")


class Current(Open):
    """kvgraft.inference.environment.record() of the run that recomputed."""

    device: str | None = nullable()
    device_name: str | None = nullable()
    dtype: str | None = nullable()
    attn_implementation: str | None = nullable()
    threads: int | None = nullable()


class EnvironmentData(Open):
    current: Current | None = None


class RecomputeData(Open):
    """The entries of a recompute result (schemas/recompute-result.v1.json) or a subset of its members; a member that
    is present has the shape the recompute result gives it, so that every member the renderers draw is there when its
    object is."""

    reference: str | None = Field(None, description="What the stored states were compared with.")
    all_byte_exact: bool | None = None
    statements: list[str] | None = None
    entries: list[EntryData]
    verdict: Verdict | None = None
    require: Require | None = None
    passed: bool | None = None
    sample: Sample | None = None
    bound: Bound | None = None
    cost: Cost | None = None
    conditions: Conditions | None = None
    environment: EnvironmentData | None = None


TYPED = Typed("recompute-result.v1.json", "kvgraft recompute audit result, version 1", RecomputeResult, RecomputeData)
