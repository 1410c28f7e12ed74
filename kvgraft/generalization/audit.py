"""The generalization audit: does grafting a solved problem's solution help on problems it does not solve?

Conditions, on the same queries with the same decoding (greedy unless `samples` > 1):

- ``none``  (a) no graft: the query prompt alone;
- ``own``   (b) graft of the query's own solution from the library (replay);
- ``other`` (c) graft of the nearest OTHER library entry (generalization); entries of the query's own
  problem are excluded by problem id and by problem hash;
- ``own_text`` / ``other_text`` (d) the grafted entry's token ids given as plain prompt tokens instead:
  a fresh prefill under the release's recorded schedule, then the query. Under that matched schedule
  the output tokens must equal those of (b) / (c) exactly; every query is checked and mismatches are
  reported.

The query prompt is ``"\\n" + preamble + "Problem: {problem}\\nSolution:"`` (no special tokens) after the
grafted prefix, the same text without one, after the tokens the release's schedule starts a sequence with (a
tokenizer's beginning-of-sequence token, as every entry begins with it). The preamble (empty by default; a base
model that writes prose instead of an answer line is shown worked examples there) is a recorded setting, the same
text in every condition, so it moves no condition against another. Decoding stops at EOS, at `max_new_tokens`, or
once an "Answer: …" line is complete; `answers.check` decides correctness.

`--policy` chooses what runs: ``none`` only (a); ``exact`` adds (b) and its (d) (the own entry found by
problem id, else by exact problem hash); ``nearest`` (TF-IDF) or ``bm25`` also adds (c) and its (d),
selected by that similarity among the other entries. Selection scores are recorded.

`run_query` is a pure function of (model, library, task, settings) → a run (kvgraft.results.generalization.Run,
as JSON: an executor's unit result); `aggregate` turns the runs into accuracy with Wilson intervals, paired exact
McNemar tests (mid-p and a paired bootstrap as secondary figures), the clean/contaminated split, the token/energy
ledger and the context accounting, built as the result's models (`GeneralizationResult`). `audit` plans the runs,
maps `run_query` over them through an executor (in this process, in order, by default) and aggregates; the
result becomes JSON where it is written (kvgraft.audit.checks.generalization).
"""

from __future__ import annotations

import copy
import functools
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch

from kvgraft import __version__
from kvgraft.errors import InputError
from kvgraft.generalization import answers, stats
from kvgraft.generalization.conditions import AS_TEXT, CONDITIONS, GRAFTED, LABELS, SHORT
from kvgraft.generalization.energy import measure
from kvgraft.generalization.leakage import NGRAM, leakage_for
from kvgraft.generalization.library import (
    LibraryMeta,
    SourceRead,
    SourceRecord,
    SplitRead,
    decode,
    library_meta,
    load_problems,
    prompt_text,
    sample_seed,
)
from kvgraft.generalization.problems import GENERATED, Problem, SplitRecord, normalize_text, problem_hash, split, synthetic
from kvgraft.generalization.selection import POLICIES, Index
from kvgraft.inference.graft import check_model, restore
from kvgraft.inference.models import LoadedModel
from kvgraft.inference.runtime import Schedule, encode, eos_ids, new_cache, prefill
from kvgraft.release.format import now_utc
from kvgraft.results import generalization as result
from kvgraft.results.base import JsonObject
from kvgraft.results.generalization import (
    FILE,
    MAX_PREAMBLE,
    RESULT_KIND,
    Accuracy,
    Comparison,
    ConditionAccuracy,
    ConditionLedger,
    Context,
    Equality,
    Flags,
    GeneralizationResult,
    Leakage,
    Ledger,
    LibraryLedger,
    McNemar,
    Mismatch,
    PerQuery,
    PlanSource,
    PlanSplit,
    PlanSynthetic,
    Power,
    Run,
    Selection,
    Split,
    SplitPart,
)
from kvgraft.signing.verify import VerifiedRelease

if TYPE_CHECKING:
    from kvgraft.execution.executor import Executor

FORMAT_VERSION = 1
SCHEMA = FILE

GROUPS = ("library", "held_out", "synthetic")
ONE_SHOT = Schedule()
Runs = dict[tuple[str, str], Run]  # (query id, condition) → its run
MEMORY_METHOD = "VmHWM of /proc/self/status after writing '5' to /proc/self/clear_refs (whole process, weights included)"


def query_text(problem: str, preamble: str = "") -> str:
    """The prompt fed after the grafted prefix (or alone): '\\n' + preamble + 'Problem: …\\nSolution:'."""
    return "\n" + preamble + prompt_text(problem)


# ---------------------------------------------------------------- settings, queries, tasks


