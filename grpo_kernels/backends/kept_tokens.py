"""Log-probs over per-position kept-token sets: the distribution a top-p / top-k sampler actually drew from.

A truncating sampler draws token y at position n from softmax(z / tau) renormalised over the ids K_n it kept.
Scored over the whole vocabulary, the trainer's log-prob is short by log(kept mass), so the importance ratio of
an exactly on-policy token sits at the kept mass instead of 1. Here a position with a set gets

    lp_n = l_ny - logsumexp_{v in K_n} l_nv,    ent_n = -sum_{v in K_n} p_nv log p_nv,

with l the logits the softmax sees (the head's transform and temperature, head.py) and p renormalised over K_n;
a position whose set is all padding (-1) is scored over the whole vocabulary by the backend this head wraps.

`KeptTokenHead` is a backend of the small interface (`linear_forward` statistics, `linear_backward` from g and
e), wrapping another one for the rows without a set, so vocabulary shards (vocab_parallel.py) and the custom
ops take it like any backend. Per chunk of rows it gathers U, the union of the chunk's kept ids, and computes
the [rows, |U|] logits with one GEMM against W[U] (W itself when U is most of the vocabulary): a token costs
|U| / rows logits instead of V, K for disjoint sets and less when the sets of a chunk overlap (top-p sets of one
context do); the backward computes them again (the statistics are all the forward keeps). dW lands in W[U]
through `index_add_` over the distinct ids U, one writer per row of W, so it does not depend on thread order.
The GEMMs run as the GEMM path's do (16-bit operands with float32 output on CUDA, float32 on CPU); the set
statistics and dZ are torch ops on the [rows, K] gathered logits.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from .workspace import DEFAULT_WORKSPACE_BYTES
from .wide_gemm import gemm_dtype, mm_wide
from ..head import LMHead
from .protocol import stats_dtype
from .row_math import transform_logits_

NO_TOKEN = -1  # padding inside a set, and an id held by another vocabulary shard
# A chunk takes at least MIN_ROWS rows (enough tokens per byte of W[U] read for a GEMM at tensor-core rate) and
# about UNION_COLUMNS kept ids in all when the sets are small, so a token costs at most
# max(UNION_COLUMNS, MIN_ROWS x K) / rows logits for disjoint sets, fewer when the sets of a chunk overlap.
# Sets wide enough for the union to cover the head take chunks as large as the GEMM path's waves (its logits
# workspace), so dW is accumulated as rarely as there.
MIN_ROWS = 256
UNION_COLUMNS = 4096
CHUNK_ELEMENTS = DEFAULT_WORKSPACE_BYTES // 4  # the chunk's [rows, |U|] float32 logits


def rows_with_set(kept_token_ids: torch.Tensor) -> torch.Tensor:
    """[R] bool: the positions that carry a kept set (any id >= 0)."""
    return (kept_token_ids >= 0).any(-1)


def chunk_rows(num_rows: int, set_size: int, vocab_size: int, elements: int = CHUNK_ELEMENTS,
               covers_head: bool = False) -> int:
    """Rows per chunk: max(MIN_ROWS, UNION_COLUMNS / K), or a whole wave of `elements / V` rows when a chunk's
    union covers most of the head anyway; rows x min(V, rows x K) (the most the union can hold) within
    `elements`."""
    K = max(1, set_size)
    rows = max(MIN_ROWS, UNION_COLUMNS // K)
    if covers_head:
        rows = max(rows, elements // max(1, vocab_size))
    rows = min(rows, max(1, elements // max(1, min(vocab_size, rows * K))))
    return max(1, min(num_rows, rows))


class _Chunk:
    """One chunk of rows with sets: the union U of their ids, each kept id's column in U, and the logits.
    GEMMs run as the GEMM path runs them (gemm_path: 16-bit operands with float32 output on CUDA, float32 on
    CPU). A union covering most of the vocabulary is the whole head: then W is used in place, no W[U] copy."""

    def __init__(self, hidden: torch.Tensor, w_gemm: torch.Tensor, bias: Optional[torch.Tensor], ids: torch.Tensor,
                 inv_tau: float, cap_scale: Optional[float]):
        wide = stats_dtype(hidden.dtype)
        V = w_gemm.shape[0]
        self.valid = ids >= 0
        union, inverse = torch.unique(ids[self.valid], sorted=True, return_inverse=True)
        self.whole = 2 * union.numel() > V
        self.union = None if self.whole else union
        self.column = torch.zeros_like(ids)
        self.column[self.valid] = ids[self.valid] if self.whole else inverse
        self.w = w_gemm if self.whole else w_gemm.index_select(0, union)
        self.h = hidden.to(w_gemm.dtype)
        z_union = mm_wide(self.h, self.w.T, wide)
        if bias is not None:
            z_union += (bias if self.whole else bias.index_select(0, union)).to(wide)
        # [rows, K] logits of each row's own set as the softmax sees them (the head's transform); -inf on the padding
        self.z = transform_logits_(z_union.gather(1, self.column), inv_tau, cap_scale)
        self.z.masked_fill_(~self.valid, float("-inf"))

    def stats(self, ids: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(lse, entropy, target logit) over each row's set; a row with no id here has lse -inf, and a target
        outside the set (another shard's) contributes a target logit of 0."""
        lse = torch.logsumexp(self.z, dim=-1)
        finite = torch.isfinite(lse)
        safe_lse = torch.where(finite, lse, torch.zeros_like(lse))
        p = torch.exp(self.z - safe_lse[:, None])
        mean_z = (p * torch.where(self.valid, self.z, torch.zeros_like(self.z))).sum(-1)
        entropy = torch.where(finite, lse - mean_z, torch.zeros_like(lse))
        is_target = self.valid & (ids == targets[:, None])
        target_z = torch.where(is_target, self.z, torch.zeros_like(self.z)).sum(-1)
        return lse, entropy, target_z

    def union_grad(self, ids: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor, entropy: torch.Tensor,
                   g: torch.Tensor, e: Optional[torch.Tensor], inv_tau: float, cap_scale: Optional[float]
                   ) -> torch.Tensor:
        """dLoss/d(raw logits) on the union's columns [rows, |U|]: (g (onehot - p) - e p (log p + ent)) times
        the transform's slope (inv_tau, and cap_scale (1 - tanh^2) with a soft-cap) over each row's set, 0 on the
        ids outside it."""
        log_p = self.z - lse[:, None]
        p = torch.where(self.valid, torch.exp(log_p), torch.zeros_like(log_p))
        dz = torch.where(self.valid & (ids == targets[:, None]), g[:, None], torch.zeros_like(p)) - g[:, None] * p
        if e is not None:
            dz -= e[:, None] * p * torch.where(self.valid, log_p + entropy[:, None], torch.zeros_like(log_p))
        slope = inv_tau
        if cap_scale is not None:  # z = inv_tau tanh(cap_scale x): dz/dx = inv_tau cap_scale (1 - (z / inv_tau)^2)
            tanh = torch.where(self.valid, self.z, torch.zeros_like(self.z)) / inv_tau
            slope = inv_tau * cap_scale * (1.0 - tanh.square())
        dz_union = torch.zeros(self.z.shape[0], self.w.shape[0], dtype=dz.dtype, device=dz.device)
        # a set holds each id once (validated), so only padding (adding 0) shares a column with a kept id
        dz_union.scatter_add_(1, self.column, torch.where(self.valid, dz * slope, torch.zeros_like(dz)))
        return dz_union

    def add_weight_grad(self, grad_weight: torch.Tensor, dz: torch.Tensor) -> None:
        """grad_weight[U] += dz^T h: `index_add_` over distinct ids, one writer per row of W."""
        rows_grad = mm_wide(dz.T, self.h, grad_weight.dtype)
        if self.whole:
            grad_weight += rows_grad
        else:
            grad_weight.index_add_(0, self.union, rows_grad)

    def add_bias_grad(self, grad_bias: torch.Tensor, dz_wide: torch.Tensor) -> None:
        if self.whole:
            grad_bias += dz_wide.sum(0)
        else:
            grad_bias.index_add_(0, self.union, dz_wide.sum(0))


