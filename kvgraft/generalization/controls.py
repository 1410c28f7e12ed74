"""Controls for the generalization audit: effects planted where they are known, so the report shows that the
audit finds replay when there is replay, transfer when there is transfer, and nothing when there is nothing.

A generated library of facts, one per entry, that no model can know: "What is the locker number of Mia Torres
at the gym?" solved as "The gym records show that Mia Torres has locker number 4817." (random names and
numbers). A small model copies a stated fact far more reliably than it applies a made-up rule, so every
control asks for a copied fact, never for invented arithmetic.

- replay:   the library's own questions, their own entry grafted (b) vs no graft (a). Expected: (b) far
            above (a), significant, and every grafted entry flagged contaminated (the answer is in it).
- related:  held-out questions about the same facts in other words ("Mia Torres wants to open a locker at
            the gym. Which locker number does she open?"), the nearest other entry grafted (c) vs (a).
            Expected: (c) above (a), significant; the leakage split says whether the wins are clean or come
            from the answer sitting in the grafted entry (here: the latter, by construction).
- null:     questions on a topic no entry touches, with their fact stated in the question itself ("The train
            to Oslo leaves from platform 312. Which platform ...?"), the nearest (unrelated) entry grafted (c) vs
            (a); the question is phrased so that the model answers it without any graft (a strong baseline), so that
            a graft that hurt would show as well as one that helped.
            Expected: no significant difference, reported with the smallest effect detectable at this n.

Each control is a generalization audit (kvgraft.generalization.audit) on its own queries; the prompt-text condition
(d) is left to the main generalization check.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from kvgraft import __version__
from kvgraft.errors import InputError
from kvgraft.generalization.problems import Problem
from kvgraft.results.base import JsonObject
from kvgraft.results.controls import ControlsResult, Generator, Library, PlantedControl, Row, SplitPart, SplitParts
from kvgraft.results.generalization import GeneralizationResult
from kvgraft.results.stats import KN

if TYPE_CHECKING:
    from kvgraft.execution.executor import Executor
    from kvgraft.generalization.library import BuildResult
    from kvgraft.inference.models import LoadedModel
    from kvgraft.signing.verify import VerifiedRelease

KIND = "kvgraft-controls-result"
SCHEMA = "controls-result.v1.json"
VERSION = 1  # of the generated problems: bump when their text changes
SOURCE = f"controls/v{VERSION}"

_FIRST = ("Mia", "Leo", "Ava", "Noah", "Zoe", "Omar", "Lena", "Ivan", "Rosa", "Kai", "Nina", "Hugo", "Iris", "Theo", "Maya",
          "Eli", "Sara", "Finn", "Lila", "Adam", "Vera", "Jon", "Tess", "Ben", "Ines", "Paul", "Ada", "Raul", "Edda", "Tom")
_LAST = ("Torres", "Park", "Novak", "Reyes", "Berg", "Okafor", "Lind", "Moreau", "Sato", "Kowal", "Haas", "Quinn", "Duarte",
         "Falk", "Ibsen", "Marsh", "Vidal", "Yilmaz", "Brandt", "Costa", "Weber", "Nagy", "Petrov", "Silva", "Lopez", "Dahl")
_PLACES = ("gym", "library", "school", "office", "pool", "club")
_CITIES = ("Oslo", "Lyon", "Porto", "Graz", "Turin", "Ghent", "Bergen", "Basel", "Cork", "Malmo", "Split", "Riga", "Brno",
           "Delft", "Parma", "Tartu", "Nantes", "Leeds", "Lille", "Krakow", "Sevilla", "Aarhus", "Bremen", "Bilbao",
           "Vigo", "Pisa", "Linz", "Gdansk", "Utrecht", "Dijon", "Zagreb", "Kaunas", "Tampere", "Bari", "Aachen", "Nice")

# What each control expects, in words for the report.
EXPECT = {
    "replay": "(b) far above (a), significant, every grafted entry flagged contaminated",
    "related": "(c) above (a), significant; the leakage split says whether the wins are clean",
    "null": "no significant difference between (c) and (a)",
}


@dataclass(frozen=True)
class ControlSet:
    facts: list[Problem]  # the library: each entry states one fact that only it holds
    related: list[Problem]  # held-out questions whose fact sits in another library entry (same index)
    unrelated: list[Problem]  # questions on a topic no entry touches, their fact stated in the question


def problems(n: int, seed: int) -> ControlSet:
    """n facts, n related questions and n unrelated questions; deterministic for (n, seed, VERSION)."""
    if not 1 <= n <= len(_CITIES):
        raise InputError(f"controls: n must be within [1, {len(_CITIES)}], got {n}")
    r = random.Random(f"kvgraft-controls-v{VERSION}:{seed}")
    names = r.sample([f"{a} {b}" for a in _FIRST for b in _LAST], n)
    lockers = r.sample(range(1000, 10000), n)  # four digits: never equal to a platform number below
    facts, related = [], []
    for i, (name, num) in enumerate(zip(names, lockers, strict=True)):
        place = _PLACES[i % len(_PLACES)]
        meta: JsonObject = {"control": "fact", "seed": seed, "index": i, "version": VERSION}
        facts.append(Problem(f"control-{seed}-fact-{i:03d}", f"What is the locker number of {name} at the {place}?",
                             str(num), f"The {place} records show that {name} has locker number {num}.", SOURCE, meta))
        related.append(Problem(f"control-{seed}-related-{i:03d}",
                               f"{name} wants to open a locker at the {place}. Which locker number does {name} open?",
                               str(num), None, SOURCE, {**meta, "control": "related", "fact": facts[-1].id}))
    unrelated = []
    for i, (city, platform) in enumerate(zip(r.sample(_CITIES, n), r.sample(range(100, 1000), n), strict=True)):
        unrelated.append(Problem(f"control-{seed}-null-{i:03d}",
                                 f"The train to {city} leaves from platform {platform}. Which platform does the train "
                                 f"to {city} leave from?", str(platform), None, SOURCE,
                                 {"control": "null", "seed": seed, "index": i, "version": VERSION}))
    return ControlSet(facts, related, unrelated)


def build(lm: LoadedModel, out: Path, *, n: int, seed: int, schedule: Any = None, overwrite: bool = False) -> BuildResult:
    """Capture the fact library (every fact in it, reference traces only) as a release at `out`."""
    from kvgraft.generalization import library

    cs = problems(n, seed)
    return library.build(lm, cs.facts, out, library_fraction=1.0, salt=f"controls-{seed}",
                         source=library.SourceRecord(source=SOURCE, limit=n, seed=seed), schedule=schedule,
                         settings=library.BuildSettings(generate=False), overwrite=overwrite)


def _outcome(name: Literal["replay", "related", "null"], g: GeneralizationResult, condition: Literal["own", "other"],
             comparison: str) -> PlantedControl:
    """One control's figures and whether it shows what it expects."""
    comp = next(c for c in g.comparisons if c.name == comparison)
    m = comp.mcnemar
    split = g.leakage.by_condition[condition]
    better = m.c > m.b
    if name == "replay":
        flagged = split.contaminated.n == comp.n
        shows = comp.significant and better and flagged
    elif name == "related":
        shows = comp.significant and better
    else:
        shows = not comp.significant
    assert comp.detectable is not None  # every comparison the audit makes says what it could detect
    runs = {(r.query_id, r.condition): r for r in g.runs}
    rows = [Row(query_id=q, entry_id=runs[(q, condition)].entry_id, entry_problem_id=runs[(q, condition)].entry_problem_id,
                baseline_correct=runs[(q, "none")].correct, graft_correct=runs[(q, condition)].correct,
                contaminated=bool(leak.contaminated) if (leak := runs[(q, condition)].leakage) is not None else False)
            for q in comp.query_ids]
    parts = {part: SplitPart(k=getattr(split, part).k, n=getattr(split, part).n, baseline_k=getattr(split, part).baseline.k)
             for part in ("clean", "contaminated")}
    return PlantedControl(name=name, expect=EXPECT[name], condition=condition, n=comp.n,
                          baseline=KN(k=m.correct_a, n=comp.n), graft=KN(k=m.correct_b, n=comp.n), mcnemar=m,
                          significant=comp.significant, detectable=comp.detectable, split=SplitParts(**parts),
                          shows=shows, verdict=comp.verdict, rows=rows)


