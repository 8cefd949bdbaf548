"""The roofline model's vocabulary: device rates, the problem, a phase of work, a path's estimate.

Predicted time = sum over phases of max(FLOPs / matmul rate, HBM bytes / achievable bandwidth): each phase
is either compute- or memory-bound, phases run one after another. L2 bytes are reported, not timed (no
measured L2 bandwidth is at hand), so paths that live in L2 (the streaming kernels, CCE's atomics) are
predicted optimistically.
"""

from __future__ import annotations

from dataclasses import dataclass, field

GIB = 2**30
MIB = 2**20
ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass(frozen=True)
class DeviceRates:
    name: str
    tensor_flops: float  # dense 16-bit tensor-core matmul, FLOP/s
    fp32_flops: float  # float32 matmul on the CUDA cores (torch's default: no TF32), FLOP/s
    hbm_bytes_per_s: float  # achievable HBM bandwidth
    hbm_peak_bytes_per_s: float
    l2_bytes: int
    sms: int
    source: str


# One table, with where each number comes from. H100 and H200 share the GH100 die (same SMs, clocks and L2);
# they differ in HBM.
DEVICES: dict[str, DeviceRates] = {
    "H100": DeviceRates(
        "H100 SXM5 80GB", tensor_flops=790e12, fp32_flops=67e12, hbm_bytes_per_s=3.0e12,
        hbm_peak_bytes_per_s=3.35e12, l2_bytes=50 * MIB, sms=132,
        source="bf16 790 TFLOP/s: measured bare GEMM rate on this project's H200 sheet (same GH100 die; datasheet "
               "989 dense); fp32 67 TFLOP/s, HBM3 3.35 TB/s peak, 50 MB L2, 132 SMs: NVIDIA H100 datasheet; "
               "3.0 TB/s achievable: ~90% of peak, the usual STREAM-like ratio"),
    "H200": DeviceRates(
        "H200 SXM 141GB", tensor_flops=790e12, fp32_flops=67e12, hbm_bytes_per_s=4.3e12,
        hbm_peak_bytes_per_s=4.8e12, l2_bytes=50 * MIB, sms=132,
        source="bf16 790 TFLOP/s: measured on this project's H200 sheet; HBM3e 4.8 TB/s peak: NVIDIA H200 "
               "datasheet; 4.3 TB/s achievable: ~90% of peak, as for H100; SMs, L2, fp32 rate as H100 (same die)"),
}


def device_key(device_name: str) -> str | None:
    """'H100' / 'H200' for a CUDA device name such as 'NVIDIA H100 80GB HBM3', else None (not modelled)."""
    upper = device_name.upper()
    return next((key for key in DEVICES if key in upper), None)


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
    l2_bytes: float = 0.0
    fp32_matmul: bool = False  # FLOPs run at the float32 CUDA-core rate, not on tensor cores
    count: int = 1  # identical repetitions (waves, chunks)

    def seconds(self, rates: DeviceRates) -> float:
        flop_rate = rates.fp32_flops if self.fp32_matmul else rates.tensor_flops
        return self.count * max(self.flops / flop_rate, self.hbm_bytes / rates.hbm_bytes_per_s)


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
        return sum(p.l2_bytes * p.count for p in self.phases)

    def seconds(self, rates: DeviceRates) -> float:
        """Phases one after another, each compute- or memory-bound: the prediction."""
        return sum(p.seconds(rates) for p in self.phases)

    def overlapped_seconds(self, rates: DeviceRates) -> float:
        """Lower bound if memory-bound phases overlapped compute-bound ones (e.g. row kernels of one wave on a
        second stream beside the next wave's GEMM): max(all FLOPs / rate, all bytes / bandwidth)."""
        compute = sum(p.count * p.flops / (rates.fp32_flops if p.fp32_matmul else rates.tensor_flops)
                      for p in self.phases)
        return max(compute, self.hbm_bytes / rates.hbm_bytes_per_s)
