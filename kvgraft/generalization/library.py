"""The solution library: one solution trace per library problem whose final answer was checked (solved), captured.

For each problem of the library split (`problems.split`) a trace is obtained and accepted only when
`answers.check` on it agrees with the gold answer:

1. the reference solution when the source has one, as "Problem: …\\nSolution: …\\nAnswer: …";
2. otherwise (or when the reference fails the check) the model's own generation after
   "Problem: …\\nSolution:": greedy first, then up to `attempts` sampled continuations from a
   seeded `torch.Generator`.

Every accepted trace is captured with `capture.capture` (answer = gold). Each entry's `meta` records
the problem (id, hash, text, source), whether the trace is the reference or model-generated, the
split it came from and its upstream cost: tokens generated to obtain the trace (failed attempts
included), the prompt tokens prefilled for those attempts, and the prefill tokens of the capture.
Problems without a solved trace are returned in the build result, never dropped silently.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NotRequired

import torch
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError
from typing_extensions import TypedDict  # pydantic validates these (TypeAdapter): typing.TypedDict is refused on 3.11

from kvgraft._internal import jsonio
from kvgraft.errors import InputError
from kvgraft.generalization import answers, problems
from kvgraft.generalization.energy import EnergyRecord, measure
from kvgraft.generalization.problems import Problem, SplitRecord
from kvgraft.inference.capture import capture as capture_release
from kvgraft.inference.models import DEFAULT_MODEL, LoadedModel
from kvgraft.inference.reapply import DEFAULT_CONDITIONS, Conditions
from kvgraft.inference.runtime import Decoded, Schedule, encode, eos_ids, prefill
from kvgraft.inference.runtime import decode as capture_decode
from kvgraft.inference.runtime import tokenize as capture_tokenize
from kvgraft.release.models import Entry, ScheduleRecord
from kvgraft.results.base import JsonObject

ENTRY_KIND = "kvgraft-library-entry"
BUILD_KIND = "kvgraft-library-build"
SOURCES = ("gsm8k", *problems.GENERATED, "aime2025", "champ")
TRACE_REFERENCE = "reference"
TRACE_MODEL = "model"

Checker = Callable[[str, str], bool]

# An "Answer: …" line followed by a newline: the line is complete and decoding may stop.
_ANSWER_DONE = re.compile(r"(?im)^[^\n]*?\b(?:final[ \t]+answer|answer)[ \t]*(?:is)?[ \t]*[:：][ \t]*\S[^\n]*\n")


# ---------------------------------------------------------------- problem sources


class SourceRecord(TypedDict):
    """Where a library's problems come from (`load_problems`; the controls' fact library adds its seed)."""

    source: str
    limit: int | None
    synthetic_seed: NotRequired[int]
    synthetic_version: NotRequired[int]
    seed: NotRequired[int]


def load_problems(source: str, limit: int | None = None, *, synthetic_seed: int = 0) -> tuple[list[Problem], SourceRecord]:
    """Problems of a named source (gsm8k, synthetic, arithmetic, aime2025, champ) or a JSONL file; the first `limit`.

    Returns (problems, a record of the source spec). A generated source (synthetic, arithmetic) needs `limit` (how
    many to draw) and draws from `synthetic_seed`.
    """
    if limit is not None and limit < 0:
        raise InputError(f"--limit must be >= 0, got {limit}")
    record = SourceRecord(source=source, limit=limit)
    if source == "gsm8k":
        found = problems.gsm8k(limit)
    elif source in problems.GENERATED:
        if limit is None:
            raise InputError(f"--source {source} needs --limit N (how many problems to draw)")
        draw, version = problems.GENERATED[source]
        found = draw(limit, synthetic_seed)
        record["synthetic_seed"] = synthetic_seed
        record["synthetic_version"] = version
    elif source == "aime2025":
        found = problems.aime2025()
    elif source == "champ":
        found = problems.champ()
    elif source.endswith(".jsonl") or jsonio.stat_or_none(Path(source), follow=True) is not None:
        found = problems.from_jsonl(source)
    else:
        raise InputError(f"--source {source}: expected one of {', '.join(SOURCES)} or a .jsonl file")
    if limit is not None:
        found = found[:limit]
    if not found:
        raise InputError(f"--source {source}: no problems")
    return found, record


# ---------------------------------------------------------------- trace text


def prompt_text(problem: str) -> str:
    """What a solution continues from: 'Problem: …\\nSolution:'."""
    return f"Problem: {problem.strip()}\nSolution:"


def reference_trace(problem: Problem) -> str:
    """The reference solution as a trace: 'Problem: …\\nSolution: …\\nAnswer: …'."""
    if not problem.solution:
        raise InputError(f"{problem.id}: no reference solution")
    return f"{prompt_text(problem.problem)} {problem.solution.strip()}\nAnswer: {problem.answer.strip()}"


def answer_line_complete(text: str) -> bool:
    """True once the text holds an 'Answer: …' line followed by a newline."""
    return _ANSWER_DONE.search(text) is not None


# ---------------------------------------------------------------- decoding


def sample_seed(seed: int, *parts: str | int) -> int:
    """A 63-bit generator seed derived from a base seed and labels (query id, sample index, …)."""
    h = hashlib.sha256("\x00".join(str(p) for p in (seed, *parts)).encode()).digest()
    return int.from_bytes(h[:8], "big") & ((1 << 63) - 1)


def decode(lm: LoadedModel, cache: Any, first_logits: torch.Tensor, *, max_new_tokens: int, temperature: float = 0.0,
           generator: torch.Generator | None = None, eos: Iterable[int] = (), stop_at_answer: bool = True) -> Decoded:
    """runtime.decode with this module's stop rule: an 'Answer: …' line is complete (stop "answer")."""
    d = capture_decode(lm, cache, first_logits, max_new_tokens=max_new_tokens, temperature=temperature, generator=generator,
                       eos=eos, stop=answer_line_complete if stop_at_answer else None)
    if d.stop == "stop":
        d.stop = "answer"
    return d


