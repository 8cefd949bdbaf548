"""Block / warp / stage tables of the Triton kernels, per GPU architecture.

Every GPU entry here is compiled for sm_90a and sm_80 by `python -m benchmarks.model.kernel_report`, and
tests/grpo_kernels/kernels/test_kernel_report.py fails if any of them spills registers or if a Hopper build of a
tensor-core kernel has no wgmma. Hopper's wgmma needs the dot's M (the first block of the A operand) to be
a multiple of 64 and whole warpgroups (num_warps a multiple of 4).

Every entry must compile without spills under each triton the project supports (3.6, the oldest tested, and
the newest): their register allocators differ, and the tight entries below leave little headroom.

Why these shapes (bf16 / fp16; zero spill bytes on both archs and both tritons in the reports):
- forward: token-major [128 tokens, 128 vocab] logits tiles over 64-wide slices of H, 8 warps, 3 stages (wgmma
  M = the token block). The tile's online softmax (a masked copy, exp, three row sums) needs as many registers as
  its accumulator: 128 x 256 spills 0.4-1.3 KB at 8 warps and at 16, 128 x 128 at 4 stages spills under 3.6. A
  split is 16 tiles (2048 vocabulary entries): enough programs for 132 SMs from N = 256 on, and a partial-statistics
  buffer of 16 x 75 x N bytes at V 151936.
- the backward's programs own 64 rows (wgmma M) and stream 128: dH owns tokens and streams vocabulary entries, dW
  the reverse; the float32 accumulator round trip (the backward's dominant traffic) happens once per 128 streamed
  rows. Streaming 256 spills: for dW, the streamed tokens' vectors (target, lse, entropy, g, e) are replicated
  across a warp in the wgmma layout (0.6-0.8 KB); for dH, the soft-capped variants under triton 3.9 (8-16 B).
- Ampere (mma.sync): forward 128 x 128 x 32, backward 64 x 128 x 32 and 64 x 64 (x 128 tokens) x 32.
- persistent (persistent_forward.py, the Hopper recipe: TMA loads, persistent programs): 128 x 128 x 64, 8 warps,
  4 stages (164 KiB of shared memory). The largest tile that compiles clean under both tritons: at 128 x 256 the
  online softmax epilogue needs the tile twice (the accumulator and p), 256 float32 registers a thread at 8 warps,
  and it spills 448-544 B (600 B at 16 warps, where the limit is 128 registers a thread; 256 x 128 spills 304 B).
  Ampere's 128 x 64 x 32 (3 stages); 128 x 128 x 32 spills 8 B under triton 3.6. Float32: 64 x 64 x 16, 8 warps,
  2 stages (4 warps spill under 3.6 on sm_80; a 32-wide K slice spills 512-552 B).
- float32 inputs use exact (non-TF32) dots without tensor cores: smaller tiles, 16-wide K slices in the
  backward (Hopper: 4 warps, 1 stage; ptxas holds these builds at 128-168 registers, and with 8 warps or 2 stages
  some variant spills 8-32 B under one triton or the other; Ampere: 8 warps, at 4 its dW spills) and in Ampere's
  forward.
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
    # persistent kernels only: programs launched per streaming multiprocessor (1: one resident program each; 2 lets
    # one program's epilogue run beside another's tensor-core loop where registers and shared memory hold two)
    programs_per_sm: int = 1
    # persistent_forward.py only: triton's Hopper warp specialisation of the vocabulary-tile loop (a warpgroup
    # issuing the TMA loads, two consumer warpgroups each computing half of the tile's rows and folding them in its
    # epilogue, registers rebalanced by setmaxnreg). Triton builds it so only at num_warps 4 (the consumer
    # warpgroup's size); at 8 the flag changes nothing. A candidate of the tile sweep, not a table entry until a
    # GPU times it.
    warp_specialize: bool = False
    # constexprs the kernel takes for its block shape
    blocks: dict = field(init=False, compare=False, repr=False)

    def __post_init__(self):
        blocks = {"BLOCK_N": self.block_n, "BLOCK_V": self.block_v}
        if self.block_k:
            blocks["BLOCK_K"] = self.block_k
        object.__setattr__(self, "blocks", blocks)

    def launch_options(self, interpreted: bool) -> dict:
        """Keyword arguments of a kernel launch: the blocks, plus warps and stages on a GPU."""
        flags = {"WARP_SPECIALIZE": True} if self.warp_specialize else {}
        if interpreted:
            return dict(self.blocks, **flags)
        return dict(self.blocks, **flags, num_warps=self.num_warps, num_stages=self.num_stages)


# A table's entries: "forward" the partial-statistics kernel of both linear forwards (log-probs and the GRPO
# epilogue), "merge" the split merge, "grad_hidden" / "grad_weight" the backward's two orientations, "grad_tiles"
# the opt-in one-kernel backward (tile_backward.py), "logits" the logits-input kernels, "persistent" the
# persistent TMA forward (persistent_forward.py), "chunk_grad" its token-chunk backward's dz pass (chunk_grad.py),
# "persistent_dz" the two-pass backward's dz tiles (persistent_grad.py).
SIXTEEN_BIT, FLOAT32 = "16bit", "fp32"

_MERGE = KernelConfig(block_n=128, block_v=1, num_warps=4, num_stages=1)
_LOGITS = KernelConfig(block_n=4, block_v=1024, num_warps=4, num_stages=2)


def _table(forward: tuple, grad_hidden: tuple, grad_weight: tuple, grad_tiles: tuple, persistent: tuple,
           persistent_dz: tuple | None = None) -> dict[str, dict[str, KernelConfig]]:
    """One architecture's table from (16-bit, float32) entries of the linear kernels; persistent_dz defaults to the
    persistent forward's tiles and pipeline."""
    linear = {"forward": forward, "grad_hidden": grad_hidden, "grad_weight": grad_weight, "grad_tiles": grad_tiles,
              "persistent": persistent, "persistent_dz": persistent_dz or persistent}
    table = {name: {SIXTEEN_BIT: pair[0], FLOAT32: pair[1]} for name, pair in linear.items()}
    return table | {"logits": {SIXTEEN_BIT: _LOGITS, FLOAT32: _LOGITS}, "merge": {SIXTEEN_BIT: _MERGE, FLOAT32: _MERGE},
                    "chunk_grad": {SIXTEEN_BIT: _chunk_grad(persistent[0]), FLOAT32: _chunk_grad(persistent[1])}}


