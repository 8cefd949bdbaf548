"""FLOPs, bytes, launches and peak memory of the peers' paths (Liger, Cut Cross-Entropy, TRL) and the bare GEMMs,
counted from their algorithms, beside this library's own paths, whose model lives in the library
(grpo_kernels/cost_model/paths.py) because `backend="auto"` routes by it.

One small function per path, so a change to a kernel's tile loop is a change to one function. c is the
input dtype's byte size. Counts are per call of the benchmarked step (loss: forward + backward; logprobs:
forward under no_grad). Every count of an elementwise op is one read per input and one write per output.
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import partial
from typing import Callable

from grpo_kernels.backends import get_backend
from grpo_kernels.cost_model import library_paths, PER_TOKEN_BYTES, gemm_phase as _gemm, waves as _waves
from grpo_kernels.cost_model.paths import (atomic_tile_backward, chunked_logits_peak_bytes, gemm, gradients_from_stats,
                                           padding_phases, sequence_wave_phases)
from grpo_kernels.routing import modelled_route

from .roofline_model import DEVICES, MIB, DeviceRates, Estimate, Phase, Problem


def floor(p: Problem) -> Estimate:
    """Bare GEMMs over all B*T positions, as benchmarks.suite.paths.make_floor_step measures: logits, dH, dW."""
    N, H, V, c = p.tokens, p.hidden, p.vocab, p.itemsize
    phases = [_gemm("logits = h W^T", N, V, H, c, c)]
    if p.hidden_needs_grad:
        phases.append(_gemm("dH = G W", N, H, V, c, c))
    if p.weight_grad:
        phases.append(_gemm("dW = G^T h", V, H, N, c, c))
    return Estimate("floor", p, phases, gemms=len(phases), peak_extra_bytes=N * V * c, fp32_weight_grad_bytes=0,
                    assumptions=["no padding is dropped (the measured floor runs every position)"])


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


def cce(p: Problem, block: int = 256) -> Estimate:
    """Cut Cross-Entropy (Wijmans et al. 2024) as the log-prob engine: forward lse kernel (1 GEMM) + indexed dot;
    backward kernel recomputes logits and adds dE, dC with float32 atomics (3 GEMMs). Gradient filtering skips
    tiles whose probabilities are all below 2^-12; on flat logits it skips none, which is what is modelled.
    Atomics resolve in L2 (counted as L2 bytes, block x block tiles: 256 fits the H200 run's loss cases at S1 and
    S3 within 2%, 128 predicted half their time). Every position, padding included."""
    N, H, V, c = p.tokens, p.hidden, p.vocab, p.itemsize
    grads = p.operation == "loss"
    phases = [Phase("forward: lse kernel", flops=2 * N * V * H, hbm_bytes=(N + V) * H * c, triton_matmul=True),
              Phase("forward: target logit (indexed dot)", flops=2 * N * H, hbm_bytes=2 * N * H * c)]
    if grads:
        phases.append(atomic_tile_backward("backward: recompute + dE + dC (atomics)", N, V, H, c, block, block,
                                           p.hidden_needs_grad, p.weight_grad))
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
        phases.append(Phase("forward: Triton fold (online lse, entropy)", hbm_bytes=rows * cols * c,
                            row_read_bytes=rows * cols * c, count=count))
    phases.append(Phase("per-token log-probs, entropy and TRL's loss", hbm_bytes=N * PER_TOKEN_BYTES))
    if grads:
        phases.append(Phase("zero the float32 accumulators",
                            hbm_bytes=4 * H * (N * p.hidden_needs_grad + V * p.weight_grad)))
        for rows, cols, count in tiles:
            phases.append(_gemm("backward: recompute tile", rows, cols, H, c, c, count))
            phases.append(Phase("backward: Triton dZ in place", hbm_bytes=2 * rows * cols * c,
                                row_read_bytes=rows * cols * c, count=count))
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
    return Estimate("trl", p, phases, gemms=1 + grads * (1 + p.hidden_needs_grad + p.weight_grad),
                    peak_extra_bytes=chunked_logits_peak_bytes(p, token_chunk, vocab_chunk),
                    fp32_weight_grad_bytes=V * H * 4 if p.weight_grad else 0,
                    assumptions=[f"[{token_chunk}, {vocab_chunk}] tiles in the compute dtype",
                                 "padding rows dropped (TRL scores valid rows only on CUDA)",
                                 "dH, dW accumulated in float32 by 16-bit GEMMs with float32 output"])


def auto(p: Problem, rates: DeviceRates = DEVICES["H100"]) -> Estimate:
    """What `backend="auto"` runs on a device: the route the library's cost model picks (routing.py), within its
    default memory budget."""
    route, est = modelled_route(p, rates)
    workspace = get_backend(route.backend).uses_workspace
    label = route.backend + (f" {route.workspace_bytes / MIB:.0f} MiB" if workspace else "")
    return replace(est, path=f"auto: {label}", assumptions=[f"{label}: {route.reason}", *est.assumptions])


def sequence_waves(p: Problem, seq_len: int = 1024, scratch_rows: int = 256) -> Estimate:
    """The GEMM path's waves of whole sequences (cost_model.paths.sequence_waves, built: where the store holds the
    longest sequence) extended by a design the code does not implement: a sequence longer than the store keeps its
    first rows there and defers the rest, whose statistics its wave took; after the last wave the deferred rows take
    the two-pass route's second pass (gradients_from_stats), its dW slices added into the accumulator. Between three
    GEMM-equivalents (the store holds whole sequences) and four."""
    N, H, V, c = p.valid_tokens, p.hidden, p.vocab, p.itemsize
    length, scratch = min(seq_len, N), min(scratch_rows, N)
    store_rows = max(0, (p.workspace_bytes - scratch * V * 4) // (V * c))
    stored_per_sequence = min(length, store_rows)
    phases = padding_phases(p) + sequence_wave_phases(p, length, stored_per_sequence, max(1, store_rows // length),
                                                      scratch)
    deferred = N - min(N, max(1, N // length) * stored_per_sequence)
    deferred_peak = 0
    if deferred:  # every dW row already written by the waves: each slice's GEMM reads its rows as C
        gradient_phases, deferred_peak = gradients_from_stats(replace(p, tokens=deferred, valid_fraction=1.0))
        phases += [replace(ph, hbm_bytes=ph.hbm_bytes + ph.gemm_shape[0] * H * 4 * (stored_per_sequence > 0))
                   if ph.name.startswith("GEMM3") else ph for ph in gradient_phases]
    if p.weight_grad:
        phases.append(Phase("cast dW to the weight dtype", hbm_bytes=V * H * (4 + c), launches=1))
    return Estimate("sequence waves (design)", p, phases, gemms=3 + (deferred > 0),
                    peak_extra_bytes=max(store_rows * V * c + scratch * V * 4, deferred_peak) + N * PER_TOKEN_BYTES,
                    fp32_weight_grad_bytes=V * H * 4 if p.weight_grad else 0,
                    assumptions=[f"{seq_len}-token sequences", f"{store_rows} stored rows, {scratch}-row scratch",
                                 f"{deferred} rows deferred to a second pass",
                                 "a loss separable by sequence, no entropy term"])


MODELS: dict[str, Callable[[Problem], Estimate]] = {
    "floor": floor, **library_paths(), "auto": auto, "liger": liger, "cce": cce, "trl": trl,
}

# Designs the code does not implement, for comparison (`python -m benchmarks.model.roofline --paths ...`).
ALTERNATIVES: dict[str, Callable[[Problem], Estimate]] = {
    "gemm+dw-temporary": partial(gemm, dw_through_temporary=True),
    "gemm+sequence-waves": sequence_waves,
}
