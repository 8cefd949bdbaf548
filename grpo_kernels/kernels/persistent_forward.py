"""The Hopper recipe of the forward: one persistent program per SM looping over work items in a grouped order, its
operands loaded through tensor descriptors (TMA on sm_90a), the online log-sum-exp in each tile GEMM's epilogue.

A work item is (token block, vocabulary split), as in linear_forward.py: the program sweeps the split's vocabulary
tiles in ascending order; per tile the K loop loads [BLOCK_N, BLOCK_K] hidden and [BLOCK_V, BLOCK_K] weight blocks
through descriptors (`tl.make_tensor_descriptor`: TMA loads into shared memory, zero-filled past the tensor's end,
so neither a pointer tile nor a mask is held in registers) and accumulates a float32 [BLOCK_N, BLOCK_V] logits tile
on tensor cores (wgmma on Hopper); the epilogue adds the bias, applies the logit transform and folds the tile into
each row's running max, sum exp, sum exp * z and target logit. The item's four statistics go to the same
[4, splits, N] buffer as linear_forward.py's, merged by its merge kernels (the GRPO epilogue among them).
With STORE_CHUNK the epilogue also writes the tile's p = exp(z - m) to a chunk in the input dtype, through a
descriptor store, and m, each row's running maximum after the tile (so p <= 1), to tile_max[row, tile], float32:
the token-chunk backward (chunk_grad.py) rebuilds the probabilities as p exp(m - lse) and turns the chunk into dz in
place. The fold computes that p anyway (online_softmax_step): storing it costs no exponential. Why exponentials and
not the logits: a logit rounded to bf16 is off by up to |z| 2^-9, so p = exp(z - lse) by that much relative (7% of
the largest dH element off float64 at |z| ~ 15, measured in the interpreter tests), where a rounded p is off by 2^-9
relative whatever |z| (fp16: 2^-11, and 2^-25 absolute below its normal range), the size of dz's own rounding to
the input dtype; and a chunk of half the bytes of a float32 one.

Persistent order and L2: the grid is `programs` (the SM count on a GPU); program p runs items p, p + programs, ...
Items are numbered as linear_forward.py's grid (GROUP token blocks x all splits before the next group), so the
programs resident at one time work on consecutive items and share GROUP hidden blocks and each weight tile about
once per group, as a grouped GEMM does.

Determinism and batch invariance, as linear_forward.py: a row's tiles, their K order, its split boundaries
(`plan`: V and the table entry only) and the merge order are fixed whatever N, the row's position or the number of
programs; which program runs an item changes no arithmetic, and no reduction crosses rows. TMA's zero fill of rows
past N only touches rows that are never stored.

Cost (bf16 on Hopper, configs.py's "persistent" sm90 entry: 128 x 128 x 64 tiles, split_tiles 16, 8 warps, 4
stages): tensor-core work 2 N V H (one GEMM-equivalent); HBM: the weight once per group of GROUP token blocks, the
hidden states once, 16 bytes x splits x N of statistics; with STORE_CHUNK, N V x the input's bytes and 4 N V / BLOCK_V
more written.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import interpreter_compat  # noqa: F401  (runtime-bounded loops under triton 3.6's interpreter)
from .configs import PERSISTENT_GROUP_N, KernelConfig
from .linear_forward import ForwardPlan, fold_split_tile, partial_buffer, store_partial, work_item
from .tiles import head_transform_args, online_softmax_init, transform_logits

GROUP_N = PERSISTENT_GROUP_N


@triton.jit
def operand_descriptors(hidden_ptr, weight_ptr, N, V, H, stride_hidden, stride_weight, BLOCK_N: tl.constexpr,
                        BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr):
    """Tensor descriptors of the hidden states [N, H] and the head [V, H], in [BLOCK_N | BLOCK_V, BLOCK_K] blocks."""
    hidden_desc = tl.make_tensor_descriptor(hidden_ptr, shape=[N, H], strides=[stride_hidden, 1],
                                            block_shape=[BLOCK_N, BLOCK_K])
    weight_desc = tl.make_tensor_descriptor(weight_ptr, shape=[V, H], strides=[stride_weight, 1],
                                            block_shape=[BLOCK_V, BLOCK_K])
    return hidden_desc, weight_desc


@triton.jit
def descriptor_tile_dot(hidden_desc, weight_desc, n0, v0, H, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr):
    """The float32 logits tile of hidden rows [n0, n0 + BLOCK_N) and head rows [v0, v0 + BLOCK_V): K in ascending
    BLOCK_K slices loaded through the descriptors (TMA on sm_90a; zero past the tensors' ends), on tensor cores."""
    acc = tl.zeros((BLOCK_N, BLOCK_V), dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        a = hidden_desc.load([n0, k0])
        b = weight_desc.load([v0, k0])
        if UPCAST:  # the CPU interpreter mis-computes 16-bit dots; it upcasts first
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b.T, acc, input_precision=PRECISION)
    return acc


@triton.jit(do_not_specialize=["N", "splits", "programs"])
def _persistent_stats_kernel(
    hidden_ptr, weight_ptr, bias_ptr, targets_ptr, partial_ptr, chunk_ptr, tile_max_ptr,
    N, V, H, stride_hidden, stride_weight, stride_chunk, stride_tile_max, inv_tau, cap_scale, split_width, splits,
    programs,
    HAS_BIAS: tl.constexpr, SOFTCAP: tl.constexpr, STORE_CHUNK: tl.constexpr, UPCAST: tl.constexpr,
    PRECISION: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP: tl.constexpr, WARP_SPECIALIZE: tl.constexpr = False,
):
    hidden_desc, weight_desc = operand_descriptors(hidden_ptr, weight_ptr, N, V, H, stride_hidden, stride_weight,
                                                   BLOCK_N, BLOCK_V, BLOCK_K)
    if STORE_CHUNK:
        chunk_desc = tl.make_tensor_descriptor(chunk_ptr, shape=[N, V], strides=[stride_chunk, 1],
                                               block_shape=[BLOCK_N, BLOCK_V])
    for item in range(tl.program_id(0), tl.cdiv(N, BLOCK_N) * splits, programs):
        block, split, rows, row_ok, targets, v_start, v_end = work_item(item, targets_ptr, N, V, splits,
                                                                        split_width, BLOCK_N, GROUP)
        n0 = block * BLOCK_N
        run_max, sum_exp, sum_exp_z, target_z = online_softmax_init(BLOCK_N)
        for v0 in tl.range(v_start, v_end, BLOCK_V, warp_specialize=WARP_SPECIALIZE):
            acc = descriptor_tile_dot(hidden_desc, weight_desc, n0, v0, H, UPCAST, PRECISION, BLOCK_N, BLOCK_V,
                                      BLOCK_K)
            cols = v0 + tl.arange(0, BLOCK_V)
            # columns past v_end are the next split's only past V (split_width is a whole number of tiles)
            col_ok = cols < v_end
            if HAS_BIAS:
                acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
            z = transform_logits(acc, inv_tau, cap_scale, SOFTCAP)
            run_max, sum_exp, sum_exp_z, target_z, p = fold_split_tile(run_max, sum_exp, sum_exp_z, target_z, z,
                                                                       targets, v0, v_end, col_ok, BLOCK_V)
            if STORE_CHUNK:  # p against run_max, which now includes this tile: clipped at N and V by the descriptor
                chunk_desc.store([n0, v0], p.to(chunk_ptr.dtype.element_ty))
                tl.store(tile_max_ptr + rows.to(tl.int64) * stride_tile_max + v0 // BLOCK_V, run_max, mask=row_ok)
        store_partial(partial_ptr, split, N, splits, rows, row_ok, run_max, sum_exp, sum_exp_z, target_z)


def set_descriptor_allocator() -> None:
    """In-kernel descriptors take a scratch buffer (128 bytes a program) from triton's allocator."""
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8,
                                                                     device="cuda" if torch.cuda.is_available()
                                                                     else "cpu"))