def _chunk_grad(persistent: KernelConfig) -> KernelConfig:
    """chunk_grad.py's tiles: the persistent forward's vocabulary tile (one stored maximum a row), 32 rows (4096
    elements, 16 a thread at 4 warps: a memory-bound pass, every tile its own program)."""
    return KernelConfig(block_n=32, block_v=persistent.block_v, num_warps=4, num_stages=1)


_BACKWARD_FLOAT32 = {"sm90": KernelConfig(64, 64, 16, num_warps=4, num_stages=1),
                     "sm80": KernelConfig(64, 64, 16, num_warps=8, num_stages=2)}
# token blocks per group of persistent_forward.py's item order (L2 reuse only; no effect on any value): 8 x 128 tokens
# share each weight tile fetched from HBM
PERSISTENT_GROUP_N = 8
# Token chunks of the persistent route (backends/triton_tma.py: chunk_rows) of fewer than two token blocks are
# multiples of this many rows (of the block, when smaller), not whole blocks: the chunk's last block partly filled
# (its rows past the chunk masked), so a small workspace is sized finer than a block (at S2, a 112 MiB workspace
# runs 224-token chunks, not 128: dH GEMMs that small leave most of the GPU idle). Larger chunks keep whole blocks:
# a partial block in every chunk would cost more than the memory it saves.
CHUNK_ROW_ALIGN = 32


