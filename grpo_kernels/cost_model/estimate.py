"""The model's vocabulary: the problem, a phase of work, a path's estimate.

Predicted time = sum over phases of max(arithmetic time, HBM bytes / HBM bandwidth, L2 reads / L2 read bandwidth
+ L2 reductions / L2 reduction rate, a row kernel's loads / the rate its programs in flight reach), plus each
phase's kernel launches and host synchronisations: each phase is compute- or memory-bound, phases run one after
another. A GEMM phase's arithmetic time is that of its shape
(device.gemm_compute_seconds).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .device import DeviceRates, gemm_compute_seconds

GIB = 2**30
ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass(frozen=True)
class Problem:
    """One call: `tokens` = B*T positions, of which `valid_fraction` have completion_mask != 0."""
    tokens: int
    hidden: int
    vocab: int
    dtype: str = "bfloat16"
    operation: str = "loss"  # "loss" (forward + backward) or "logprobs" (no-grad log-probs)
    level: str = "token"  # "token": objective closed-form per token; "sequence": needs a token reduction first
    frozen_head: bool = False  # weight.requires_grad False: no dW
    hidden_grad: bool = True
    valid_fraction: float = 1.0
    workspace_bytes: int = GIB  # the gemm path's float32 logits workspace
    # The longest sequence's rows, where a sequence-level loss is separable by sequence (the GEMM path may then run
    # it in one pass over waves of whole sequences, backends/gemm.py: stream_sequence_waves); 0: that route does not
    # apply.
    sequence_rows: int = 0

    def __post_init__(self) -> None:
        for name in ("tokens", "hidden", "vocab", "workspace_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.dtype not in ITEMSIZE:
            raise ValueError(f"dtype must be one of {sorted(ITEMSIZE)}, got {self.dtype!r}")
        if self.operation not in ("loss", "logprobs"):
            raise ValueError(f"operation must be 'loss' or 'logprobs', got {self.operation!r}")
        if self.level not in ("token", "sequence"):
            raise ValueError(f"level must be 'token' or 'sequence', got {self.level!r}")
        if not isinstance(self.sequence_rows, int) or self.sequence_rows < 0:
            raise ValueError(f"sequence_rows must be an int >= 0, got {self.sequence_rows!r}")
        if not 0.0 < self.valid_fraction <= 1.0:
            raise ValueError(f"valid_fraction must be in (0, 1], got {self.valid_fraction!r}")

    @property
    def valid_tokens(self) -> int:
        return max(1, round(self.tokens * self.valid_fraction))

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    @property
    def gemm_flops(self) -> int:
        """One [N, H] x [H, V] GEMM over every position."""
        return 2 * self.tokens * self.hidden * self.vocab

    @property
    def weight_grad(self) -> bool:
        return self.operation == "loss" and not self.frozen_head

    @property
    def hidden_needs_grad(self) -> bool:
        return self.operation == "loss" and self.hidden_grad


@dataclass(frozen=True)
class Phase:
    name: str
    flops: float = 0.0
    hbm_bytes: float = 0.0
    l2_bytes: float = 0.0  # L2 -> SM reads (operand tiles a kernel re-reads from L2)
    fp32_matmul: bool = False  # FLOPs run at the float32 CUDA-core rate, not on tensor cores
    triton_matmul: bool = False  # FLOPs run by a Triton kernel's tl.dot tiles (rates.triton_tensor_flops)
    # A row kernel's loads: a pass over [rows, V] logits rows whose programs each walk a row, so its loads are
    # latency-bound: `row_programs` programs per launch (this library's row kernels) load at
    # min(HBM, programs x rates.row_program_bytes_per_s); 0 programs: a peer's row kernel, at
    # rates.row_pass_bytes_per_s. Its bytes are in hbm_bytes too (stores and loads at the HBM rate).
    row_read_bytes: float = 0.0
    row_programs: int = 0
    count: int = 1  # identical repetitions (waves, chunks)
    gemm_shape: Optional[tuple[int, int, int]] = None  # (m, n, k) of a cuBLAS GEMM: its arithmetic at that shape
    launches: int = 0  # kernel launches per repetition
    host_syncs: int = 0  # host synchronisations per repetition
    # float32 atomic adds / reductions resolved in L2 (8 bytes an element added: the line read and written there)
    l2_reduction_bytes: float = 0.0

    def compute_seconds(self, rates: DeviceRates) -> float:
        """One repetition's arithmetic."""
        rate = rates.fp32_flops if self.fp32_matmul else rates.triton_tensor_flops if self.triton_matmul \
            else rates.tensor_flops
        if self.gemm_shape is not None:
            return gemm_compute_seconds(*self.gemm_shape, rate, rates)
        return self.flops / rate

    def l2_seconds(self, rates: DeviceRates) -> float:
        """Reads and reductions share the L2 slices: their times add."""
        return self.l2_bytes / rates.l2_bytes_per_s + self.l2_reduction_bytes / rates.l2_reduction_bytes_per_s

    def row_seconds(self, rates: DeviceRates) -> float:
        """One repetition's row-kernel loads at the rate their programs in flight reach."""
        if not self.row_read_bytes:
            return 0.0
        rate = min(rates.hbm_bytes_per_s, self.row_programs * rates.row_program_bytes_per_s) if self.row_programs \
            else rates.row_pass_bytes_per_s
        return self.row_read_bytes / rate

    def seconds(self, rates: DeviceRates) -> float:
        bound = max(self.compute_seconds(rates), self.hbm_bytes / rates.hbm_bytes_per_s, self.l2_seconds(rates),
                    self.row_seconds(rates))
        return self.count * (bound + self.launches * rates.kernel_launch_s + self.host_syncs * rates.host_sync_s)


@dataclass
class Estimate:
    path: str
    problem: Problem
    phases: list[Phase]
    gemms: int  # passes of 2*N*H*V FLOPs over the rows the path processes (valid rows when padding is dropped)
    peak_extra_bytes: int  # beyond the inputs, the gradients themselves and one float32 dW copy
    fp32_weight_grad_bytes: int  # the float32 dW copy (accumulator), reported separately
    assumptions: list[str] = field(default_factory=list)

    @property
    def flops(self) -> float:
        return sum(p.flops * p.count for p in self.phases)

    @property
    def hbm_bytes(self) -> float:
        return sum(p.hbm_bytes * p.count for p in self.phases)

    @property
    def l2_bytes(self) -> float:
        """Reads and reductions."""
        return sum((p.l2_bytes + p.l2_reduction_bytes) * p.count for p in self.phases)

    @property
    def launches(self) -> int:
        return sum(p.launches * p.count for p in self.phases)

    def seconds(self, rates: DeviceRates) -> float:
        """Phases one after another, each compute- or memory-bound, with its launches: the prediction."""
        return sum(p.seconds(rates) for p in self.phases)

    def overlapped_seconds(self, rates: DeviceRates) -> float:
        """Lower bound if memory-bound phases overlapped compute-bound ones (e.g. row kernels of one wave on a
        second stream beside the next wave's GEMM): max(all arithmetic, all HBM bytes, all L2 bytes)."""
        compute = sum(p.count * p.compute_seconds(rates) for p in self.phases)
        return max(compute, self.hbm_bytes / rates.hbm_bytes_per_s,
                   sum(p.count * p.row_seconds(rates) for p in self.phases),
                   sum(p.count * p.l2_seconds(rates) for p in self.phases))