@dataclass(frozen=True)
class Settings:
    max_new_tokens: int = 64
    samples: int = 1
    temperature: float = 0.0
    seed: int = 0
    policy: str = "nearest"
    stop_at_answer: bool = True
    force: bool = False
    budget: int | None = None  # decode-token budget per query; None: condition (a)'s decode tokens on that query
    track_memory: bool = True
    n_boot: int = 10_000
    text_conditions: bool = True  # (d): run the grafted entries again as prompt text and compare token for token
    preamble: str = ""  # text before every query, in every condition alike (worked examples for a base model)

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise InputError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.samples < 1:
            raise InputError(f"--samples must be >= 1, got {self.samples}")
        if self.samples > 1 and self.temperature <= 0:
            raise InputError("--samples > 1 needs --temperature > 0 (greedy samples would all be the same)")
        if self.temperature < 0:
            raise InputError(f"--temperature must be >= 0, got {self.temperature}")
        if self.policy not in POLICIES:
            raise InputError(f"--policy {self.policy}: expected one of {', '.join(POLICIES)}")
        if self.budget is not None and self.budget < 1:
            raise InputError(f"--budget must be >= 1, got {self.budget}")
        if len(self.preamble) > MAX_PREAMBLE:
            raise InputError(f"the query preamble is {len(self.preamble)} characters; at most {MAX_PREAMBLE}")

    @property
    def decoding(self) -> str:
        return "greedy" if self.temperature <= 0 else f"sampled, temperature {self.temperature:g}"

    def conditions(self) -> tuple[str, ...]:
        if self.policy == "none":
            return ("none",)
        wanted = ("none", "own", "own_text") if self.policy == "exact" else CONDITIONS
        return wanted if self.text_conditions else tuple(c for c in wanted if c not in AS_TEXT.values())

    def record(self) -> result.Settings:
        """These settings as the result records them."""
        return result.Settings.model_validate({**asdict(self), "decoding": self.decoding,
                                               "conditions": list(self.conditions())})


@dataclass(frozen=True)
class Query:
    problem: Problem
    group: str  # "library" | "held_out" | "synthetic"


@dataclass(frozen=True)
class Task:
    query: Query
    condition: str
    entry_id: str | None
    selection: Selection | None


@dataclass(frozen=True)
class Prepared:
    """What `prepare` records of the queries: the source and split they come from, the synthetic problems added,
    the library-split problems with no entry in the library, and notes on how this audit's split differs."""

    source: SourceRecord | None = None
    split: SplitRecord | None = None
    synthetic: PlanSynthetic | None = None
    queries: dict[str, int] = field(default_factory=dict)  # per group
    library_missing: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class Library:
    """A library release's entries indexed by problem id, problem hash and text similarity."""

    def __init__(self, release: VerifiedRelease) -> None:
        self.release = release
        where = str(release.root)
        self.entries = release.release.entries
        # each refused, naming it, unless it carries what `library build` writes
        self.meta: dict[str, LibraryMeta] = {e["id"]: library_meta(e, where) for e in self.entries}
        self.index = Index((e["id"], self.meta[e["id"]].problem) for e in self.entries)
        self.by_id = {e["id"]: e for e in self.entries}

    def own_ids(self, problem: Problem) -> list[str]:
        """Entries of this problem: same problem id, same problem hash, or entry id equal to the problem id."""
        h = problem_hash(problem.problem)
        return [i for i, m in self.meta.items() if m.problem_id == problem.id or m.problem_hash == h or i == problem.id]

    def own(self, problem: Problem) -> Selection | None:
        """The selection of the query's own entry: by problem id, else by exact problem hash (selection.py)."""
        for i, m in self.meta.items():
            if m.problem_id == problem.id:
                return Selection(policy="own", id=i, score=1.0, matched_by="problem_id")
        sel = self.index.select(problem.problem, "exact")
        if sel.id is None:
            return None
        return Selection.model_validate({**sel.as_dict(), "policy": "own", "matched_by": "problem_hash"})

    def other(self, problem: Problem, policy: str) -> Selection:
        """The nearest entry that is NOT the query's own problem (excluded by id and by hash)."""
        sel = self.index.select(problem.problem, policy, exclude=self.own_ids(problem))
        return Selection.model_validate(sel.as_dict())


def plan(library: Library, queries: Sequence[Query], settings: Settings) -> list[Task]:
    """Every (query, condition) run, with the entry to graft and how it was selected."""
    wanted = settings.conditions()
    tasks: list[Task] = []
    for q in queries:
        tasks.append(Task(q, "none", None, None))
        if "own" in wanted and (own := library.own(q.problem)) is not None:
            tasks += [Task(q, c, own.id, own) for c in ("own", "own_text") if c in wanted]
        if "other" in wanted:
            other = library.other(q.problem, settings.policy)
            if other.id is not None:
                tasks += [Task(q, c, other.id, other) for c in ("other", "other_text") if c in wanted]
    return tasks


# ---------------------------------------------------------------- memory


