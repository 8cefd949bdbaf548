"""FLOPs, bytes, launches and peak memory of this library's own paths, counted from their algorithms.

One small function per path, so a change to a kernel's loop is a change to one function; each backend's registry
entry (grpo_kernels/backends) names its function here. c is the input dtype's
byte size. Counts are per call (loss: forward + backward; logprobs: forward under no_grad). Every count of an
elementwise op is one read per input and one write per output. benchmarks/model/roofline_paths.py models the peers
(TRL, Liger, CCE) and the bare GEMMs with the same helpers.
"""

from __future__ import annotations

import math
from dataclasses import replace

from ..kernels.configs import GPU_CONFIGS, SIXTEEN_BIT
from .device import MIB
from .estimate import Estimate, Phase, Problem

# Per-token vectors an objective or a statistics pass reads and writes (logp, entropy, lse, old, ref,
# advantage, mask, weight in; term, g, kl, clip out): a few dozen bytes, negligible beside [N, V] traffic.
PER_TOKEN_BYTES = 64
# L2 traffic of one float32 element added by an atomic / reduction: the line read and written in L2.
REDUCTION_BYTES = 8
# Small torch ops per wave of the GEMM path's token-level objective (g and e of the wave's tokens; assumed).
OBJECTIVE_LAUNCHES = 10
# The GEMM path's statistics pass splits each row of a head without bias into up to MAX_ROW_SEGMENTS equal
# segments of at least MIN_SEGMENT columns, a row-kernel program each, and merges the segments' (lse, entropy,
# target logit): its loads are latency-bound (DeviceRates.row_program_bytes_per_s), so programs in flight set the
# rate. The segments' targets of every row once a call (SEGMENT_TARGET_LAUNCHES ops), sliced per wave; each
# wave: the merge, a log-sum-exp fold over
# [rows, segments] (SEGMENT_MERGE_LAUNCHES ops, counted from torch's composite logsumexp and the weighted mean),
# once a wave where the wave's statistics are needed before the next (the one-pass route), else once after the
# last wave over every row's segments (log-probs, a two-pass loss's first pass).
MAX_ROW_SEGMENTS = 8
MIN_SEGMENT = 4096
SEGMENT_TARGET_LAUNCHES = 2
SEGMENT_MERGE_LAUNCHES = 15


