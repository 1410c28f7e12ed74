"""Differences in units that mean something for every value: ULP only between finite same-sign normal numbers,
absolute and relative difference always, and a face that says which."""

from __future__ import annotations

from typing import Any

import torch

from kvgraft.audit.checks import KINDS
from kvgraft.recompute.compare import diff_tensors, max_relative, max_ulp, ulp_comparable, ulp_distance
from kvgraft.render.views import heatmap_model, recompute_rows
from kvgraft.results.recompute import RecomputeData, TensorDiff


def steps(x: torch.Tensor, k: int) -> torch.Tensor:
    for _ in range(k):
        x = torch.nextafter(x, torch.full_like(x, float("inf")))
    return x


def test_ulp_between_same_sign_normals_counts_steps() -> None:
    a = torch.tensor([1.0, -3.5, 1e-20, 7e30], dtype=torch.float32)
    b = steps(a, 5)
    d = diff_tensors(a, b)
    assert (d.max_ulp, d.ulp_pairs, d.differing) == (5, 4, 4)
    assert 0 < d.max_rel < 1e-5


def test_across_zero_and_subnormals_is_no_ulp_figure() -> None:
    # The case that motivated it: a tiny difference across zero is ~2e9 ULP apart, which says nothing.
    stored = torch.tensor([-3.0e-5, 1.0, 1e-40, 2.0, float("inf")], dtype=torch.float32)
    fresh = torch.tensor([4.8e-5, 1.0, 3e-40, 2.0, 1e30], dtype=torch.float32)
    fresh[1] = steps(fresh[1:2], 2)[0]
    assert int(ulp_distance(stored, fresh)[0]) > 10**9  # what "max ULP" used to report
    assert ulp_comparable(stored, fresh).tolist() == [False, True, False, True, False]
    d = diff_tensors(stored, fresh)
    assert (d.differing, d.ulp_pairs, d.max_ulp) == (4, 1, 2)  # only the pair at 1.0 has a ULP distance
    assert d.max_abs > 1e300  # an infinite difference (the stored inf)
    # relative: |(-3e-5) - 4.8e-5| / 4.8e-5 = 1.625 at the sign change, the largest; inf is left out
    assert abs(d.max_rel - (7.8e-5 / 4.8e-5)) < 1e-6
    assert max_ulp(stored, fresh) == (2, 2)  # the equal pair at 2.0 counts too when no mask is given
    assert max_relative(torch.zeros(3), torch.zeros(3)) == 0.0


def test_bfloat16_and_float16_too() -> None:
    for dtype in (torch.bfloat16, torch.float16):
        a = torch.tensor([1.0, -2.0, 0.0], dtype=dtype)
        b = steps(a.float(), 0).to(dtype)
        b[0] = torch.nextafter(a[0:1], torch.tensor([2.0], dtype=dtype))[0]
        b[2] = -torch.finfo(dtype).tiny
        d = diff_tensors(a, b)
        assert (d.differing, d.ulp_pairs, d.max_ulp) == (2, 1, 1), dtype


def _entry(diff: TensorDiff) -> dict[str, Any]:
    return {"id": "e0", "num_tokens": 8, "byte_exact": False, "verdict": "consistent", "max_excess": 0.02,
            "layers": [{"index": 0, "kind": "full", "keys": diff.model_dump(), "values": {"equal": True, "differing": 0}}],
            "first_difference": {"layer": 0, "tensor": "keys", "location": [0, 0, 3, 1]}}


def test_face_and_tables_use_absolute_and_relative_where_ulp_means_nothing() -> None:
    stored = torch.tensor([[[[-3.0e-5, 1.0]]]])
    fresh = torch.tensor([[[[4.8e-5, 1.0]]]])
    diff = diff_tensors(stored, fresh).record()
    data = RecomputeData.model_validate({"entries": [_entry(diff)], "verdict": "consistent"})
    row = recompute_rows(data)[0]
    assert row["max_ulp"] is None and row["max_rel"] is not None  # no ULP figure for a pair across zero
    figures = " ".join(KINDS["recompute"].face(data).figures)
    assert "max |diff| 7.8e-05" in figures and "relative 1.625" in figures and "x the noise bound" in figures
    assert "ULP" not in figures
    assert heatmap_model(data)["metric"] == "abs"
    # A same-sign normal difference keeps its ULP figure, in the face and the heat map.
    ok = diff_tensors(torch.tensor([[[[1.0, 2.0]]]]), steps(torch.tensor([[[[1.0, 2.0]]]]), 3)).record()
    data = RecomputeData.model_validate({"entries": [_entry(ok)], "verdict": "consistent"})
    assert "3 ULP between same-sign normal values" in " ".join(KINDS["recompute"].face(data).figures)
    assert heatmap_model(data)["metric"] == "ulp"
    # Mixed: one cell with no ULP figure draws the whole heat map by absolute difference.
    mixed = RecomputeData.model_validate({"entries": [_entry(ok), {**_entry(diff), "id": "e1"}], "verdict": "consistent"})
    assert heatmap_model(mixed)["metric"] == "abs"