def _status_bytes(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def reset_peak_rss() -> str | None:
    """Reset VmHWM to the current RSS; None on success, else why it could not be reset."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError as exc:
        return f"cannot reset the peak: {exc.strerror or exc}"
    return None


# ---------------------------------------------------------------- one run


def run_query(lm: LoadedModel, release: VerifiedRelease, task: Task, settings: Settings) -> JsonObject:
    """One (query, condition) run → its result: a `Run` as JSON, an executor's unit result (the executor adds its
    placement and carries it back; `aggregate` reads it as a `Run`). A pure function of (model, library, task,
    settings).

    Samples use generators seeded from (settings.seed, query id, sample index), the same for every
    condition of a query, so (b) and (d) see the same random numbers.
    """
    q = task.query.problem
    cond = task.condition
    if cond not in CONDITIONS:
        raise InputError(f"unknown condition {cond!r}")
    entry = release.release.entry(task.entry_id) if task.entry_id is not None else None
    if cond != "none" and entry is None:
        raise InputError(f"condition {cond} needs a library entry for query {q.id!r}")
    prompt_ids = encode(lm, query_text(q.problem, settings.preamble))
    # Without a prefix the query starts the sequence: it gets the tokens the release's schedule puts at the start of
    # one (Gemma's <bos>, nothing for SmolLM2), as every grafted entry and its prompt text (d) begin with them.
    start = [] if cond != "none" else encode(lm, "", add_special_tokens=Schedule.from_dict(
        release.manifest["schedule"]).add_special_tokens)
    memory_note = reset_peak_rss() if settings.track_memory else "not tracked"
    rss_before = _status_bytes("VmRSS") if settings.track_memory else None
    restored_tokens = kv_bytes = entry_prefill = 0
    restore_s = prefill_s = 0.0
    t0 = time.perf_counter()
    with measure() as meter:
        if cond in GRAFTED:
            assert entry is not None
            r = restore(release, entry["id"], lm, force=settings.force)
            cache, kv_bytes, restored_tokens = r.cache, r.kv_bytes, int(entry["num_tokens"])
            restore_s = time.perf_counter() - t0
        elif cond in AS_TEXT.values():
            assert entry is not None
            cache, _ = prefill(lm, [int(t) for t in entry["token_ids"]], Schedule.from_dict(release.manifest["schedule"]))
            entry_prefill = int(entry["num_tokens"])
            prefill_s = time.perf_counter() - t0
        else:
            cache = new_cache(lm)
        tp = time.perf_counter()
        cache, logits = prefill(lm, start + prompt_ids, ONE_SHOT, cache)  # one pass over the prompt, last logits only
        prefill_s += time.perf_counter() - tp
        samples: list[result.Sample] = []
        eos = eos_ids(lm)
        for i in range(settings.samples):
            c = cache if i == settings.samples - 1 else copy.deepcopy(cache)
            gen = None
            if settings.temperature > 0:
                gen = torch.Generator(device="cpu").manual_seed(sample_seed(settings.seed, "query", q.id, i))
            d = decode(lm, c, logits, max_new_tokens=settings.max_new_tokens, temperature=settings.temperature,
                       generator=gen, eos=eos, stop_at_answer=settings.stop_at_answer)
            samples.append(result.Sample.model_validate({
                "token_ids": d.token_ids, "text": d.text, "extracted": answers.extract_answer(d.text),
                "correct": bool(answers.check(d.text, q.answer)), "stop": d.stop, "decode_tokens": len(d.token_ids),
                "seconds": d.seconds}))
    total_s = time.perf_counter() - t0
    assert meter.result is not None
    peak = _status_bytes("VmHWM") if settings.track_memory and memory_note is None else None
    decode_tokens = sum(s.decode_tokens for s in samples)
    prefix = restored_tokens + entry_prefill
    meta = library_meta(entry, str(release.root)) if entry is not None else None
    run = Run.model_validate({
        "query_id": q.id,
        "group": task.query.group,
        "condition": cond,
        "entry_id": entry["id"] if entry is not None else None,
        "entry_problem_id": meta.problem_id if meta is not None else None,
        "selection": task.selection,
        "gold": q.answer,
        "samples": samples,
        "correct": samples[0].correct,
        "n_correct": sum(1 for s in samples if s.correct),
        "n_samples": len(samples),
        "tokens": result.Tokens(decode=decode_tokens, prompt=len(start) + len(prompt_ids),
                                prefill=entry_prefill + len(start) + len(prompt_ids), restored=restored_tokens,
                                prefix=prefix,
                                attended_max=prefix + len(start) + len(prompt_ids) + max(s.decode_tokens for s in samples)),
        "kv_bytes_restored": kv_bytes,
        "upstream_tokens": meta.upstream.tokens if meta is not None else 0,
        "upstream_tokens_all": meta.upstream.tokens_all if meta is not None else 0,
        "seconds": result.RunSeconds(restore=restore_s, prefill=prefill_s, decode=sum(s.seconds or 0.0 for s in samples),
                                     total=total_s),
        "energy": {"joules": meter.result.joules, "method": meter.result.method, "is_estimate": meter.result.is_estimate},
        "memory": result.Memory(peak_rss_bytes=peak, rss_before_bytes=rss_before, note=memory_note),
        "leakage": result.RunLeakage(**leakage_for(entry["source"].get("text", ""), q).as_dict())
        if entry is not None else None,
    })
    return run.model_dump(mode="json", exclude_unset=True)


# ---------------------------------------------------------------- preparing the queries


def prepare(release: VerifiedRelease, *, source: str | None = None, limit: int | None = None,
            library_fraction: float | None = None, salt: str | None = None, synthetic_n: int = 0,
            synthetic_seed: int = 1) -> tuple[list[Query], Prepared]:
    """The queries: the library and held-out halves of the source split, then `synthetic_n` fresh problems.

    Source, fraction and salt default to what the library's entries recorded at build time, and so does
    the limit when the source is the library's.
    Returns (queries, plan record) where the record lists library problems with no entry (unsolved).
    """
    lib = Library(release)
    first = next(iter(lib.meta.values()), None)
    recorded = (first.split if first is not None else None) or SplitRead()
    rec_source = recorded.source or SourceRead()
    notes: list[str] = []
    if source is None:
        source = rec_source.source
        if source is None:
            raise InputError(f"{release.root}: the library does not record its source; pass --source")
    if limit is None and source == rec_source.source:
        limit = rec_source.limit
    fraction = library_fraction if library_fraction is not None else (
        recorded.library_fraction if recorded.library_fraction is not None else 0.5)
    salt = salt if salt is not None else (recorded.salt if recorded.salt is not None else "kvgraft")
    problems_all, source_rec = load_problems(source, limit,
                                             synthetic_seed=rec_source.synthetic_seed if source in GENERATED else 0)
    library, held_out, split_rec = split(problems_all, float(fraction), str(salt))
    if recorded.model_fields_set:
        for key, had, want in (("salt", recorded.salt, salt), ("library_fraction", recorded.library_fraction, fraction)):
            if had != want:
                notes.append(f"the library was split with {key} {had!r}, this audit uses {want!r}")
        if recorded.problems_digest != split_rec["problems_digest"]:
            notes.append("the library was built from a different problem set (source or limit differ); library "
                         "problems missing from it are listed")
    have = {m.problem_id for m in lib.meta.values()}
    missing = [p.id for p in library if p.id not in have]
    if missing:
        notes.append(f"{len(missing)} library problem(s) have no solved trace in the library and get no replay "
                     f"condition: {', '.join(missing[:10])}{' …' if len(missing) > 10 else ''}")
    queries = [Query(p, "library") for p in library] + [Query(p, "held_out") for p in held_out]
    synth: list[Problem] = []
    if synthetic_n > 0:
        synth = synthetic(synthetic_n, synthetic_seed)
        queries += [Query(p, "synthetic") for p in synth]
    seen: set[str] = set()
    for qq in queries:
        if qq.problem.id in seen:
            raise InputError(f"query id {qq.problem.id!r} occurs twice (is the library source also synthetic with "
                             f"seed {synthetic_seed}? pass another --synthetic-seed)")
        seen.add(qq.problem.id)
    return queries, Prepared(source=source_rec, split=split_rec,
                             synthetic=PlanSynthetic(n=synthetic_n, seed=synthetic_seed) if synthetic_n > 0 else None,
                             queries={g: sum(1 for qq in queries if qq.group == g) for g in GROUPS},
                             library_missing=missing, notes=notes)


# ---------------------------------------------------------------- aggregation


def _acc(rows: Sequence[Run]) -> Accuracy:
    n = len(rows)
    k = sum(1 for r in rows if r.correct)
    lo, hi = stats.wilson(k, n)
    return Accuracy(k=k, n=n, accuracy=k / n if n else None, interval=[lo, hi])


def _pass(rows: Sequence[Run], samples: int) -> tuple[float | None, dict[str, float]]:
    """pass@1 averaged over every sample, and pass@k for k up to `samples`."""
    if not rows:
        return None, {}
    p1 = sum(r.n_correct / r.n_samples for r in rows) / len(rows)
    pk = {str(k): sum(stats.pass_at_k(r.n_samples, r.n_correct, k) for r in rows) / len(rows)
          for k in range(1, samples + 1)}
    return p1, pk


def _compare(by: Runs, qids: Sequence[str], cond: str, name: str, scope: str,
             settings: Settings) -> Comparison:
    ids = [q for q in qids if (q, "none") in by and (q, cond) in by]
    a = [by[(q, "none")].correct for q in ids]
    b = [by[(q, cond)].correct for q in ids]
    m = stats.mcnemar(a, b, labels=(SHORT["none"], SHORT[cond]))
    boot = None
    if ids:
        fa = [by[(q, "none")].n_correct / by[(q, "none")].n_samples for q in ids]
        fb = [by[(q, cond)].n_correct / by[(q, cond)].n_samples for q in ids]
        boot = stats.paired_bootstrap(fa, fb, n_boot=settings.n_boot, seed=settings.seed).model()
    verdict = m.verdict if ids else f"no queries to compare a and {SHORT[cond]} ({scope})"
    detectable = Power(**stats.detectable_effect(len(ids)))
    if ids and not m.significant:
        verdict += f"; {power_phrase(detectable)}"
    return Comparison.model_validate({
        "name": name, "a": "none", "b": cond, "scope": scope, "query_ids": ids, "n": len(ids),
        "mcnemar": McNemar(**m.as_dict()), "bootstrap": boot, "significant": m.significant if ids else False,
        "detectable": detectable, "verdict": f"{name}: {verdict}"})


def power_phrase(d: Power) -> str:
    """What a non-significant comparison on n items can say: no effect larger than the detectable one."""
    if d.effect is None:
        return f"at n = {d.n} no difference could be significant, so this says nothing about an effect"
    return (f"at n = {d.n} only a difference of {d.effect * 100:.0f} percentage points or more is detected "
            f"with {d.power:.0%} power "
            f"(at least {d.min_discordant} one-way flips): no effect larger than that is likely missed, "
            "smaller ones are not excluded")


def _split_rows(rows: Sequence[Run], by: Runs) -> Split:
    def part(contaminated: bool) -> SplitPart:
        sel = [r for r in rows if r.leakage is not None and r.leakage.contaminated == contaminated]
        base = [by[(r.query_id, "none")] for r in sel if (r.query_id, "none") in by]
        return SplitPart(**_acc(sel).model_dump(), baseline=_acc(base), query_ids=[r.query_id for r in sel])

    leaks = [r.leakage for r in rows if r.leakage is not None]
    flags = Flags(answer_in_entry=sum(1 for x in leaks if x.answer_in_entry),
                  problem_in_entry=sum(1 for x in leaks if x.problem_in_entry),
                  solution_in_entry=sum(1 for x in leaks if x.solution_in_entry))
    return Split(clean=part(False), contaminated=part(True), flags=flags)


def _sum(rows: Sequence[Run], f: Callable[[Run], float]) -> float:
    return float(sum(f(r) for r in rows))


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def _accuracies(results: Sequence[Run], conds: Sequence[str], settings: Settings) -> list[ConditionAccuracy]:
    """Accuracy per condition, overall and per group (with pass@k over the samples)."""
    conditions: list[ConditionAccuracy] = []
    for c in conds:
        rows = [r for r in results if r.condition == c]
        groups = {g: _acc([r for r in rows if r.group == g]) for g in GROUPS if any(r.group == g for r in rows)}
        p1, pk = _pass(rows, settings.samples)
        conditions.append(ConditionAccuracy.model_validate({
            "condition": c, "label": LABELS[c], **_acc(rows).model_dump(), "pass_at_1_mean": p1, "pass_at_k": pk,
            "groups": groups}))
    return conditions


def _comparisons(by: Runs, queries: Sequence[Query], conds: Sequence[str],
                 settings: Settings) -> list[Comparison]:
    """The paired comparisons against no graft (a): replay (b), and the other entry (c) per query group."""
    qids = [q.problem.id for q in queries]
    own_ids = [q for q in qids if (q, "own") in by]
    in_group = {g: [q.problem.id for q in queries if q.group == g] for g in GROUPS}
    comparisons: list[Comparison] = []
    if "own" in conds:
        comparisons.append(_compare(by, own_ids, "own", "replay (a vs b)", "queries with their own entry", settings))
    if "other" in conds:
        comparisons.append(_compare(by, in_group["held_out"], "other", "held-out generalization (a vs c)", "held_out", settings))
        comparisons.append(_compare(by, in_group["synthetic"], "other", "synthetic generalization (a vs c)", "synthetic",
                                    settings))
        comparisons.append(_compare(by, in_group["library"], "other", "library queries, other entry (a vs c)", "library",
                                    settings))
    return comparisons


def _equality(by: Runs, qids: Sequence[str], conds: Sequence[str]) -> dict[Literal["own", "other"], Equality]:
    """(d) equals (b) / (c) token for token: each prompt-text condition against its graft, first difference of each."""
    equality: dict[Literal["own", "other"], Equality] = {}
    for g, t in AS_TEXT.items():
        pairs = [q for q in qids if (q, g) in by and (q, t) in by]
        mismatches = []
        for q in pairs:
            ga, ta = by[(q, g)].samples, by[(q, t)].samples
            for i, (x, y) in enumerate(zip(ga, ta, strict=True)):
                if x.token_ids != y.token_ids:
                    at = next((j for j, (u, v) in enumerate(zip(x.token_ids, y.token_ids, strict=False)) if u != v),
                              min(len(x.token_ids), len(y.token_ids)))
                    mismatches.append(Mismatch(query_id=q, sample=i, first_difference=at))
                    break
        if pairs or g in conds:
            equality[g] = Equality(graft=g, text=t, n=len(pairs), equal=len(pairs) - len(mismatches),
                                   mismatches=mismatches)
    return equality


def _leakage(results: Sequence[Run], by: Runs, conds: Sequence[str]) -> Leakage:
    """The clean / contaminated split per grafted condition, with (a) on the same queries."""
    return Leakage(method=f"lm-evaluation-harness janitor {NGRAM}-grams of problem and solution, and the gold answer "
                          "as a standalone token (kvgraft.generalization.leakage)",
                   by_condition={c: _split_rows([r for r in results if r.condition == c], by) for c in conds if c != "none"})


def _condition_ledger(rows: Sequence[Run], budget_of: dict[str, float], amortized: float | None,
                      uses_library: bool) -> ConditionLedger:
    """One condition's totals, per-query means and ratios to the decode budget (upstream cost attributed, amortized)."""
    n = len(rows)
    dec = _sum(rows, lambda r: r.tokens.decode)
    up_attr = _sum(rows, lambda r: r.upstream_tokens)
    bud = _sum([r for r in rows if r.query_id in budget_of], lambda r: budget_of[r.query_id])
    dec_b = _sum([r for r in rows if r.query_id in budget_of], lambda r: r.tokens.decode)
    up_b = _sum([r for r in rows if r.query_id in budget_of], lambda r: r.upstream_tokens)
    n_b = sum(1 for r in rows if r.query_id in budget_of)
    totals: dict[str, float] = {
        "queries": n,
        "decode_tokens": int(dec),
        "prefill_tokens": int(_sum(rows, lambda r: r.tokens.prefill)),
        "restored_tokens": int(_sum(rows, lambda r: r.tokens.restored)),
        "kv_bytes_restored": int(_sum(rows, lambda r: r.kv_bytes_restored)),
        "upstream_tokens_attributed": int(up_attr),
        "seconds": _sum(rows, lambda r: r.seconds.total),
        "restore_seconds": _sum(rows, lambda r: r.seconds.restore),
        "prefill_seconds": _sum(rows, lambda r: r.seconds.prefill),
        "decode_seconds": _sum(rows, lambda r: r.seconds.decode),
        "energy_joules": _sum(rows, lambda r: r.energy.joules),
    }
    per_query = PerQuery.model_validate({k: (v / n if n else None) for k, v in totals.items() if k != "queries"})
    return ConditionLedger.model_validate({
        **totals,
        "per_query": per_query,
        "budget_tokens": int(bud),
        "decode_vs_budget": _ratio(dec_b, bud),
        "with_upstream_attributed": _ratio(dec_b + (up_b if uses_library else 0.0), bud),
        "with_upstream_amortized": _ratio(dec_b + ((amortized or 0.0) * n_b if uses_library else 0.0), bud),
    })