def stored_rows_within(float32_rows: int, itemsize: int, block_v: int) -> int:
    """Rows of the persistent route's chunk (persistent_forward.py's STORE_CHUNK: an exponential of `itemsize` bytes
    a logit and a float32 maximum per `block_v` columns) in the bytes of `float32_rows` float32 logits rows, up to
    a few bytes a row (the last tile's maximum and the row's 16-byte padding). A function of float32_rows alone for
    a dtype: a vocabulary shard's ranks, given float32_rows alike (vocab_parallel.VocabShard.wave_workspace), get
    the same chunks whatever their vocabulary."""
    return max(1, float32_rows * 4 * block_v // (itemsize * block_v + 4))


def chunk_rows_within(wave_rows: int, block_n: int, align: int = CHUNK_ROW_ALIGN) -> int:
    """Tokens a chunk of the persistent route holds, of the `wave_rows` rows its workspace holds:
    whole token blocks from two on, else a multiple of `align` rows (of the block, when smaller), at least a block.
    backends/triton_tma.py and its cost model (cost_model/triton_tma.py) both size chunks by it."""
    step = block_n if wave_rows >= 2 * block_n else max(1, min(block_n, align))
    return max(block_n, wave_rows // step * step)


# persistent_forward.py (16-bit, float32); every entry splits the vocabulary every 2048 entries, as "forward" does
_PERSISTENT = {"sm90": (KernelConfig(128, 128, 64, num_warps=8, num_stages=4, split_tiles=16),
                        KernelConfig(64, 64, 16, num_warps=8, num_stages=2, split_tiles=32)),
               # float32 on Ampere: one stage (at two, the logits-storing variants spill 8-16 B under triton 3.6)
               "sm80": (KernelConfig(128, 64, 32, num_warps=8, num_stages=3, split_tiles=32),
                        KernelConfig(64, 64, 16, num_warps=8, num_stages=1, split_tiles=32))}
GPU_CONFIGS: dict[str, dict[str, dict[str, KernelConfig]]] = {
    "sm90": _table(forward=(KernelConfig(128, 128, 64, num_warps=8, num_stages=3, split_tiles=16),
                            KernelConfig(64, 64, 32, num_warps=4, num_stages=2, split_tiles=32)),
                   grad_hidden=(KernelConfig(64, 128, 64, num_warps=8, num_stages=3), _BACKWARD_FLOAT32["sm90"]),
                   grad_weight=(KernelConfig(128, 64, 64, num_warps=8, num_stages=3), _BACKWARD_FLOAT32["sm90"]),
                   grad_tiles=(KernelConfig(128, 128, 64, num_warps=8, num_stages=3),
                               KernelConfig(64, 64, 16, num_warps=8, num_stages=1)),
                   persistent=_PERSISTENT["sm90"]),
    "sm80": _table(forward=(KernelConfig(128, 128, 32, num_warps=8, num_stages=3, split_tiles=16),
                            KernelConfig(64, 64, 16, num_warps=8, num_stages=2, split_tiles=32)),
                   grad_hidden=(KernelConfig(64, 128, 32, num_warps=8, num_stages=3), _BACKWARD_FLOAT32["sm80"]),
                   grad_weight=(KernelConfig(128, 64, 32, num_warps=8, num_stages=3), _BACKWARD_FLOAT32["sm80"]),
                   grad_tiles=(KernelConfig(128, 128, 32, num_warps=8, num_stages=3), _BACKWARD_FLOAT32["sm80"]),
                   persistent=_PERSISTENT["sm80"],
                   # 16-bit: the forward's 128 x 64 x 32 at 8 warps spills 8-16 B in some variant at 1-4 stages
                   # under triton 3.6 or 3.9 (the kernel reports); 64 x 64 at 4 warps builds clean under both
                   persistent_dz=(KernelConfig(64, 64, 32, num_warps=4, num_stages=3), _PERSISTENT["sm80"][1])),
}
# Other CUDA GPUs (Volta, Turing, Blackwell...): the Ampere table, the most conservative.
GPU_CONFIGS["default"] = GPU_CONFIGS["sm80"]

# The interpreter runs blocks as numpy arrays: bigger blocks mean fewer Python-level programs, which is
# what its run time is made of. Warps and stages mean nothing there. Its forward splits every 2 tiles, so small
# test vocabularies already cross several splits.
_INTERPRETER_LINEAR = KernelConfig(32, 64, 32)
_INTERPRETER_PERSISTENT = KernelConfig(16, 32, 32, split_tiles=2)
INTERPRETER_CONFIGS: dict[str, KernelConfig] = {
    "forward": KernelConfig(16, 32, 32, split_tiles=2),
    "grad_hidden": _INTERPRETER_LINEAR, "grad_weight": _INTERPRETER_LINEAR, "grad_tiles": _INTERPRETER_LINEAR,
    "merge": KernelConfig(32, 1), "logits": KernelConfig(16, 64),
    # the dz kernel's tile is the forward's vocabulary tile, one running maximum a row (launch.chunk_grad_ asserts it)
    "persistent": _INTERPRETER_PERSISTENT, "chunk_grad": KernelConfig(16, _INTERPRETER_PERSISTENT.block_v),
    "persistent_dz": _INTERPRETER_PERSISTENT,
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
