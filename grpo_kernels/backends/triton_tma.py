"""The Triton path on the Hopper recipe: the persistent TMA kernel's statistics, and the gradients either formed in
the forward over token chunks or recomputed in the GEMM path's tiles.

Token chunks (as many tokens as `workspace_bytes` holds at one exponential in the input dtype a logit and a float32
maximum per vocabulary tile: chunk_rows), a token-level loss's route where the chunks pay (below):
1. the persistent TMA kernel (kernels/persistent_forward.py) makes the chunk's logits tile by tile, folds each tile
   into the row statistics in its epilogue and stores the tile's exp(z - m) in the input dtype to the chunk, m (the
   row's running maximum) beside it; the merge kernel finishes the rows' log-prob, entropy and lse;
2. the objective's g = dLoss/dlp and e = dLoss/dent of those rows (`token_grads`, the ONE_PASS route);
3. kernels/chunk_grad.py turns the chunk into dz in the input dtype, in place (its docstring says why no thread
   still needs the bytes it overwrites, and why exponentials keep dz's digits where rounded logits would not);
4. dH[chunk] = dz W and dW += dz^T h (a float32 accumulator written by the first chunk's GEMM, then read as C by
   each later one, in chunk order) and dbias += column sums of dz: cuBLAS on a GPU (backends/wide_gemm.py).
Three GEMM-equivalents for a trained head (two for a frozen head), but the float32 dW accumulator is read and
written once a chunk: a small workspace means many chunks.

Two passes, every other call (a sequence-level loss through `linear_backward`, and a token-level loss where the
workspace is too small for the chunks to pay, by cost_model.triton_tma.chunks_pay): the persistent kernel's
statistics of every token in one launch, no logits stored; the objective; then the GEMM path's gradient pass in
its tiles (gemm.gradients_from_stats: vocabulary slices of token waves, dH summed over the slices in float32 in
slice order, each dW slice's rows over the token waves in order), each tile's dz written by the persistent kernel
of kernels/persistent_grad.py straight from the statistics (no float32 logits, no row pass; tiles of the input
dtype, so twice the rows of the GEMM path's in a workspace). Four GEMM-equivalents, in a workspace as small as
the float32 dH of the tokens.

No atomics: every output element has one writer, chunks, waves and slices run in a fixed order, so the gradients are
bitwise repeatable run to run; the log-probs and entropies are the persistent kernel's, batch-invariant
(kernels/linear_forward.py explains why the split boundaries make them so), whatever the chunking.

Extra memory: the chunk and its maxima or the gradient pass's tiles (at most `workspace_bytes`, up to a few bytes a
row; a chunk at least one token block of rows), the float32 dW accumulator when the head is trained, the forward's
partial statistics (16 bytes x splits x rows).
"""

from __future__ import annotations

from typing import Optional

import torch

from ..head import LMHead
from ..kernels import launch
from ..kernels.configs import CHUNK_ROW_ALIGN, chunk_rows_within, stored_rows_within
from ..cost_model.estimate import Problem
from ..cost_model.triton_tma import chunks_pay
# WeightGrad: the GEMM path's float32 dW accumulator (first chunk's GEMM writes it, later ones add into it as C);
# gradients_from_stats: its gradient pass from given statistics
from .gemm import (DEFAULT_WORKSPACE_BYTES, MIN_GRADIENT_SLICE, CombineStats, TokenGrads, WeightGrad, default_rows,
                   gradients_from_stats, wave_rows)
from .protocol import stats_dtype
from .wide_gemm import gemm_dtype, mm_wide


def chunk_rows(vocab_size: int, workspace_bytes: int, block_n: int, itemsize: int, block_v: int,
               align: int = CHUNK_ROW_ALIGN) -> int:
    """Tokens per chunk: the rows of exponentials (itemsize bytes a logit) and maxima (float32 per block_v columns)
    that the GEMM path's wave (gemm.wave_rows: float32 rows of V in workspace_bytes) holds (configs.stored_rows_within),
    rounded down to whole token blocks where that is two or more (every chunk's blocks full), else to a multiple of
    `align` rows (configs.CHUNK_ROW_ALIGN says why), at least one block.
    Counted from the GEMM path's wave, a vocabulary shard's ranks run the same number of chunks
    (vocab_parallel.VocabShard.wave_workspace): the statistics are combined per chunk, a collective."""
    return chunk_rows_within(stored_rows_within(wave_rows(vocab_size, workspace_bytes), itemsize, block_v), block_n,
                             align)