def _ledger(lib: Library, results: Sequence[Run], by: Runs,
            qids: Sequence[str], conds: Sequence[str], settings: Settings) -> Ledger:
    """Tokens, time and energy per condition, against the decode budget, with and without the library's upstream cost."""
    up_entries = [m.upstream for m in lib.meta.values()]
    served = sorted({r.query_id for r in results if r.condition != "none"})
    lib_up = int(sum(u.tokens for u in up_entries))
    lib_up_all = int(sum(u.tokens_all for u in up_entries))
    amortized = lib_up / len(served) if served else None
    budget_of: dict[str, float] = {}
    for q in qids:
        if settings.budget is not None:
            budget_of[q] = float(settings.budget * settings.samples)
        elif (q, "none") in by:
            budget_of[q] = float(by[(q, "none")].tokens.decode)
    per_condition = {c: _condition_ledger([r for r in results if r.condition == c], budget_of, amortized, c != "none")
                     for c in conds}
    return Ledger(
        per_condition=per_condition,
        library=LibraryLedger(
            entries=len(lib.entries),
            entry_tokens=sum(int(e["num_tokens"]) for e in lib.entries),
            upstream_tokens=lib_up,
            upstream_tokens_all=lib_up_all,
            generated_tokens=int(sum(u.generated_tokens for u in up_entries)),
            failed_attempts=int(sum(u.failed_attempts for u in up_entries)),
            reference_traces=sum(1 for m in lib.meta.values() if m.trace == "reference"),
            model_traces=sum(1 for m in lib.meta.values() if m.trace == "model"),
            upstream_seconds=float(sum(u.seconds for u in up_entries)),
            upstream_energy_joules=float(sum(u.energy.joules if u.energy is not None else 0.0 for u in up_entries)),
            queries_served=len(served),
            amortized_upstream_tokens_per_query=amortized,
        ),
        budget=result.Budget(source=(f"--budget {settings.budget} decode tokens per query and sample"
                                     if settings.budget is not None
                                     else "decode tokens of condition a (no graft) on the same query"),
                             per_query=settings.budget),
        definitions={
            "upstream_tokens": "tokens generated to obtain the solved trace (failed attempts included) + prefill "
                               "tokens of its capture",
            "upstream_tokens_all": "upstream_tokens + prompt tokens prefilled for generation attempts + capture probe tokens",
            "upstream_tokens_attributed": "sum over runs of the grafted entry's upstream_tokens (an entry used twice "
                                          "counts twice)",
            "decode_vs_budget": "decode tokens / budget tokens over the condition's queries that have a budget",
            "with_upstream_attributed": "(decode + upstream_tokens_attributed) / budget",
            "with_upstream_amortized": "(decode + library upstream_tokens / queries_served per query) / budget",
        },
    )


