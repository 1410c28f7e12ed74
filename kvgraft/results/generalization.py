"""The generalization audit: does grafting a solved problem's solution help on problems it does not solve?

The result (kvgraft.generalization.audit.aggregate) and a report's short form of it. Inner objects are open, as
the schema always left them: a reader ignores a member it does not know.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, JsonValue, WithJsonSchema

from kvgraft.results.base import Closed, JsonObject, Open, Typed, nullable
from kvgraft.results.stats import Count, Fraction
from kvgraft.results.verify import ReleaseSignature

FILE = "generalization-result.v1.json"
RESULT_KIND = "kvgraft-generalization-result"
SHA256 = r"^[0-9a-f]{64}$"
MAX_PREAMBLE = 16_384  # characters: a few worked examples, not a library

Status = Literal["passed", "failed", "incomplete"]
ConditionName = Literal["none", "own", "other", "own_text", "other_text"]
Group = Literal["library", "held_out", "synthetic"]
Digest = Annotated[str, Field(pattern=SHA256)]
Interval = Annotated[list[Fraction], Field(min_length=2, max_length=2)]
Ratio = Annotated[float, Field(ge=0)] | None
Seconds = Annotated[float, Field(ge=0)]
Bytes = Annotated[int, Field(ge=0)] | None
EnergyMethod = Literal["rapl", "nvml", "estimate"]


# ---------------------------------------------------------------- one run


class Accuracy(Open):
    """k of n with its Wilson 95% interval (accuracy null when n is 0)."""

    k: Count
    n: Count
    accuracy: Fraction | None
    interval: Interval


class Selection(Open):
    """How the grafted entry was chosen (kvgraft.generalization.selection): the best and second best candidates,
    the entries excluded as the query's own, and for the own entry what it matched by."""

    policy: str
    id: str | None
    score: float | None
    runner_up_id: str | None = nullable()
    runner_up_score: float | None = nullable()
    excluded: list[str] | None = None
    candidates: Count | None = None
    matched_by: Literal["problem_id", "problem_hash"] | None = None


class RunLeakage(Open):
    """kvgraft.generalization.leakage: what of the query the grafted entry's text holds."""

    answer_in_entry: bool
    problem_in_entry: bool
    solution_in_entry: bool
    contaminated: bool
    problem_ngrams: Count | None = None
    solution_ngrams: Count | None = None
    problem_n: Count | None = None
    solution_n: Count | None = None
    text_overlap: bool | None = None


class Sample(Open):
    token_ids: list[Count]
    text: str
    extracted: str | None
    correct: bool
    stop: Literal["eos", "answer", "max_new_tokens"]
    decode_tokens: Count
    seconds: Seconds | None = None


class Tokens(Open):
    decode: Count
    prompt: Count
    prefill: Count
    restored: Count
    prefix: Count
    attended_max: Count
    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, Count] = Field(init=False)


class RunSeconds(Open):
    restore: Seconds
    prefill: Seconds
    decode: Seconds
    total: Seconds
    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, Seconds] = Field(init=False)


class RunEnergy(Open):
    joules: Seconds
    method: EnergyMethod
    is_estimate: bool


class Memory(Open):
    peak_rss_bytes: Bytes
    rss_before_bytes: Bytes
    note: str | None


class Run(Open):
    """One (query, condition) run (kvgraft.generalization.audit.run_query)."""

    query_id: str
    group: Group
    condition: ConditionName
    entry_id: str | None
    entry_problem_id: str | None = nullable()
    selection: Selection | None
    gold: str
    samples: Annotated[list[Sample], Field(min_length=1)]
    correct: bool
    n_correct: Count
    n_samples: Annotated[int, Field(ge=1)]
    tokens: Tokens
    kv_bytes_restored: Count
    upstream_tokens: Count
    upstream_tokens_all: Count | None = None
    seconds: RunSeconds
    energy: RunEnergy
    memory: Memory
    leakage: RunLeakage | None
    placement: JsonObject | None = Field(None, description="Where the run ran (kvgraft.execution.records.Placement).")


# ---------------------------------------------------------------- the aggregate


class Model(Open):
    """The model the audit ran, and where and how it ran."""

    spec: str
    identity: Digest
    release_identity: Digest
    forced: bool
    device: str | None = None
    dtype: str | None = None
    attn: str | None = None
    executor: JsonObject | None = None
    threads: int | None = None
    omp_wait_policy: str | None = nullable()


class Library(Open):
    path: str
    root_digest: Digest
    entries: Count
    entry_tokens: Count
    missing: list[str] = Field(description="Library-split problems without a solved trace in the library.")


class QueryCounts(Open):
    library: Count
    held_out: Count
    synthetic: Count
    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, Count] = Field(init=False)


class PlanSource(Open):
    """kvgraft.generalization.library.load_problems' record of the problems' source."""

    source: str
    limit: Count | None
    synthetic_seed: int | None = None
    synthetic_version: int | None = None
    seed: int | None = None


class PlanSplit(Open):
    """kvgraft.generalization.problems.split's record of the split."""

    method: str
    salt: str
    library_fraction: Fraction
    n: Count
    library_ids: list[str]
    held_out_ids: list[str]
    problems_digest: Digest
    duplicates_across_split: list[list[str]]


