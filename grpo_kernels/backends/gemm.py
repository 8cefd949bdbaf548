"""The GEMM-rate backend: the logits of a wave of tokens through one GEMM into a reused float32 workspace,
one row pass for the statistics, the same workspace turned into dZ in place, then dH and dW by GEMM.

Tokens go in waves of `wave_rows(V, workspace_bytes)` rows, so the extra memory is the workspace (1 GiB by
default) plus O(tokens) vectors, plus one float32 dW accumulator when the head is trained. For token-level
objectives `g = dLoss/dlp` and `e = dLoss/dent` are closed-form per token, so `linear_forward_with_grads`
does the whole step in the forward: three GEMMs in all, the floor. Everything else uses the small backend
interface (`linear_forward` for the statistics, `linear_backward` for the gradients from g and e), which costs
a fourth GEMM (the logits again) in the backward. That second pass needs no whole rows (each logit's gradient
needs only its row's statistics), so it may take the workspace as vocabulary slices of more tokens a wave:
fewer passes over the float32 dW accumulator for a few over the wave's float32 dH sums (cost_model.paths.
gradient_tiles).

On CUDA the GEMMs run in the input dtype with float32 output, and the row passes are the Triton kernels of
`kernels/rows.py`. Elsewhere (CPU) the operands are upcast to float32 (float64 stays float64) and the row
passes are the torch functions below; the algorithm and the memory bounds are the same. CUDA's data flow also
runs on CPU (tests): `GemmBackend(rows=triton_rows(gpu_launch=True), gemm_in_input_dtype=True)` keeps 16-bit
operands and narrows dZ in place with the Triton row kernels, interpreted; only each cuBLAS GEMM with float32
output (or float32 C) is stood in for by a float32 GEMM of the same 16-bit values (exact products, float32 sums).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

import torch

from ..cost_model.paths import (MIN_GRADIENT_SLICE, MIN_SEGMENT, gradient_tiles, row_segments,
                                sequence_store_layout)
from ..head import LMHead
from .workspace import DEFAULT_WORKSPACE_BYTES
from .protocol import stats_dtype
from .row_math import (OnlineSoftmaxStats, merge_segment_stats, softmax_grad_, target_in_range, target_logit,
                       transform_logits_)
from .wide_gemm import add_mm_wide_, gemm_dtype, mm_wide

# The CPU row pass works on at most ROW_CHUNK rows at a time, and on at most 1 / ROW_CHUNK_FRACTION of the
# wave's: its temporaries ([rows, V], one or two) stay a few percent of the workspace, as the model counts none.
ROW_CHUNK = 64
ROW_CHUNK_FRACTION = 32


def _row_chunk(rows: int) -> int:
    return max(1, min(ROW_CHUNK, rows // ROW_CHUNK_FRACTION))

TokenGrads = Callable[[int, int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, Optional[torch.Tensor]]]
# (lse, entropy, target logit) of a wave -> the same three over the whole vocabulary of a sharded head
CombineStats = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def wave_rows(vocab_size: int, workspace_bytes: int) -> int:
    """Tokens per wave: as many float32 logits rows as the workspace holds (at least one)."""
    if workspace_bytes <= 0:
        raise ValueError(f"workspace_bytes must be > 0, got {workspace_bytes}")
    return max(1, workspace_bytes // (4 * vocab_size))


# ---- row passes: statistics and softmax gradient over whole rows of raw logits z = h W^T -------------------
# inv_tau and cap_scale: LMHead.logit_constants (the transform of (z + bias), head.py)

def _torch_row_stats(z, bias, targets, inv_tau, cap_scale):
    lse, entropy, target_z = (torch.empty(z.shape[0], dtype=z.dtype, device=z.device) for _ in range(3))
    unchanged = bias is None and inv_tau == 1.0 and cap_scale is None
    chunk = _row_chunk(z.shape[0])
    for r0 in range(0, z.shape[0], chunk):
        r1 = min(r0 + chunk, z.shape[0])
        scaled = z[r0:r1] if unchanged else _transformed(z[r0:r1].clone(), bias, inv_tau, cap_scale)
        stats = OnlineSoftmaxStats(r1 - r0, z.dtype, z.device)
        stats.update(scaled)
        lse[r0:r1], entropy[r0:r1] = stats.lse_and_entropy()
        inside, column = target_in_range(targets[r0:r1], 0, z.shape[1])
        target_z[r0:r1] = target_logit(scaled, inside, column)
    return lse, entropy, target_z


def _torch_row_grad_(z, bias, targets, lse, entropy, g, e, inv_tau, cap_scale, out_dtype, out=None):
    chunk = _row_chunk(z.shape[0])
    for r0 in range(0, z.shape[0], chunk):
        r1 = min(r0 + chunk, z.shape[0])
        inside, column = target_in_range(targets[r0:r1], 0, z.shape[1])
        softmax_grad_(_transformed(z[r0:r1], bias, inv_tau, cap_scale), lse[r0:r1], entropy[r0:r1], g[r0:r1],
                      None if e is None else e[r0:r1], inside, column, inv_tau, cap_scale)
        if out is not None:  # a chunk at a time: the CPU's extra traffic stays within the chunk
            out[r0:r1] = z[r0:r1]
    return z if out is None else out


def _transformed(z: torch.Tensor, bias: Optional[torch.Tensor], inv_tau: float,
                 cap_scale: Optional[float]) -> torch.Tensor:
    """The softmax's logits of raw logits z, in place: (z + bias), soft-capped, times inv_tau."""
    if bias is not None:
        z.add_(bias)
    return transform_logits_(z, inv_tau, cap_scale)