def _context(lib: Library, results: Sequence[Run], context_length: int | None) -> Context:
    """Context accounting: library size against what is attended at once and the model's context, peak memory."""
    graft_rows = [r for r in results if r.condition != "none"]
    peaks = [r.memory.peak_rss_bytes for r in results if r.condition in GRAFTED and r.memory.peak_rss_bytes]
    before = [r.memory.rss_before_bytes for r in results if r.memory.rss_before_bytes]
    notes_mem = sorted({str(r.memory.note) for r in results if r.memory.note})
    library_tokens = sum(int(e["num_tokens"]) for e in lib.entries)
    attended = max((r.tokens.attended_max for r in graft_rows), default=0)
    return Context(
        library_tokens=library_tokens,
        largest_prefix_tokens=max((r.tokens.prefix for r in graft_rows), default=0),
        attended_at_once_max=attended,
        attended_at_once_max_all=max((r.tokens.attended_max for r in results), default=0),
        model_context_tokens=context_length,
        attended_fits_context=None if context_length is None else attended <= context_length,
        library_fits_context=None if context_length is None else library_tokens <= context_length,
        peak_rss_bytes_grafted=max(peaks) if peaks else None,
        rss_before_bytes_min=min(before) if before else None,
        memory_method=MEMORY_METHOD if not notes_mem else f"{MEMORY_METHOD}; {'; '.join(notes_mem)}",
    )


