"""The comparison: bitwise tensor diffs (count, max abs and relative, ULP where it means something, first location), KL."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

from kvgraft.inference.tensors import tensor_sha256
from kvgraft.results import recompute as res

_ORDERED_INT = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16,
                torch.float64: torch.int64}


@dataclass
class TensorDiff:
    """How a fresh tensor differs from a stored one. `first` is (batch, head, position, dim)."""

    equal: bool
    sha256_fresh: str
    sha256_stored: str
    elements: int
    differing: int = 0
    max_abs: float = 0.0
    max_ulp: int = 0  # among the ulp_pairs only: see `ulp_comparable`
    first: list[int] | None = None
    shape_mismatch: str | None = None
    max_rel: float = 0.0  # largest |stored - fresh| / max(|stored|, |fresh|) over finite differing elements
    ulp_pairs: int = 0  # differing elements whose ULP distance means something (finite, normal, same sign)

    @property
    def fraction(self) -> float:
        return self.differing / self.elements if self.elements else 0.0

    def record(self, judged: Judged | None = None) -> res.TensorDiff:
        """As a result records it; with `judged`, how far it lies outside the noise bound."""
        return res.TensorDiff(**asdict(self), fraction=self.fraction,
                              **({} if judged is None else {f: getattr(judged, f) for f in JUDGED}))


JUDGED = ("outside", "max_excess", "worst", "first_outside", "worst_values")


@dataclass(frozen=True)
class Judged:
    """A differing tensor judged against the noise bound (kvgraft.recompute.noise.judge), positions absolute."""

    outside: int
    max_excess: float
    worst: list[int] | None
    first_outside: list[int] | None
    worst_values: res.WorstValues | None


def ordered(t: torch.Tensor) -> torch.Tensor:
    """Map floats to integers whose difference is the distance in units in the last place."""
    it = _ORDERED_INT[t.dtype]
    bits = t.contiguous().view(it).to(torch.int64)
    sign_mask = {torch.int16: 0x7FFF, torch.int32: 0x7FFFFFFF, torch.int64: 0x7FFFFFFFFFFFFFFF}[it]
    return torch.where(bits < 0, -(bits & sign_mask), bits)


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (ordered(a) - ordered(b)).abs()


def ulp_comparable(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Where a ULP distance is a useful figure: both values finite, normal (not zero or subnormal) and of the
    same sign. Across zero it counts every float between them (1.7e9 ULP between -1e-30 and 1e-30), and
    among subnormals a unit is no longer relative to the value; there only absolute and relative differences
    say how far apart two numbers are."""
    tiny = torch.finfo(a.dtype).tiny
    a64, b64 = a.double(), b.double()
    return (torch.isfinite(a64) & torch.isfinite(b64) & (a64.abs() >= tiny) & (b64.abs() >= tiny)
            & (torch.signbit(a64) == torch.signbit(b64)))


def max_ulp(a: torch.Tensor, b: torch.Tensor, where: torch.Tensor | None = None) -> tuple[int, int]:
    """(largest ULP distance, how many elements it is taken over) among the ULP-comparable elements
    (`ulp_comparable`), within `where` when given (e.g. the differing ones)."""
    ok = ulp_comparable(a, b)
    if where is not None:
        ok &= where
    pairs = int(ok.sum())
    return (int(ulp_distance(a, b)[ok].max()) if pairs else 0), pairs


