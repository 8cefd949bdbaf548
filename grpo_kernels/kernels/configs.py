"""Block / warp / stage tables of the Triton kernels, per GPU architecture.

Every GPU entry here is compiled for sm_90a and sm_80 by `python -m benchmarks.model.kernel_report`, and
tests/grpo_kernels/kernels/test_kernel_report.py fails if any of them spills registers or if a Hopper build of a
tensor-core kernel has no wgmma. Hopper's wgmma needs the dot's M (the first block of the A operand) to be
a multiple of 64 and whole warpgroups (num_warps a multiple of 4).

Every entry must compile without spills under each triton the project supports (3.6, the oldest tested, and
the newest): their register allocators differ, and the tight entries below leave little headroom.

Why these shapes (bf16 / fp16; zero spill bytes on both archs in the report):
- forward: vocabulary-major [512 vocab, 32 tokens] logits tiles over 64-wide slices of H, 8 warps. Each
  program re-reads its hidden block once per vocabulary tile, so the tile width sets the forward's
  traffic: 512 reads a quarter of what the old [64, 128] tile did (which also spilled 656 B at 4 warps).
  1024 x 16 needs 267 KB of shared memory on Hopper (over the 227 KB limit).
- grad_hidden / grad_weight contract transposed tall-skinny tiles (linear_backward.py): the float32
  accumulator round trip, the backward's dominant traffic, happens once per BLOCK_V vocabulary columns
  (dH) / BLOCK_N tokens (dW). Hopper: dH 32 tokens x 512 vocab, dW 512 tokens x 16 vocab, with
  BLOCK_K 64 (the contraction's wgmma M; 32 falls back to mma.sync). Ampere: 64 x 256 and 256 x 32.
  Before, both were 64 x 128: 4x (dH) and 8x (dW) more accumulator traffic on Hopper.
- grad_hidden_narrow: dH whose dz tile needs more registers: the entropy gradient (HAS_ENT_GRAD: e, the entropy
  and their dz term) or a soft-capped head (SOFTCAP: the tanh's slope). Hopper's 32 x 512 spills 8-16 B there
  under triton 3.6 (255 registers; none under 3.9), so those variants take 32 x 256 (182-237 registers under
  3.6 with the entropy gradient): one dH accumulator round trip per 256 vocabulary columns instead of 512. Measured under 3.6 at 32 x 512, the alternatives were worse: 3 stages spill 40 B,
  16 warps 104 B, 16 x 1024 tiles 80 B, BLOCK_K 32 still spills and loses wgmma in the contraction; 1 stage
  fits (254 registers) but leaves the H loop's loads unpipelined. Ampere keeps its dH entry.
- float32 inputs use exact (non-TF32) dots without tensor cores: smaller tiles, 16-wide K slices in the
  backward and in Ampere's forward (at 32, triton 3.6's ptxas holds the 8-warp GRPO forward at 128 registers
  and spills 8-16 B; 16 keeps the pipelined loads and the 8 warps).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class KernelConfig:
    block_n: int
    block_v: int
    block_k: int = 0  # 0 for the logits-input kernels, which have no H loop
    num_warps: int = 4
    num_stages: int = 2
    # forward only: vocabulary tiles per split of the 2-D grid (0: the whole vocabulary in one split)
    split_tiles: int = 0
    # constexprs the kernel takes for its block shape
    blocks: dict = field(init=False, compare=False, repr=False)

    def __post_init__(self):
        blocks = {"BLOCK_N": self.block_n, "BLOCK_V": self.block_v}
        if self.block_k:
            blocks["BLOCK_K"] = self.block_k
        object.__setattr__(self, "blocks", blocks)

    def launch_options(self, interpreted: bool) -> dict:
        """Keyword arguments of a kernel launch: the blocks, plus warps and stages on a GPU."""
        if interpreted:
            return dict(self.blocks)
        return dict(self.blocks, num_warps=self.num_warps, num_stages=self.num_stages)


# A table's entries: "forward" serves both linear forwards (log-probs and the GRPO epilogue) and the
# split-vocabulary partial-statistics kernel, "merge" the split merge, "logits" the logits-input kernels.
SIXTEEN_BIT, FLOAT32 = "16bit", "fp32"

_MERGE = KernelConfig(block_n=128, block_v=1, num_warps=4, num_stages=1)
_LOGITS = KernelConfig(block_n=4, block_v=1024, num_warps=4, num_stages=2)


def _table(forward: tuple, grad_hidden: tuple, grad_weight: tuple) -> dict[str, dict[str, KernelConfig]]:
    """One architecture's table from (16-bit, float32) entries of the linear kernels."""
    linear = {"forward": forward, "grad_hidden": grad_hidden, "grad_weight": grad_weight}
    table = {name: {SIXTEEN_BIT: pair[0], FLOAT32: pair[1]} for name, pair in linear.items()}
    return table | {"merge": {SIXTEEN_BIT: _MERGE, FLOAT32: _MERGE}, "logits": {SIXTEEN_BIT: _LOGITS, FLOAT32: _LOGITS}}


_BACKWARD_FLOAT32 = KernelConfig(64, 64, 16, num_warps=8, num_stages=2)
GPU_CONFIGS: dict[str, dict[str, dict[str, KernelConfig]]] = {
    "sm90": _table(forward=(KernelConfig(128, 128, 64, num_warps=8, num_stages=3, split_tiles=16),
                            KernelConfig(64, 64, 32, num_warps=4, num_stages=2, split_tiles=32)),
                   grad_hidden=(KernelConfig(64, 256, 64, num_warps=8, num_stages=3), _BACKWARD_FLOAT32),
                   grad_weight=(KernelConfig(128, 64, 64, num_warps=8, num_stages=3), _BACKWARD_FLOAT32)),
    "sm80": _table(forward=(KernelConfig(128, 128, 32, num_warps=8, num_stages=3, split_tiles=16),
                            KernelConfig(64, 64, 16, num_warps=8, num_stages=2, split_tiles=32)),
                   grad_hidden=(KernelConfig(64, 128, 32, num_warps=8, num_stages=3), _BACKWARD_FLOAT32),
                   grad_weight=(KernelConfig(128, 64, 32, num_warps=8, num_stages=3), _BACKWARD_FLOAT32)),
}
# Other CUDA GPUs (Volta, Turing, Blackwell...): the Ampere table, the most conservative.
GPU_CONFIGS["default"] = GPU_CONFIGS["sm80"]

# The interpreter runs blocks as numpy arrays: bigger blocks mean fewer Python-level programs, which is
# what its run time is made of. Warps and stages mean nothing there. Its forward splits every 2 tiles, so small
# test vocabularies already cross several splits.
_INTERPRETER_LINEAR = KernelConfig(32, 64, 32)
INTERPRETER_CONFIGS: dict[str, KernelConfig] = {
    "forward": KernelConfig(16, 32, 32, split_tiles=2),
    "grad_hidden": _INTERPRETER_LINEAR, "grad_weight": _INTERPRETER_LINEAR,
    "merge": KernelConfig(32, 1), "logits": KernelConfig(16, 64),
}


def arch_of(capability: tuple[int, int]) -> str:
    """The table for a CUDA compute capability: Hopper, Ampere / Ada, or the default."""
    major = capability[0]
    if major == 9:
        return "sm90"
    if major == 8:
        return "sm80"
    return "default"


def dtype_class(is_float32: bool) -> str:
    return FLOAT32 if is_float32 else SIXTEEN_BIT