# ---------------------------------------------------------------- solving one problem


@dataclass(frozen=True)
class BuildSettings:
    """How traces are obtained. `attempts` sampled continuations follow the greedy one."""

    attempts: int = 3
    temperature: float = 0.7
    seed: int = 0
    max_new_tokens: int = 256
    use_reference: bool = True
    generate: bool = True  # False: reference traces only
    stop_at_answer: bool = True

    def __post_init__(self) -> None:
        if self.attempts < 0:
            raise InputError(f"--attempts must be >= 0, got {self.attempts}")
        if self.attempts > 0 and self.temperature <= 0:
            raise InputError(f"sampled attempts need a temperature > 0, got {self.temperature}")
        if self.max_new_tokens < 1:
            raise InputError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")

    def as_dict(self) -> BuildSettingsRecord:
        return BuildSettingsRecord(attempts=self.attempts, temperature=self.temperature, seed=self.seed,
                                   max_new_tokens=self.max_new_tokens, use_reference=self.use_reference,
                                   generate=self.generate, stop_at_answer=self.stop_at_answer)


class BuildSettingsRecord(TypedDict):
    """`BuildSettings.as_dict`."""

    attempts: int
    temperature: float
    seed: int
    max_new_tokens: int
    use_reference: bool
    generate: bool
    stop_at_answer: bool


class EnergyBrief(TypedDict):
    """What a library records of the energy a block of work took (kvgraft.generalization.energy)."""

    joules: float
    method: str
    is_estimate: bool


class Attempt(TypedDict):
    """One way a trace was tried: the reference solution, the greedy generation or a sampled one."""

    kind: str  # "reference" | "greedy" | "sample"
    index: int
    seed: int | None
    generated_tokens: int
    prefill_tokens: int
    extracted: str | None
    correct: bool
    stop: str | None


