"""Streaming means and co-moments (Welford/Chan merges) of per-draw values."""

from __future__ import annotations

from typing import Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from interp_toolkit.errors import UserError

# --------------------------------------------------------------------------- accumulation


class CoMoments:
    """Streaming means and cross co-moments of two vectors (Welford / Chan et al. merging).

    Keeps ``count``, ``mean_a``, ``mean_b``, the sums of squared deviations ``m2_a``,
    ``m2_b`` (float64) and the co-moment matrix ``comoment = sum (a - mean_a)(b - mean_b)^T``
    in ``dtype`` (float64 by default; float32 halves the memory of the only large tensor).
    Memory is ``O(n_a x n_b)`` whatever the number of updates.

    Float32 accumulation stays accurate because every update adds *centred* products: a
    batch of draws is centred on its own mean before its co-moment (one matrix product) is
    merged, and the merge adds the rank-one mean correction (Chan et al.), so no large
    uncentred sums are ever formed. :meth:`update_batch` merges in place (no ``n_a x n_b``
    temporary).

    ``out``: an existing zeroed ``n_a x n_b`` tensor to hold the co-moment (e.g. one row of a
    ``[chains, n_a, n_b]`` tensor, so the per-chain estimates need no copy); its dtype and
    device win over ``dtype`` and ``device``.
    """

    def __init__(
        self,
        n_a: int,
        n_b: int,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float64,
        out: Float[Tensor, "n_a n_b"] | None = None,
    ) -> None:
        if out is not None:
            if tuple(out.shape) != (n_a, n_b):
                raise UserError(f"out must have shape {(n_a, n_b)}, got {tuple(out.shape)}")
            device, dtype = out.device, out.dtype
        self.count = 0
        self.mean_a = torch.zeros(n_a, dtype=torch.float64, device=device)
        self.mean_b = torch.zeros(n_b, dtype=torch.float64, device=device)
        self.m2_a = torch.zeros(n_a, dtype=torch.float64, device=device)
        self.m2_b = torch.zeros(n_b, dtype=torch.float64, device=device)
        self.comoment = torch.zeros(n_a, n_b, dtype=dtype, device=device) if out is None else out.zero_()

    def update(self, a: Float[Tensor, " n_a"], b: Float[Tensor, " n_b"]) -> None:
        """Add one draw (Welford's update)."""
        a = a.to(self.mean_a.device, torch.float64)
        b = b.to(self.mean_b.device, torch.float64)
        self.count += 1
        delta_a = a - self.mean_a
        self.mean_a += delta_a / self.count
        delta_b_old = b - self.mean_b
        self.mean_b += delta_b_old / self.count
        delta_b_new = b - self.mean_b
        self.m2_a += delta_a * (a - self.mean_a)
        self.m2_b += delta_b_old * delta_b_new
        dtype = self.comoment.dtype
        self.comoment.addr_(delta_a.to(dtype), delta_b_new.to(dtype))  # in place: no n_a x n_b temporary

    def update_batch(self, a: Float[Tensor, "k n_a"], b: Float[Tensor, "k n_b"]) -> None:
        """Add ``k`` draws at once, in place: the batch's centred co-moment (one matrix
        product) plus the rank-one correction of the means (Chan et al.)."""
        k = a.shape[0]
        if k == 0:
            return
        device, dtype = self.mean_a.device, self.comoment.dtype
        a = a.to(device, torch.float64)
        b = b.to(device, torch.float64)
        batch_mean_a, batch_mean_b = a.mean(0), b.mean(0)
        ca, cb = a - batch_mean_a, b - batch_mean_b
        n1, n = self.count, self.count + k
        delta_a = batch_mean_a - self.mean_a
        delta_b = batch_mean_b - self.mean_b
        factor = n1 * k / n
        self.comoment.addmm_(ca.T.to(dtype), cb.to(dtype)).addr_(delta_a.to(dtype), delta_b.to(dtype), alpha=factor)
        self.m2_a += (ca * ca).sum(0) + delta_a * delta_a * factor
        self.m2_b += (cb * cb).sum(0) + delta_b * delta_b * factor
        self.mean_a += delta_a * (k / n)
        self.mean_b += delta_b * (k / n)
        self.count = n

    @classmethod
    def from_batch(
        cls,
        a: Float[Tensor, "k n_a"],
        b: Float[Tensor, "k n_b"],
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float64,
    ) -> "CoMoments":
        """Moments of a batch of draws, computed directly (co-moment in ``dtype``)."""
        a = a.to(device, torch.float64)
        b = b.to(device, torch.float64)
        out = cls(a.shape[1], b.shape[1], device=device, dtype=dtype)
        out.count = a.shape[0]
        out.mean_a = a.mean(0)
        out.mean_b = b.mean(0)
        ca = a - out.mean_a
        cb = b - out.mean_b
        out.m2_a = (ca * ca).sum(0)
        out.m2_b = (cb * cb).sum(0)
        out.comoment = (ca.T @ cb).to(dtype)
        return out

    def merge_(self, other: "CoMoments") -> "CoMoments":
        """Merge ``other`` into ``self`` (Chan et al. parallel update); returns ``self``."""
        if other.count == 0:
            return self
        if self.count == 0:
            self.count = other.count
            for name in ("mean_a", "mean_b", "m2_a", "m2_b", "comoment"):
                setattr(self, name, getattr(other, name).clone())
            return self
        n1, n2 = self.count, other.count
        n = n1 + n2
        delta_a = other.mean_a - self.mean_a
        delta_b = other.mean_b - self.mean_b
        factor = n1 * n2 / n
        dtype = self.comoment.dtype
        self.comoment.add_(other.comoment).addr_(delta_a.to(dtype), delta_b.to(dtype), alpha=factor)
        self.m2_a += other.m2_a + delta_a * delta_a * factor
        self.m2_b += other.m2_b + delta_b * delta_b * factor
        self.mean_a += delta_a * (n2 / n)
        self.mean_b += delta_b * (n2 / n)
        self.count = n
        return self

    @staticmethod
    def merged(parts: Sequence["CoMoments"]) -> "CoMoments":
        """An accumulator holding all of ``parts`` (the part itself if there is only one:
        do not modify the result in place then)."""
        if len(parts) == 1:
            return parts[0]
        out = CoMoments(
            parts[0].mean_a.shape[0], parts[0].mean_b.shape[0], device=parts[0].mean_a.device,
            dtype=parts[0].comoment.dtype,
        )
        for part in parts:
            out.merge_(part)
        return out

    def covariance(self) -> Float[Tensor, "n_a n_b"]:
        """Population cross-covariance ``comoment / count``."""
        if self.count == 0:
            raise UserError("no draws accumulated")
        return self.comoment / self.count

    def correlation(self) -> Float[Tensor, "n_a n_b"]:
        """Pearson cross-correlation (0 where a variance is 0)."""
        dtype = self.comoment.dtype
        denom = torch.sqrt(torch.outer(self.m2_a, self.m2_b)).to(dtype)
        tiny = torch.finfo(dtype).tiny
        return torch.where(denom > 0, self.comoment / denom.clamp_min(tiny), torch.zeros_like(denom))


