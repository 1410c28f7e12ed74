"""The noise bound, replay and verdict functions, each pinned against values worked out by hand (mutmut survivors,
docs/mutation.md).

No model loads here except the tiny llama of tests/tiny.py (calibrate, perturbations): the rest are
pure functions of tensors and dicts, so each test is milliseconds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from kvgraft import verdict
from kvgraft.errors import EXIT_INCOMPLETE, EXIT_NOT_EXACT, EXIT_OK, InputError
from kvgraft.inference import reapply
from kvgraft.inference.reapply import Conditions
from kvgraft.inference.runtime import Schedule, attention
from kvgraft.recompute import audit as recompute
from kvgraft.recompute import noise
from kvgraft.recompute.compare import Judged
from kvgraft.recompute.noise import FACTOR, Judgement, NoiseBound, judge, worst
from kvgraft.results.recompute import EntryResult, LayerResult, PrefixGrafts, RecomputeResult, TensorDiff, WorstValues

# --------------------------------------------------------------------------- noise.judge / worst / allowed


def test_worst_is_the_worst_of_the_entries() -> None:
    assert worst([]) == "byte-exact"
    assert worst(["byte-exact", "byte-exact"]) == "byte-exact"
    assert worst(["consistent", "byte-exact"]) == "consistent"
    assert worst(["byte-exact", "inconsistent", "consistent"]) == "inconsistent"
    assert noise.VERDICTS == ("byte-exact", "consistent", "inconsistent") and FACTOR == 64.0


def test_judge_equal_tensors_is_nothing() -> None:
    t = torch.arange(24, dtype=torch.float32).reshape(1, 2, 3, 4)
    assert judge(t, t.clone(), torch.ones(1, 2, 3, 1)) == Judgement(0, 0.0, None, None, None)


def test_judge_locates_first_outside_and_worst() -> None:
    fresh = torch.zeros(1, 2, 3, 4, dtype=torch.float32)
    stored = fresh.clone()
    allowed = torch.full((1, 2, 3, 1), 0.5, dtype=torch.float64)
    stored[0, 0, 1, 2] = 0.25  # inside: excess 0.5
    stored[0, 0, 2, 1] = 1.0  # outside: excess 2, first in C order
    stored[0, 1, 0, 3] = -3.0  # outside: excess 6, the worst
    stored[0, 1, 2, 0] = 0.5  # exactly the allowed difference: excess 1.0 is inside
    j = judge(stored, fresh, allowed)
    assert j.outside == 2 and j.max_excess == 6.0
    assert j.first == [0, 0, 2, 1] and j.worst == [0, 1, 0, 3]
    assert j.worst_values == {"stored": -3.0, "fresh": 0.0, "abs_diff": 3.0, "allowed": 0.5}
    assert all(isinstance(i, int) for i in j.first + j.worst)


def test_judge_inside_only_has_a_worst_but_no_first() -> None:
    fresh = torch.ones(1, 1, 2, 2, dtype=torch.float32)
    stored = fresh.clone()
    stored[0, 0, 1, 1] = 1.5
    j = judge(stored, fresh, torch.ones(1, 1, 2, 1))
    assert (j.outside, j.max_excess, j.worst, j.first) == (0, 0.5, [0, 0, 1, 1], None)


def test_judge_non_finite_values() -> None:
    fresh = torch.zeros(1, 1, 1, 4, dtype=torch.float32)
    stored = fresh.clone()
    stored[0, 0, 0, 1] = float("nan")  # stored NaN, fresh finite: outside, infinitely
    stored[0, 0, 0, 3] = float("inf")
    j = judge(stored, fresh, torch.ones(1, 1, 1, 1))
    # infinitely outside: +inf, not the largest float (nan_to_num's posinf default wrote that finite figure)
    assert j.outside == 2 and j.max_excess == float("inf") and j.first == [0, 0, 0, 1] and j.worst == [0, 0, 0, 1]
    both = torch.full((1, 1, 1, 2), float("nan"))  # NaN where fresh is NaN too: the same computation
    assert judge(both, both.clone(), torch.ones(1, 1, 1, 1)) == Judgement(0, 0.0, None, None, None)
    fresh_nan = torch.tensor([[[[float("nan"), 0.0]]]])
    assert judge(torch.tensor([[[[1.0, 0.0]]]]), fresh_nan, torch.ones(1, 1, 1, 1)).outside == 0


def test_noise_bound_allowed_is_factor_times_noise_or_one_ulp() -> None:
    fresh = torch.tensor([[[[1.0, -4.0], [0.5, 0.25]]]], dtype=torch.float32)  # [1, 1, 2, 2]
    noise = torch.tensor([[[[1e-3], [0.0]]]], dtype=torch.float64)
    env = NoiseBound({"k": noise})
    a = env.allowed("k", fresh)
    eps = float(torch.finfo(torch.float32).eps)
    assert a.shape == (1, 1, 2, 1) and a.dtype == torch.float64
    assert a[0, 0, 0, 0].item() == 64.0 * max(1e-3, 4.0 * eps)  # the noise: above the row's ulp
    assert a[0, 0, 1, 0].item() == 64.0 * 0.5 * eps  # no noise: one ulp of the row's largest |value|
    assert NoiseBound({"k": noise}, factor=2.0).allowed("k", fresh)[0, 0, 1, 0].item() == 2.0 * 0.5 * eps
    assert env.record().model_dump() == {"factor": 64.0, "perturbations": [], "seconds": 0.0, "reused": False}


class _FakeModel:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def set_attn_implementation(self, attn: str) -> None:
        self.calls.append(attn)


class _FakeLM:
    def __init__(self, attn: str) -> None:
        self.model = _FakeModel()
        self.attn = attn


def test_attention_switches_and_restores() -> None:
    lm: Any = _FakeLM("sdpa")
    with attention(lm, "sdpa"):
        assert lm.attn == "sdpa"
    assert lm.model.calls == []
    with pytest.raises(RuntimeError), attention(lm, "eager"):
        assert lm.attn == "eager"
        raise RuntimeError
    assert lm.model.calls == ["eager", "sdpa"] and lm.attn == "sdpa"


def test_perturbations_and_calibrate_on_the_tiny_model(tiny_lm: Callable[[str], Any]) -> None:
    from kvgraft.inference.runtime import layer_map, prefill, threads

    lm = tiny_lm("llama")
    ids = list(range(5, 25))
    with threads(2):
        labels = [name for name, _ in noise.perturbations(lm, ids, Schedule())]
        assert labels == ["float64 (higher precision)", "eager attention", "1 thread", "chunks of 10",
                          "row 0 of a left-padded batch of 4"]
    with threads(1):
        assert [n for n, _ in noise.perturbations(lm, ids, Schedule(4))][2:4] == ["2 threads", "one-shot"]
    assert [n for n, _ in noise.perturbations(lm, list(range(5, 75)), Schedule())][3] == "chunks of 64"
    assert "chunks of" not in " ".join(n for n, _ in noise.perturbations(lm, [7], Schedule()))
    ref = layer_map(lm, prefill(lm, ids, Schedule())[0])[1]
    only = {"eager attention", "float64 (higher precision)"}
    env = noise.calibrate(lm, ids, Schedule(), ref, only=only)
    assert [r.name for r in env.runs] == ["float64 (higher precision)", "eager attention"]
    assert not env.reused and env.seconds > 0 and set(env.noise) == set(ref)
    for name, t in ref.items():
        assert env.noise[name].shape == (*t.shape[:-1], 1) and env.noise[name].dtype == torch.float64
        assert bool((env.noise[name] >= 0).all())
    assert any(bool((n > 0).any()) for n in env.noise.values())  # float64 differs from float32 somewhere
    for r in env.runs:
        assert set(r.model_dump(exclude_unset=True)) == {"name", "seconds", "tensors_differing", "max_abs"}
        assert r.max_abs >= 0
    again = noise.calibrate(lm, ids, Schedule(), ref, only=only)
    assert again.reused and again.seconds == 0.0 and again.runs == env.runs
    skipped = noise.calibrate(lm, ids, Schedule(), ref, skip={"eager attention", "1 thread", "2 threads",
                                                                 "chunks of 10", "row 0 of a left-padded batch of 4"})
    assert [r.name for r in skipped.runs] == ["float64 (higher precision)"] and not skipped.reused
    other = {k: v.clone() for k, v in ref.items()}
    first = next(iter(other))
    other[first].view(-1)[0] += 1.0  # other reference bytes: measured again
    assert not noise.calibrate(lm, ids, Schedule(), other, only=only).reused


def test_higher_precision_is_one_wider_copy_that_follows_the_attention_kernel(tiny_lm: Callable[[str], Any]) -> None:
    """The higher-precision perturbation's model: a float64 copy of the float32 model (the model itself
    untouched), made once per model, run with the kernel the model runs with now."""
    lm = tiny_lm("llama")
    high = noise._higher_precision(lm)
    assert high is not None and high.model is not lm.model
    assert next(high.model.parameters()).dtype == torch.float64
    assert next(lm.model.parameters()).dtype == torch.float32
    assert (high.spec, high.device, high.dtype, high.attn) == (lm.spec, lm.device, "float64", lm.attn)
    again = noise._higher_precision(lm)
    assert again is not None and again.model is high.model  # copied once, not per entry
    before = lm.attn
    other = "eager" if before != "eager" else "sdpa"
    with attention(lm, other):
        switched = noise._higher_precision(lm)
        assert switched is not None and switched.model is high.model
        assert switched.attn == other and switched.model.config._attn_implementation == other
    back = noise._higher_precision(lm)
    assert back is not None and back.model.config._attn_implementation == before


def test_perturbations_keep_every_position_of_the_sliding_layers_the_entry_stores_whole(
        tiny_lm: Callable[[str], Any]) -> None:
    """A release may store a sliding layer with every position (runtime.new_cache's `every`): each benign
    rerun must hold that layer the same way, or the bound would be measured on another shape."""
    import tiny

    lm = tiny_lm("gemma3")  # layer 0 slides over tiny.SLIDING_WINDOW tokens
    ids = list(range(5, 5 + tiny.SLIDING_WINDOW + 6))
    whole = {name: run()["layer.0.keys"].shape[2] for name, run in noise.perturbations(lm, ids, Schedule(), frozenset({0}))}
    assert len(whole) >= 4 and set(whole.values()) == {len(ids)}
    window = {name: run()["layer.0.keys"].shape[2] for name, run in noise.perturbations(lm, ids, Schedule())}
    assert set(window) == set(whole) and max(window.values()) < len(ids)  # control: the sliding cache's own


def test_judged_row_positions_are_absolute() -> None:
    """A judged tensor's locations, (batch, head, position, dim), shifted by the stored rows' first position."""
    values = {"stored": 1.0, "fresh": 1.5, "abs_diff": 0.5, "allowed": 0.25}
    j = Judgement(2, 3.5, [0, 1, 2, 3], [0, 0, 1, 7], values)
    assert recompute._judged(j, 10) == Judged(2, 3.5, [0, 1, 12, 3], [0, 0, 11, 7], WorstValues(**values))
    assert recompute._judged(Judgement(0, 0.0, None, None, None), 10) == Judged(0, 0.0, None, None, None)
    assert recompute._judged(Judgement(1, 2.0, [4, 5], None, None), 10).worst == [4, 5]  # not a row: as given


def _comparison(verdict: str) -> dict[str, Any]:
    exact = verdict == "byte-exact"
    return {"verdict": verdict, "byte_exact": exact, "first_differing_tensor": None if exact else "layer.0.keys",
            "max_abs_diff": 0.0 if exact else 1e-3, "differing_elements": 0 if exact else 1,
            "outside": int(verdict == "inconsistent"), "max_excess": 2.0 if verdict == "inconsistent" else 0.5,
            "first_outside_tensor": "layer.0.keys" if verdict == "inconsistent" else None}


def _graft(verdict: str, alone: str, entry: str = "e0") -> dict[str, Any]:
    return {"entry": entry, "tokens": 32, "of": 40, "schedule": {"chunk_tokens": None}, "rows": "rows [0, 32)",
            "verdict": verdict, "byte_exact": verdict == "byte-exact", "under_recorded_schedule": _comparison(verdict),
            "against_prefix_alone": _comparison(alone)}


def _grafts(*pairs: tuple[str, str], skipped: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"tokens": 32, "entries": [_graft(v, a) for v, a in pairs],
            "skipped": [{"entry": e, "reason": "too short"} for e in skipped]}


def test_prefix_statement_whole() -> None:
    grafts = _grafts(("byte-exact", "consistent"), ("consistent", "inconsistent"), ("inconsistent", "inconsistent"),
                     ("byte-exact", "byte-exact"), ("byte-exact", "inconsistent"), skipped=("a", "b"))
    assert recompute.prefix_statement(PrefixGrafts.model_validate(grafts)) == (
        "Prefix grafts of 32 tokens (rows [0, 32) of each entry's recorded prefill), judged under that schedule: "
        "3 byte-exact, 1 consistent, 1 inconsistent of 5; against a prefill of the prefix alone: 1 byte-identical, "
        "1 inside its noise bound, 3 outside; 2 entries skipped (no such prefix graft).")
    assert recompute.prefix_statement(PrefixGrafts.model_validate({**grafts, "skipped": []})).endswith(
        "1 inside its noise bound, 3 outside.")
    r = _model(_result(["byte-exact"], prefix_grafts=grafts))
    out = recompute.statements(r)
    assert r.prefix_grafts is not None
    assert out[-2:] == [recompute.prefix_statement(r.prefix_grafts), recompute.verdict_statement(r)]


def test_perturbations_run_the_other_attention_kernel(tiny_lm: Callable[[str], Any]) -> None:
    lm = tiny_lm("llama")
    ids = list(range(5, 15))
    for kernel, other in (("eager", "sdpa"), ("sdpa", "eager")):
        with attention(lm, kernel):
            labels = [name for name, _ in noise.perturbations(lm, ids, Schedule())]
        assert f"{other} attention" in labels and f"{kernel} attention" not in labels


def test_perturbations_rerun_with_other_threads_only_where_there_are_cores(tiny_lm: Callable[[str], Any],
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    lm = tiny_lm("llama")
    ids = list(range(5, 15))
    monkeypatch.setattr(noise, "cores", lambda: 1)
    assert not any("thread" in name for name, _ in noise.perturbations(lm, ids, Schedule()))
    monkeypatch.setattr(noise, "cores", lambda: 2)
    assert any("thread" in name for name, _ in noise.perturbations(lm, ids, Schedule()))


def test_perturbations_chunk_a_short_one_shot_prefix_in_halves_down_to_one_token(tiny_lm: Callable[[str], Any]) -> None:
    lm = tiny_lm("llama")

    def chunks(n: int) -> list[str]:
        return [name for name, _ in noise.perturbations(lm, list(range(5, 5 + n)), Schedule()) if "chunks" in name]

    assert chunks(3) == ["chunks of 1"] and chunks(2) == ["chunks of 1"] and chunks(1) == []
    assert chunks(10) == ["chunks of 5"] and chunks(200) == ["chunks of 64"]
    assert chunks(64) == ["chunks of 32"] and chunks(65) == ["chunks of 64"]  # the edge: more than 64 tokens


def test_the_other_attention_rerun_runs_under_that_kernel(tiny_lm: Callable[[str], Any],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    lm = tiny_lm("llama")
    ids = list(range(5, 15))
    real = noise.prefill
    seen: list[str] = []
    monkeypatch.setattr(noise, "prefill", lambda model, *a: seen.append(model.model.config._attn_implementation)
                        or real(model, *a))
    for kernel, other in (("eager", "sdpa"), ("sdpa", "eager")):
        with attention(lm, kernel):
            seen.clear()
            dict(noise.perturbations(lm, ids, Schedule()))[f"{other} attention"]()
            assert seen == [other] and lm.attn == kernel  # and switched back after the rerun


def test_a_calibration_is_reused_only_for_the_same_choice_of_perturbations(tiny_lm: Callable[[str], Any]) -> None:
    lm = tiny_lm("llama")
    ids = [31, 41, 59, 26, 53, 58, 97, 93, 23, 84, 62, 64]  # tokens no other test calibrates (the memo is shared)
    reference = noise.layer_map(lm, noise.prefill(lm, ids, Schedule(), noise.new_cache(lm, frozenset()))[0])[1]
    other = "eager attention" if lm.attn != "eager" else "sdpa attention"
    one = noise.calibrate(lm, ids, Schedule(), reference, only={other})
    every = noise.calibrate(lm, ids, Schedule(), reference)
    assert [r.name for r in one.runs] == [other] and not every.reused and len(every.runs) > 1
    again = noise.calibrate(lm, ids, Schedule(), reference)  # the control: the same question, answered once
    assert again.reused and [r.name for r in again.runs] == [r.name for r in every.runs]


def test_the_schedule_perturbations_rerun_one_shot_or_in_chunks_as_they_say(tiny_lm: Callable[[str], Any]) -> None:
    """The schedule rerun of a chunked entry is one forward pass; of a one-shot entry, chunks of half (here 5):
    each equal, bit for bit, to a prefill under that schedule (and the two schedules differ, the control)."""
    lm = tiny_lm("llama")
    ids = list(range(5, 15))

    def prefilled(sched: Schedule) -> dict[str, torch.Tensor]:
        return noise.layer_map(lm, noise.prefill(lm, ids, sched, noise.new_cache(lm, frozenset()))[0])[1]

    def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
        return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    one_shot, halves, ones = prefilled(Schedule()), prefilled(Schedule(5)), prefilled(Schedule(1))
    assert not same(one_shot, ones)  # the control: chunks of one token change the bytes here
    assert same(dict(noise.perturbations(lm, ids, Schedule(3)))["one-shot"](), one_shot)
    assert same(dict(noise.perturbations(lm, ids, Schedule()))["chunks of 5"](), halves)


def test_a_benign_rerun_that_overflows_or_gives_nan_adds_no_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    """An infinite or NaN difference from a benign rerun says nothing about the noise: it must not widen the
    noise bound to the largest float (which would judge every stored value consistent)."""
    ref = {"layer0.keys": torch.zeros(1, 1, 3, 3)}
    bad = torch.zeros(1, 1, 3, 3)
    bad[0, 0, 0, 1] = float("inf")  # row 0 overflows, row 1 is NaN, row 2 differs by a finite amount
    bad[0, 0, 1, 2] = float("nan")
    bad[0, 0, 2, 0] = 0.25
    monkeypatch.setattr(noise, "perturbations", lambda *a, **k: [("overflow", lambda: {"layer0.keys": bad})])
    bound = noise._measure(None, [1, 2, 3], Schedule(), ref, None, None)  # type: ignore[arg-type]
    assert bound.noise["layer0.keys"].flatten().tolist() == [0.0, 0.0, 0.25]
    assert bound.runs[0].name == "overflow" and bound.runs[0].max_abs == 0.25
    assert bound.runs[0].tensors_differing == 1


def test_measure_counts_the_tensors_each_rerun_changes_and_refuses_another_shape(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ref = {"a": torch.zeros(1, 1, 2, 2), "b": torch.zeros(1, 1, 2, 2), "c": torch.zeros(1, 1, 2, 2)}
    small = {**ref, "a": torch.full((1, 1, 2, 2), 1e-6), "c": torch.full((1, 1, 2, 2), 3.0)}
    runs = [("same", lambda: dict(ref)), ("two differ", lambda: small)]
    monkeypatch.setattr(noise, "perturbations", lambda *a, **k: runs)
    bound = noise._measure(None, [1, 2], Schedule(), ref, None, None)  # type: ignore[arg-type]
    assert [(r.name, r.tensors_differing, r.max_abs) for r in bound.runs] == [
        ("same", 0, 0.0), ("two differ", 2, 3.0)]
    runs[:] = [("cut", lambda: {**ref, "b": torch.zeros(1, 1, 1, 2)})]
    with pytest.raises(ValueError) as info:
        noise._measure(None, [1, 2], Schedule(), ref, None, None)  # type: ignore[arg-type]
    assert str(info.value) == "perturbation 'cut' gave b of shape [1, 1, 1, 2], expected [1, 1, 2, 2]"


def test_calibrating_an_entry_that_stores_a_sliding_layer_whole_measures_every_position(
        tiny_lm: Callable[[str], Any]) -> None:
    """_measure hands the entry's layout (`every`) to each rerun: without it the sliding layer's reruns hold the
    window only, and the bound cannot be measured against the whole stored layer."""
    import tiny

    lm = tiny_lm("gemma3")
    ids = list(range(5, 5 + tiny.SLIDING_WINDOW + 6))
    every = frozenset({0})
    reference = noise.layer_map(lm, noise.prefill(lm, ids, Schedule(), noise.new_cache(lm, every))[0])[1]
    assert reference["layer.0.keys"].shape[2] == len(ids)
    bound = noise._measure(lm, ids, Schedule(), reference, {"eager attention", "sdpa attention"}, None, every)
    assert bound.noise["layer.0.keys"].shape[2] == len(ids) and len(bound.runs) == 1


def test_on_a_gpu_the_perturbations_add_the_same_run_with_matmul_precision_switched(
        tiny_lm: Callable[[str], Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU-only rerun, reached on this CPU machine: a model that says it is on cuda gets one more run, the
    plain rerun under `_switched_matmul` (its flags: test_switched_matmul_...), computed here on the CPU."""
    import dataclasses

    lm = tiny_lm("llama")
    ids = list(range(5, 15))
    label = "reduced-precision matmul switched"
    assert label not in dict(noise.perturbations(lm, ids, Schedule()))
    from kvgraft.inference.models import LoadedModel

    class OnCuda(LoadedModel):
        @property
        def torch_device(self) -> torch.device:
            return torch.device("cuda")

    on_cuda = OnCuda(**{f.name: getattr(lm, f.name) for f in dataclasses.fields(lm)})
    real = noise.prefill
    monkeypatch.setattr(noise, "_higher_precision", lambda model: None)
    monkeypatch.setattr(noise, "prefill", lambda model, i, sched, cache: real(lm, i, sched, cache))
    runs = dict(noise.perturbations(on_cuda, ids, Schedule()))
    switched: list[int] = []
    monkeypatch.setattr(noise, "_switched_matmul", lambda fn: switched.append(1) or fn())
    got = runs[label]()
    plain = noise.layer_map(lm, real(lm, ids, Schedule(), noise.new_cache(lm, frozenset()))[0])[1]
    assert switched == [1] and set(got) == set(plain) and all(torch.equal(got[k], plain[k]) for k in plain)


def test_first_difference_names_the_first_differing_row() -> None:
    d = _t(False, first=[0, 1, 2, 3], max_ulp=4, max_abs=0.5, shape_mismatch=None)

    def first(rows: list[LayerResult]) -> dict[str, Any] | None:
        found = recompute._first_difference(rows)
        return None if found is None else found.model_dump(exclude_unset=True)

    rows = [_row(0, keys=_t(), values=_t()), _row(1, keys=_t(), values=d), _row(2, layout_mismatch="later")]
    assert first(rows) == {"layer": 1, "tensor": "values", "location": [0, 1, 2, 3],
                           "named": {"batch": 0, "head": 1, "position": 2, "dim": 3},
                           "max_ulp": 4, "max_abs": 0.5, "detail": None}
    assert first([_row(5, layout_mismatch="stored 2 positions, expected 4"), rows[1]]) == {
        "layer": 5, "tensor": None, "detail": "stored 2 positions, expected 4"}
    assert first(rows[:1]) is None
    assert first([_row(4, keys=d, values=d)]) == {
        "layer": 4, "tensor": "keys", "location": [0, 1, 2, 3], "named": {"batch": 0, "head": 1, "position": 2, "dim": 3},
        "max_ulp": 4, "max_abs": 0.5, "detail": None}
    # a comparison read back without shape_mismatch (a fresh one states it, null or not) is no comparison
    with pytest.raises(ValueError, match="compared without shape_mismatch"):
        recompute._first_difference([_row(4, keys=_t(False, first=[0, 1, 2, 3], max_ulp=4, max_abs=0.5))])


def test_switched_matmul_flips_each_reduced_precision_flag_for_one_run_and_restores_them() -> None:
    """The GPU-only perturbation's switch, run on the flags themselves (settable without a GPU)."""
    m = torch.backends.cuda.matmul
    names = ("allow_tf32", "allow_bf16_reduced_precision_reduction", "allow_fp16_reduced_precision_reduction")
    before = tuple(getattr(m, n) for n in names)
    for start in ((False, True, False), (True, False, True)):
        for n, v in zip(names, start, strict=True):
            setattr(m, n, v)
        seen: list[tuple[bool, ...]] = []

        def run(seen: list[tuple[bool, ...]] = seen) -> dict[str, torch.Tensor]:
            seen.append(tuple(getattr(m, n) for n in names))
            return {"x": torch.zeros(1)}

        assert list(noise._switched_matmul(run)) == ["x"]
        assert seen == [tuple(not v for v in start)]
        assert tuple(getattr(m, n) for n in names) == start

        def fails() -> dict[str, torch.Tensor]:
            raise RuntimeError("boom")

        with pytest.raises(RuntimeError):
            noise._switched_matmul(fails)
        assert tuple(getattr(m, n) for n in names) == start  # restored after a failing run too
    for n, v in zip(names, before, strict=True):
        setattr(m, n, v)


# --------------------------------------------------------------------------- replay


def test_load_options_replays_the_record_unless_overridden() -> None:
    rec = {"device": "cpu", "dtype": "bfloat16", "attn_implementation": "eager"}
    assert Conditions().load_options(rec) == ("cpu", "bfloat16", "eager")
    assert Conditions("cpu", "float16", "sdpa").load_options(rec) == ("cpu", "float16", "sdpa")
    assert Conditions().load_options({**rec, "attn_implementation": "vllm:CPU_ATTN"})[2] == "sdpa"
    if not torch.cuda.is_available():
        assert Conditions().load_options({**rec, "device": "cuda"})[0] == "cpu"
    with pytest.raises(InputError) as info:
        Conditions().load_options({**rec, "dtype": "int8"})
    assert str(info.value) == ("recorded dtype 'int8' is not one kvgraft can load (float32, bfloat16, float16); "
                               "pass --dtype")
    assert Conditions(dtype="float32").load_options({**rec, "dtype": "int8"})[1] == "float32"


def test_load_options_loads_on_cuda_only_when_recorded_there_and_present(monkeypatch: pytest.MonkeyPatch) -> None:
    """The device branch, with CUDA's presence simulated (this machine has none): the recorded cuda is
    replayed where CUDA is present, the recorded cpu stays cpu, and without CUDA cuda falls back to cpu."""
    rec = {"device": "cuda", "dtype": "float32", "attn_implementation": "sdpa"}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert Conditions().load_options(rec)[0] == "cuda"
    assert Conditions().load_options({**rec, "device": "cpu"})[0] == "cpu"
    assert Conditions().load_options({**rec, "device": None})[0] == "cpu"
    assert Conditions(device="cpu").load_options({**rec, "device": "cuda"})[0] == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert Conditions().load_options(rec)[0] == "cpu"


def test_schedule_override() -> None:
    rec = {"chunk_tokens": 8, "add_special_tokens": False, "add_generation_prompt": True}
    assert Conditions().schedule(rec) is None
    assert Conditions(chunk=4).schedule(rec) == Schedule(4, False, True)
    assert Conditions(one_shot=True).schedule(rec) == Schedule(None, False, True)
    with pytest.raises(InputError) as info:
        Conditions(chunk=4, one_shot=True).schedule(rec)
    assert str(info.value) == "--chunk and --one-shot exclude each other"


def test_thread_count() -> None:
    assert Conditions().thread_count({"threads": 3}, "cpu") == 3
    assert Conditions(threads=5).thread_count({"threads": 3}, "cpu") == 5
    assert Conditions(threads=5).thread_count({"threads": 3}, "cuda") is None
    assert Conditions().thread_count({"threads": True}, "cpu") is None
    assert Conditions().thread_count({"threads": "3"}, "cpu") is None
    assert Conditions().thread_count({}, "cpu") is None


def test_overrides() -> None:
    rec = {"device": "cpu", "dtype": "float32", "attn_implementation": "sdpa", "threads": 2,
           "deterministic_algorithms": False}
    assert Conditions("cpu", None, "sdpa", 2).overrides(rec) == {}
    assert Conditions("cuda", "bfloat16", "eager", 4).overrides(rec) == {
        "device": "cuda", "dtype": "bfloat16", "attn_implementation": "eager", "threads": 4}


class _ParamModel(_FakeModel):
    def parameters(self) -> Any:
        return iter([torch.zeros(1)])


class _ParamLM(_FakeLM):
    def __init__(self, attn: str) -> None:
        self.model = _ParamModel()
        self.attn = attn
        self.torch_device = torch.device("cpu")


def test_applied_sets_the_recorded_conditions_and_restores_them() -> None:
    lm: Any = _ParamLM("sdpa")
    n0, det0 = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    recorded = {"attn_implementation": "eager", "threads": 1, "deterministic_algorithms": not det0}
    with reapply.applied(lm, recorded, {}):
        assert lm.attn == "eager" and torch.get_num_threads() == 1
        assert torch.are_deterministic_algorithms_enabled() == (not det0)
    assert lm.attn == "sdpa" and torch.get_num_threads() == n0 and torch.are_deterministic_algorithms_enabled() == det0
    with reapply.applied(lm, recorded, {"attn_implementation": "sdpa", "threads": 2}):
        assert lm.attn == "sdpa" and torch.get_num_threads() == 2
        assert torch.are_deterministic_algorithms_enabled() == (not det0)  # not overridden: the record's
    assert torch.get_num_threads() == n0 and torch.are_deterministic_algorithms_enabled() == det0
    for bad in ({"threads": 0}, {"threads": True}, {"attn_implementation": "vllm:X"}, {"deterministic_algorithms": 1}):
        with reapply.applied(lm, bad, {}):
            assert lm.attn == "sdpa" and torch.get_num_threads() == n0
            assert torch.are_deterministic_algorithms_enabled() == det0
    remote: Any = _FakeLM("sdpa")  # no parameters: remote workers set their own conditions
    with reapply.applied(remote, recorded, {}):
        assert remote.attn == "sdpa" and torch.get_num_threads() == n0
    assert lm.model.calls == ["eager", "sdpa"]


def test_describe_and_summary() -> None:
    recorded = {"device": "cpu", "dtype": "float32", "threads": 4, "torch": "2.0"}
    current = {"device": "cpu", "dtype": "bfloat16", "threads": 2, "torch": "2.1"}
    d = reapply.describe(recorded, current, {"dtype": "bfloat16"})
    assert d == {"replayed": ["device"], "overridden": {"dtype": {"recorded": "float32", "used": "bfloat16"}},
                 "not_replayed": {"threads": [4, 2], "torch": ["2.0", "2.1"]}}
    assert reapply.summary(d) == ("overridden: dtype 'float32' -> 'bfloat16'; not replayed: threads 4 -> 2, "
                                 "torch '2.0' -> '2.1'")
    assert reapply.describe({"a": 1}, {}, {"threads": 3})["overridden"] == {"threads": {"recorded": None, "used": 3}}
    same = reapply.describe({"device": "cpu"}, {"device": "cpu"}, {})
    assert same == {"replayed": ["device"], "overridden": {}, "not_replayed": {}}
    assert reapply.summary(same) == "every recorded condition replayed"
    assert reapply.summary({"overridden": {}, "not_replayed": {"b": [1, 2], "a": [3, 4]}}) == \
        "not replayed: a 3 -> 4, b 1 -> 2"
    two = {"overridden": {"threads": {"recorded": 4, "used": 2}, "dtype": {"recorded": "float32", "used": "float16"}},
           "not_replayed": {}}
    assert reapply.summary(two) == "overridden: dtype 'float32' -> 'float16', threads 4 -> 2"
    assert reapply.REAPPLIED == ("device", "dtype", "attn_implementation", "threads", "deterministic_algorithms")
    # a condition one side does not report and the other reports as null is equal: replayed
    assert reapply.describe({"device": "cpu"}, {"device": "cpu", "cuda": None}, {})["replayed"] == ["device", "cuda"]
    assert reapply.describe({"device": "cpu", "cuda": None}, {"device": "cpu"}, {})["replayed"] == ["device", "cuda"]


# --------------------------------------------------------------------------- recompute's verdict


def _t(equal: bool = True, **kw: Any) -> TensorDiff:
    """A comparison holding only the members given (as a journal's might)."""
    return TensorDiff.model_construct(equal=equal, **kw)


def _row(index: int, **kw: Any) -> LayerResult:
    return LayerResult.model_construct(index=index, **kw)


def _classify(rows: list[LayerResult]) -> tuple[str, dict[str, Any] | None]:
    verdict, outside = recompute.classify(rows)
    return verdict, None if outside is None else outside.model_dump(exclude_unset=True)


def test_classify_every_case() -> None:
    assert _classify([_row(0, keys=_t(), values=_t())]) == ("byte-exact", None)
    assert _classify([]) == ("byte-exact", None)
    inside = _t(False, outside=0, max_excess=0.5)
    assert _classify([_row(0, keys=_t(), values=inside)]) == ("consistent", None)
    assert _classify([_row(0, layout_mismatch="m")])[0] == "inconsistent"
    values = WorstValues(stored=1.0, fresh=2.0, abs_diff=1.0, allowed=0.5)
    a = _t(False, outside=2, max_excess=3.0, first_outside=[0, 1, 2, 3], worst=[0, 1, 4, 5], worst_values=values)
    b = _t(False, outside=5, max_excess=9.0, first_outside=[0, 0, 0, 0], worst=[0, 0, 1, 2], worst_values=None)
    rows = [_row(0, keys=_t(), values=a), _row(2, keys=b, values=_t()),
            _row(3, layout_mismatch="layer 3 is absent"),
            _row(4, keys=_t(False, shape_mismatch="stored [1], fresh [2]"), values=_t())]
    v, s = _classify(rows)
    assert v == "inconsistent"
    assert s == {"elements": 7, "tensors": 3, "layers": [0, 2, 3, 4], "layout": ["layer 3: layer 3 is absent"],
                 "shape": ["layer 4 keys: stored [1], fresh [2]"],
                 "first": {"layer": 0, "tensor": "values", "batch": 0, "head": 1, "position": 2, "dim": 3},
                 "worst": {"layer": 2, "tensor": "keys", "batch": 0, "head": 0, "position": 1, "dim": 2,
                           "excess": 9.0}}
    # the worst is the largest excess, wherever it lies (here in the lower layer, the first row)
    big = _t(False, outside=1, max_excess=50.0, first_outside=[0, 0, 0, 0], worst=[0, 1, 0, 0], worst_values=None)
    _, s = _classify([_row(0, keys=big, values=_t()), _row(3, keys=a, values=_t())])
    assert s is not None and s["worst"] == {"layer": 0, "tensor": "keys", "batch": 0, "head": 1, "position": 0,
                                            "dim": 0, "excess": 50.0}
    _, s = _classify([_row(0, keys=a, values=_t())])  # the worst element's values, where the judgement has them
    assert s is not None and s["worst"] == {"layer": 0, "tensor": "keys", "batch": 0, "head": 1, "position": 4,
                                            "dim": 5, "stored": 1.0, "fresh": 2.0, "abs_diff": 1.0, "allowed": 0.5,
                                            "excess": 3.0}
    odd = _t(False, outside=1, max_excess=2.0, first_outside=[1, 2], worst=[1, 2], worst_values=None)
    _, s = _classify([_row(1, values=odd)])
    assert s is not None and s["first"] == {"layer": 1, "tensor": "values"}
    assert s["worst"] == {"layer": 1, "tensor": "values", "excess": 2.0}
    # a judgement read back without one of its members (a fresh one states each) is no judgement
    partial = _t(False, outside=1, max_excess=2.0, first_outside=[1, 2], worst=[1, 2])
    with pytest.raises(ValueError, match="judged without worst_values"):
        recompute.classify([_row(1, values=partial)])


def _distribution(kl: float, equal: bool) -> dict[str, Any]:
    return {"kl_per_position": [kl], "kl_max": kl, "kl_mean": kl, "greedy_agreement": 1.0, "topk": 5,
            "topk_overlap_mean": 1.0, "max_abs_logit_diff": 0.0 if equal else 0.5, "logits_equal": equal}


def _entry(i: int, v: str) -> dict[str, Any]:
    """A whole entry result with verdict `v` (its comparisons left out: what the statements read is here)."""
    return {"id": f"e{i}", "num_tokens": 10 + i, "byte_exact": v == "byte-exact", "verdict": v, "outside": None,
            "noise_bound": None, "max_excess": 0.0, "tensors_equal": 0, "tensors": 0, "next_token_logits_equal": True,
            "first_difference": None, "layers": [], "probe_token_ids": [1],
            "matched": _distribution(0.0 if v == "byte-exact" else 0.5, v == "byte-exact"),
            "natural": _distribution(-0.25 * i, i == 0),
            "seconds": {"prefill": 0.0, "compare": 0.0, "noise_bound": 0.0, "total": 0.0}}


def _result(verdicts: list[str], *, require: str = "exact", passed: bool = True, **extra: Any) -> dict[str, Any]:
    """A whole recompute result of entries with these verdicts, as its file holds it."""
    return {"kind": "kvgraft-recompute-result", "format_version": 1, "kvgraft_version": "0",
            "release": {"path": "rel", "root_digest": "0" * 64},
            "model": {"spec": "m", "identity": {}, "release_identity": "0" * 64, "forced": False},
            "schedule": {"chunk_tokens": None},
            "environment": {"recorded": {}, "differences": {},
                            "current": {"device_name": "cpu0", "device": "cpu", "dtype": "float32",
                                        "attn_implementation": "sdpa", "threads": 2}},
            "conditions": {"replayed": [], "not_replayed": {}, "overridden": {}}, "require": require,
            "entries": [_entry(i, v) for i, v in enumerate(verdicts)], "all_byte_exact": False,
            "verdict": worst(verdicts), "passed": passed, "statements": [], **extra}


def _model(r: dict[str, Any]) -> RecomputeResult:
    return RecomputeResult.model_validate(r)


def test_verdict_statement_whole() -> None:
    r = _result(["byte-exact"])
    assert recompute.verdict_statement(_model(r)) == (
        "Verdict byte-exact (every SHA-256 equal) on cpu0 (cpu, float32, sdpa, 2 threads), every recorded condition "
        "replayed: 1 byte-exact, 0 consistent, 0 inconsistent of 1 entries; requirement exact: met.")
    r = _result(["byte-exact", "consistent", "inconsistent", "inconsistent"], require="consistent", passed=False)
    r["conditions"] = {"replayed": [], "not_replayed": {"threads": [4, 2], "cpu_isa": ["a", "b"]},
                       "overridden": {"dtype": {"recorded": "float32", "used": "bfloat16"},
                                      "threads": {"recorded": 4, "used": 1}}}
    r["entries"][2]["outside"] = {"worst": {"layer": 1, "tensor": "keys", "head": 0, "position": 3, "dim": 7,
                                            "abs_diff": 0.012345, "excess": 123.456}, "layout": [], "shape": [],
                                  "elements": 1, "tensors": 1, "layers": [1]}
    r["entries"][3]["outside"] = {"layout": ["layer 0: gone"], "shape": ["layer 1 keys: s"], "elements": 0,
                                  "tensors": 1, "layers": [0, 1]}
    assert recompute.verdict_statement(_model(r)) == (
        "Verdict inconsistent (some difference lies outside the noise bound: not the same computation) on cpu0 (cpu, "
        "float32, sdpa, 2 threads), not replayed: cpu_isa 'a' -> 'b', threads 4 -> 2; overridden: dtype 'float32' -> "
        "'bfloat16', threads 4 -> 1: 1 byte-exact, 1 consistent, 2 inconsistent of 4 entries; requirement consistent: NOT met. "
        "Outside the noise bound: e2: layer 1 keys (head 0, position 3, dim 7) |diff| 0.0123 is 123x the noise bound; "
        "e3: layer 0: gone; layer 1 keys: s.")
    r = _result(["consistent"])
    assert "Verdict consistent (bytes differ, every difference inside the measured noise bound of the same " \
           "computation)" in recompute.verdict_statement(_model(r))


def test_statements_whole() -> None:
    r = _model(_result(["byte-exact"]))
    out = recompute.statements(r)
    assert out[:2] == [
        "Matched schedule (one-shot, same recorded environment): KV bytes identical (SHA-256 equal) in 1/1 entries; "
        "KL(fresh ‖ grafted) exactly 0.0 in 1/1.",
        "Natural contrast (one forward pass over prefix + probe, no cache): logits identical in 1/1 entries; "
        "max KL(natural ‖ grafted) = 0.0."]
    assert len(out) == 3 and out[2] == recompute.verdict_statement(r)
    d = _result(["byte-exact", "consistent", "inconsistent"], schedule_overridden=True)
    d["schedule"] = {"chunk_tokens": 16}
    d["environment"]["differences"] = {"torch": [1, 2], "cpu_isa": [2, 3]}
    d["model"]["forced"] = True
    r = _model(d)
    out = recompute.statements(r)
    assert out[0] == ("Recomputed with an overridden schedule (chunks of 16, environment differs in cpu_isa, torch): "
                      "KV bytes identical (SHA-256 equal) in 1/3 entries; KL(fresh ‖ grafted) exactly 0.0 in 1/3.")
    assert out[1] == ("Natural contrast (one forward pass over prefix + probe, no cache): logits identical in "
                      "1/3 entries; max KL(natural ‖ grafted) = 5.000e-01; byte-exactness and zero KL do not hold "
                      "for this comparison.")  # |-0.5|: the largest natural KL's magnitude
    assert out[2] == "The model's identity differs from the release's (forced): differences are expected."
    assert out[-1] == recompute.verdict_statement(r) and len(out) == 4
    # no entry compared: no natural KL was measured, and none is made up
    out = recompute.statements(_model(_result([])))
    assert out[1] == ("Natural contrast (one forward pass over prefix + probe, no cache): logits identical in 0/0 "
                      "entries; max KL(natural ‖ grafted) = 0.0.")


def test_statements_of_a_sampled_audit_say_how_it_was_drawn_and_its_bound() -> None:
    d = _result(["byte-exact", "byte-exact"])
    d["sample"] = {"size": 2, "population": 12000, "method": "sha256-rank-v1", "nonce": "n0", "nonce_source": "given",
                   "weighting": "uniform over entries", "root_digest": "0" * 64, "population_tokens": 480000,
                   "positions": [7, 11], "entries": ["e0", "e1"]}
    r = _model(d)
    out = recompute.statements(r)
    assert out[2] == ("Sample: 2 of 12,000 entries drawn by sha256-rank-v1 from the root digest and nonce 'n0' (given), "
                      "uniform over entries; re-derive: kvgraft audit sample RELEASE --check RESULT.json.")
    assert len(out) == 4 and out[3] == recompute.verdict_statement(r)  # no bound recorded: no bound sentence
    from kvgraft import sampling

    d["bound"] = sampling.bound([False, False], [10, 11], [40] * 11998).as_dict("not byte-exact")
    r = _model(d)
    out = recompute.statements(r)
    assert out[3] == f"Bound: {sampling.sentence(d['bound'])}." and out[3].startswith("Bound: 0 of 2 sampled fail")
    assert len(out) == 5 and out[4] == recompute.verdict_statement(r)


def test_the_verdict_is_the_worst_of_the_entries_and_the_prefix_grafts() -> None:
    def conclude(verdicts: list[str], grafts: list[str] | None, require: str = "exact") -> tuple[str, bool, bool]:
        entries = [EntryResult.model_validate(_entry(i, v)) for i, v in enumerate(verdicts)]
        judged = None if grafts is None else PrefixGrafts.model_validate(_grafts(*((g, g) for g in grafts)))
        c = recompute.conclude(entries, judged, require)
        return c.verdict, c.passed, c.all_byte_exact

    assert conclude(["byte-exact", "byte-exact"], None) == ("byte-exact", True, True)
    assert conclude(["byte-exact", "byte-exact"], ["byte-exact", "inconsistent"]) == ("inconsistent", False, True)
    assert conclude(["byte-exact", "byte-exact"], ["consistent"], "consistent") == ("consistent", True, True)
    assert conclude(["byte-exact", "byte-exact"], ["consistent"]) == ("consistent", False, True)
    assert conclude(["byte-exact", "inconsistent"], ["consistent"]) == ("inconsistent", False, False)
    assert conclude([], []) == ("byte-exact", True, True)


def test_requirements_and_failing() -> None:
    assert recompute.passes("byte-exact", "exact") and recompute.passes("byte-exact", "consistent")
    assert not recompute.passes("consistent", "exact") and recompute.passes("consistent", "consistent")
    assert not recompute.passes("inconsistent", "consistent") and not recompute.passes("inconsistent", "exact")
    with pytest.raises(InputError) as info:
        recompute.passes("byte-exact", "close")
    assert str(info.value) == "--require close: expected one of exact, consistent"
    recompute.check_requirement("exact")
    recompute.check_requirement("consistent")
    consistent = EntryResult.model_validate(_entry(0, "consistent"))
    assert recompute.failing(consistent, "exact") and not recompute.failing(consistent, "consistent")
    assert recompute.failing({"verdict": "consistent"}, "exact") and not recompute.failing({"verdict": "consistent"},
                                                                                            "consistent")
    assert recompute.check_requirement("consistent") == "consistent"


def test_bound_counts_failing_entries_and_the_rest() -> None:
    from kvgraft import sampling

    r = _model(_result(["byte-exact", "consistent", "inconsistent"], require="consistent"))
    ids, tokens = [*(e.id for e in r.entries), "x", "y"], [*(e.num_tokens for e in r.entries), 40, 50]
    got = recompute.bound(r.entries, "consistent", ids, tokens)
    want = sampling.bound([False, False, True], [10, 11, 12], [40, 50]).as_dict("inconsistent")
    assert got.model_dump() == want
    exact = recompute.bound(r.entries, "exact", ids, tokens)
    assert exact.model_dump() == sampling.bound([False, True, True], [10, 11, 12], [40, 50]).as_dict("not byte-exact")


# --------------------------------------------------------------------------- the status rules (audit/checks) and verdict.py


def test_exit_codes() -> None:
    assert [verdict.exit_code(s) for s in verdict.STATUSES] == [EXIT_OK, EXIT_NOT_EXACT, EXIT_INCOMPLETE]
    with pytest.raises(InputError) as info:
        verdict.exit_code("done")
    assert str(info.value) == "unknown status 'done' (one of passed, failed, incomplete)"