class PlanSynthetic(Open):
    n: Count
    seed: int


class Plan(Open):
    source: PlanSource | None
    split: PlanSplit | None
    synthetic: PlanSynthetic | None
    queries: QueryCounts
    conditions: list[ConditionName]
    runs: Count


class Settings(Open):
    max_new_tokens: Annotated[int, Field(ge=1)]
    samples: Annotated[int, Field(ge=1)]
    temperature: Annotated[float, Field(ge=0)]
    seed: JsonValue
    policy: Literal["none", "exact", "nearest", "bm25"]
    decoding: JsonValue
    preamble: Annotated[str, Field(max_length=MAX_PREAMBLE)] | None = Field(
        None, description="Text put before every query in every condition alike.")
    stop_at_answer: bool | None = None
    force: bool | None = None
    budget: Annotated[int, Field(ge=1)] | None = nullable(description="Decode tokens per query and sample; null: "
                                                          "condition a's on the same query.")
    track_memory: bool | None = None
    n_boot: Annotated[int, Field(ge=1)] | None = None
    text_conditions: bool | None = None
    conditions: list[ConditionName] | None = None


class ConditionAccuracy(Accuracy):
    """One condition's accuracy, overall and per query group, with pass@k over its samples."""

    condition: ConditionName
    label: str
    pass_at_1_mean: Fraction | None
    pass_at_k: dict[str, Fraction]
    groups: dict[Group, Accuracy]


class McNemar(Open):
    """kvgraft.generalization.stats.mcnemar: the exact paired test on the discordant queries (b: right under a only,
    c: right under b only)."""

    n: Count
    correct_a: Count
    correct_b: Count
    b: Count
    c: Count
    p_exact: Fraction
    p_midp: Fraction
    alpha: float
    significant: bool
    verdict: str
    difference: float | None = None


class Bootstrap(Open):
    difference: JsonValue
    lo: JsonValue
    hi: JsonValue
    confidence: JsonValue
    n_boot: JsonValue
    seed: JsonValue
    n: Count | None = None
    discordant: Count | None = None
    note: str | None = None
    method: str | None = None
    excludes_zero: bool | None = None


class Power(Open):
    """kvgraft.generalization.stats.detectable_effect: the smallest difference a test at n could find."""

    n: Count
    alpha: float
    power: float
    min_discordant: int | None
    min_significant: float | None
    effect: float | None
    method: str | None = None


class Comparison(Open):
    name: str
    a: ConditionName
    b: ConditionName
    scope: str
    query_ids: list[str]
    n: Count
    mcnemar: McNemar
    bootstrap: Bootstrap | None
    significant: bool
    detectable: Power | None = Field(
        None, description="Smallest difference the exact McNemar test detects on these n queries "
        "(kvgraft.generalization.stats.detectable_effect): a non-significant result excludes only effects at least "
        "this large.")
    verdict: str


class Mismatch(Open):
    query_id: JsonValue
    sample: JsonValue
    first_difference: JsonValue


class Equality(Open):
    graft: ConditionName
    text: ConditionName
    n: Count
    equal: Count
    mismatches: list[Mismatch]


class SplitPart(Accuracy):
    baseline: Accuracy
    query_ids: list[str]


class Flags(Open):
    answer_in_entry: Count
    problem_in_entry: Count
    solution_in_entry: Count
    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, Count] = Field(init=False)


class Split(Open):
    clean: SplitPart
    contaminated: SplitPart
    flags: Flags


class Leakage(Open):
    method: str
    by_condition: dict[str, Split]


class PerQuery(Open):
    """The condition's totals divided by its runs (null for a condition with none)."""

    decode_tokens: float | None
    prefill_tokens: float | None
    restored_tokens: float | None
    kv_bytes_restored: float | None
    restore_seconds: float | None
    prefill_seconds: float | None
    decode_seconds: float | None
    energy_joules: float | None
    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, float | None] = Field(init=False)


class ConditionLedger(Open):
    queries: JsonValue
    decode_tokens: JsonValue
    prefill_tokens: JsonValue
    restored_tokens: JsonValue
    kv_bytes_restored: JsonValue
    upstream_tokens_attributed: JsonValue
    seconds: JsonValue
    restore_seconds: float | None = None
    prefill_seconds: float | None = None
    decode_seconds: float | None = None
    energy_joules: JsonValue
    per_query: PerQuery = Field(description="The condition's totals divided by its runs (null for a condition with "
                                "none).")
    budget_tokens: JsonValue
    decode_vs_budget: Ratio
    with_upstream_attributed: Ratio
    with_upstream_amortized: Ratio


class LibraryLedger(Open):
    entries: JsonValue
    entry_tokens: JsonValue
    upstream_tokens: JsonValue
    upstream_tokens_all: JsonValue
    generated_tokens: JsonValue
    failed_attempts: JsonValue
    reference_traces: JsonValue
    model_traces: JsonValue
    upstream_seconds: JsonValue
    upstream_energy_joules: JsonValue
    queries_served: JsonValue
    amortized_upstream_tokens_per_query: JsonValue