def row_segments(vocab: int, has_bias: bool = False, min_segment: int = MIN_SEGMENT) -> int:
    """Segments per row of the GEMM path's statistics pass: the most (a power of two up to MAX_ROW_SEGMENTS)
    that divide the vocabulary into segments of at least `min_segment` columns; 1 with a bias (the row kernel
    indexes the bias by the column within its row)."""
    if has_bias:
        return 1
    k = MAX_ROW_SEGMENTS
    while k > 1 and (vocab % k or vocab // k < min_segment):
        k //= 2
    return k
_HOPPER = GPU_CONFIGS["sm90"]


# cuBLAS's output tiles on Hopper (DeviceRates.gemm_tile): tiles of the gradient pass in whole ones where they can
GEMM_TILE_ROWS, GEMM_TILE_COLUMNS = 128, 256
# The gradient pass from given statistics (a two-pass loss's second pass) needs no whole rows: its logits tiles
# may be vocabulary slices. Slices of at least this many columns keep the GEMMs' tiles full.
MIN_GRADIENT_SLICE = 4096


# Rows of the one-pass sequence route's float32 scratch (backends/gemm.py: stream_sequence_waves): enough for the
# logits GEMM to fill its tiles (two 128-row tiles), few enough that the store keeps most of the workspace.
SEQUENCE_SCRATCH_ROWS = 256


def sequence_store_layout(rows: int, vocab: int, gemm_itemsize: int, workspace_bytes: int,
                          scratch_itemsize: int = 4) -> tuple[int, int]:
    """(scratch rows, store rows) of the one-pass sequence route's workspace: a scratch of up to
    SEQUENCE_SCRATCH_ROWS rows in the statistics dtype (float32; float64 for the oracle), fewer when the call has
    fewer, the rest a store of rows in the GEMM dtype (0 when the scratch alone fills it)."""
    scratch = max(1, min(SEQUENCE_SCRATCH_ROWS, rows))
    return scratch, max(0, (workspace_bytes - scratch * vocab * scratch_itemsize) // (vocab * gemm_itemsize))


def gradient_tiles(tokens: int, vocab: int, hidden: int, workspace_bytes: int, hidden_grad: bool = True,
                   weight_grad: bool = True, min_slice: int = MIN_GRADIENT_SLICE, logit_bytes: int = 4
                   ) -> tuple[int, int]:
    """(rows, columns) of the logits tiles of the gradient pass from given statistics: token waves of whole rows
    (columns = vocab), or fewer token waves of vocabulary slices (`min_slice` columns times a power of two), whose
    wave's float32 dH sums ([rows, hidden]) the workspace holds too. Each token wave after the first reads and
    writes the float32 dW accumulator again; each slice after the first, the dH sums of its wave: the tiling with
    the least accumulator traffic (the widest slices on a tie). logit_bytes: a tile element's (4: the GEMM path's
    float32 logits; the input dtype's where a kernel writes dz alone, cost_model/triton_tma.py)."""
    if workspace_bytes <= 0:
        raise ValueError(f"workspace_bytes must be > 0, got {workspace_bytes}")
    N, V = max(1, tokens), vocab

    def traffic(rows: int, columns: int) -> int:  # accumulator elements passed over again, per hidden unit
        return weight_grad * (math.ceil(N / rows) - 1) * V + hidden_grad * (math.ceil(V / columns) - 1) * N

    widths = {V, *(min(V, min_slice << k) for k in range(max(1, V.bit_length())))}
    sums = hidden if hidden_grad else 0
    tilings = [(min(N, max(1, workspace_bytes // (logit_bytes * columns + 4 * sums * (columns < V)))), columns)
               for columns in widths]
    # the least traffic; then the widest slices (fewer launches, whole rows first)
    rows, columns = min(tilings, key=lambda tiling: (traffic(*tiling), -tiling[1]))
    return balanced(N, rows, GEMM_TILE_ROWS), balanced(V, columns, GEMM_TILE_COLUMNS)


def balanced(total: int, most: int, align: int) -> int:
    """The size of the fewest equal parts of `total` no larger than `most`, rounded up to a multiple of `align`
    where that stays within `most`: no thin last part, and whole GEMM tiles."""
    parts = math.ceil(total / most)
    size = math.ceil(total / parts)
    aligned = math.ceil(size / align) * align
    return aligned if aligned <= most else size


def gemm_phase(name: str, m: int, n: int, k: int, c: int, out_bytes: int, count: int = 1) -> Phase:
    """C[m, n] = A[m, k] B[k, n] by cuBLAS: reads both operands once, writes C once (tiles re-read from L2)."""
    return Phase(name, flops=2 * m * n * k, hbm_bytes=(m * k + k * n) * c + m * n * out_bytes, count=count,
                 gemm_shape=(m, n, k), launches=1)


def waves(rows: int, per_wave: int) -> list[tuple[int, int]]:
    """(rows in the wave, how many such waves): full waves, then the remainder."""
    full, rest = divmod(rows, per_wave)
    return [(per_wave, full)] * (full > 0) + [(rest, 1)] * (rest > 0)


def padding_phases(p: Problem) -> list[Phase]:
    """Padding-free paths gather the valid rows of hidden before the head (a host sync: the mask's nonzero) and
    scatter dH back after."""
    n, c = p.valid_tokens, p.itemsize
    if n == p.tokens:
        return []
    phases = [Phase("gather valid rows", hbm_bytes=2 * n * p.hidden * c, launches=2, host_syncs=1)]
    if p.hidden_needs_grad:
        phases.append(Phase("scatter dH (zeros at padding)", hbm_bytes=p.tokens * p.hidden * c + n * p.hidden * c,
                            launches=2))
    return phases


def gemm(p: Problem, dw_through_temporary: bool = False, sliced_second_pass: bool = True) -> Estimate:
    """The GEMM-rate path: waves of n_w rows through a reused float32 [n_w, V] logits workspace.

    Later waves' GEMM3 adds into the float32 dW accumulator itself (cuBLAS reads it as C: backends/wide_gemm.py's
    add_mm_wide_; the accumulator read and written once per wave, no temporary). dw_through_temporary models the
    design that avoids: a float32 temporary from torch.mm(out_dtype=float32), then added into the accumulator.
    sliced_second_pass=False: a two-pass loss's second pass in waves of whole rows (a backend that does not slice).
    """
    if p.operation == "loss" and p.level == "sequence" and 0 < p.sequence_rows <= sequence_store_layout(
            p.valid_tokens, p.vocab, p.itemsize, p.workspace_bytes)[1]:
        return sequence_waves(p)
    N, H, V, c = p.valid_tokens, p.hidden, p.vocab, p.itemsize
    n_w = min(N, max(1, p.workspace_bytes // (4 * V)))
    wave_list = waves(N, n_w)
    n_waves = sum(count for _, count in wave_list)
    grads = p.operation == "loss"
    two_pass = grads and p.level == "sequence"
    phases = padding_phases(p)

    segments = row_segments(V)
    merged_once = segments > 1 and not (grads and not two_pass)  # statistics only: merged after the last wave

    def logits_and_stats(tag: str) -> list[Phase]:
        out = []
        if segments > 1:  # every row's targets per segment ([N, segments], int64)
            out.append(Phase(f"{tag}segment targets for the statistics", hbm_bytes=N * (8 + segments * 8),
                             launches=SEGMENT_TARGET_LAUNCHES))
        for rows, count in wave_list:
            out.append(gemm_phase(f"{tag}GEMM1 Z = h W^T (fp32 out)", rows, V, H, c, 4, count))
            merges = SEGMENT_MERGE_LAUNCHES * (segments > 1 and not merged_once)
            out.append(Phase(f"{tag}row statistics ({segments} segments a row)",
                             hbm_bytes=rows * V * 4 + rows * PER_TOKEN_BYTES, row_read_bytes=rows * V * 4,
                             row_programs=rows * segments, count=count,
                             launches=1 + merges * (segments > 1)))
        if merged_once:  # the segments' statistics gathered ([N, segments] x 3, float32) and merged
            out.append(Phase(f"{tag}merge the segments' statistics", hbm_bytes=N * segments * 12 * 2,
                             launches=3 + SEGMENT_MERGE_LAUNCHES))
        return out

    phases += logits_and_stats("pass 1: " if two_pass else "")
    second_pass_peak = 0
    if grads:
        phases.append(Phase("objective", hbm_bytes=N * PER_TOKEN_BYTES,
                            launches=OBJECTIVE_LAUNCHES * (1 if two_pass else n_waves)))
        if two_pass:
            gradient_phases, second_pass_peak = gradients_from_stats(p, whole_rows=not sliced_second_pass)
            phases += gradient_phases
        else:
            phases += _one_pass_gradients(p, wave_list, dw_through_temporary)
        if p.weight_grad:
            phases.append(Phase("cast dW to the weight dtype", hbm_bytes=V * H * (4 + c), launches=1))
        # the one-pass route forms the gradients for an upstream gradient of 1 and scales them in the backward
        # (ops._attach_backward); the two-pass route's g and e already carry it
        if p.weight_grad and not two_pass:
            phases.append(Phase("backward: scale dW by the incoming gradient", hbm_bytes=2 * V * H * c, launches=1))
        if p.hidden_needs_grad and not two_pass:
            phases.append(Phase("backward: scale dH by the incoming gradient", hbm_bytes=2 * N * H * c, launches=1))
    gemms = (2 if two_pass else 1) + (p.hidden_needs_grad + p.weight_grad) * grads
    temporary = V * H * 4 if p.weight_grad and n_waves > 1 and dw_through_temporary and not two_pass else 0
    gathered = N * H * c if N < p.tokens else 0
    assumptions = [f"n_w = {n_w} rows per wave, {n_waves} waves", "padding rows dropped before the head",
                   "a head without bias"]
    if two_pass and sliced_second_pass:
        tile_rows, tile_columns = gradient_tiles(N, V, H, p.workspace_bytes, p.hidden_needs_grad, p.weight_grad)
        assumptions.append(f"second pass in [{tile_rows}, {tile_columns}] logits tiles")
    return Estimate("GEMM-rate waves" + ", dW through a temporary" * dw_through_temporary, p, phases, gemms=gemms,
                    peak_extra_bytes=max(n_w * V * 4, second_pass_peak) + temporary + gathered
                    + N * PER_TOKEN_BYTES + N * segments * 12 * merged_once,
                    fp32_weight_grad_bytes=V * H * 4 if p.weight_grad else 0, assumptions=assumptions)


def _one_pass_gradients(p: Problem, wave_list: list[tuple[int, int]], dw_through_temporary: bool) -> list[Phase]:
    """Each wave's dZ in place, dH and dW from it (the one-pass token-level route: the statistics just taken)."""
    H, V, c = p.hidden, p.vocab, p.itemsize
    phases = []
    first = True
    for rows, count in wave_list:
        phases.append(Phase("row gradient Z -> dZ in place", hbm_bytes=rows * V * (4 + c),
                            row_read_bytes=rows * V * 4, row_programs=rows, count=count, launches=1))
        if p.hidden_needs_grad:
            phases.append(gemm_phase("GEMM2 dH = dZ W", rows, H, V, c, c, count))
        if p.weight_grad:
            later = count - 1 if first else count
            if first:  # the first wave's GEMM3 writes the float32 accumulator directly
                phases.append(gemm_phase("GEMM3 dW = dZ^T h (first wave)", V, H, rows, c, 4))
            if later and not dw_through_temporary:  # the GEMM reads the accumulator as C and writes it back
                gemm3 = gemm_phase("GEMM3 dW += dZ^T h (into the accumulator)", V, H, rows, c, 4, later)
                phases.append(replace(gemm3, hbm_bytes=gemm3.hbm_bytes + V * H * 4))
            elif later:  # later waves: float32 temporary (written, read) + accumulator read-modify-write
                phases.append(gemm_phase("GEMM3 dW += dZ^T h (fp32 temporary)", V, H, rows, c, 4, later))
                phases.append(Phase("add temporary into dW accumulator", hbm_bytes=V * H * (4 + 8), count=later,
                                    launches=1))
        first = False
    return phases


def gradients_from_stats(p: Problem, whole_rows: bool = False, logit_bytes: int = 4) -> tuple[list[Phase], int]:
    """The second pass of the two-pass route (backends/gemm.py's _gradients_from_stats) and its peak: per
    [rows, columns] tile of gradient_tiles, the logits GEMM (float32 out), dZ in place, dH of the tile's rows
    (written, or added into the wave's float32 sums read as C after its first slice; those sums cast at the end of
    the wave), and dW of the slice's rows (written by the first wave, added into by later ones). whole_rows: waves
    of whole rows (a backend that does not slice). logit_bytes: a tile element's in the workspace (gradient_tiles);
    the phases are the GEMM path's, which cost_model/triton_tma.py replaces where its kernel writes dz alone."""
    N, H, V, c = p.valid_tokens, p.hidden, p.vocab, p.itemsize
    tile_rows, tile_columns = (min(N, max(1, p.workspace_bytes // (4 * V))), V) if whole_rows else \
        gradient_tiles(N, V, H, p.workspace_bytes, p.hidden_needs_grad, p.weight_grad, logit_bytes=logit_bytes)
    sliced = tile_columns < V
    phases = []
    for wave, (rows, row_count) in enumerate(waves(N, tile_rows)):
        for first_slice, (columns, count) in _firsts(waves(V, tile_columns)):
            tiles = row_count * count
            phases.append(gemm_phase("pass 2: GEMM1 Z = h W^T (fp32 out)", rows, columns, H, c, 4, tiles))
            phases.append(Phase("row gradient Z -> dZ in place", hbm_bytes=rows * columns * (4 + c),
                                row_read_bytes=rows * columns * 4, row_programs=rows, count=tiles, launches=1))
            if p.hidden_needs_grad and not sliced:
                phases.append(gemm_phase("GEMM2 dH = dZ W", rows, H, columns, c, c, tiles))
            elif p.hidden_needs_grad:
                dh = gemm_phase("GEMM2 dH (+)= dZ W_slice (fp32 sums)", rows, H, columns, c, 4, tiles)
                later = row_count * (count - first_slice)  # tiles that read the sums as C
                phases.append(replace(dh, hbm_bytes=dh.hbm_bytes + rows * H * 4 * later // tiles))
            if p.weight_grad:
                dw = gemm_phase("GEMM3 dW_slice (+)= dZ^T h", columns, H, rows, c, 4, tiles)
                later_waves = tiles if wave else count * (row_count - 1)  # tiles that read their dW rows as C
                phases.append(replace(dw, hbm_bytes=dw.hbm_bytes + columns * H * 4 * later_waves // tiles))
    if p.hidden_needs_grad and sliced and c != 4:
        phases.append(Phase("cast the dH sums", hbm_bytes=N * H * (4 + c), launches=math.ceil(N / tile_rows)))
    peak = tile_rows * tile_columns * logit_bytes + (tile_rows * H * 4 if p.hidden_needs_grad and sliced and c != 4
                                                     else 0)
    return phases, peak


def sequence_waves(p: Problem) -> Estimate:
    """The GEMM path's one-pass route for a loss separable by sequence (backends/gemm.py: stream_sequence_waves),
    its store holding p.sequence_rows rows a sequence: every sequence that long (the fewest sequences a wave)."""
    N, V, c = p.valid_tokens, p.vocab, p.itemsize
    scratch, store_rows = sequence_store_layout(N, V, c, p.workspace_bytes)
    length = min(p.sequence_rows, N)
    phases = padding_phases(p) + sequence_wave_phases(p, length, length, store_rows // length, scratch)
    if p.weight_grad:
        phases.append(Phase("cast dW to the weight dtype", hbm_bytes=V * p.hidden * (4 + c), launches=1))
    return Estimate("GEMM-rate waves of whole sequences", p, phases, gemms=1 + p.hidden_needs_grad + p.weight_grad,
                    peak_extra_bytes=scratch * V * 4 + min(N, store_rows // length * length) * V * c
                    + N * PER_TOKEN_BYTES, fp32_weight_grad_bytes=V * p.hidden * 4 if p.weight_grad else 0,
                    assumptions=[f"{length}-row sequences, {store_rows // length} a wave",
                                 f"a {scratch}-row float32 scratch, a store of {store_rows} rows"])


def sequence_wave_phases(p: Problem, length: int, stored_per_sequence: int, per_wave: int, scratch: int
                         ) -> list[Phase]:
    """Waves of `per_wave` whole sequences of `length` rows: each row's logits through the float32 scratch (GEMM1,
    the statistics), the first `stored_per_sequence` rows of each sequence's Q = d lp / d z read from the scratch and
    written into the store in the input dtype (a program per row segment); once the wave is complete, its objective,
    dH = g (Q W) and dW (+)= Q^T (g h) of the stored rows (the accumulator read as C after the first wave)."""
    H, V, c = p.hidden, p.vocab, p.itemsize
    segments = row_segments(V)
    phases: list[Phase] = []
    first = True
    for sequences, count in waves(max(1, p.valid_tokens // length), max(1, per_wave)):
        rows, stored = sequences * length, sequences * stored_per_sequence
        for sub, sub_count in waves(rows, scratch):
            phases.append(gemm_phase("GEMM1 Z = h W^T (fp32 out, scratch)", sub, V, H, c, 4, count * sub_count))
            phases.append(Phase(f"row statistics ({segments} segments a row)",
                                hbm_bytes=sub * V * 4 + sub * PER_TOKEN_BYTES, row_read_bytes=sub * V * 4,
                                row_programs=sub * segments, count=count * sub_count,
                                launches=1 + SEGMENT_MERGE_LAUNCHES * (segments > 1)))
        if stored:
            chunks = math.ceil(stored / scratch)
            phases.append(Phase("Q = d lp / d z into the store (input dtype)", hbm_bytes=stored * V * (4 + c),
                                row_read_bytes=stored * V * 4, row_programs=min(stored, scratch) * segments,
                                count=count, launches=chunks))
        phases.append(Phase("objective of the wave's sequences", hbm_bytes=p.tokens * PER_TOKEN_BYTES,
                            launches=OBJECTIVE_LAUNCHES, count=count))
        if p.hidden_needs_grad and stored:
            phases.append(gemm_phase("GEMM2 Q W (fp32 out)", stored, H, V, c, 4, count))
            phases.append(Phase("dH = g (Q W), cast", hbm_bytes=stored * H * (4 + c), count=count, launches=1))
        if p.weight_grad and stored:
            phases.append(Phase("g h", hbm_bytes=stored * H * 2 * c, count=count, launches=1))
            dw = gemm_phase("GEMM3 dW (+)= Q^T (g h)", V, H, stored, c, 4, count)
            later = count - 1 if first else count  # waves whose GEMM reads the accumulator as C
            phases.append(replace(dw, hbm_bytes=dw.hbm_bytes + V * H * 4 * later / count))
        first = False
    return phases


def _firsts(wave_list: list[tuple[int, int]]) -> list[tuple[int, tuple[int, int]]]:
    """(how many of the group are the first of the list: 1 or 0, the group) of waves()'s groups."""
    return [(int(i == 0), group) for i, group in enumerate(wave_list)]


def triton(p: Problem, programs_in_flight: int | None = None, l2_bytes: int = 50 * MIB) -> Estimate:
    """Fused streaming kernels (linear_forward.py, linear_backward.py) with Hopper's 16-bit blocks
    (kernels/configs.py): no [N, V] tensor at all.

    Forward: a program per token block walks the whole vocabulary, so every program reads all of W from L2
    (block_n tokens per W byte): the forward's L2 traffic is (N / block_n) x W. Programs in flight (one per SM)
    walk their loop in step, so W comes from HBM once per wave of programs. The backward kernels recompute the
    logits; their accumulators round-trip once per tile, to HBM when the in-flight accumulators exceed L2.
    """
    in_flight = programs_in_flight or 132
    phases = padding_phases(p) + [_triton_forward(p, in_flight)]
    if p.operation == "loss":
        phases += _owner_backward(p, in_flight, l2_bytes)
    gemms = 1 + 2 * (p.hidden_needs_grad + p.weight_grad) * (p.operation == "loss")
    return _triton_estimate("fused Triton streaming kernels", p, phases, gemms)


def triton_tiles(p: Problem, programs_in_flight: int | None = None, l2_bytes: int = 50 * MIB) -> Estimate:
    """The same forward; a trained head's backward in one kernel (tile_backward.py): a program per [block_n,
    block_v] tile recomputes it once and adds dz W into dH and dz^T h into dW with float32 atomics, charged as the
    roofline charges Cut Cross-Entropy's backward (atomic_tile_backward). With one gradient, the owner kernel."""
    in_flight = programs_in_flight or 132
    phases = padding_phases(p) + [_triton_forward(p, in_flight)]
    both = p.hidden_needs_grad and p.weight_grad
    if p.operation == "loss" and both:
        tiles = _HOPPER["grad_tiles"][SIXTEEN_BIT]
        phases.append(atomic_tile_backward("backward: one kernel, recompute + dH + dW (atomics)", p.valid_tokens,
                                           p.vocab, p.hidden, p.itemsize, tiles.block_n, tiles.block_v, True, True))
    elif p.operation == "loss":
        phases += _owner_backward(p, in_flight, l2_bytes)
    gemms = 1 + (3 if both else 2 * (p.hidden_needs_grad + p.weight_grad)) * (p.operation == "loss")
    return _triton_estimate("fused Triton kernels, one-kernel atomic backward", p, phases, gemms)


def atomic_tile_backward(name: str, N: int, V: int, H: int, c: int, block_n: int, block_v: int, hidden_grad: bool,
                         weight_grad: bool) -> Phase:
    """A backward kernel over [block_n, block_v] tiles (Cut Cross-Entropy's, this library's tile_backward.py): each
    tile's logits recomputed once from its two operand blocks read from L2, each needed gradient's contribution
    formed from the other operand's block (dH from W's, dW from h's, read again) and added by float32 atomics,
    which resolve in L2. HBM: the operands once, each float32 accumulator zeroed, read by the cast, and cast to c
    bytes."""
    tiles = math.ceil(N / block_n) * math.ceil(V / block_v)
    recompute = (block_n + block_v) * H * c
    contractions = (block_v * hidden_grad + block_n * weight_grad) * H * c
    return Phase(name, flops=2 * (1 + hidden_grad + weight_grad) * N * V * H,
                 hbm_bytes=(N + V) * H * c + (N * H * hidden_grad + V * H * weight_grad) * (4 + 4 + c),
                 l2_bytes=tiles * (recompute + contractions),
                 l2_reduction_bytes=tiles * (block_n * hidden_grad + block_v * weight_grad) * H * REDUCTION_BYTES,
                 launches=1, triton_matmul=True)


def _triton_forward(p: Problem, in_flight: int) -> Phase:
    """linear_forward.py's statistics kernel and merge (the epilogue's too)."""
    N, H, V, c = p.valid_tokens, p.hidden, p.vocab, p.itemsize
    fwd = _HOPPER["forward"][SIXTEEN_BIT]
    token_blocks, vocab_blocks = math.ceil(N / fwd.block_n), math.ceil(V / fwd.block_v)
    token_waves = math.ceil(token_blocks / in_flight)
    return Phase("forward: stream W, online softmax (+ epilogue)", flops=2 * N * V * H,
                 hbm_bytes=N * H * c + token_waves * V * H * c + N * PER_TOKEN_BYTES,
                 l2_bytes=token_blocks * V * H * c + vocab_blocks * N * H * c, launches=2, triton_matmul=True)


def _owner_backward(p: Problem, in_flight: int, l2_bytes: int) -> list[Phase]:
    """linear_backward.py's kernels, one per gradient needed."""
    N, H, V, c = p.valid_tokens, p.hidden, p.vocab, p.itemsize
    dh, dw = _HOPPER["grad_hidden"][SIXTEEN_BIT], _HOPPER["grad_weight"][SIXTEEN_BIT]
    phases = []
    if p.hidden_needs_grad:  # programs over token blocks, streaming the vocabulary
        phases.append(_streaming_backward("backward dH kernel: recompute + dZ W", N, dh.block_n, V, dh.block_v, H, c,
                                          in_flight, l2_bytes, streamed_reads=1))
    if p.weight_grad:  # programs over vocabulary blocks, streaming the tokens
        phases.append(_streaming_backward("backward dW kernel: recompute + dZ^T h", V, dw.block_v, N, dw.block_n, H, c,
                                          in_flight, l2_bytes, streamed_reads=2))
    return phases


def _triton_estimate(path: str, p: Problem, phases: list[Phase], gemms: int) -> Estimate:
    grads = p.operation == "loss"
    fwd = _HOPPER["forward"][SIXTEEN_BIT]
    return Estimate(path, p, phases, gemms=gemms,
                    peak_extra_bytes=(p.valid_tokens * p.hidden * 4 if grads and p.hidden_needs_grad else 0)
                    + p.valid_tokens * PER_TOKEN_BYTES,
                    fp32_weight_grad_bytes=p.vocab * p.hidden * 4 if p.weight_grad else 0,
                    assumptions=[f"forward blocks {fwd.block_n} tokens x {fwd.block_v} vocabulary; tensor cores at "
                                 "the Triton tile rate",
                                 "padding rows dropped; no dW kernel for a frozen head"])


def _streaming_backward(name: str, rows: int, row_block: int, cols: int, col_block: int, H: int, c: int,
                        in_flight: int, l2_bytes: int, streamed_reads: int) -> Phase:
    """A backward kernel with one program per block of `rows` (tokens for dH, vocabulary rows for dW) that
    streams all `cols` in col_block tiles, recomputing the logits: each tile's contribution is added into its
    float32 accumulator [row_block, H] by reductions in L2 (REDUCTION_BYTES an element), whose lines go to HBM
    and back once per tile (8 bytes) when the accumulators in flight exceed L2; the streamed operand comes from
    HBM once per wave of programs (`streamed_reads` times) and from L2 for the others."""
    row_blocks, col_blocks = math.ceil(rows / row_block), math.ceil(cols / col_block)
    waves_of_programs = math.ceil(row_blocks / in_flight)
    added = row_blocks * col_blocks * row_block * H  # float32 elements
    spills_l2 = min(in_flight, row_blocks) * row_block * H * 4 > l2_bytes
    return Phase(name, flops=4 * rows * cols * H,
                 hbm_bytes=rows * H * (4 + c + c) + streamed_reads * waves_of_programs * cols * H * c
                 + 2 * 4 * added * spills_l2,
                 l2_bytes=2 * row_blocks * cols * H * c + col_blocks * rows * H * c,
                 l2_reduction_bytes=added * REDUCTION_BYTES, launches=2, triton_matmul=True)


def torch_chunked(p: Problem, token_chunk: int = 256, vocab_chunk: int = 4096) -> Estimate:
    """torch_chunked.py on CUDA: [token_chunk, vocab_chunk] tiles, bf16 GEMM for logits, float32 GEMMs for dH, dW.

    Each token chunk streams all of W again (W exceeds L2), and the backward casts each W chunk to float32.
    Forward per logit: GEMM out c, cast c+4, max 4, sub+exp 16, sum 4, mul 12, sum 4 = 2c + 44 bytes.
    Backward per logit: GEMM out c, cast c+4, sub 8, exp 8, scale by -g 8, two fp32 GEMM reads 8 = 2c + 36.
    """
    N, H, V, c = p.valid_tokens, p.hidden, p.vocab, p.itemsize
    chunks = math.ceil(N / token_chunk)
    tiles = chunks * math.ceil(V / vocab_chunk)
    grads = p.operation == "loss"
    phases = padding_phases(p)
    phases.append(Phase("forward: logits tiles (bf16 GEMM)", flops=2 * N * V * H, hbm_bytes=chunks * V * H * c,
                        launches=tiles))
    phases.append(Phase("forward: online softmax on tiles", hbm_bytes=N * V * (2 * c + 44), launches=8 * tiles))
    if grads:
        phases.append(Phase("backward: recompute logits (bf16 GEMM)", flops=2 * N * V * H,
                            hbm_bytes=chunks * V * H * c, launches=tiles))
        phases.append(Phase("backward: dZ tiles", hbm_bytes=N * V * (2 * c + 36), launches=6 * tiles))
        contractions = p.hidden_needs_grad + p.weight_grad
        # per token chunk: W chunks cast to float32 (c + 4) and read by the GEMM (4); dW += temporary (4 + 4 + 8)
        w_bytes = V * H * ((c + 8) * p.hidden_needs_grad + 16 * p.weight_grad)
        phases.append(Phase("backward: dH, dW (float32 GEMMs)", flops=2 * contractions * N * V * H,
                            hbm_bytes=chunks * w_bytes + N * H * (8 + c), fp32_matmul=True,
                            launches=2 * contractions * tiles))
    gemms = 1 + grads * (1 + p.hidden_needs_grad + p.weight_grad)
    return Estimate("torch chunks", p, phases, gemms=gemms,
                    peak_extra_bytes=_torch_chunked_peak(p, token_chunk, vocab_chunk) + N * PER_TOKEN_BYTES,
                    fp32_weight_grad_bytes=V * H * 4 if p.weight_grad else 0,
                    assumptions=["padding rows dropped; dW skipped for a frozen head",
                                 "torch's default float32 matmul (no TF32) for dH, dW"])


def _torch_chunked_peak(p: Problem, token_chunk: int, vocab_chunk: int) -> int:
    """The most torch_streaming.py holds at once besides the gradients: the forward's logits tile and its exp; in
    the backward the dZ tile, the chunk's float32 dH, (16-bit inputs) the chunk's float32 hidden, and then either
    the tile's exp, or dZ W's product with (16-bit) the float32 W chunk, or dZ^T h's [vocab_chunk, H] product."""
    H, c = p.hidden, p.itemsize
    tile, rows, vocab_rows = token_chunk * vocab_chunk * 4, token_chunk * H * 4, vocab_chunk * H * 4
    cast = c != 4
    peak = 2 * tile
    if p.operation == "loss":
        held = tile + rows + rows * cast
        peak = max(peak, held + tile)
        if p.hidden_needs_grad:
            peak = max(peak, held + rows + vocab_rows * cast)
        if p.weight_grad:
            peak = max(peak, held + vocab_rows)
    return peak


def chunked_logits_peak_bytes(p: Problem, token_chunk: int = 4096, vocab_chunk: int = 32768) -> int:
    """Peak extra memory of the common fused head that scores logits in [token_chunk, vocab_chunk] tiles of the
    input dtype (TRL 1.16's chunked_logprob; benchmarks/model/roofline_paths.py models its time): one tile buffer
    (vocab_chunk wide even when V is smaller), the valid rows of hidden gathered and saved, a float32 dH accumulator
    when hidden needs a gradient, the per-token vectors. Its float32 dW accumulator is counted apart, as ours."""
    N, H, c = p.valid_tokens, p.hidden, p.itemsize
    return min(N, token_chunk) * vocab_chunk * c + N * H * c + N * H * 4 * p.hidden_needs_grad + N * PER_TOKEN_BYTES


def reference(p: Problem) -> Estimate:
    """reference.py: bf16 logits, float32 cast, log_softmax, exp, entropy; autograd backward.

    Forward per logit: GEMM out c, cast c+4, divide by tau 8, log_softmax 12, exp 8, mul 12, sum 4 = 2c + 48.
    Backward per logit: sum/mul/exp/log_softmax/divide/gather grads, 9 fp32 ops of 8-12 bytes (84), cast to c
    (c, + the fp32 read counted there), and the two GEMMs read dZ (2c) = 3c + 84.
    """
    N, H, V, c = p.tokens, p.hidden, p.vocab, p.itemsize
    grads = p.operation == "loss"
    phases = [gemm_phase("logits (bf16)", N, V, H, c, c),
              Phase("fp32 log_softmax, entropy", hbm_bytes=N * V * (c + 48), launches=7)]
    if grads:
        phases.append(Phase("autograd through the [N, V] ops", hbm_bytes=N * V * (c + 84), launches=10))
        if p.hidden_needs_grad:
            phases.append(gemm_phase("dH = dZ W", N, H, V, c, c))
        if p.weight_grad:
            phases.append(gemm_phase("dW = dZ^T h", V, H, N, c, c))
    # alive at the peak: saved log_probs and probs, and the two gradients of their product (4 fp32 [N, V])
    peak = N * V * (16 if grads else 8 + c)
    return Estimate("materialized logits", p, phases, gemms=1 + grads * (p.hidden_needs_grad + p.weight_grad),
                    peak_extra_bytes=peak, fp32_weight_grad_bytes=0,
                    assumptions=["every position, padding included"])