def _padded_vocab(vocab_size: int, itemsize: int) -> int:
    """The chunk's row length: rows of 16-byte multiples (the descriptor store's row stride)."""
    per_16_bytes = 16 // itemsize
    return -(-vocab_size // per_16_bytes) * per_16_bytes


class TmaChunkBackend:
    """The LogprobBackend interface and the ONE_PASS route (protocol.py) over token chunks."""

    def __init__(self, workspace_bytes: int = DEFAULT_WORKSPACE_BYTES, chunks: Optional[bool] = None,
                 min_gradient_slice: int = MIN_GRADIENT_SLICE, chunk_row_align: int = CHUNK_ROW_ALIGN):
        """chunks: whether a token-level loss goes through the token chunks (True) or takes the statistics first
        and the gradients in the GEMM path's tiles (False); None: as the cost model says for the workspace
        (cost_model.triton_tma.chunks_pay). min_gradient_slice: gemm.GemmBackend's (tests take small ones);
        chunk_row_align: chunk_rows' `align` (tests take one below the interpreter's token block)."""
        self.workspace_bytes = int(workspace_bytes) if workspace_bytes else DEFAULT_WORKSPACE_BYTES
        self.chunks = chunks
        self.min_gradient_slice = int(min_gradient_slice)
        self.chunk_row_align = int(chunk_row_align)

    def linear_forward(self, hidden, head: LMHead, targets):
        """(logps, entropy, lse) [N]: the persistent kernel alone, no logits stored."""
        return launch.persistent_forward(hidden, head, targets)

    def linear_backward(self, grad_logps, grad_entropy, hidden, head: LMHead, targets, lse, entropy,
                        needs_hidden_grad=True, needs_weight_grad=True):
        """(dhidden, dweight, dbias) from g and e: the GEMM path's gradient pass (gemm.gradients_from_stats, in
        vocabulary slices where that passes over the float32 accumulators less), each tile's dz formed by
        persistent_grad.py's kernel."""
        return gradients_from_stats(hidden, head, targets, lse, entropy, grad_logps, grad_entropy,
                                    self.workspace_bytes, default_rows(hidden.device),
                                    needs_hidden_grad=needs_hidden_grad, needs_weight_grad=needs_weight_grad,
                                    min_slice=self.min_gradient_slice, dz_tile=_dz_tile(head))

    def linear_forward_with_grads(self, hidden, head: LMHead, targets, token_grads: TokenGrads,
                                  needs_hidden_grad=True, needs_weight_grad=True,
                                  combine_stats: Optional[CombineStats] = None):
        """(logps, entropy, lse, dhidden, dweight, dbias): in one pass over the token chunks, or (where the chunks do
        not pay for the workspace) the statistics of every token in one launch, the objective's g and e, then
        linear_backward's pass. A vocabulary shard always takes the chunks: its ranks must agree on the route, and
        its statistics are combined per chunk."""
        if combine_stats is not None or self._takes_chunks(hidden, head, needs_hidden_grad, needs_weight_grad):
            return self._stream(hidden, head, targets, token_grads=token_grads,
                                needs_hidden_grad=needs_hidden_grad, needs_weight_grad=needs_weight_grad,
                                combine_stats=combine_stats)
        logps, entropy, lse = launch.persistent_forward(hidden, head, targets)
        g, e = token_grads(0, hidden.shape[0], logps, entropy)  # also records the objective's value
        return (logps, entropy, lse,
                *self.linear_backward(g, e, hidden, head, targets, lse, entropy, needs_hidden_grad,
                                      needs_weight_grad))

    def _takes_chunks(self, hidden, head: LMHead, needs_hidden_grad: bool, needs_weight_grad: bool) -> bool:
        if self.chunks is not None:
            return self.chunks
        problem = Problem(tokens=max(1, hidden.shape[0]), hidden=hidden.shape[1], vocab=head.weight.shape[0],
                          dtype=str(hidden.dtype).removeprefix("torch."), frozen_head=not needs_weight_grad,
                          hidden_grad=needs_hidden_grad, workspace_bytes=self.workspace_bytes)
        return chunks_pay(problem)

    def _stream(self, hidden, head: LMHead, targets, *, token_grads: TokenGrads, needs_hidden_grad: bool,
                needs_weight_grad: bool, combine_stats: Optional[CombineStats] = None):
        weight, bias = head.weight, head.bias
        N = hidden.shape[0]
        V = weight.shape[0]
        device = hidden.device
        wide = stats_dtype(hidden.dtype)
        grads = needs_hidden_grad or needs_weight_grad
        logps, entropy, lse = (torch.empty(N, dtype=wide, device=device) for _ in range(3))
        grad_hidden = torch.empty_like(hidden) if needs_hidden_grad else None
        grad_weight = WeightGrad(weight, wide) if needs_weight_grad else None
        grad_bias = torch.zeros(V, dtype=wide, device=device) if needs_weight_grad and bias is not None else None
        w = weight.to(gemm_dtype(hidden))  # no copy on CUDA; a float32 copy of a 16-bit head on CPU

        forward = launch.config_for("persistent", hidden.dtype, device)
        itemsize = hidden.element_size()
        step = chunk_rows(V, self.workspace_bytes, forward.block_n, itemsize, forward.block_v, self.chunk_row_align)
        if N and grads:
            chunk = torch.empty(min(step, N), _padded_vocab(V, itemsize), dtype=hidden.dtype, device=device)
            tile_max = torch.empty(min(step, N), launch.chunk_tiles(V, hidden.dtype, device), dtype=torch.float32,
                                   device=device)
        for n0 in range(0, N, step):
            n1 = min(n0 + step, N)
            h, y = hidden[n0:n1], targets[n0:n1]
            if not grads:
                _row_terms(n0, n1, launch.persistent_forward(h, head, y), token_grads, combine_stats,
                           (logps, entropy, lse))
                continue
            dz, maxima = chunk[:n1 - n0, :V], tile_max[:n1 - n0]
            stats = launch.persistent_forward(h, head, y, chunk=dz, tile_max=maxima)
            lse_w, ent_w, g, e = _row_terms(n0, n1, stats, token_grads, combine_stats, (logps, entropy, lse))
            launch.chunk_grad_(dz, maxima, head, y, lse_w.float().contiguous(), ent_w.float().contiguous(), g, e)
            _add_chunk_grads(dz, w, h, None if grad_hidden is None else grad_hidden[n0:n1], grad_weight, grad_bias)
        dweight = None if grad_weight is None else grad_weight.result(weight.dtype)
        dbias = None if grad_bias is None else grad_bias.to(bias.dtype)
        return logps, entropy, lse, grad_hidden, dweight, dbias


def _dz_tile(head: LMHead):
    """gemm.gradients_from_stats' dz_tile: the persistent kernel's dz of a tile (kernels/persistent_grad.py)."""
    def tile(hidden_rows, targets, lse, entropy, g, e, v0: int, out: torch.Tensor) -> torch.Tensor:
        return launch.persistent_dz(hidden_rows, head, targets, lse.float(), entropy.float(), g, e, v0, out)
    return tile


def _add_chunk_grads(dz, w, h, hidden_rows: Optional[torch.Tensor], grad_weight: Optional[WeightGrad],
                     grad_bias: Optional[torch.Tensor]) -> None:
    """The chunk's dH rows = dz W (written into hidden_rows), dW += dz^T h, dbias += column sums of dz."""
    if hidden_rows is not None:
        if dz.dtype == w.dtype == hidden_rows.dtype:  # CUDA (or float32): one GEMM into the rows
            torch.mm(dz, w, out=hidden_rows)
        else:  # a CPU's 16-bit dz against the float32 head copy: the same values, a float32 GEMM, then cast
            hidden_rows.copy_(mm_wide(dz, w, torch.float32))
    if grad_weight is not None:
        grad_weight.add(dz, h)
    if grad_bias is not None:
        grad_bias.add_(dz.sum(0, dtype=grad_bias.dtype))


def _row_terms(n0: int, n1: int, stats: tuple, token_grads: TokenGrads, combine_stats: Optional[CombineStats],
               outputs: tuple) -> tuple:
    """(lse, entropy, g, e) of rows [n0, n1): the chunk's statistics (combined over a vocabulary shard), written to
    `outputs` (logps, entropy, lse), with the objective's g and e. token_grads is called even when nothing needs a
    gradient: it also records the objective's value of these rows."""
    logps_w, ent_w, lse_w = stats
    if combine_stats is not None:
        lse_w, ent_w, target_z = combine_stats(lse_w, ent_w, logps_w + lse_w)
        logps_w = target_z - lse_w
    for out, value in zip(outputs, (logps_w, ent_w, lse_w)):
        out[n0:n1] = value
    return (lse_w, ent_w, *token_grads(n0, n1, logps_w, ent_w))


def backend(workspace_bytes: int = DEFAULT_WORKSPACE_BYTES) -> TmaChunkBackend:
    return TmaChunkBackend(workspace_bytes)