@dataclass(frozen=True)
class RowOps:
    """The row pass over a workspace of raw logits: statistics, and dZ written over the logits."""

    stats: Callable  # (z, bias, targets, inv_tau, cap_scale) -> (lse, entropy, target logit)
    # (z, bias, targets, lse, entropy, g, e, inv_tau, cap_scale, out_dtype, out=None) -> dz: z's memory, or `out`
    # ([rows, V] in out_dtype) where given
    grad_: Callable
    # (z, bias, targets, inv_tau, cap_scale, segment_targets=None) -> the same three per row segment,
    # [rows, segments], unmerged (row_math.merge_segment_stats merges them): a pass that needs no statistics
    # before its last wave merges once for all waves. None: whole rows only. `stats` then takes segment_targets
    # too: the wave's rows of targets_by_segment(), formed once a call rather than once a wave.
    stats_parts: Optional[Callable] = None
    min_segment: int = MIN_SEGMENT  # the segments' least width (cost_model.paths.row_segments)


TORCH_ROWS = RowOps(_torch_row_stats, _torch_row_grad_)


def targets_by_segment(targets: torch.Tensor, vocab: int, segments: int) -> torch.Tensor:
    """Each row's target as a column of each of its `segments` equal segments, [rows * segments]: the column
    within the segment that holds it, outside [0, V / segments) in every other (a target lands in exactly one)."""
    width = vocab // segments
    offsets = torch.arange(0, vocab, width, device=targets.device, dtype=targets.dtype)
    return (targets[:, None] - offsets).reshape(-1)