def max_relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |a - b| / max(|a|, |b|) over elements where both are finite and not both zero (0.0 if none)."""
    a64, b64 = a.double(), b.double()
    scale = torch.maximum(a64.abs(), b64.abs())
    ok = torch.isfinite(a64) & torch.isfinite(b64) & (scale > 0)
    return float(((a64 - b64).abs()[ok] / scale[ok]).max()) if bool(ok.any()) else 0.0


def diff_tensors(stored: torch.Tensor, fresh: torch.Tensor, *, stored_sha256: str | None = None,
                 fresh_sha256: str | None = None, position_offset: int = 0) -> TensorDiff:
    """Compare bit for bit; on a difference count it, size it and locate the first element.

    `position_offset` turns the tensor's sequence index into an absolute token position
    (sliding-window layers hold only the last positions).
    """
    s_sha = stored_sha256 or tensor_sha256(stored)
    f_sha = fresh_sha256 or tensor_sha256(fresh)
    n = int(stored.numel())
    if stored.shape != fresh.shape or stored.dtype != fresh.dtype:
        return TensorDiff(False, f_sha, s_sha, n, differing=n,
                          shape_mismatch=f"stored {list(stored.shape)} {stored.dtype}, fresh {list(fresh.shape)} {fresh.dtype}")
    if f_sha == s_sha:
        return TensorDiff(True, f_sha, s_sha, n)
    fresh = fresh.to(stored.device)
    # Bitwise inequality: -0.0 vs 0.0 and NaN payloads count as differences, as in the digest.
    it = _ORDERED_INT.get(stored.dtype)
    neq = stored.view(it) != fresh.view(it) if it is not None else stored != fresh
    differing = int(neq.sum())
    idx = int(torch.nonzero(neq.reshape(-1))[0, 0]) if differing else 0
    first = [int(i) for i in np.unravel_index(idx, tuple(stored.shape))]
    if len(first) == 4:
        first[2] += position_offset
    ulp, pairs, rel = 0, 0, 0.0
    if stored.is_floating_point():
        delta = (stored.double() - fresh.double()).abs()
        # posinf stated: nan_to_num would turn an infinite difference into 1.797e308, a finite lie
        max_abs = float(torch.nan_to_num(delta, nan=float("inf"), posinf=float("inf")).max())
        if it is not None:
            ulp, pairs = max_ulp(stored, fresh, neq)
        rel = max_relative(stored, fresh)
    else:
        max_abs = float((stored.long() - fresh.long()).abs().max())
    return TensorDiff(False, f_sha, s_sha, n, differing, max_abs, ulp, first, max_rel=rel, ulp_pairs=pairs)


@dataclass
class DistributionDiff:
    """KL(reference ‖ other) per position in float64, greedy agreement and top-k overlap."""

    kl: list[float]
    greedy_agree: list[bool]
    topk_overlap: list[float]
    max_abs_logit: float
    k: int

    @property
    def kl_max(self) -> float:
        return res.largest(self.kl) if self.kl else 0.0

    @property
    def kl_mean(self) -> float:
        return float(np.mean(self.kl)) if self.kl else 0.0

    @property
    def logits_equal(self) -> bool:
        return self.max_abs_logit == 0.0

    def record(self) -> res.Distribution:
        return res.Distribution(
            kl_per_position=self.kl, kl_max=self.kl_max, kl_mean=self.kl_mean,
            greedy_agreement=sum(self.greedy_agree) / len(self.greedy_agree) if self.greedy_agree else 1.0,
            topk=self.k, topk_overlap_mean=float(np.mean(self.topk_overlap)) if self.topk_overlap else 1.0,
            max_abs_logit_diff=self.max_abs_logit, logits_equal=self.logits_equal)


def distributions(reference: torch.Tensor, other: torch.Tensor, k: int = 5) -> DistributionDiff:
    """Compare next-token distributions position by position ([positions, vocab] logits)."""
    from scipy.special import log_softmax

    ref = reference.detach().double().cpu().numpy()
    oth = other.detach().double().cpu().numpy()
    logp = log_softmax(ref, axis=-1)
    logq = log_softmax(oth, axis=-1)
    p = np.exp(logp)
    # Not clamped at zero: a tiny negative value from rounding must not print as an exact 0.0.
    kl = [float(v) for v in np.sum(p * (logp - logq), axis=-1)]
    agree = [bool(a == b) for a, b in zip(ref.argmax(-1), oth.argmax(-1), strict=True)]
    top_r = np.argsort(-ref, axis=-1)[:, :k]
    top_o = np.argsort(-oth, axis=-1)[:, :k]
    overlap = [len(set(a.tolist()) & set(b.tolist())) / k for a, b in zip(top_r, top_o, strict=True)]
    max_abs = float(np.max(np.abs(ref - oth))) if ref.size else 0.0
    return DistributionDiff(kl, agree, overlap, max_abs, k)


def fmt_kl(v: float) -> str:
    """0.0 only when exactly zero; anything else in scientific notation, never rounded to zero."""
    return "0.0" if v == 0.0 else f"{v:.3e}"
