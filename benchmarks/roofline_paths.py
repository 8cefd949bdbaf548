"""FLOPs, bytes and peak memory of each way to compute the GRPO loss, counted from its algorithm.

One small function per path, so a change to a kernel's tile loop is a change to one function. c is the
input dtype's byte size. Counts are per call of the benchmarked step (loss: forward + backward; logprobs:
forward under no_grad). Every count of an elementwise op is one read per input and one write per output.
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import partial
from typing import Callable

from grpo_kernels.backends import backend_names

from .roofline_model import MIB, Estimate, Phase, Problem

# Per-token vectors an objective or a statistics pass reads and writes (logp, entropy, lse, old, ref,
# advantage, mask, weight in; term, g, kl, clip out): a few dozen bytes, negligible beside [N, V] traffic.
PER_TOKEN_BYTES = 64


def _gemm(name: str, m: int, n: int, k: int, c: int, out_bytes: int, count: int = 1) -> Phase:
    """C[m, n] = A[m, k] B[k, n]: reads both operands once, writes C once (cuBLAS tiles re-read from L2)."""
    return Phase(name, flops=2 * m * n * k, hbm_bytes=(m * k + k * n) * c + m * n * out_bytes, count=count)


def _waves(rows: int, per_wave: int) -> list[tuple[int, int]]:
    """(rows in the wave, how many such waves): full waves, then the remainder."""
    full, rest = divmod(rows, per_wave)
    return [(per_wave, full)] * (full > 0) + [(rest, 1)] * (rest > 0)


def _padding_phases(p: Problem) -> list[Phase]:
    """Padding-free paths gather the valid rows of hidden before the head and scatter dH back after."""
    n, c = p.valid_tokens, p.itemsize
    if n == p.tokens:
        return []
    phases = [Phase("gather valid rows", hbm_bytes=2 * n * p.hidden * c)]
    if p.hidden_needs_grad:
        phases.append(Phase("scatter dH (zeros at padding)", hbm_bytes=p.tokens * p.hidden * c + n * p.hidden * c))
    return phases


def floor(p: Problem) -> Estimate:
    """Bare GEMMs over all B*T positions, as benchmarks.paths.make_floor_step measures: logits, dH, dW."""
    N, H, V, c = p.tokens, p.hidden, p.vocab, p.itemsize
    phases = [_gemm("logits = h W^T", N, V, H, c, c)]
    if p.hidden_needs_grad:
        phases.append(_gemm("dH = G W", N, H, V, c, c))
    if p.weight_grad:
        phases.append(_gemm("dW = G^T h", V, H, N, c, c))
    return Estimate("floor", p, phases, gemms=len(phases), peak_extra_bytes=N * V * c, fp32_weight_grad_bytes=0,
                    assumptions=["no padding is dropped (the measured floor runs every position)"])


def gemm(p: Problem, dw_through_temporary: bool = False) -> Estimate:
    """The GEMM-rate path: waves of n_w rows through a reused float32 [n_w, V] logits workspace.

    Later waves' GEMM3 adds into the float32 dW accumulator itself (kernels/accumulate_mm.py: the accumulator
    read and written once per wave, no temporary). dw_through_temporary models the design it replaced: a float32
    temporary from torch.mm(out_dtype=float32), then added into the accumulator.
    """
    N, H, V, c = p.valid_tokens, p.hidden, p.vocab, p.itemsize
    n_w = min(N, max(1, p.workspace_bytes // (4 * V)))
    waves = _waves(N, n_w)
    n_waves = sum(count for _, count in waves)
    grads = p.operation == "loss"
    two_pass = grads and p.level == "sequence"
    phases = _padding_phases(p)

    def logits_and_stats(tag: str) -> list[Phase]:
        out = []
        for rows, count in waves:
            out.append(_gemm(f"{tag}GEMM1 Z = h W^T (fp32 out)", rows, V, H, c, 4, count))
            out.append(Phase(f"{tag}row statistics", hbm_bytes=rows * V * 4 + rows * PER_TOKEN_BYTES, count=count))
        return out

    phases += logits_and_stats("pass 1: " if two_pass else "")
    if grads:
        phases.append(Phase("objective", hbm_bytes=N * PER_TOKEN_BYTES))
        if two_pass:
            phases += [ph for ph in logits_and_stats("pass 2: ") if "statistics" not in ph.name]
        first = True
        for rows, count in waves:
            phases.append(Phase("row gradient Z -> dZ in place", hbm_bytes=rows * V * (4 + c), count=count))
            if p.hidden_needs_grad:
                phases.append(_gemm("GEMM2 dH = dZ W", rows, H, V, c, c, count))
            if p.weight_grad:
                later = count - 1 if first else count
                if first:  # the first wave's GEMM3 writes the float32 accumulator directly
                    phases.append(_gemm("GEMM3 dW = dZ^T h (first wave)", V, H, rows, c, 4))
                if later and not dw_through_temporary:  # the GEMM reads the accumulator as C and writes it back
                    gemm3 = _gemm("GEMM3 dW += dZ^T h (into the accumulator)", V, H, rows, c, 4, later)
                    phases.append(replace(gemm3, hbm_bytes=gemm3.hbm_bytes + V * H * 4))
                elif later:  # later waves: float32 temporary (written, read) + accumulator read-modify-write
                    phases.append(_gemm("GEMM3 dW += dZ^T h (fp32 temporary)", V, H, rows, c, 4, later))
                    phases.append(Phase("add temporary into dW accumulator", hbm_bytes=V * H * (4 + 8), count=later))
            first = False
        if p.weight_grad:
            phases.append(Phase("cast dW to the weight dtype", hbm_bytes=V * H * (4 + c)))
            phases.append(Phase("backward: scale dW by the incoming gradient", hbm_bytes=2 * V * H * c))
        if p.hidden_needs_grad:
            phases.append(Phase("backward: scale dH by the incoming gradient", hbm_bytes=2 * N * H * c))
    gemms = (2 if two_pass else 1) + (p.hidden_needs_grad + p.weight_grad) * grads
    temporary = V * H * 4 if p.weight_grad and n_waves > 1 and dw_through_temporary else 0
    gathered = N * H * c if N < p.tokens else 0
    return Estimate("gemm+dw-temporary" if dw_through_temporary else "gemm", p, phases, gemms=gemms,
                    peak_extra_bytes=n_w * V * 4 + temporary + gathered + N * PER_TOKEN_BYTES,
                    fp32_weight_grad_bytes=V * H * 4 if p.weight_grad else 0,
                    assumptions=[f"n_w = {n_w} rows per wave, {n_waves} waves",
                                 "padding rows dropped before the head"])


def triton(p: Problem, block_n: int = 64, block_v: int = 128, programs_in_flight: int | None = None,
           l2_bytes: int = 50 * MIB) -> Estimate:
    """Fused streaming kernels (linear_forward.py, linear_backward.py): no [N, V] tensor at all.

    Programs in flight (one per SM by default) walk their loop in step, so a W tile (forward, dH) or an h tile
    (dW) is fetched from HBM once per wave of programs and served from L2 to the others. The backward
    accumulators round-trip once per tile: to HBM when the in-flight accumulators exceed L2, else to L2.
    """
    N, H, V, c = p.valid_tokens, p.hidden, p.vocab, p.itemsize
    in_flight = programs_in_flight or 132
    token_blocks, vocab_blocks = math.ceil(N / block_n), math.ceil(V / block_v)
    token_waves, vocab_waves = math.ceil(token_blocks / in_flight), math.ceil(vocab_blocks / in_flight)
    phases = _padding_phases(p)
    phases.append(Phase("forward: stream W, online softmax (+ epilogue)", flops=2 * N * V * H,
                        hbm_bytes=N * H * c + token_waves * V * H * c + N * PER_TOKEN_BYTES,
                        l2_bytes=token_blocks * V * H * c + vocab_blocks * N * H * c))
    grads = p.operation == "loss"
    if grads and p.hidden_needs_grad:
        round_trip = token_blocks * vocab_blocks * block_n * H * 8
        spills_l2 = min(in_flight, token_blocks) * block_n * H * 4 > l2_bytes
        phases.append(Phase("backward dH kernel: recompute + dZ W", flops=4 * N * V * H,
                            hbm_bytes=N * H * (4 + c + c) + token_waves * V * H * c + round_trip * spills_l2,
                            l2_bytes=2 * token_blocks * V * H * c + vocab_blocks * N * H * c
                            + round_trip * (not spills_l2)))
    if grads and p.weight_grad:
        round_trip = vocab_blocks * token_blocks * block_v * H * 8
        spills_l2 = min(in_flight, vocab_blocks) * block_v * H * 4 > l2_bytes
        phases.append(Phase("backward dW kernel: recompute + dZ^T h", flops=4 * N * V * H,
                            hbm_bytes=V * H * (4 + c + c) + 2 * vocab_waves * N * H * c + round_trip * spills_l2,
                            l2_bytes=2 * vocab_blocks * N * H * c + token_blocks * V * H * c
                            + round_trip * (not spills_l2)))
    gemms = 1 + 2 * (p.hidden_needs_grad + p.weight_grad) * grads
    return Estimate("triton", p, phases, gemms=gemms,
                    peak_extra_bytes=(N * H * 4 if grads and p.hidden_needs_grad else 0) + N * PER_TOKEN_BYTES,
                    fp32_weight_grad_bytes=V * H * 4 if p.weight_grad else 0,
                    assumptions=[f"BLOCK_N {block_n}, BLOCK_V {block_v}, {in_flight} programs in flight",
                                 "padding rows dropped; no dW kernel for a frozen head"])


def torch_chunked(p: Problem, token_chunk: int = 256, vocab_chunk: int = 4096) -> Estimate:
    """torch_chunked.py on CUDA: [token_chunk, vocab_chunk] tiles, bf16 GEMM for logits, float32 GEMMs for dH, dW.

    Each token chunk streams all of W again (W exceeds L2), and the backward casts each W chunk to float32.
    Forward per logit: GEMM out c, cast c+4, max 4, sub+exp 16, sum 4, mul 12, sum 4 = 2c + 44 bytes.
    Backward per logit: GEMM out c, cast c+4, sub 8, exp 8, scale by -g 8, two fp32 GEMM reads 8 = 2c + 36.
    """
    N, H, V, c = p.valid_tokens, p.hidden, p.vocab, p.itemsize
    chunks = math.ceil(N / token_chunk)
    grads = p.operation == "loss"
    phases = _padding_phases(p)
    phases.append(Phase("forward: logits tiles (bf16 GEMM)", flops=2 * N * V * H, hbm_bytes=chunks * V * H * c))
    phases.append(Phase("forward: online softmax on tiles", hbm_bytes=N * V * (2 * c + 44)))
    if grads:
        phases.append(Phase("backward: recompute logits (bf16 GEMM)", flops=2 * N * V * H,
                            hbm_bytes=chunks * V * H * c))
        phases.append(Phase("backward: dZ tiles", hbm_bytes=N * V * (2 * c + 36)))
        contractions = p.hidden_needs_grad + p.weight_grad
        # per token chunk: W chunks cast to float32 (c + 4) and read by the GEMM (4); dW += temporary (4 + 4 + 8)
        w_bytes = V * H * ((c + 8) * p.hidden_needs_grad + 16 * p.weight_grad)
        phases.append(Phase("backward: dH, dW (float32 GEMMs)", flops=2 * contractions * N * V * H,
                            hbm_bytes=chunks * w_bytes + N * H * (8 + c), fp32_matmul=True))
    gemms = 1 + grads * (1 + p.hidden_needs_grad + p.weight_grad)
    tiles = 2 * token_chunk * vocab_chunk * 4
    return Estimate("torch", p, phases, gemms=gemms,
                    peak_extra_bytes=tiles + vocab_chunk * H * 8 + N * H * 4 * grads + N * PER_TOKEN_BYTES,
                    fp32_weight_grad_bytes=V * H * 4 if p.weight_grad else 0,
                    assumptions=["padding rows dropped; dW skipped for a frozen head",
                                 "torch's default float32 matmul (no TF32) for dH, dW"])


def reference(p: Problem) -> Estimate:
    """reference.py: bf16 logits, float32 cast, log_softmax, exp, entropy; autograd backward.

    Forward per logit: GEMM out c, cast c+4, divide by tau 8, log_softmax 12, exp 8, mul 12, sum 4 = 2c + 48.
    Backward per logit: sum/mul/exp/log_softmax/divide/gather grads, 9 fp32 ops of 8-12 bytes (84), cast to c
    (c, + the fp32 read counted there), and the two GEMMs read dZ (2c) = 3c + 84.
    """
    N, H, V, c = p.tokens, p.hidden, p.vocab, p.itemsize
    grads = p.operation == "loss"
    phases = [_gemm("logits (bf16)", N, V, H, c, c), Phase("fp32 log_softmax, entropy", hbm_bytes=N * V * (c + 48))]
    if grads:
        phases.append(Phase("autograd through the [N, V] ops", hbm_bytes=N * V * (c + 84)))
        if p.hidden_needs_grad:
            phases.append(_gemm("dH = dZ W", N, H, V, c, c))
        if p.weight_grad:
            phases.append(_gemm("dW = dZ^T h", V, H, N, c, c))
    # alive at the peak: saved log_probs and probs, and the two gradients of their product (4 fp32 [N, V])
    peak = N * V * (16 if grads else 8 + c)
    return Estimate("reference", p, phases, gemms=1 + grads * (p.hidden_needs_grad + p.weight_grad),
                    peak_extra_bytes=peak, fp32_weight_grad_bytes=0,
                    assumptions=["every position, padding included"])


def liger(p: Problem, seq_len: int = 1024, seq_chunk: int = 2048, vocab_chunk: int = 4096) -> Estimate:
    """LigerFusedLinearGRPOLoss (liger-kernel 0.8.5): one sequence per outer chunk (chunk_size=1), inside it
    [seq_chunk, vocab_chunk] tiles; logits in bf16 (forward and recompute), dH and dW as float32 GEMMs; a
    float32 dW per sequence, cast and added into the weight-dtype gradient. Every position, padding included.
    Forward per logit 2c + 40 bytes; backward 2c + 52 (same op counting as torch_chunked)."""
    N, H, V, c = p.tokens, p.hidden, p.vocab, p.itemsize
    grads = p.operation == "loss"
    sequences = max(1, N // seq_len)
    chunks = sequences * math.ceil(min(seq_len, N) / seq_chunk)
    phases = [Phase("forward: logits tiles (bf16 GEMM)", flops=2 * N * V * H, hbm_bytes=chunks * V * H * c),
              Phase("forward: online lse on tiles", hbm_bytes=N * V * (2 * c + 40))]
    if grads:
        vocab_tiles = math.ceil(V / vocab_chunk)
        phases += [Phase("backward: recompute logits (bf16 GEMM)", flops=2 * N * V * H,
                         hbm_bytes=chunks * V * H * c),
                   Phase("backward: dZ tiles", hbm_bytes=N * V * (2 * c + 52)),
                   Phase("backward: dH, dW (float32 GEMMs)",
                         flops=2 * (p.hidden_needs_grad + p.weight_grad) * N * V * H, fp32_matmul=True,
                         hbm_bytes=chunks * V * H * (c + 8 + 16 * p.weight_grad)
                         + vocab_tiles * N * H * (c + 16))]
        if p.weight_grad:
            phases.append(Phase("per-sequence fp32 dW: zero, cast, accumulate",
                                hbm_bytes=sequences * V * H * (4 + 4 + c + 3 * c)))
    gemms = 1 + grads * (1 + p.hidden_needs_grad + p.weight_grad)
    return Estimate("liger", p, phases, gemms=gemms,
                    peak_extra_bytes=(V * H * c if p.weight_grad else 0) + 3 * seq_chunk * vocab_chunk * 4
                    + N * H * 4 * grads,
                    fp32_weight_grad_bytes=V * H * 4 if p.weight_grad else 0,
                    assumptions=["liger-kernel 0.8.5's chunked path; torch's default float32 matmul (no TF32)"])


def cce(p: Problem, block: int = 128) -> Estimate:
    """Cut Cross-Entropy (Wijmans et al. 2024) as the log-prob engine: forward lse kernel (1 GEMM) + indexed dot;
    backward kernel recomputes logits and adds dE, dC with float32 atomics (3 GEMMs). Gradient filtering skips
    tiles whose probabilities are all below 2^-12; on flat logits it skips none, which is what is modelled.
    Atomics resolve in L2 (counted as L2 bytes, block x block tiles assumed). Every position, padding included."""
    N, H, V, c = p.tokens, p.hidden, p.vocab, p.itemsize
    grads = p.operation == "loss"
    phases = [Phase("forward: lse kernel", flops=2 * N * V * H, hbm_bytes=(N + V) * H * c),
              Phase("forward: target logit (indexed dot)", flops=2 * N * H, hbm_bytes=2 * N * H * c)]
    if grads:
        atomics = math.ceil(N / block) * math.ceil(V / block) * block * H * 8
        phases.append(Phase("backward: recompute + dE + dC (atomics)",
                            flops=2 * (1 + p.hidden_needs_grad + p.weight_grad) * N * V * H,
                            # operands read; each fp32 accumulator zeroed, read by the cast, cast to c
                            hbm_bytes=(N + V) * H * c + (N * H * p.hidden_needs_grad + V * H * p.weight_grad)
                            * (4 + 4 + c), l2_bytes=atomics * (p.hidden_needs_grad + p.weight_grad)))
    return Estimate("cce", p, phases, gemms=1 + grads * (1 + p.hidden_needs_grad + p.weight_grad),
                    peak_extra_bytes=N * H * 4 * grads + N * PER_TOKEN_BYTES,
                    fp32_weight_grad_bytes=V * H * 4 if p.weight_grad else 0,
                    assumptions=["no gradient filtering (flat logits); fp32 atomics in L2"])


def trl(p: Problem, token_chunk: int = 4096, vocab_chunk: int = 32768) -> Estimate:
    """TRL 1.16's fused LM head (trl.kernels.chunked_logprob.ChunkedLogProbFunction, through add_fused_lm_head
    as GRPOTrainer calls it) and TRL's per-token loss.

    On CUDA only the valid rows are scored (hidden_states[mask], saved for the backward; dH scattered back).
    Per [token_chunk, vocab_chunk] tile: a cuBLAS GEMM writes the tile in the compute dtype (c bytes), a Triton
    fold reads it. Backward per tile: the GEMM again, a Triton kernel turns the tile into dZ in place (read,
    write), then dH[rows] += dZ W and dW[cols] += dZ^T h as GEMMs with float32 output into float32 accumulators
    (each reads its accumulator slice and writes it back once per tile); then both are cast. Per logit:
    forward 2c bytes, backward 5c (4c for a frozen head). W is read once per token chunk, h once per vocab tile.
    """
    N, H, V, c = p.valid_tokens, p.hidden, p.vocab, p.itemsize
    grads = p.operation == "loss"
    tiles = [(rows, cols, row_count * col_count)
             for rows, row_count in _waves(N, token_chunk) for cols, col_count in _waves(V, vocab_chunk)]
    phases = [Phase("gather valid rows (hidden_states[mask])", hbm_bytes=2 * N * H * c)]
    for rows, cols, count in tiles:
        phases.append(_gemm("forward: tile = h W^T", rows, cols, H, c, c, count))
        phases.append(Phase("forward: Triton fold (online lse, entropy)", hbm_bytes=rows * cols * c, count=count))
    phases.append(Phase("per-token log-probs, entropy and TRL's loss", hbm_bytes=N * PER_TOKEN_BYTES))
    if grads:
        phases.append(Phase("zero the float32 accumulators",
                            hbm_bytes=4 * H * (N * p.hidden_needs_grad + V * p.weight_grad)))
        for rows, cols, count in tiles:
            phases.append(_gemm("backward: recompute tile", rows, cols, H, c, c, count))
            phases.append(Phase("backward: Triton dZ in place", hbm_bytes=2 * rows * cols * c, count=count))
            if p.hidden_needs_grad:
                dh = _gemm("dH[rows] += dZ W (fp32 out)", rows, H, cols, c, 4, count)
                phases.append(replace(dh, hbm_bytes=dh.hbm_bytes + rows * H * 4))
            if p.weight_grad:
                dw = _gemm("dW[cols] += dZ^T h (fp32 out)", cols, H, rows, c, 4, count)
                phases.append(replace(dw, hbm_bytes=dw.hbm_bytes + cols * H * 4))
        if p.hidden_needs_grad:
            phases.append(Phase("cast dH", hbm_bytes=N * H * (4 + c)))
            phases.append(Phase("scatter dH to every position", hbm_bytes=p.tokens * H * c + N * H * c))
        if p.weight_grad:
            phases.append(Phase("cast dW", hbm_bytes=V * H * (4 + c)))
    tile = min(N, token_chunk) * vocab_chunk * c  # the tile buffer is vocab_chunk wide even when V is smaller
    return Estimate("trl", p, phases, gemms=1 + grads * (1 + p.hidden_needs_grad + p.weight_grad),
                    peak_extra_bytes=tile + N * H * c + N * H * 4 * p.hidden_needs_grad + N * PER_TOKEN_BYTES,
                    fp32_weight_grad_bytes=V * H * 4 if p.weight_grad else 0,
                    assumptions=[f"[{token_chunk}, {vocab_chunk}] tiles in the compute dtype",
                                 "padding rows dropped (TRL scores valid rows only on CUDA)",
                                 "dH, dW accumulated in float32 by 16-bit GEMMs with float32 output"])


# This package's backends by their registered names (grpo_kernels/backends): a registered backend without a model
# here fails on import, not later in a plan.
_BACKEND_MODELS: dict[str, Callable[[Problem], Estimate]] = {
    "reference": reference, "torch": torch_chunked, "triton": triton, "gemm": gemm}
_unmodelled = set(backend_names(with_auto=False)) - set(_BACKEND_MODELS)
if _unmodelled:
    raise ImportError(f"the roofline has no model of the registered backends {sorted(_unmodelled)}")
MODELS: dict[str, Callable[[Problem], Estimate]] = {
    "floor": floor, **{name: _BACKEND_MODELS[name] for name in backend_names(with_auto=False)},
    "liger": liger, "cce": cce, "trl": trl,
}

# Designs the code does not implement, for comparison (`python -m benchmarks.roofline --paths ...`).
ALTERNATIVES: dict[str, Callable[[Problem], Estimate]] = {
    "gemm+dw-temporary": partial(gemm, dw_through_temporary=True),
}