def segment_parts(stats: Callable, min_segment: int = MIN_SEGMENT) -> Callable:
    """The statistics pass `stats` over each row split into segments (cost_model.paths.row_segments), unmerged:
    the row kernels run a program per row and their loads are latency-bound, so a wave of a few hundred rows leaves
    HBM mostly idle (the second H200 run: 1.75 TB/s with 512 programs a launch); k segments a row give k times the
    programs. The segments are rows of a [rows * k, V / k] view of the workspace. `segment_targets`: the rows'
    targets_by_segment() when the caller formed them (once for all waves), else formed here."""
    def run(z, bias, targets, inv_tau, cap_scale, segment_targets=None):
        rows, V = z.shape
        k = row_segments(V, bias is not None, min_segment)
        if k == 1 or not z.is_contiguous():
            return tuple(x[:, None] for x in stats(z, bias, targets, inv_tau, cap_scale))
        if segment_targets is None:
            segment_targets = targets_by_segment(targets, V, k)
        lse, entropy, target_z = stats(z.view(rows * k, V // k), None, segment_targets, inv_tau, cap_scale)
        return lse.view(rows, k), entropy.view(rows, k), target_z.view(rows, k)
    return run


def merged(parts: Callable) -> Callable:
    """Whole-row statistics from a segment pass (merged exactly: row_math.merge_segment_stats)."""
    return lambda *args, **kwargs: merge_segment_stats(*parts(*args, **kwargs))


def triton_rows(gpu_launch: Optional[bool] = None, min_segment: int = MIN_SEGMENT) -> RowOps:
    """The Triton row kernels, the statistics over row segments of at least `min_segment` columns
    (segment_parts); gpu_launch=True launches them with the GPU's block size on any device (under the
    interpreter on CPU), None picks by the tensors' device."""
    from functools import partial

    from ..kernels import launch, rows

    launch.prepare(torch.device("cpu") if not torch.cuda.is_available() else torch.device("cuda"))
    parts = segment_parts(partial(rows.row_stats, gpu_launch=gpu_launch), min_segment)
    return RowOps(merged(parts), partial(rows.row_grad_, gpu_launch=gpu_launch), stats_parts=parts,
                  min_segment=min_segment)


def default_rows(device: torch.device) -> RowOps:
    return triton_rows() if device.type == "cuda" else TORCH_ROWS


# ---- GEMMs -----------------------------------------------------------------------------------------------

class WeightGrad:
    """dW = sum over waves of dZ^T H in a float32 accumulator. A wave's first GEMM into a block of rows (the whole
    head, or a vocabulary slice's rows) writes it (a GEMM with float32 output); later waves add into it inside the
    GEMM (wide_gemm.add_mm_wide_: cuBLAS reads the accumulator as C), so no temporary of the head's size is made
    and the accumulator is read and written once per wave."""

    def __init__(self, weight: torch.Tensor, wide: torch.dtype):
        self.acc = torch.empty(weight.shape, dtype=wide, device=weight.device)
        self.written: set[int] = set()  # the first rows of the blocks written so far

    def add(self, dz: torch.Tensor, h: torch.Tensor, v0: int = 0) -> None:
        """Rows [v0, v0 + dz.shape[1]) of dW += dz^T h (the same blocks every wave)."""
        rows = self.acc[v0:v0 + dz.shape[1]]
        if v0 not in self.written:
            mm_wide(dz.T, h, self.acc.dtype, out=rows)
            self.written.add(v0)
        else:
            add_mm_wide_(rows, dz.T, h)

    def result(self, dtype: torch.dtype) -> torch.Tensor:
        if not self.written:
            self.acc.zero_()
        return self.acc if self.acc.dtype == dtype else self.acc.to(dtype)


# ---- the wave loop ---------------------------------------------------------------------------------------

class HeadOperands(NamedTuple):
    """What every pass over the head reads: W in the GEMM dtype (no copy on CUDA; the one float32 copy of a 16-bit
    head on CPU), the bias in the statistics dtype, the two dtypes, and the head transform's constants."""
    w: torch.Tensor
    b: Optional[torch.Tensor]
    gemm: torch.dtype
    wide: torch.dtype
    inv_tau: float
    cap_scale: Optional[float]


def head_operands(hidden: torch.Tensor, head: LMHead, gemm_in_input_dtype: Optional[bool]) -> HeadOperands:
    gemm, wide = gemm_dtype(hidden, gemm_in_input_dtype), stats_dtype(hidden.dtype)
    return HeadOperands(head.weight.to(gemm), None if head.bias is None else head.bias.to(wide), gemm, wide,
                        *head.logit_constants)


def _stream(hidden, head: LMHead, targets, workspace_bytes, rows: RowOps, *,
            token_grads: Optional[TokenGrads] = None, needs_hidden_grad: bool = False,
            needs_weight_grad: bool = False, combine_stats: Optional[CombineStats] = None,
            gemm_in_input_dtype: Optional[bool] = None):
    """One pass over the tokens in waves of whole rows: the statistics, and with `token_grads` the gradients of
    a token-level objective. `combine_stats` turns each wave's statistics of this vocabulary shard into the whole
    vocabulary's (vocab_parallel.py), before g and e are taken from them."""
    weight, bias = head.weight, head.bias
    N, H = hidden.shape
    V = weight.shape[0]
    device = hidden.device
    w, b, gemm, wide, inv_tau, cap_scale = head_operands(hidden, head, gemm_in_input_dtype)
    wants_grads = token_grads is not None
    needs_hidden_grad, needs_weight_grad = wants_grads and needs_hidden_grad, wants_grads and needs_weight_grad
    grads = needs_hidden_grad or needs_weight_grad  # no dZ at all under no_grad or with nothing to train

    logps, entropy, lse = (torch.empty(N, dtype=wide, device=device) for _ in range(3))
    grad_hidden = torch.empty_like(hidden) if needs_hidden_grad else None
    grad_weight = WeightGrad(weight, wide) if needs_weight_grad else None
    grad_bias = torch.zeros(V, dtype=wide, device=device) if needs_weight_grad and bias is not None else None

    # statistics only (log-probs, a two-pass loss's first pass): the segments' statistics merged once, after
    # the last wave, not once a wave
    deferred = [] if token_grads is None and combine_stats is None and rows.stats_parts else None
    # segmented statistics: every row's segment targets formed once, sliced per wave
    segments = row_segments(V, b is not None, rows.min_segment) if rows.stats_parts else 1
    all_segment_targets = targets_by_segment(targets, V, segments) if segments > 1 and N else None
    step = wave_rows(V, workspace_bytes)
    workspace = torch.empty(min(step, N), V, dtype=wide, device=device) if N else None
    for n0 in range(0, N, step):
        n1 = min(n0 + step, N)
        h, y = hidden[n0:n1].to(gemm), targets[n0:n1]
        z = mm_wide(h, w.T, wide, out=workspace[:n1 - n0])
        segmented = {} if all_segment_targets is None else \
            {"segment_targets": all_segment_targets[n0 * segments:n1 * segments]}
        if deferred is not None:
            deferred.append(rows.stats_parts(z, b, y, inv_tau, cap_scale, **segmented))
            continue
        lse_w, ent_w, target_z = rows.stats(z, b, y, inv_tau, cap_scale, **segmented)
        if combine_stats is not None:
            lse_w, ent_w, target_z = combine_stats(lse_w, ent_w, target_z)
        lp_w = target_z - lse_w
        logps[n0:n1], entropy[n0:n1], lse[n0:n1] = lp_w, ent_w, lse_w
        if token_grads is None:
            continue
        g, e = token_grads(n0, n1, lp_w, ent_w)  # also the objective's value of these tokens: called even
        if not grads:  # when nothing needs a gradient
            continue
        dz = rows.grad_(z, b, y, lse_w, ent_w, g.to(wide).contiguous(), None if e is None else e.to(wide).contiguous(),
                        inv_tau, cap_scale, gemm)
        if needs_hidden_grad:
            if dz.dtype == hidden.dtype:
                torch.mm(dz, w, out=grad_hidden[n0:n1])
            else:
                grad_hidden[n0:n1] = torch.mm(dz, w)
        if grad_weight is not None:
            grad_weight.add(dz, h)
        if grad_bias is not None:
            grad_bias += dz.sum(0, dtype=wide)
    if deferred:
        lse[:], entropy[:], target_z = merge_segment_stats(*(torch.cat(parts) for parts in zip(*deferred)))
        torch.sub(target_z, lse, out=logps)
    dweight = None if grad_weight is None else grad_weight.result(weight.dtype)
    dbias = None if grad_bias is None else grad_bias.to(bias.dtype)
    return logps, entropy, lse, grad_hidden, dweight, dbias


# (hidden rows [n, H], their targets, lse, entropy, g, e, v0, out [n, columns]) -> out holding dLoss/d(raw logits) of
# head columns [v0, v0 + columns): a kernel that forms a tile's dz without a float32 logits tile
# (kernels/persistent_grad.py through backends/triton_tma.py)
LogitsGradTile = Callable[..., torch.Tensor]


def gradients_from_stats(hidden, head: LMHead, targets, lse, entropy, g, e, workspace_bytes, rows: RowOps, *,
                          needs_hidden_grad: bool, needs_weight_grad: bool, min_slice: int,
                          gemm_in_input_dtype: Optional[bool] = None, dz_tile: Optional[LogitsGradTile] = None):
    """(dH, dW, dbias) from the statistics and g = dLoss/dlp, e = dLoss/dent (a two-pass loss's second pass).
    The softmax gradient of a logit needs only its row's statistics, so the logits are recomputed in tiles of
    cost_model.paths.gradient_tiles: token waves of whole rows, or vocabulary slices of the rows of a wave. Each
    tile turns into dZ in place; dH of a wave is summed over its slices in float32 in slice order, and the slice's
    rows of dW over the waves in wave order: every element has one writer and a fixed order of additions.
    dz_tile: a kernel that writes each tile's dz in the GEMM dtype without float32 logits (no row pass); the tiles
    are then of the GEMM dtype, so the workspace holds more rows of them."""
    weight, bias = head.weight, head.bias
    N, H = hidden.shape
    V = weight.shape[0]
    if not (needs_hidden_grad or needs_weight_grad):
        return None, None, None
    device = hidden.device
    w, b, gemm, wide, inv_tau, cap_scale = head_operands(hidden, head, gemm_in_input_dtype)
    tile_rows, tile_columns = gradient_tiles(N, V, H, workspace_bytes, needs_hidden_grad, needs_weight_grad,
                                             min_slice, logit_bytes=gemm.itemsize if dz_tile else 4)
    sliced = tile_columns < V
    grad_hidden = torch.empty_like(hidden) if needs_hidden_grad else None
    # a wave's dH summed over its slices: in grad_hidden itself when it is float32 (float64), else in float32
    hidden_sums = torch.empty(min(tile_rows, N), H, dtype=wide, device=device) \
        if needs_hidden_grad and sliced and hidden.dtype != wide and N else None
    grad_weight = WeightGrad(weight, wide) if needs_weight_grad else None
    grad_bias = torch.zeros(V, dtype=wide, device=device) if needs_weight_grad and bias is not None else None
    if dz_tile is None:
        workspace = torch.empty(min(tile_rows, N) * tile_columns, dtype=wide, device=device) if N else None
    else:  # rows of whole 16-byte units: the kernel's descriptor store
        per_16_bytes = max(1, 16 // gemm.itemsize)
        padded = -(-tile_columns // per_16_bytes) * per_16_bytes
        workspace = torch.empty(min(tile_rows, N), padded, dtype=gemm, device=device) if N else None
    for n0 in range(0, N, tile_rows):
        n1 = min(n0 + tile_rows, N)
        h, y = hidden[n0:n1].to(gemm), targets[n0:n1]
        lse_w, ent_w = lse[n0:n1], entropy[n0:n1]
        g_w = g[n0:n1].to(wide).contiguous()
        e_w = None if e is None else e[n0:n1].to(wide).contiguous()
        dh_sum = None
        if needs_hidden_grad and sliced:
            dh_sum = grad_hidden[n0:n1] if hidden_sums is None else hidden_sums[:n1 - n0]
        for v0 in range(0, V, tile_columns):
            v1 = min(v0 + tile_columns, V)
            if dz_tile is not None:
                dz = dz_tile(hidden[n0:n1], y, lse_w, ent_w, g_w, e_w, v0, workspace[:n1 - n0, :v1 - v0])
            else:
                z = mm_wide(h, w[v0:v1].T, wide, out=workspace[:(n1 - n0) * (v1 - v0)].view(n1 - n0, v1 - v0))
                y_slice = y if not sliced else y - v0  # the target's column within the slice (outside it: none)
                dz = rows.grad_(z, None if b is None else b[v0:v1], y_slice, lse_w, ent_w, g_w, e_w, inv_tau,
                                cap_scale, gemm)
            if needs_hidden_grad and not sliced:
                if dz.dtype == hidden.dtype:
                    torch.mm(dz, w, out=grad_hidden[n0:n1])
                else:
                    grad_hidden[n0:n1] = torch.mm(dz, w)
            elif needs_hidden_grad and v0 == 0:
                mm_wide(dz, w[v0:v1], wide, out=dh_sum)
            elif needs_hidden_grad:
                add_mm_wide_(dh_sum, dz, w[v0:v1])
            if grad_weight is not None:
                grad_weight.add(dz, h, v0)
            if grad_bias is not None:
                grad_bias[v0:v1] += dz.sum(0, dtype=wide)
        if hidden_sums is not None:
            grad_hidden[n0:n1] = dh_sum
    dweight = None if grad_weight is None else grad_weight.result(weight.dtype)
    dbias = None if grad_bias is None else grad_bias.to(bias.dtype)
    return grad_hidden, dweight, dbias


# ---- a loss separable by sequence in one pass: waves of whole sequences --------------------------------------
# The two-pass route takes every row's statistics first and forms the logits again once the objective has given
# each token its g. Where the loss is separable by sequence (objective.sequence_waves_apply) and has no entropy term,
# a token's gradient with respect to its raw logits is g times Q = d lp / d z, which needs only its row's statistics:
# each row's logits go through a float32 scratch once (the logits GEMM, the statistics, Q narrowed to the GEMM dtype
# into a compact store); once a wave's sequences are all in the store, their g gives dH = g (Q W) and
# dW += Q^T (g h): three GEMM-equivalents. The workspace holds the scratch and the store
# (cost_model.paths.sequence_store_layout); sequence_route.py decides where the route applies and groups the waves.
# Every dW element is added in wave order, every dH row written once: deterministic, as the two-pass route.

# (r0, r1, logps [r1], entropy [r1]) -> g [r1 - r0]: the objective's dLoss/dlp of rows r0..r1 (whole sequences),
# given every row's statistics up to r1
WaveGrads = Callable[[int, int, torch.Tensor, torch.Tensor], torch.Tensor]


def stream_sequence_waves(hidden: torch.Tensor, head: LMHead, targets: torch.Tensor, waves: list[tuple[int, int]],
                          workspace_bytes: int, rows: RowOps, wave_grads: WaveGrads, *, needs_hidden_grad: bool,
                          needs_weight_grad: bool, gemm_in_input_dtype: Optional[bool] = None):
    """(logps, entropy, lse, dH, dW, dbias) of rows [N, H] in `waves` (sequence_waves of the store that
    cost_model.paths.sequence_store_layout gives the workspace), the gradients from `wave_grads`' g per wave."""
    weight, bias = head.weight, head.bias
    N, H = hidden.shape
    V = weight.shape[0]
    device = hidden.device
    w, b, gemm, wide, inv_tau, cap_scale = head_operands(hidden, head, gemm_in_input_dtype)
    scratch_rows, store_rows = sequence_store_layout(N, V, gemm.itemsize, workspace_bytes, wide.itemsize)

    logps, entropy, lse = (torch.empty(N, dtype=wide, device=device) for _ in range(3))
    grad_hidden = torch.empty_like(hidden) if needs_hidden_grad else None
    grad_weight = WeightGrad(weight, wide) if needs_weight_grad else None
    grad_bias = torch.zeros(V, dtype=wide, device=device) if needs_weight_grad and bias is not None else None
    longest = max((r1 - r0 for r0, r1 in waves), default=0)
    scratch = torch.empty(min(scratch_rows, N), V, dtype=wide, device=device) if N else None
    store = torch.empty(longest, V, dtype=gemm, device=device)
    # Q needs no reduction once the row's statistics are known, so its pass runs, as the statistics', a program per
    # row segment: [rows * k, V / k] views of the scratch and the store (gemm.segment_parts says why)
    segments = row_segments(V, b is not None, rows.min_segment) if rows.stats_parts else 1
    all_segment_targets = targets_by_segment(targets, V, segments) if segments > 1 and N else None
    ones = torch.ones(scratch_rows * segments, dtype=wide, device=device)
    for r0, r1 in waves:
        for c0 in range(r0, r1, scratch_rows):
            c1 = min(c0 + scratch_rows, r1)
            h, y = hidden[c0:c1].to(gemm), targets[c0:c1]
            z = mm_wide(h, w.T, wide, out=scratch[:c1 - c0])
            by_segment = None if all_segment_targets is None else \
                all_segment_targets[c0 * segments:c1 * segments]
            lse_c, ent_c, target_z = rows.stats(z, b, y, inv_tau, cap_scale,
                                                **({} if by_segment is None else {"segment_targets": by_segment}))
            logps[c0:c1], entropy[c0:c1], lse[c0:c1] = target_z - lse_c, ent_c, lse_c
            # Q = d lp / d z (g = 1, no entropy term), read from the scratch and written into the store in the
            # GEMM dtype
            count = (c1 - c0) * segments
            rows.grad_(z.view(count, V // segments), b, y if by_segment is None else by_segment,
                       lse_c.repeat_interleave(segments), ent_c.repeat_interleave(segments), ones[:count], None,
                       inv_tau, cap_scale, gemm, out=store[c0 - r0:c1 - r0].view(count, V // segments))
        g = wave_grads(r0, r1, logps[:r1], entropy[:r1]).to(wide)
        q = store[:r1 - r0]
        if grad_hidden is not None:
            grad_hidden[r0:r1] = mm_wide(q, w, wide).mul_(g[:, None])
        if grad_weight is not None:
            grad_weight.add(q, (hidden[r0:r1].to(wide) * g[:, None]).to(gemm))
        if grad_bias is not None:
            grad_bias += mm_wide(q.T, g[:, None].to(gemm), wide).squeeze(1)
    dweight = None if grad_weight is None else grad_weight.result(weight.dtype)
    dbias = None if grad_bias is None else grad_bias.to(bias.dtype)
    return logps, entropy, lse, grad_hidden, dweight, dbias


class GemmBackend:
    """The backend interface (per-token statistics forward; gradients from g and e backward), plus the
    one-pass token-level step."""

    def __init__(self, workspace_bytes: int = DEFAULT_WORKSPACE_BYTES, rows: Optional[RowOps] = None,
                 gemm_in_input_dtype: Optional[bool] = None, min_gradient_slice: int = MIN_GRADIENT_SLICE):
        """rows: the row pass (default: Triton on CUDA, torch elsewhere); gemm_in_input_dtype: GEMM operands in
        the input dtype (default: on CUDA only; True runs CUDA's 16-bit data flow on CPU, see the module doc);
        min_gradient_slice: the narrowest vocabulary slice of the gradient pass (cost_model.paths.gradient_tiles;
        tests take small ones)."""
        self.workspace_bytes = int(workspace_bytes)
        self.min_gradient_slice = int(min_gradient_slice)
        self.rows = rows
        self.gemm_in_input_dtype = gemm_in_input_dtype

    def _rows(self, device: torch.device) -> RowOps:
        return self.rows if self.rows is not None else default_rows(device)

    def linear_forward(self, hidden, head: LMHead, targets):
        """hidden [N, H], head.weight [V, H], targets [N] -> (logps, entropy, lse) [N]: one GEMM per wave."""
        logps, entropy, lse, *_ = _stream(hidden, head, targets, self.workspace_bytes, self._rows(hidden.device),
                                          gemm_in_input_dtype=self.gemm_in_input_dtype)
        return logps, entropy, lse

    def linear_backward(self, grad_logps, grad_entropy, hidden, head: LMHead, targets, lse, entropy,
                        needs_hidden_grad=True, needs_weight_grad=True):
        """(dhidden, dweight, dbias) from g = dLoss/dlp and e = dLoss/dent: the logits again (in vocabulary
        slices when that passes over the float32 accumulators less: gradients_from_stats), dZ, two GEMMs."""
        return gradients_from_stats(hidden, head, targets, lse, entropy, grad_logps, grad_entropy,
                                     self.workspace_bytes, self._rows(hidden.device),
                                     needs_hidden_grad=needs_hidden_grad, needs_weight_grad=needs_weight_grad,
                                     min_slice=self.min_gradient_slice, gemm_in_input_dtype=self.gemm_in_input_dtype)

    def linear_forward_with_grads(self, hidden, head: LMHead, targets, token_grads: TokenGrads,
                                  needs_hidden_grad=True, needs_weight_grad=True,
                                  combine_stats: Optional[CombineStats] = None):
        """Statistics and the gradients of a token-level objective in one pass: per wave the logits GEMM, the
        statistics (combined over the vocabulary shards by `combine_stats` when given), `token_grads(n0, n1,
        logps, entropy) -> (g, e)` for those tokens, dZ in place, dH and dW."""
        return _stream(hidden, head, targets, self.workspace_bytes, self._rows(hidden.device),
                       token_grads=token_grads, needs_hidden_grad=needs_hidden_grad,
                       needs_weight_grad=needs_weight_grad, combine_stats=combine_stats,
                       gemm_in_input_dtype=self.gemm_in_input_dtype)

    def sequence_store_rows(self, rows: int, vocab: int, hidden: torch.Tensor) -> int:
        """Rows of the store of the one-pass sequence-level route (stream_sequence_waves) in this workspace."""
        return sequence_store_layout(rows, vocab, gemm_dtype(hidden, self.gemm_in_input_dtype).itemsize,
                                     self.workspace_bytes, stats_dtype(hidden.dtype).itemsize)[1]

    def linear_forward_with_sequence_grads(self, hidden, head: LMHead, targets, waves: list[tuple[int, int]],
                                           wave_grads, needs_hidden_grad=True, needs_weight_grad=True):
        """Statistics and the gradients of a loss separable by sequence in one pass over `waves` of whole
        sequences (stream_sequence_waves): per wave the logits GEMM, the statistics and Q = d lp / d z into
        the store, `wave_grads(r0, r1, logps, entropy) -> g` of its rows once they are all in, dH and dW."""
        return stream_sequence_waves(hidden, head, targets, waves, self.workspace_bytes, self._rows(hidden.device),
                                     wave_grads, needs_hidden_grad=needs_hidden_grad,
                                     needs_weight_grad=needs_weight_grad, gemm_in_input_dtype=self.gemm_in_input_dtype)


def backend(workspace_bytes: int = DEFAULT_WORKSPACE_BYTES) -> GemmBackend:
    return GemmBackend(workspace_bytes)