class Unsolved(TypedDict):
    """`Solved.as_dict`: a problem and every attempt made at it (the build result lists the unsolved ones)."""

    problem_id: str
    problem_hash: str
    source: str
    solved: bool
    trace_kind: str | None
    attempts: list[Attempt]
    failed_attempts: int
    generated_tokens: int
    generation_prefill_tokens: int
    seconds: float
    energy: EnergyBrief | None


@dataclass
class Solved:
    """The outcome of `solve` for one problem."""

    problem: Problem
    solved: bool  # a trace whose final answer equals the problem's
    trace: str | None
    trace_kind: str | None  # "reference" | "model" | None
    attempts: list[Attempt] = field(default_factory=list)
    generated_tokens: int = 0  # every attempt, failed ones included
    generation_prefill_tokens: int = 0  # the prompt, prefilled once per model attempt
    seconds: float = 0.0
    energy: EnergyBrief | None = None

    @property
    def failed_attempts(self) -> int:
        return sum(1 for a in self.attempts if not a["correct"])

    def as_dict(self) -> Unsolved:
        return Unsolved(problem_id=self.problem.id, problem_hash=problems.problem_hash(self.problem.problem),
                        source=self.problem.source, solved=self.solved, trace_kind=self.trace_kind,
                        attempts=self.attempts, failed_attempts=self.failed_attempts,
                        generated_tokens=self.generated_tokens, generation_prefill_tokens=self.generation_prefill_tokens,
                        seconds=self.seconds, energy=self.energy)


def solve(lm: LoadedModel, problem: Problem, settings: BuildSettings = BuildSettings(), *,
          schedule: Schedule | None = None, check: Checker = answers.check) -> Solved:
    """A solved trace for one problem, or none; every attempt and every generated token is recorded.

    A pure function of (problem, model, settings): sampled attempts use generators seeded from
    (settings.seed, problem id, attempt number).
    """
    schedule = schedule or Schedule()
    t0 = time.perf_counter()
    attempts: list[Attempt] = []
    result = Solved(problem, False, None, None, attempts)
    with measure() as meter:
        if settings.use_reference and problem.solution:
            trace = reference_trace(problem)
            ok = bool(check(trace, problem.answer))
            attempts.append(Attempt(kind=TRACE_REFERENCE, index=0, seed=None, generated_tokens=0, prefill_tokens=0,
                                    extracted=answers.extract_answer(trace), correct=ok, stop=None))
            if ok:
                result.solved, result.trace, result.trace_kind = True, trace, TRACE_REFERENCE
        if not result.solved and settings.generate:
            prompt = prompt_text(problem.problem)
            ids = encode(lm, prompt, add_special_tokens=schedule.add_special_tokens)
            eos = eos_ids(lm)
            for index in range(1 + settings.attempts):
                sampled = index > 0
                seed = sample_seed(settings.seed, "library", problem.id, index) if sampled else None
                gen = torch.Generator(device="cpu").manual_seed(seed) if seed is not None else None
                cache, logits = prefill(lm, ids, schedule)
                out = decode(lm, cache, logits, max_new_tokens=settings.max_new_tokens,
                             temperature=settings.temperature if sampled else 0.0, generator=gen, eos=eos,
                             stop_at_answer=settings.stop_at_answer)
                ok = bool(check(out.text, problem.answer))
                result.generated_tokens += len(out.token_ids)
                result.generation_prefill_tokens += len(ids)
                attempts.append(Attempt(kind="sample" if sampled else "greedy", index=index, seed=seed,
                                        generated_tokens=len(out.token_ids), prefill_tokens=len(ids),
                                        extracted=answers.extract_answer(out.text), correct=ok, stop=out.stop))
                if ok:
                    result.solved, result.trace, result.trace_kind = True, prompt + out.text, TRACE_MODEL
                    break
    result.seconds = time.perf_counter() - t0
    assert meter.result is not None
    result.energy = _energy_brief(meter.result.as_dict())
    return result


def _energy_brief(e: EnergyRecord) -> EnergyBrief:
    return EnergyBrief(joules=e["joules"], method=e["method"], is_estimate=e["is_estimate"])


# ---------------------------------------------------------------- entries and the build


