"""What a GPU charges: its rates, with where each number comes from, and a GEMM's achieved time at its shape.

A GEMM does not run at one rate. cuBLAS splits the output into tiles, one thread block each, and runs them in
waves of one block per SM: a partial tile (M not a multiple of the tile's rows) computes padding, a partial last
wave leaves SMs idle (tile and wave quantization), and every tile pays its pipeline's fill and drain along K.
When the tiles cannot fill one wave and K is long, cuBLAS splits K across blocks (split-K / stream-K). So a
wave of a few hundred rows runs well below the rate of a large GEMM, and the model charges that. Every kernel
launch and every host synchronisation costs a fixed time on the GPU's timeline as well.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

MIB = 2**20

# Cited and assumed numbers (docs/benchmarks.md, "What the model charges", lists them with their sources).
# cuBLAS's output tile for 16-bit GEMMs on Hopper: 128 x 256 (assumed: a common Hopper bf16 tile; cuBLAS does
# not publish its heuristics).
HOPPER_GEMM_TILE = (128, 256)
# Pipeline fill and drain of one output tile, in elements of K: two 64-wide K stages (assumed).
GEMM_K_FILL = 128
# Gap on the GPU's timeline per dependent kernel launch (assumed, the order of CUDA's launch latency).
KERNEL_LAUNCH_S = 4e-6
# A host synchronisation (a boolean-mask gather's nonzero, .item()): the queue drains and refills (assumed).
HOST_SYNC_S = 20e-6


@dataclass(frozen=True)
class DeviceRates:
    name: str
    tensor_flops: float  # dense 16-bit tensor-core matmul of a large GEMM (full tiles, full waves), FLOP/s
    fp32_flops: float  # float32 matmul on the CUDA cores (torch's default: no TF32), FLOP/s
    hbm_bytes_per_s: float  # achievable HBM bandwidth
    hbm_peak_bytes_per_s: float
    l2_bytes: int
    sms: int
    source: str
    l2_bytes_per_s: float = math.inf  # achievable L2 -> SM read bandwidth; inf: L2 traffic not timed
    gemm_tile: tuple[int, int] = (1, 1)  # output tile of a cuBLAS GEMM; (1, 1): no tile quantization
    gemm_k_fill: int = 0  # per-tile pipeline fill and drain, in elements of K
    kernel_launch_s: float = 0.0
    host_sync_s: float = 0.0
    triton_tensor_flops: float = math.nan  # a Triton kernel's tl.dot tiles; nan: tensor_flops (set in __post_init__)
    row_pass_bytes_per_s: float = math.nan  # a peer's (TRL's) row kernel's loads; nan: hbm_bytes_per_s
    # what one program of this library's row kernels (kernels/rows.py: a program per row) loads per second; a
    # launch loads at min(HBM, programs x this); nan: hbm_bytes_per_s (one program saturates HBM)
    row_program_bytes_per_s: float = math.nan
    l2_reduction_bytes_per_s: float = math.nan  # float32 atomics / reductions in L2; nan: l2_bytes_per_s

    def __post_init__(self) -> None:
        if math.isnan(self.triton_tensor_flops):
            object.__setattr__(self, "triton_tensor_flops", self.tensor_flops)
        if math.isnan(self.row_pass_bytes_per_s):
            object.__setattr__(self, "row_pass_bytes_per_s", self.hbm_bytes_per_s)
        if math.isnan(self.row_program_bytes_per_s):
            object.__setattr__(self, "row_program_bytes_per_s", self.hbm_bytes_per_s)
        if math.isnan(self.l2_reduction_bytes_per_s):
            object.__setattr__(self, "l2_reduction_bytes_per_s", self.l2_bytes_per_s)


# Fitted to the project's two GPU runs (benchmarks/results/h200.json and h200-second-run/, NVIDIA H200, torch 2.11,
# triton 3.6) by `python -m benchmarks.model.calibrate`: cuBLAS's large-GEMM rate from the bare-GEMM floor cases, a
# Triton kernel's tl.dot rate from Cut Cross-Entropy's log-probs, the rate of float32 atomics in L2 from Cut
# Cross-Entropy's loss cases (first run); the row kernels' load rates from the second run's kernel profile
# (h200-second-run/profile-s1.md, below); the L2 read rate from the second run's Triton forward (below).
MEASURED_TENSOR_FLOPS = 711e12
MEASURED_TRITON_TENSOR_FLOPS = 514e12
# This library's row kernels (kernels/rows.py, a program per row, 4 warps) load at a rate proportional to the
# programs in a launch until HBM saturates: the second run's profile at S1 (V 151936, float32 rows) measured the
# statistics kernel at 1.75 TB/s with 512 programs a launch (16 launches, 8192 rows, 2.85 ms) and at 2.76 TB/s
# with ~1000 (6 launches, 6004 rows, 1.32 ms), the gradient kernel's loads at 2.72 TB/s with ~1000 (1.34 ms): per
# program 3.41, 2.76 and 2.72 GB/s, fitted 2.95 (latency-bound loads: Little's law, not a bandwidth ceiling).
MEASURED_ROW_PROGRAM_BYTES_PER_S = 2.95e9
# TRL's Triton row kernels (the forward fold and the dZ kernel, over [4096, 32768] 16-bit tiles): their loads in the
# same profile: 2.37 TB/s (log-probs fold, 8192 rows), 1.58 (loss fold, 6004 rows), 1.72 (dZ kernel); fitted 1.86.
MEASURED_ROW_PASS_BYTES_PER_S = 1.86e12
# L2 -> SM reads: the least rate consistent with the second H200 run's Triton forward
# (benchmarks/results/h200-second-run/triton-check.log: S1's no-grad log-probs, 159 GB of 128 x 128 tile loads in
# 20.48 ms, compute-bound at the Triton tile rate): a lower bound. The first run's 4.5 TB/s was fitted to kernels
# since replaced, which re-read W through 32-token tiles.
MEASURED_L2_BYTES_PER_S = 7.8e12
# float32 atomics / reductions resolved in L2, at 8 bytes an element added: fitted to Cut Cross-Entropy's loss cases
# (its backward adds dE and dC by atomics; the operands' tile reads charged at the read rate above).
MEASURED_L2_REDUCTION_BYTES_PER_S = 8.2e12
_GEMM_SOURCE = ("bf16 711 TFLOP/s for cuBLAS, 514 for Triton tl.dot tiles, "
                "8.2 TB/s of float32 atomics in L2 (8 bytes an element): fitted to this project's first H200 run "
                "(benchmarks/results/h200.json; datasheet 989 dense; the same rates are charged on H100, the same "
                "die); L2 reads at least 7.8 TB/s: the second H200 run's Triton forward (159 GB of tile loads in "
                "20.48 ms, compute-bound); row kernels' loads: 2.95 GB/s per program of this library's (up to HBM), "
                "1.86 TB/s for TRL's: the second H200 run's kernel profile (h200-second-run/profile-s1.md); a GEMM "
                "at other shapes: 128 x 256 tiles in waves of one per SM, 128 elements of K per tile's fill and "
                "drain, split-K when the tiles do not fill a wave (assumed); 4 us per kernel launch, 20 us per host "
                "sync (assumed)")
# What the two share (the GH100 die, the GEMM rule, the launch costs); they differ in HBM.
_GH100 = dict(tensor_flops=MEASURED_TENSOR_FLOPS, triton_tensor_flops=MEASURED_TRITON_TENSOR_FLOPS,
              row_pass_bytes_per_s=MEASURED_ROW_PASS_BYTES_PER_S,
              row_program_bytes_per_s=MEASURED_ROW_PROGRAM_BYTES_PER_S, l2_bytes_per_s=MEASURED_L2_BYTES_PER_S,
              l2_reduction_bytes_per_s=MEASURED_L2_REDUCTION_BYTES_PER_S,
              fp32_flops=67e12, l2_bytes=50 * MIB, sms=132,
              gemm_tile=HOPPER_GEMM_TILE, gemm_k_fill=GEMM_K_FILL, kernel_launch_s=KERNEL_LAUNCH_S,
              host_sync_s=HOST_SYNC_S)
DEVICES: dict[str, DeviceRates] = {
    "H100": DeviceRates(
        "H100 SXM5 80GB", hbm_bytes_per_s=3.0e12, hbm_peak_bytes_per_s=3.35e12, **_GH100,
        source=_GEMM_SOURCE + "; fp32 67 TFLOP/s, HBM3 3.35 TB/s peak, 50 MB L2, 132 SMs: NVIDIA H100 datasheet; "
                              "3.0 TB/s achievable: ~90% of peak, the usual STREAM-like ratio"),
    "H200": DeviceRates(
        "H200 SXM 141GB", hbm_bytes_per_s=4.3e12, hbm_peak_bytes_per_s=4.8e12, **_GH100,
        source=_GEMM_SOURCE + "; HBM3e 4.8 TB/s peak: NVIDIA H200 datasheet; 4.3 TB/s achievable: ~90% of peak, "
                              "as for H100; SMs, L2, fp32 rate as H100 (same die)"),
}


def device_key(device_name: str) -> Optional[str]:
    """'H100' / 'H200' for a CUDA device name such as 'NVIDIA H100 80GB HBM3', else None (not modelled)."""
    upper = device_name.upper()
    return next((key for key in DEVICES if key in upper), None)


def gemm_compute_seconds(m: int, n: int, k: int, flop_rate: float, rates: DeviceRates) -> float:
    """Time of the arithmetic of C[m, n] = A[m, k] B[k, n] at `flop_rate` (a large GEMM's rate): whole tiles in
    whole waves of one tile per SM, each tile's K loop plus its fill; K split over idle SMs when the tiles do
    not fill one wave. With gemm_tile (1, 1) and no fill it is 2mnk / rate."""
    if min(m, n, k) <= 0:
        return 0.0
    tile_m, tile_n = rates.gemm_tile
    tiles = math.ceil(m / tile_m) * math.ceil(n / tile_n)
    split = max(1, min(rates.sms // tiles, math.ceil(k / max(1, 4 * rates.gemm_k_fill)))) if rates.gemm_k_fill else 1
    blocks = tiles * split
    waves = math.ceil(blocks / rates.sms)
    per_block = 2 * tile_m * tile_n * (math.ceil(k / split) + rates.gemm_k_fill)
    return waves * rates.sms * per_block / flop_rate
