"""Softmax statistics, the softmax gradient and the logit transform (head.py) on rows of logits, in torch ops.

Shared by the chunked torch backend (which sees a vocabulary chunk of a row at a time and folds the
chunks with an online log-sum-exp) and the GEMM path's CPU row pass (which sees whole rows). Every
function works in the dtype of its input (float32, or float64 for the float64 oracle runs).
"""

from __future__ import annotations

from typing import Optional

import torch


class OnlineSoftmaxStats:
    """Running max, sum of exp and sum of exp * z over vocabulary chunks, for lse and entropy."""

    def __init__(self, rows: int, dtype: torch.dtype, device: torch.device):
        self.max = torch.full((rows,), float("-inf"), dtype=dtype, device=device)
        self.sum_exp = torch.zeros(rows, dtype=dtype, device=device)
        self.sum_exp_z = torch.zeros(rows, dtype=dtype, device=device)

    def update(self, z: torch.Tensor) -> None:
        """Fold a [rows, chunk] tile of scaled logits in; allocates one tile-sized temporary."""
        new_max = torch.maximum(self.max, z.max(dim=-1).values)
        rescale = torch.exp(self.max - new_max)
        p = torch.sub(z, new_max[:, None]).exp_()
        self.sum_exp = self.sum_exp * rescale + p.sum(-1)
        self.sum_exp_z = self.sum_exp_z * rescale + p.mul_(z).sum(-1)
        self.max = new_max

    def lse_and_entropy(self) -> tuple[torch.Tensor, torch.Tensor]:
        lse = self.max + torch.log(self.sum_exp)
        return lse, lse - self.sum_exp_z / self.sum_exp


def merge_segment_stats(lse: torch.Tensor, entropy: torch.Tensor, target_z: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[rows, segments] statistics of the segments of each row (lse, entropy, target logit: 0 in the segments
    that do not hold the target) -> the rows' [rows]. A row's softmax is its segments' weighted by
    w_s = exp(lse_s - lse): lse = logsumexp_s lse_s, and the mean logit sum_s w_s (lse_s - entropy_s)."""
    if lse.shape[1] == 1:  # whole rows: nothing to merge
        return lse[:, 0], entropy[:, 0], target_z[:, 0]
    total = torch.logsumexp(lse, dim=1)
    weight = torch.exp(lse - total[:, None])
    mean_z = (weight * (lse - entropy)).sum(1)
    return total, total - mean_z, target_z.sum(1)


def target_in_range(targets: torch.Tensor, v0: int, v1: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Which rows' target falls in [v0, v1), and its column within the range (0 where it does not).
    Targets outside the weight's vocabulary (a shard's foreign ids, -1) fall in no range."""
    inside = (targets >= v0) & (targets < v1)
    return inside, torch.where(inside, targets - v0, torch.zeros_like(targets))


def target_logit(z: torch.Tensor, inside: torch.Tensor, column: torch.Tensor) -> torch.Tensor:
    """z[row, column] where the target is inside this tile, 0 elsewhere."""
    return torch.where(inside, z.gather(1, column[:, None]).squeeze(1), 0.0)


def transform_logits_(z: torch.Tensor, inv_tau: float, cap_scale: Optional[float]) -> torch.Tensor:
    """Raw logits (h W^T + b) -> the softmax's logits, in place: inv_tau * tanh(cap_scale * z) with a soft-cap,
    inv_tau * z without (LMHead.logit_constants gives the two numbers)."""
    if cap_scale is not None:
        return z.mul_(cap_scale).tanh_().mul_(inv_tau)
    return z.mul_(inv_tau) if inv_tau != 1.0 else z


def _softcap_slope(logits: torch.Tensor, inv_tau: float, cap_scale: Optional[float]) -> Optional[torch.Tensor]:
    """cap_scale (1 - t^2), t = tanh(cap_scale z) recovered from the transformed logits (None without a soft-cap):
    with dlogits/dz = inv_tau * slope, the chain rule through the transform."""
    if cap_scale is None:
        return None
    return (logits * (1.0 / inv_tau)).square_().neg_().add_(1.0).mul_(cap_scale)


def softmax_grad_(z: torch.Tensor, lse: torch.Tensor, ent: torch.Tensor, g: torch.Tensor, e: Optional[torch.Tensor],
                  inside: torch.Tensor, column: torch.Tensor, inv_tau: float,
                  cap_scale: Optional[float] = None) -> torch.Tensor:
    """Turn a tile of transformed logits z (`transform_logits_`) into dLoss/d(raw logits), in place, and return
    it (z's storage).

    dz = (g (onehot - p) - e p (log p + ent)) * inv_tau [* cap_scale (1 - tanh^2)] with g = dLoss/dlp, e = dLoss/dent
    per row. One tile-sized temporary (p) is alive besides z, two with a soft-cap (its slope).
    """
    slope = _softcap_slope(z, inv_tau, cap_scale)
    log_p = z.sub_(lse[:, None])
    p = torch.exp(log_p)
    if e is not None:
        log_p.add_(ent[:, None]).mul_(e[:, None]).add_(g[:, None]).mul_(p).neg_()
    else:
        torch.mul(p, -g[:, None], out=log_p)
    del p
    rows = torch.nonzero(inside).squeeze(-1)
    z[rows, column[rows]] += g[rows]
    if inv_tau != 1.0:
        z.mul_(inv_tau)
    return z if slope is None else z.mul_(slope)