def descriptor_ready(x: torch.Tensor) -> torch.Tensor:
    """x itself when a tensor descriptor can address it (unit inner stride, base and row stride 16-byte aligned),
    else a fresh contiguous copy (aligned; callers pad the inner size to 16 bytes, launch.padded_to_block_k)."""
    size = x.element_size()
    if x.stride(-1) == 1 and x.data_ptr() % 16 == 0 and (x.stride(0) * size) % 16 == 0:
        return x
    return x.clone(memory_format=torch.contiguous_format)


def programs_for(device: torch.device, items: int, per_sm: int = 1) -> int:
    """The persistent grid: `per_sm` programs per SM on a GPU (never more than the items); under the interpreter a
    few, so that the item loop runs more than once per program in the tests."""
    if device.type == "cuda":
        return max(1, min(items, per_sm * torch.cuda.get_device_properties(device).multi_processor_count))
    return max(1, min(items, 3))


def persistent_partial_stats(hidden: torch.Tensor, head, targets: torch.Tensor, config: KernelConfig, upcast: bool,
                             precision: str, chunk: torch.Tensor | None = None,
                             tile_max: torch.Tensor | None = None) -> tuple[torch.Tensor, ForwardPlan]:
    """The [4, splits, N] partial statistics of linear_forward.py's layout (its merge kernels finish them); with
    `chunk` ([N, V] in the input dtype, unit column stride, rows 16-byte aligned) and `tile_max` ([N, cdiv(V,
    config.block_v)] float32, unit column stride) also each tile's exp(z - m) and m (the module docstring). H must be
    a multiple of config.block_k (launch.padded_to_block_k)."""
    partial, shape = partial_buffer(hidden, head, config)
    (N, H), V, bias = hidden.shape, head.weight.shape[0], head.bias
    inv_tau, cap_scale, capped = head_transform_args(head)
    hidden, weight = descriptor_ready(hidden), descriptor_ready(head.weight)
    programs = programs_for(hidden.device, shape.programs, config.programs_per_sm)
    store = chunk is not None
    if store:
        assert chunk.shape == (N, V) and tile_max.shape == (N, triton.cdiv(V, config.block_v))
        assert chunk.dtype == hidden.dtype and tile_max.dtype == torch.float32 and tile_max.stride(1) == 1
    set_descriptor_allocator()
    _persistent_stats_kernel[(programs,)](
        hidden, weight, bias if bias is not None else hidden, targets, partial,
        chunk if store else hidden, tile_max if store else partial,
        N, V, H, hidden.stride(0), weight.stride(0), chunk.stride(0) if store else 0,
        tile_max.stride(0) if store else 0, inv_tau, cap_scale, shape.split_width, shape.splits, programs,
        HAS_BIAS=bias is not None, SOFTCAP=capped, STORE_CHUNK=store, UPCAST=upcast,
        PRECISION=precision, GROUP=GROUP_N, **config.launch_options(upcast),
    )
    return partial, shape