def _statements(prepared: Prepared, comparisons: Sequence[Comparison],
                equality: dict[Literal["own", "other"], Equality], leakage: Leakage, results: Sequence[Run],
                energy: result.Energy | None, settings: Settings) -> list[str]:
    """The result's sentences: preparation notes, each comparison's verdict, (d) vs graft, leakage, caveats."""
    statements: list[str] = list(prepared.notes)
    for comp in comparisons:
        statements.append(comp.verdict)
    for g, eq in equality.items():
        if eq.n == 0:
            continue
        label = f"condition {SHORT[AS_TEXT[g]]} (the same tokens as prompt text) vs {SHORT[g]} (grafted)"
        if eq.equal == eq.n:
            statements.append(f"{label}: identical output tokens on {eq.equal}/{eq.n} queries")
        else:
            ids = ", ".join(str(m.query_id) for m in eq.mismatches[:10])
            statements.append(f"{label}: outputs DIFFER on {eq.n - eq.equal}/{eq.n} queries ({ids}); the graft "
                              "is not equivalent to the prompt text here")
    for c, sp in leakage.by_condition.items():
        dirty, clean = sp.contaminated, sp.clean
        if c in GRAFTED and dirty.n:
            statements.append(f"{SHORT[c]}: {dirty.n} of {clean.n + dirty.n} grafted entries leak the query's answer or "
                              f"text (accuracy there {dirty.k}/{dirty.n}, clean {clean.k}/{clean.n})")
    foreign = sorted({r.query_id for r in results if r.condition == "own" and r.group != "library"})
    if foreign:
        statements.append(f"{len(foreign)} query(ies) outside the library split have their own entry in the library: "
                          f"{', '.join(foreign[:10])}")
    if energy is not None and energy.is_estimate:
        statements.append(f"energy figures are an ESTIMATE, not a measurement: {energy.note}")
    if settings.preamble:
        statements.append(f"every query, in every condition, was asked after the same preamble of "
                          f"{len(settings.preamble)} characters (settings.preamble): the accuracies are those of "
                          "queries asked after it")
    if settings.samples > 1:
        statements.append(f"{settings.samples} samples per query ({settings.decoding}); k/n, Wilson intervals and McNemar "
                          "use the first sample of each query, pass@1 averages all samples")
    return statements


