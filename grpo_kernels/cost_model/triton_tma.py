"""Cost of backends/triton_tma.py: token chunks through the persistent TMA forward, dz in place, dH and dW by GEMM.

The chunk loop is the GEMM path's wave loop (paths.gemm) with two steps changed: where the GEMM path writes a
float32 logits wave by cuBLAS and reads it back in a row pass for the statistics, the persistent kernel computes the
tiles and folds the statistics in its epilogue, writing the chunk (an exponential in the input dtype a logit, a
float32 maximum per row and tile) only when a gradient follows (and nothing at all for no-grad log-probs, which run
in one launch over every token); and the dz pass reads and writes the input dtype a logit in tiles of their own
programs (kernels/chunk_grad.py) where the GEMM path's row pass reads float32. The dH and dW GEMMs, the objective's
small ops and the casts are the GEMM path's, charged by paths.gemm itself; the chunk holds the rows of the GEMM
path's wave bytes (configs.stored_rows_within: about twice as many at 16 bits) rounded down to whole 128-token
blocks, or below two blocks to a multiple of 32 tokens (chunk_rows).

Two passes (a sequence-level loss; a token-level one where the chunks do not pay): the persistent kernel's
statistics in one launch, then the GEMM path's gradient pass (paths.gradients_from_stats) in tiles of the input
dtype, each tile's float32 logits GEMM and row pass replaced by one launch of persistent_grad.py's kernel over the
same tile (dz written in its epilogue). At the Triton rate that is about level with cuBLAS plus the row pass where
H is large (S1's 4096: the row pass is small beside the GEMM), and 7-11% less time a tile at S2 / S3's H.

The Triton kernel's tensor-core rate: no GPU has measured this project's persistent kernel yet. Until one does, it
is the published rate of the same kind of kernel: persistent Triton GEMMs loading through tensor descriptors (TMA)
on Hopper ran at 700 TFLOP/s where cuBLAS ran at 780 (PyTorch issue 149790, bf16, 128 x 256 x 64 tiles), and at
666-689 TFLOP/s on 8192-cubed GEMMs (tritonbench issue 894). The model charges cuBLAS's time at the same shape
(device.gemm_compute_seconds: the calibrated cuBLAS rate, tile and wave quantization) divided by 700 / 780. This
project's tile is 128 x 128 x 64 (configs.py: 128 x 256 spills), which the cited 0.90 does not cover: an
assumption until the next GPU run measures it (benchmarks/triton_check.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

from ..kernels.configs import GPU_CONFIGS, PERSISTENT_GROUP_N, SIXTEEN_BIT, KernelConfig, chunk_rows_within, \
    dtype_class, stored_rows_within
from .estimate import Estimate, Phase, Problem
from .device import DEVICES, DeviceRates
from .paths import PER_TOKEN_BYTES, gemm, gradients_from_stats, padding_phases

# persistent TMA Triton GEMM / cuBLAS on Hopper: 700 / 780 TFLOP/s (PyTorch issue 149790; tritonbench issue 894:
# 666-689 TFLOP/s): published, not measured here
TMA_TRITON_FRACTION_OF_CUBLAS = 700 / 780
# The epilogue's exponentials on the special-function units: one a logit (p; the running max's rescale is one a
# row), counted in the persistent kernel's sm_90a code (benchmarks/results/kernels/kernel-report-triton-*.md, column
# ex2: 66 MUFU.EX2 a thread for the 64 logits each of 256 threads holds of a 128 x 128 tile, under both supported
# tritons; a soft-capped head's tanh adds one more); 16 results per clock per SM for compute capability 9.0 (CUDA
# C++ Programming Guide, arithmetic instruction throughput, exp2), at H100 / H200's 1.98 GHz boost clock; not
# overlapped with the tile's tensor-core work (no warp specialisation on Hopper in stock Triton, and one program an
# SM: benchmarks/triton_check.py (d) times two an SM, which would hide them, on the next GPU).
EPILOGUE_EXPS_PER_LOGIT = 1
SFU_RESULTS_PER_CLOCK_PER_SM = 16
SM_CLOCK_HZ = 1.98e9
# paths.gemm's row gradient pass, which the chunk loop replaces by chunk_grad.py's (named so in the estimate)
ROW_GRADIENT = "row gradient Z -> dZ in place"
# paths.gradients_from_stats' logits tile, which persistent_grad.py's kernel replaces (dz written in its epilogue)
PASS_2_LOGITS = "pass 2: GEMM1 Z = h W^T (fp32 out)"
CHUNK_GRADIENT = "chunk gradient: exponentials -> dZ in place"
CHUNK_GRAD_BLOCK_N = GPU_CONFIGS["sm90"]["chunk_grad"][SIXTEEN_BIT].block_n


@dataclass(frozen=True)
class PersistentKernelPhase(Phase):
    """The persistent kernel: its tile GEMM at cuBLAS's time for the shape over the published Triton fraction,
    plus the epilogue's exponentials."""

    exps: float = 0.0

    def compute_seconds(self, rates) -> float:
        sfu_rate = SFU_RESULTS_PER_CLOCK_PER_SM * rates.sms * SM_CLOCK_HZ
        return super().compute_seconds(rates) / TMA_TRITON_FRACTION_OF_CUBLAS + self.exps / sfu_rate