class Upstream(TypedDict):
    """What obtaining an entry's trace cost: attempts, tokens generated and prefilled, time and energy."""

    generated_tokens: int
    generation_prefill_tokens: int
    capture_prefill_tokens: int
    capture_probe_tokens: int
    attempts: int
    failed_attempts: int
    tokens: int  # generated to obtain the trace plus the prefill tokens of capture
    tokens_all: int  # every token the model processed for this entry
    seconds: float
    energy: EnergyBrief | None


class SplitSummary(TypedDict):
    """What each entry carries about the split (the id lists stay in the build result)."""

    salt: str
    library_fraction: float
    n: int
    problems_digest: str
    method: str
    source: SourceRecord


class EntryMeta(TypedDict):
    """The `meta` of a library entry: the problem, the trace kind, the split and the upstream cost."""

    kind: str
    problem_id: str
    problem_hash: str
    problem: str
    source: str
    trace: str | None
    upstream: Upstream
    split: SplitSummary


def entry_meta(solved: Solved, capture_prefill_tokens: int, probe_tokens: int, split: SplitSummary) -> EntryMeta:
    """The `meta` of a library entry: the problem, the trace kind, the split and the upstream cost."""
    p = solved.problem
    upstream = Upstream(
        generated_tokens=solved.generated_tokens,
        generation_prefill_tokens=solved.generation_prefill_tokens,
        capture_prefill_tokens=capture_prefill_tokens,
        capture_probe_tokens=probe_tokens,
        attempts=len(solved.attempts),
        failed_attempts=solved.failed_attempts,
        tokens=solved.generated_tokens + capture_prefill_tokens,
        tokens_all=solved.generated_tokens + solved.generation_prefill_tokens + capture_prefill_tokens + probe_tokens,
        seconds=solved.seconds,
        energy=solved.energy,
    )
    return EntryMeta(kind=ENTRY_KIND, problem_id=p.id, problem_hash=problems.problem_hash(p.problem), problem=p.problem,
                     source=p.source, trace=solved.trace_kind, upstream=upstream, split=split)


def split_summary(record: SplitRecord, source: SourceRecord) -> SplitSummary:
    """What each entry carries about the split (the id lists stay in the build result)."""
    return SplitSummary(salt=record["salt"], library_fraction=record["library_fraction"], n=record["n"],
                        problems_digest=record["problems_digest"], method=record["method"], source=source)


_ENTRY_META = TypeAdapter(EntryMeta)


class BuiltRelease(TypedDict):
    path: str
    root_digest: str


class BuiltModel(TypedDict):
    spec: str
    identity: str


class InLibrary(TypedDict):
    """A solved problem as the build result lists it: its entry and what the entry cost."""

    problem_id: str
    entry_id: str
    trace: str | None
    num_tokens: int
    upstream: Upstream


class Counts(TypedDict):
    reference: int
    model: int
    unsolved: int


class Totals(TypedDict):
    entry_tokens: int
    upstream_tokens: int
    upstream_tokens_all: int
    generated_tokens: int  # unsolved problems' attempts included
    generated_tokens_solved: int
    failed_attempts: int
    seconds: float


class BuildResult(TypedDict):
    """`build`'s result: the split, the solved problems' entries with their upstream cost, the unsolved problems
    with every attempt made, totals, and the release's root digest."""

    kind: str
    release: BuiltRelease
    model: BuiltModel
    source: SourceRecord
    split: SplitRecord
    settings: BuildSettingsRecord
    schedule: ScheduleRecord
    library: int
    held_out: int
    solved: list[InLibrary]
    unsolved: list[Unsolved]
    counts: Counts
    totals: Totals
    energy: EnergyRecord