class Budget(Open):
    source: JsonValue
    per_query: JsonValue


class Ledger(Open):
    per_condition: dict[str, ConditionLedger]
    library: LibraryLedger
    budget: Budget
    definitions: dict[str, str]


class Context(Open):
    library_tokens: JsonValue
    largest_prefix_tokens: JsonValue
    attended_at_once_max: JsonValue
    attended_at_once_max_all: Count | None = Field(None, description="As attended_at_once_max, over every run (no "
                                                   "graft included).")
    model_context_tokens: Annotated[int, Field(ge=1)] | None
    attended_fits_context: bool | None
    library_fits_context: bool | None
    peak_rss_bytes_grafted: Bytes
    rss_before_bytes_min: Bytes
    memory_method: JsonValue


class Energy(Open):
    method: EnergyMethod
    joules: JsonValue
    seconds: JsonValue
    is_estimate: bool
    constants: JsonObject
    note: str
    device: str | None = None
    domains: dict[str, float] | None = None
    watts: float | None = None


class Query(Open):
    id: str
    group: Group
    source: str | None = None
    problem_hash: Digest
    gold: JsonValue




class GeneralizationResult(Closed):
    """Replay vs generalization of KV-cache grafting. Conditions on the same queries with the same decoding: none (a,
    no graft), own (b, graft of the query's own solution), other (c, graft of the nearest other library entry; the
    query's own problem excluded by id and by hash), own_text / other_text (d, the grafted entry's tokens as plain
    prompt tokens: a fresh prefill under the release's recorded schedule, which must reproduce the graft's output
    tokens). Accuracy with Wilson 95% intervals, paired exact McNemar tests (mid-p and a paired bootstrap secondary),
    a clean/contaminated split by the leakage audit, a token/energy ledger and context accounting. Energy may be an
    estimate: energy.is_estimate says so."""

    status: Status | None = Field(None, description="This result's own verdict (kvgraft.verdict): it decides the exit "
                                  "code of the single-audit command and the check's status in `audit run`.")
    kind: Literal["kvgraft-generalization-result"]
    format_version: Literal[1]
    kvgraft_version: str
    created: str
    model: Model
    library: Library
    plan: Plan
    settings: Settings
    schedule: JsonObject
    conditions: list[ConditionAccuracy]
    comparisons: list[Comparison]
    equality: dict[Literal["own", "other"], Equality]
    leakage: Leakage
    ledger: Ledger
    context: Context
    energy: Energy | None
    seconds: Seconds | None = nullable()
    queries: list[Query]
    runs: list[Run]
    release_signature: ReleaseSignature | None = Field(
        None, description="What was checked of the library's signature before it was read (as an audit report's "
        "release_signature).")
    statements: list[str]


# ---------------------------------------------------------------- a report's short form


class NamedAccuracy(Open):
    """k of n under a named condition, with its Wilson interval when the producer wrote it."""

    name: Annotated[str, Field(min_length=1)]
    k: Count
    n: Annotated[int, Field(ge=1)]
    interval: Interval | None = Field(None, description="Wilson score interval of k/n.")
    confidence: Annotated[float, Field(gt=0, lt=1)] | None = None


class Benchmark(Open):
    name: str | None = None
    size: Annotated[int, Field(ge=1)] | None = None


class McNemarRow(Open):
    a: str
    b: str
    a_only: Count = Field(description="Problems solved under a but not b.")
    b_only: Count = Field(description="Problems solved under b but not a.")
    p_value: Fraction
    method: str | None = None


class AccuracySplit(Open):
    """Accuracy per condition on the problems that are clean (no stored solution of them or a near copy) and
    contaminated."""

    clean: list[NamedAccuracy] | None = None
    contaminated: list[NamedAccuracy] | None = None


class ResultFace(Open):
    """What a report's face reads of the whole result it holds under `result`."""

    kind: Literal["kvgraft-generalization-result"]
    equality: dict[Literal["own", "other"], Equality] | None = None
    comparisons: list[Comparison] | None = None
    leakage: Leakage | None = None


# The report schema names the whole result's kind only; kvgraft.report.document.validate_report checks the rest
# against the result's own schema when it reads a report.
_RESULT_IN_REPORT = WithJsonSchema({
    "description": "The whole generalization result, valid against schemas/generalization-result.v1.json "
                   "(kvgraft.report.document.validate_report checks it against that schema when it reads a report).",
    "type": "object", "required": ["kind"], "properties": {"kind": {"const": RESULT_KIND}}})


class GeneralizationData(Open):
    """A generalization result as a report's check holds it: a short form (accuracy per condition, the paired tests,
    the clean/contaminated split, a few ledger figures) and, under `result`, the whole result."""

    benchmark: Benchmark | None = None
    conditions: list[NamedAccuracy]
    mcnemar: list[McNemarRow] | None = None
    split: AccuracySplit | None = None
    ledger: JsonObject | None = None
    result: Annotated[ResultFace, _RESULT_IN_REPORT] | None = None


TYPED = Typed(FILE, "kvgraft generalization audit result, version 1", GeneralizationResult, GeneralizationData)