def _persistent(p: Problem) -> KernelConfig:
    """The persistent kernel's Hopper table entry for the problem's dtype."""
    return GPU_CONFIGS["sm90"]["persistent"][dtype_class(p.itemsize == 4)]


def chunk_rows_modelled(p: Problem) -> int:
    """backends/triton_tma.chunk_rows for this problem on Hopper (kept free of torch and triton imports). A chunk
    whose last token block is partly filled is charged whole blocks: the GEMM phases' tiles at its shape."""
    config = _persistent(p)
    return chunk_rows_within(stored_rows_within(max(1, p.workspace_bytes // (4 * p.vocab)), p.itemsize,
                                                config.block_v), config.block_n)


def chunk_bytes(rows: int, p: Problem) -> int:
    """A chunk of `rows` tokens: an exponential in the input dtype a logit (rows padded to 16 bytes) and a float32
    maximum per row and vocabulary tile."""
    tiles = math.ceil(p.vocab / _persistent(p).block_v)
    return rows * (math.ceil(p.vocab * p.itemsize / 16) * 16 + 4 * tiles)


def persistent_forward_phase(name: str, rows: int, p: Problem, store_logits: bool, count: int = 1) -> Phase:
    """One launch of persistent_forward.py over `rows` tokens, and the merge: the weight from HBM once per group of
    PERSISTENT_GROUP_N token blocks (the items in flight share it), the hidden rows once, the partial statistics
    written and read, the chunk written when stored."""
    H, V, c = p.hidden, p.vocab, p.itemsize
    config = _persistent(p)
    splits = math.ceil(V / (config.block_v * config.split_tiles))
    groups = math.ceil(rows / (config.block_n * PERSISTENT_GROUP_N))
    hbm = rows * H * c + groups * V * H * c + 2 * 16 * splits * rows + rows * PER_TOKEN_BYTES
    return PersistentKernelPhase(name, flops=2 * rows * V * H, hbm_bytes=hbm + store_logits * chunk_bytes(rows, p),
                                 gemm_shape=(rows, V, H), count=count, launches=2,
                                 exps=EPILOGUE_EXPS_PER_LOGIT * rows * V)


def triton_tma(p: Problem) -> Estimate:
    """The route backends/triton_tma.py takes: no-grad log-probs in one launch; a token-level loss through the token
    chunks where chunks_pay says so, else (and a sequence-level loss always) the statistics first and the gradients
    in the GEMM path's tiles."""
    N = p.valid_tokens
    if p.operation == "logprobs":
        phases = padding_phases(p) + [persistent_forward_phase("persistent TMA forward + merge", N, p, False)]
        return Estimate("persistent TMA Triton forward", p, phases, gemms=1,
                        peak_extra_bytes=_partial_bytes(N, p) + N * PER_TOKEN_BYTES + (N * p.hidden * p.itemsize
                                                                                       if N < p.tokens else 0),
                        fp32_weight_grad_bytes=0, assumptions=_assumptions(chunk_rows_modelled(p), N))
    if p.level == "sequence" or not chunks_pay(p):
        return two_passes(p)
    return token_chunks(p)


def chunks_pay(p: Problem, rates: DeviceRates = DEVICES["H100"]) -> bool:
    """Whether a token-level loss is faster through the token chunks (three GEMM-equivalents, but the float32 dW
    accumulator passed over once a chunk) than in two passes (a fourth, the statistics, but few passes over the
    accumulators): by this model on the rates of the Hopper GPU the kernels are built for (the choice must not
    depend on where it is asked: a CPU runs the same route, interpreted)."""
    return token_chunks(p).seconds(rates) <= two_passes(p).seconds(rates)


def token_chunks(p: Problem) -> Estimate:
    """The chunk loop: paths.gemm's waves with each wave's logits GEMM and row statistics replaced by the persistent
    kernel, storing the chunk, and its row gradient pass by chunk_grad.py's."""
    rows = chunk_rows_modelled(p)
    waves = gemm(replace(p, level="token", workspace_bytes=rows * 4 * p.vocab))
    phases = [_chunk_grad_phase(phase, p) if phase.name == ROW_GRADIENT else phase
              for phase in _replaced(waves.phases, p, lambda phase: True)]
    if not any(phase.name == CHUNK_GRADIENT for phase in phases):
        raise RuntimeError(f"paths.gemm names no {ROW_GRADIENT!r} phase: this model must follow its rename")
    held = min(rows, p.valid_tokens)  # the chunk as allocated in place of paths.gemm's float32 wave
    return Estimate("persistent TMA Triton chunks, dz in place, dH / dW by GEMM", p, phases, gemms=waves.gemms,
                    peak_extra_bytes=waves.peak_extra_bytes - held * 4 * p.vocab + chunk_bytes(held, p)
                    + _partial_bytes(held, p),
                    fp32_weight_grad_bytes=waves.fp32_weight_grad_bytes,
                    assumptions=_assumptions(rows, p.valid_tokens))


def two_passes(p: Problem) -> Estimate:
    """The statistics by the persistent kernel in one launch (no logits stored), the objective, then the GEMM path's
    gradient pass from the statistics (paths.gradients_from_stats) in tiles of the input dtype, each tile's dz
    written by persistent_grad.py's kernel where the GEMM path writes float32 logits and turns them into dz."""
    N = p.valid_tokens
    waves = gemm(replace(p, level="sequence", sequence_rows=0))  # no waves of whole sequences here
    before = waves.phases[:[phase.name for phase in waves.phases].index("objective") + 1]
    after = [phase for phase in waves.phases if phase.name == "cast dW to the weight dtype"]
    second_pass, second_pass_peak = gradients_from_stats(p, logit_bytes=p.itemsize)
    if not any(phase.name == PASS_2_LOGITS for phase in second_pass):
        raise RuntimeError(f"paths.gradients_from_stats names no {PASS_2_LOGITS!r} phase: this model must follow")
    phases = (_replaced(before, p, lambda phase: phase.name.startswith("pass 1"))
              + [_dz_tiles_phase(phase, p) for phase in second_pass if phase.name != ROW_GRADIENT] + after)
    return Estimate("persistent TMA Triton statistics, then dz tiles by the persistent kernel, dH / dW by GEMM", p,
                    phases, gemms=waves.gemms,
                    peak_extra_bytes=max(second_pass_peak, _partial_bytes(N, p)) + N * PER_TOKEN_BYTES
                    + (N * p.hidden * p.itemsize if N < p.tokens else 0),
                    fp32_weight_grad_bytes=waves.fp32_weight_grad_bytes,
                    assumptions=[*waves.assumptions[-1:], *_assumptions(N, N)[1:]])


def _dz_tiles_phase(phase: Phase, p: Problem) -> Phase:
    """A second-pass phase as the Triton path runs it: the GEMM path's float32 logits tile becomes
    persistent_grad.py's launch over the same [rows, columns] (the weight slice from HBM once per group of token
    blocks, the hidden rows once, dz written in the input dtype; one exponential a logit); the rest as it is."""
    if phase.name != PASS_2_LOGITS:
        return phase
    rows, columns, H = phase.gemm_shape
    c, config = p.itemsize, GPU_CONFIGS["sm90"]["persistent_dz"][dtype_class(p.itemsize == 4)]
    groups = math.ceil(rows / (config.block_n * PERSISTENT_GROUP_N))
    return PersistentKernelPhase("pass 2: persistent TMA dz tiles", flops=phase.flops,
                                 hbm_bytes=rows * H * c + groups * columns * H * c + rows * columns * c
                                 + rows * PER_TOKEN_BYTES, gemm_shape=phase.gemm_shape, count=phase.count,
                                 launches=1, exps=EPILOGUE_EXPS_PER_LOGIT * rows * columns)


def _replaced(phases: list[Phase], p: Problem, by_the_kernel: Callable[[Phase], bool]) -> list[Phase]:
    """paths.gemm's phases with the logits GEMMs (and their statistics) that `by_the_kernel` selects replaced by the
    persistent kernel: a first pass's by one launch over every token, a chunk's with the chunk stored."""
    statistics = ("row statistics", "merge the segments", "segment targets")
    out, replaced = [], 0
    for phase in phases:
        if not by_the_kernel(phase):
            out.append(phase)
        elif "GEMM1" in phase.name:
            replaced += 1
            if phase.name.startswith("pass 1"):  # a two-pass loss's statistics: linear_forward, one launch
                if replaced == 1:
                    out.append(persistent_forward_phase("pass 1: persistent TMA forward + merge", p.valid_tokens,
                                                        p, False))
            else:  # a chunk's logits, for the first time: the chunk stored
                out.append(persistent_forward_phase(phase.name.replace("GEMM1 Z = h W^T (fp32 out)",
                                                                       "persistent TMA forward, chunk stored"),
                                                    phase.gemm_shape[0], p, True, phase.count))
        elif not any(name in phase.name for name in statistics):  # the statistics are the kernel's epilogue's
            out.append(phase)
    if not replaced:
        raise RuntimeError("paths.gemm names no 'GEMM1' logits phase: this model must follow its rename")
    return out


def _chunk_grad_phase(row_gradient: Phase, p: Problem) -> Phase:
    """chunk_grad.py over a chunk of paths.gemm's wave rows: the input dtype read and written a logit, a maximum a
    row and tile read, one program per [32, tile] block (so never few programs: HBM-bound)."""
    rows, config = row_gradient.row_programs, _persistent(p)  # paths.gemm's row pass: one program a row
    tiles = math.ceil(p.vocab / config.block_v)
    read = rows * p.vocab * p.itemsize + rows * tiles * 4
    return replace(row_gradient, name=CHUNK_GRADIENT, hbm_bytes=read + rows * p.vocab * p.itemsize,
                   row_read_bytes=read, row_programs=math.ceil(rows / CHUNK_GRAD_BLOCK_N) * tiles)


def _partial_bytes(rows: int, p: Problem) -> int:
    config = _persistent(p)
    return 16 * math.ceil(p.vocab / (config.block_v * config.split_tiles)) * rows


def _assumptions(rows: int, N: int) -> list[str]:
    return [f"{min(rows, N)} tokens a chunk, {math.ceil(N / rows)} chunks",
            f"Triton tile GEMM at {TMA_TRITON_FRACTION_OF_CUBLAS:.2f} of cuBLAS's time at the shape (published: "
            "PyTorch issue 149790, tritonbench issue 894; not yet measured for this kernel)",
            "epilogue exponentials on the SFUs, not overlapped", "padding rows dropped before the head"]