def _statement(o: PlantedControl) -> str:
    from kvgraft.generalization.audit import power_phrase

    g, a, n = o.graft.k, o.baseline.k, o.n
    cond = "b" if o.condition == "own" else "c"
    head = f"{o.name} control: {cond} {g}/{n} vs a {a}/{n}, exact McNemar p = {o.mcnemar.p_exact:.3g}"
    sp = o.split
    split = (f"; wins clean {sp.clean.k}/{sp.clean.n}, contaminated {sp.contaminated.k}/"
             f"{sp.contaminated.n} (answer or text of the query in the grafted entry)")
    if o.name == "null":
        body = ("no significant difference, as planted; " + power_phrase(o.detectable)) if o.shows else \
            "a significant difference where none was planted: the audit's nulls cannot be read as evidence"
        return f"{head}: {body}"
    if o.shows:
        return f"{head}: shows the planted effect{split}"
    return (f"{head}: does NOT show the planted effect ({o.expect}){split}; the audit could not show that it "
            "finds this effect at this size")


def run(lm: LoadedModel, release: VerifiedRelease, *, n: int, seed: int, max_new_tokens: int = 32,
        executor: Executor | None = None) -> ControlsResult:
    """Run the three controls against the fact library `release` (built by `build` with the same n and seed, then
    `kvgraft.signing.verify.verified` under the policy it is read with: `OwnOutput` when built in this process)."""
    from kvgraft.generalization import audit as gen
    cs = problems(n, seed)

    def settings(policy: str) -> gen.Settings:
        return gen.Settings(max_new_tokens=max_new_tokens, policy=policy, text_conditions=False, n_boot=1000)

    t0 = time.perf_counter()
    replay = gen.audit(lm, release, [gen.Query(p, "library") for p in cs.facts], settings("exact"), executor=executor)
    related = gen.audit(lm, release, [gen.Query(p, "held_out") for p in cs.related], settings("nearest"), executor=executor)
    null = gen.audit(lm, release, [gen.Query(p, "held_out") for p in cs.unrelated], settings("nearest"), executor=executor)
    related_out = _outcome("related", related, "other", "held-out generalization (a vs c)")
    right_entry = sum(1 for r in related_out.rows if r.entry_problem_id == f"control-{seed}-fact-{r.query_id[-3:]}")
    outcomes = [_outcome("replay", replay, "own", "replay (a vs b)"),
                related_out.model_copy(update={"fact_entry_selected": right_entry}),
                _outcome("null", null, "other", "held-out generalization (a vs c)")]
    statements = [_statement(o) for o in outcomes]
    statements.append(f"related control: the entry holding the query's fact was the nearest other entry for "
                      f"{right_entry}/{outcomes[1].n} queries")
    # Unsealed: its status is judged where it becomes a verdict (kvgraft.audit.checks.seal).
    return ControlsResult.model_validate({
        "kind": KIND, "format_version": 1, "kvgraft_version": __version__, "model": replay.model.spec,
        "library": Library(path=str(release.root), root_digest=release.manifest["root_digest"],
                           entries=release.release.num_entries),
        "generator": Generator(source=SOURCE, n=n, seed=seed),
        "settings": {"max_new_tokens": max_new_tokens, "decoding": "greedy"},
        "controls": outcomes, "statements": statements, "seconds": time.perf_counter() - t0,
        "decode_tokens": sum(r.tokens.decode for g in (replay, related, null) for r in g.runs)})