def aggregate(model: result.Model, release: VerifiedRelease, queries: Sequence[Query], runs: Sequence[Run],
              settings: Settings, *, prepared: Prepared | None = None, energy: result.Energy | None = None,
              context_length: int | None = None, seconds: float | None = None) -> GeneralizationResult:
    """Per-run results → the audit result (valid against schemas/generalization-result.v1.json once sealed, as
    `model_dump(mode="json", exclude_unset=True)`: a member the producer did not set is not written)."""
    prepared = prepared or Prepared()
    lib = Library(release)
    by: Runs = {(r.query_id, r.condition): r for r in runs}
    qids = [q.problem.id for q in queries]
    conds = [c for c in CONDITIONS if any(r.condition == c for r in runs)]
    conditions = _accuracies(runs, conds, settings)
    comparisons = _comparisons(by, queries, conds, settings)
    equality = _equality(by, qids, conds)
    leakage = _leakage(runs, by, conds)
    ledger = _ledger(lib, runs, by, qids, conds, settings)
    context = _context(lib, runs, context_length)
    statements = _statements(prepared, comparisons, equality, leakage, runs, energy, settings)
    plan_ = result.Plan.model_validate({
        "source": PlanSource(**prepared.source) if prepared.source is not None else None,
        "split": PlanSplit(**prepared.split) if prepared.split is not None else None,
        "synthetic": prepared.synthetic,
        "queries": {g: sum(1 for q in queries if q.group == g) for g in GROUPS}, "conditions": conds, "runs": len(runs)})
    return GeneralizationResult.model_validate({
        "kind": RESULT_KIND,
        "format_version": FORMAT_VERSION,
        "kvgraft_version": __version__,
        "created": now_utc(),
        "model": model,
        "library": result.Library(path=str(release.root), root_digest=release.manifest["root_digest"],
                                  entries=len(lib.entries), entry_tokens=sum(int(e["num_tokens"]) for e in lib.entries),
                                  missing=list(prepared.library_missing)),
        "plan": plan_,
        "settings": settings.record(),
        "schedule": release.manifest["schedule"],
        "conditions": conditions,
        "comparisons": comparisons,
        "equality": equality,
        "leakage": leakage,
        "ledger": ledger,
        "context": context,
        "energy": energy,
        "seconds": seconds,
        "queries": [result.Query.model_validate({
            "id": q.problem.id, "group": q.group, "source": q.problem.source,
            "problem_hash": problem_hash(q.problem.problem), "gold": q.problem.answer}) for q in queries],
        "runs": runs,
        "statements": statements,
    })