def build(lm: LoadedModel, all_problems: Sequence[Problem], out: Path, *, library_fraction: float = 0.5,
          salt: str = "kvgraft", source: SourceRecord | None = None, settings: BuildSettings = BuildSettings(),
          schedule: Schedule | None = None, probe_tokens: int = 0, overwrite: bool = False,
          check: Checker = answers.check, progress: Callable[[int, int], None] | None = None) -> BuildResult:
    """Split, solve each library problem, capture the solved traces into a release at `out`.

    Returns the build result: the split, the solved problems' entries with their upstream cost, the
    unsolved problems with every attempt made, totals, and the release's root digest.
    """
    schedule = schedule or Schedule()
    library, held_out, record = problems.split(all_problems, library_fraction, salt)
    if not library:
        raise InputError(f"the library split is empty ({len(all_problems)} problems, fraction {library_fraction})")
    source = source or SourceRecord(source="problems", limit=None)
    split_info = split_summary(record, source)
    t0 = time.perf_counter()
    solved: list[Solved] = []
    total = len(library) + 1  # the capture is the last step
    with measure() as meter:
        for i, p in enumerate(library):
            solved.append(solve(lm, p, settings, schedule=schedule, check=check))
            if progress:
                progress(i + 1, total)
        records: list[tuple[str, JsonObject]] = []
        built: dict[str, EntryMeta] = {}  # by entry id: what the build result reports of each entry
        for s in solved:
            if not s.solved or s.trace is None:
                continue
            where = f"library:{s.problem.id}"
            ids, _ = capture_tokenize(lm, {"text": s.trace}, schedule, where)
            built[s.problem.id] = entry_meta(s, len(ids), probe_tokens, split_info)
            meta = _ENTRY_META.dump_python(built[s.problem.id], mode="json")
            rec: JsonObject = {"id": s.problem.id, "text": s.trace, "answer": s.problem.answer, "meta": meta}
            records.append((where, rec))
        if not records:
            names = ", ".join(s.problem.id for s in solved[:10])
            raise InputError(f"no library problem has a solved trace ({names}); nothing to capture")
        manifest = capture_release(lm, records, out, schedule=schedule, probe_tokens=probe_tokens, overwrite=overwrite)
    if progress:
        progress(total, total)
    assert meter.result is not None
    entries = manifest["entries"]
    metas = [built[e["id"]] for e in entries]
    up = [m["upstream"] for m in metas]
    in_library = [InLibrary(problem_id=m["problem_id"], entry_id=e["id"], trace=m["trace"], num_tokens=e["num_tokens"],
                            upstream=m["upstream"]) for e, m in zip(entries, metas, strict=True)]
    unsolved = [s.as_dict() for s in solved if not s.solved]
    return BuildResult(
        kind=BUILD_KIND,
        release=BuiltRelease(path=str(out), root_digest=manifest["root_digest"]),
        model=BuiltModel(spec=lm.spec, identity=lm.identity.sha256),
        source=source,
        split=record,
        settings=settings.as_dict(),
        schedule=schedule.as_dict(),
        library=len(library),
        held_out=len(held_out),
        solved=in_library,
        unsolved=unsolved,
        counts=Counts(reference=sum(1 for v in in_library if v["trace"] == TRACE_REFERENCE),
                      model=sum(1 for v in in_library if v["trace"] == TRACE_MODEL), unsolved=len(unsolved)),
        totals=Totals(
            entry_tokens=sum(e["num_tokens"] for e in entries),
            upstream_tokens=sum(u["tokens"] for u in up),
            upstream_tokens_all=sum(u["tokens_all"] for u in up),
            generated_tokens=sum(s.generated_tokens for s in solved),
            generated_tokens_solved=sum(u["generated_tokens"] for u in up),
            failed_attempts=sum(s.failed_attempts for s in solved),
            seconds=time.perf_counter() - t0,
        ),
        energy=meter.result.as_dict(),
    )


# ---------------------------------------------------------------- reading a library back


