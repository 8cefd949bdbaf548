"""The problem sizes: LM heads (H, V), token counts N = B * T, and the named sets a run picks from."""

from __future__ import annotations

from dataclasses import dataclass

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class LMHead:
    name: str
    hidden: int
    vocab: int


@dataclass(frozen=True)
class BenchShape:
    head: LMHead
    batch: int  # completions B
    seq_len: int  # positions T per completion
    dtype: str  # a key of DTYPES

    @property
    def tokens(self) -> int:
        return self.batch * self.seq_len

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def id(self) -> str:
        return f"{self.head.name}-N{self.tokens}"


# Real LM heads for the GPU set (hidden size, vocabulary) from the models' configs.
QWEN25_05B = LMHead("qwen2.5-0.5b", 896, 151936)
QWEN25_7B = LMHead("qwen2.5-7b", 3584, 152064)
LLAMA3_8B = LMHead("llama3-8b", 4096, 128256)
# CPU heads: small enough that the whole CPU set (about 160 cases, each timed and measured in a fresh
# process) finishes in minutes on two shared cores; V = 8192 is one chunk of the torch backend.
CPU_HEAD = LMHead("cpu-lm", 128, 8192)
SMOKE_HEAD = LMHead("tiny", 32, 512)

GPU_SEQ_LEN = 1024  # completions of 1024 tokens: N = 4096, 16384, 65536 is 4, 16, 64 completions

SHAPE_SETS: dict[str, tuple[BenchShape, ...]] = {
    "smoke": (BenchShape(SMOKE_HEAD, 2, 32, "float32"),),
    "cpu": (
        BenchShape(SMOKE_HEAD, 2, 32, "float32"),  # the only CPU size the Triton interpreter runs in seconds
        BenchShape(CPU_HEAD, 2, 128, "float32"),
        BenchShape(CPU_HEAD, 4, 256, "float32"),
    ),
    "gpu": tuple(
        BenchShape(head, tokens // GPU_SEQ_LEN, GPU_SEQ_LEN, "bfloat16")
        for head in (QWEN25_05B, QWEN25_7B, LLAMA3_8B)
        for tokens in (4096, 16384, 65536)
    ),
}

# The project's target shapes for GPU speed (bf16, dapo with beta = 0.04 and old/ref log-probs): the roofline's
# headline and the GPU command's main cases.
TARGET_SHAPES: dict[str, BenchShape] = {
    "S1": BenchShape(LMHead("S1", 4096, 151936), 8192 // GPU_SEQ_LEN, GPU_SEQ_LEN, "bfloat16"),
    "S2": BenchShape(LMHead("S2", 2048, 248320), 16384 // GPU_SEQ_LEN, GPU_SEQ_LEN, "bfloat16"),
    "S3": BenchShape(LMHead("S3", 1536, 151936), 65536 // GPU_SEQ_LEN, GPU_SEQ_LEN, "bfloat16"),
}
TARGET_SHAPE_MEANING = {"S1": "an 8B model's LM head", "S2": "a 248k-vocabulary LM head",
                        "S3": "a 1.5B model's LM head over many tokens"}

# The memory wall: the largest N that fits, per path, at one realistic head (doubling N from 4096).
MEMORY_WALL_HEAD = QWEN25_7B
MEMORY_WALL_TOKENS = tuple(4096 * 2**k for k in range(9))  # 4096 ... 1048576

# The Triton interpreter runs each program instance in numpy; beyond this many multiply-adds (N * H * V)
# a CPU case takes minutes, so the triton path is skipped on CPU above it (with this reason).
TRITON_INTERPRETER_MAX_MACS = 2**21


def shape_set(name: str) -> tuple[BenchShape, ...]:
    """The named set; 'auto' is the GPU set when CUDA is available, else the CPU set."""
    if name == "auto":
        name = "gpu" if torch.cuda.is_available() else "cpu"
    if name not in SHAPE_SETS:
        raise ValueError(f"--bench-set must be one of {sorted(SHAPE_SETS)} or 'auto', got {name!r}")
    return SHAPE_SETS[name]


def macs(shape: BenchShape) -> int:
    """Multiply-adds of one [N, H] x [H, V] GEMM."""
    return shape.tokens * shape.head.hidden * shape.head.vocab