# ---------------------------------------------------------------- the whole audit


def audit(lm: LoadedModel, rel: VerifiedRelease, queries: Sequence[Query], settings: Settings = Settings(), *,
          prepared: Prepared | None = None,
          progress: Callable[[int, int, str], None] | None = None,
          executor: Executor | None = None) -> GeneralizationResult:
    """Plan, run every (query, condition) through `executor` (default: in this process, in order), aggregate."""
    from kvgraft.execution.executor import LocalExecutor

    shown = [q.problem.id for q in queries if settings.preamble and
             normalize_text(q.problem.problem) in normalize_text(settings.preamble)]
    if shown:  # its answer would be in front of the model in every condition
        raise InputError(f"the query preamble holds the problem of query {shown[0]!r}"
                         f"{f' and {len(shown) - 1} more' if len(shown) > 1 else ''}: give it examples of other problems")
    ex = executor or LocalExecutor()
    forced = check_model(rel, lm, force=settings.force)
    library = Library(rel)
    tasks = plan(library, queries, settings)
    t0 = time.perf_counter()
    with measure() as meter:
        results = ex.map(functools.partial(run_query, settings=settings), rel, tasks, lm=lm, progress=progress,
                         labels=[f"{t.query.problem.id} {SHORT[t.condition]}" for t in tasks])
        if progress:
            progress(len(tasks), len(tasks), "aggregating")
    assert meter.result is not None
    cfg = lm.model.config.get_text_config()
    ctx = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
    model = result.Model(spec=lm.spec, identity=lm.identity.sha256, release_identity=rel.manifest["model"]["identity"]["sha256"],
                         forced=forced, device=lm.device, dtype=lm.dtype, attn=lm.attn, executor=ex.describe(),
                         threads=torch.get_num_threads(), omp_wait_policy=os.environ.get("OMP_WAIT_POLICY"))
    # Unsealed: its status is judged where it becomes a verdict (kvgraft.audit.checks.seal).
    return aggregate(model, rel, queries, [Run.model_validate(r) for r in results], settings, prepared=prepared,
                     energy=result.Energy.model_validate(meter.result.as_dict()),
                     context_length=int(ctx) if ctx else None, seconds=time.perf_counter() - t0)


__all__ = [
    "RESULT_KIND", "SCHEMA", "Library", "Prepared", "Query", "Settings", "Task", "aggregate", "audit", "plan",
    "prepare", "query_text", "run_query",
]