@dataclass(frozen=True)
class LibraryBuild:
    """`library build`'s options: the release folder, the problems and their split, how traces are obtained
    (BuildSettings' fields, checked when the build starts), the capture schedule, the model and its conditions."""

    out: Path
    source: str = "gsm8k"
    limit: int | None = None
    library_fraction: float = 0.5
    salt: str = "kvgraft"
    synthetic_seed: int = 0
    attempts: int = 3
    temperature: float = 0.7
    seed: int = 0
    max_new_tokens: int = 256
    use_reference: bool = True
    generate: bool = True
    chunk: int | None = None
    probe: int = 0
    overwrite: bool = False
    model: str = DEFAULT_MODEL
    conditions: Conditions = DEFAULT_CONDITIONS


def build_from(b: LibraryBuild, *, load: Callable[[str, str, str, str], LoadedModel],
               progress: Callable[[], AbstractContextManager[Callable[[int, int], None]]]) -> BuildResult:
    """`build` as `library build` asks for it: every option checked and the folder refused (an existing one without
    `overwrite`) before the model loads; the model loaded (`load(model, device, dtype, attention)`) and the build run
    under the torch thread count of `b.conditions`."""
    from kvgraft.inference.runtime import threads as torch_threads

    if not b.use_reference and not b.generate:
        raise InputError("--no-reference and --no-generate leave no way to obtain a trace")
    jsonio.refuse_existing(b.out, b.overwrite)  # before the model loads, not after
    jsonio.check_writable(b.out)
    all_problems, source = load_problems(b.source, b.limit, synthetic_seed=b.synthetic_seed)
    settings = BuildSettings(attempts=b.attempts, temperature=b.temperature, seed=b.seed, max_new_tokens=b.max_new_tokens,
                             use_reference=b.use_reference, generate=b.generate)
    threads = b.conditions.threads
    if threads is not None and threads < 1:
        raise InputError(f"--threads must be >= 1, got {threads}")
    with torch_threads(threads):
        lm = load(b.model, *b.conditions.load_options({}))
        with progress() as tick:
            return build(lm, all_problems, b.out, library_fraction=b.library_fraction, salt=b.salt, source=source,
                         settings=settings, schedule=Schedule(chunk_tokens=b.chunk), probe_tokens=b.probe,
                         overwrite=b.overwrite, progress=tick)



class _Read(BaseModel):
    model_config = ConfigDict(frozen=True)


class EnergyRead(_Read):
    joules: float = 0.0


class UpstreamRead(_Read):
    """What the audit's ledger reads of an entry's upstream cost (`Upstream`); a member an entry lacks counts 0."""

    tokens: int = 0
    tokens_all: int = 0
    generated_tokens: int = 0
    failed_attempts: int = 0
    seconds: float = 0.0
    energy: EnergyRead | None = None


class SourceRead(_Read):
    source: str | None = None
    limit: int | None = None
    synthetic_seed: int = 0


class SplitRead(_Read):
    """What the audit reads of the split an entry records (`SplitSummary`), to reproduce it."""

    salt: str | None = None
    library_fraction: float | None = None
    problems_digest: str | None = None
    source: SourceRead | None = None


class LibraryMeta(_Read):
    """What the audit reads of a library entry's `meta` (`EntryMeta`, as `entry_meta` wrote it)."""

    kind: Literal["kvgraft-library-entry"]  # ENTRY_KIND
    problem_id: str
    problem_hash: str
    problem: str
    trace: str | None = None
    upstream: UpstreamRead = UpstreamRead()
    split: SplitRead | None = None


def library_meta(entry: Entry, where: str) -> LibraryMeta:
    """An entry's library metadata as the audit reads it; refused when it is not what `library build` writes."""
    try:
        return LibraryMeta.model_validate(entry.get("meta"))
    except ValidationError as exc:
        raise InputError(f"{where}: entry {entry['id']!r} carries no library metadata ({exc.errors()[0]['msg']}); build "
                         "the release with `kvgraft library build`") from None


__all__ = [
    "BUILD_KIND", "ENTRY_KIND", "SOURCES", "BuildResult", "BuildSettings", "Decoded", "EntryMeta", "LibraryMeta", "Solved",
    "SourceRecord", "answer_line_complete", "build", "decode", "entry_meta", "library_meta",
    "load_problems", "prompt_text", "reference_trace", "sample_seed", "solve",
]