class KeptTokenHead:
    """The backend interface over rows that carry kept sets, wrapping `inner` for the rows that do not.

    kept_token_ids [R, K]: this head's (local) vocabulary ids of each row's set, -1 padding; `has_set` [R] bool
    says which rows carry a set at all (on a vocabulary shard a row's set may have no id on this rank, yet it is
    still scored over its set, not over the whole vocabulary)."""

    def __init__(self, inner: Any, kept_token_ids: torch.Tensor, has_set: Optional[torch.Tensor] = None,
                 chunk_elements: int = CHUNK_ELEMENTS):
        self.inner = inner
        self.kept = kept_token_ids
        self.has_set = rows_with_set(kept_token_ids) if has_set is None else has_set
        self.chunk_elements = chunk_elements

    def _split(self) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.nonzero(self.has_set).squeeze(-1), torch.nonzero(~self.has_set).squeeze(-1)

    def _chunks(self, rows: torch.Tensor, vocab_size: int):
        K = self.kept.shape[-1]
        step = chunk_rows(rows.numel(), K, vocab_size, self.chunk_elements)
        # the first chunk's union tells how much the sets overlap; if it covers the head, so will the others
        first = self.kept[rows[:step]]
        if 2 * torch.unique(first[first >= 0]).numel() > vocab_size:
            step = chunk_rows(rows.numel(), K, vocab_size, self.chunk_elements, covers_head=True)
        for r0 in range(0, rows.numel(), step):
            yield rows[r0:r0 + step]

    def linear_forward(self, hidden: torch.Tensor, head: LMHead, targets: torch.Tensor):
        """hidden [R, H], head.weight [V, H], targets [R] -> (logps, entropy, lse) [R]."""
        weight, bias = head.weight, head.bias
        inv_tau, cap_scale = head.logit_constants
        dtype = stats_dtype(hidden.dtype)
        R = hidden.shape[0]
        logps, entropy, lse = (torch.empty(R, dtype=dtype, device=hidden.device) for _ in range(3))
        with_set, without = self._split()
        if without.numel():
            lp_w, ent_w, lse_w = self.inner.linear_forward(hidden[without], head, targets[without])
            logps[without], entropy[without], lse[without] = lp_w.to(dtype), ent_w.to(dtype), lse_w.to(dtype)
        if with_set.numel():
            w_gemm = weight.to(gemm_dtype(hidden))  # no copy on CUDA; the one float32 copy of a 16-bit head on CPU
        for rows in self._chunks(with_set, weight.shape[0]):
            ids, y = self.kept[rows], targets[rows]
            chunk = _Chunk(hidden[rows], w_gemm, bias, ids, inv_tau, cap_scale)
            lse_c, ent_c, target_z = chunk.stats(ids, y)
            # a row with no id on this shard: lse -inf and lp 0 - (-inf); the shard's combine weighs it 0
            logps[rows], entropy[rows], lse[rows] = target_z - lse_c, ent_c, lse_c
        return logps, entropy, lse

    def linear_backward(self, grad_logps, grad_entropy, hidden: torch.Tensor, head: LMHead, targets: torch.Tensor,
                        lse, entropy, needs_hidden_grad=True, needs_weight_grad=True):
        """(dhidden, dweight, dbias) from g = dLoss/dlp and e = dLoss/dent; None where not needed."""
        if not (needs_hidden_grad or needs_weight_grad):
            return None, None, None
        weight, bias = head.weight, head.bias
        inv_tau, cap_scale = head.logit_constants
        dtype = stats_dtype(hidden.dtype)
        with_set, without = self._split()
        grad_hidden = torch.zeros_like(hidden) if needs_hidden_grad else None
        grad_weight = torch.zeros(weight.shape, dtype=dtype, device=weight.device) if needs_weight_grad else None
        grad_bias = (torch.zeros(weight.shape[0], dtype=dtype, device=weight.device)
                     if needs_weight_grad and bias is not None else None)
        if without.numel():
            dh, dw, db = self.inner.linear_backward(
                grad_logps[without].contiguous(), None if grad_entropy is None else grad_entropy[without].contiguous(),
                hidden[without].contiguous(), head, targets[without].contiguous(), lse[without].contiguous(),
                entropy[without].contiguous(), needs_hidden_grad=needs_hidden_grad,
                needs_weight_grad=needs_weight_grad)
            if grad_hidden is not None:
                grad_hidden[without] = dh
            if grad_weight is not None:
                grad_weight += dw.to(dtype)
            if grad_bias is not None:
                grad_bias += db.to(dtype)
        if with_set.numel():
            w_gemm = weight.to(gemm_dtype(hidden))
        for rows in self._chunks(with_set, weight.shape[0]):
            ids, y = self.kept[rows], targets[rows]
            chunk = _Chunk(hidden[rows], w_gemm, bias, ids, inv_tau, cap_scale)
            e = None if grad_entropy is None else grad_entropy[rows].to(dtype)
            dz_wide = chunk.union_grad(ids, y, lse[rows].to(dtype), entropy[rows].to(dtype),
                                       grad_logps[rows].to(dtype), e, inv_tau, cap_scale)
            dz = dz_wide.to(w_gemm.dtype)  # the GEMMs' operand dtype, as the GEMM path narrows dZ
            if grad_hidden is not None:
                grad_hidden[rows] = mm_wide(dz, chunk.w, dtype).to(hidden.dtype)
            if grad_weight is not None:
                chunk.add_weight_grad(grad_weight, dz)
            if grad_bias is not None:
                chunk.add_bias_grad(grad_bias, dz_wide)
        return (grad_hidden, None if grad_weight is None else grad_weight.to(weight.dtype),
                None if grad_bias is None else grad_bias.to(bias.dtype))


def local_kept_ids(kept_token_ids: torch.Tensor, offset: int, size: int) -> torch.Tensor:
    """Global ids -> ids of the shard [offset, offset + size), -1 for the ids other ranks hold (and padding)."""
    local = kept_token_ids - offset
    return torch.where((kept_token_ids >= 0) & (local >= 0) & (local < size), local, torch.full_like(local, NO_TOKEN))
