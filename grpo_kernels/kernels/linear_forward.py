"""Forward: hidden x LM head -> per token log-prob, entropy, lse (and the token-level objective), logits never
whole in memory. Two launches:

1. `_partial_stats_kernel`, a grid of (token block, vocabulary split) programs. Each program sweeps the
   vocabulary tiles of its split in ascending order; per tile one tensor-core GEMM over H makes a float32
   [BLOCK_N tokens, BLOCK_V vocab] logits tile (token-major: the dot's M is the token block, a multiple of 64
   on Hopper, so it lowers to wgmma), folded into each row's running max, sum exp, sum exp * z (for the
   entropy) and target logit. The four statistics of (row, split) go to a [4, splits, N] float32 buffer.
2. `_merge_logprobs_kernel` (or `_merge_grpo_kernel`, with the token-level objective's epilogue) folds the
   splits of each row in ascending order.

Batch invariance: the split width is `split_tiles` vocabulary tiles of the architecture's table entry (`plan`):
it depends on V and fixed constants only, never on N. A row's tiles, their K order, its splits and the merge
order are therefore the same whatever else is in the batch, and no reduction crosses rows, so its log-prob and
entropy are bitwise the same alone or in any batch, at any position (tests/grpo_kernels/kernels/
test_linear_forward.py). N only changes how many programs run and in which order (`GROUP_N` below), which
changes no arithmetic.

L2 reuse: the grid is one-dimensional and walks GROUP_N token blocks x all splits before the next group, so the
programs resident at once share GROUP_N hidden blocks and each weight tile is read from HBM about once per
group, as a grouped GEMM does.

Cost at a shape (the roofline model's inputs; bf16 on Hopper, the sm90 table of configs.py: BLOCK_N 128,
BLOCK_V 128, BLOCK_K 64, split_tiles 16, GROUP_N 16; docs/architecture.md has the table for every pass):
- programs: cdiv(N, 128) x cdiv(V, 2048); launches: 2 (statistics, merge)
- tensor-core work: 2 N V H flop (one GEMM-equivalent), on tiles 128 x 128 x 64
- L2 -> SM traffic: the tile GEMM's, 2 bytes x N V H (1/BLOCK_V + 1/BLOCK_N) (about 160 GB at S1)
- HBM: the weight once per group of 16 token blocks (V H 2 bytes x cdiv(N, 2048)), the hidden states once,
  the partial statistics 16 bytes x splits x N written and read once (10 MB at S1), the outputs 12-30 bytes/token
- extra memory: the partial statistics buffer (16 x splits x N bytes)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .configs import KernelConfig
from .tiles import head_transform_args, load_targets, logits_tile, online_softmax_init, online_softmax_merge, online_softmax_result, \
    online_softmax_step
from .token_objective import token_objective

# token blocks per program group of the grid (L2 reuse only; no effect on any value)
GROUP_N = 16


@dataclass(frozen=True)
class ForwardPlan:
    """What one forward launches for a shape: a pure function of (N, V) and the table entry."""

    token_blocks: int
    split_width: int  # vocabulary entries per split (a whole number of tiles): depends on V and the entry only
    splits: int

    @property
    def programs(self) -> int:
        return self.token_blocks * self.splits


def plan(N: int, V: int, config: KernelConfig) -> ForwardPlan:
    """The launch plan: cdiv(N, block_n) token blocks x cdiv(V, split width) splits. The split width is
    `split_tiles` vocabulary tiles (the whole vocabulary, one split, when it holds fewer), so no split is empty
    (its max would be -inf, and the merge would compute inf - inf) and the boundaries do not depend on N."""
    tiles = triton.cdiv(V, config.block_v)
    width = min(config.split_tiles, tiles) * config.block_v if config.split_tiles else tiles * config.block_v
    return ForwardPlan(triton.cdiv(N, config.block_n), width, triton.cdiv(V, width))


# N and splits stay runtime values even when 1 (triton would make a 1 a compile-time constant): 64-bit offsets
# are derived from them
@triton.jit(do_not_specialize=["N", "splits"])
def _partial_stats_kernel(
    hidden_ptr, weight_ptr, bias_ptr, targets_ptr, partial_ptr,
    N, V, H, stride_hidden, stride_weight, inv_tau, cap_scale, split_width, splits,
    HAS_BIAS: tl.constexpr, SOFTCAP: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr,
):
    """Program (token block, split): the four running statistics of the split's vocabulary range, written to
    partial[:, split, rows]."""
    block, split, rows, row_ok, targets, v_start, v_end = work_item(tl.program_id(0), targets_ptr, N, V, splits,
                                                                    split_width, BLOCK_N, GROUP)
    run_max, sum_exp, sum_exp_z, target_z = online_softmax_init(BLOCK_N)
    for v0 in range(v_start, v_end, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        col_ok = cols < v_end
        z = logits_tile(hidden_ptr, block * BLOCK_N, N, stride_hidden, weight_ptr, v0, V, stride_weight, bias_ptr, H,
                        inv_tau, cap_scale, HAS_BIAS, SOFTCAP, UPCAST, PRECISION, BLOCK_N, BLOCK_V, BLOCK_K, 1)
        run_max, sum_exp, sum_exp_z, target_z, _ = fold_split_tile(run_max, sum_exp, sum_exp_z, target_z, z,
                                                                   targets, v0, v_end, col_ok, BLOCK_V)
    store_partial(partial_ptr, split, N, splits, rows, row_ok, run_max, sum_exp, sum_exp_z, target_z)


@triton.jit
def work_item(item, targets_ptr, N, V, splits, split_width, BLOCK_N: tl.constexpr, GROUP: tl.constexpr):
    """Work item `item` (numbered GROUP token blocks x all splits, then the next group): its token block and split,
    rows, which of them exist, their targets (load_targets) and its vocabulary range [v_start, v_end)."""
    per_group = GROUP * splits
    first_block = (item // per_group) * GROUP
    group_size = tl.minimum(tl.cdiv(N, BLOCK_N) - first_block, GROUP)
    block = first_block + (item % per_group) % group_size
    split = (item % per_group) // group_size
    rows = block * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    v_start = split * split_width
    return (block, split, rows, row_ok, load_targets(targets_ptr, rows, row_ok, V), v_start,
            tl.minimum(v_start + split_width, V))


@triton.jit
def fold_split_tile(run_max, sum_exp, sum_exp_z, target_z, z, targets, v0, v_end, col_ok, BLOCK_V: tl.constexpr):
    """Fold a token-major tile of a split's columns [v0, v0 + BLOCK_V) into the rows' running statistics; also
    returns the tile's p = exp(z - the rows' new running max) (online_softmax_step)."""
    # the target's column in this tile, -1 when it lies outside [v0, v_end): columns past v_end are other
    # splits' (or past V)
    local = tl.where((targets >= v0) & (targets < v_end), targets - v0, -1)
    return online_softmax_step(run_max, sum_exp, sum_exp_z, target_z, z,
                               tl.arange(0, BLOCK_V)[None, :] == local[:, None], col_ok[None, :], 1)


@triton.jit
def store_partial(partial_ptr, split, N, splits, rows, row_ok, run_max, sum_exp, sum_exp_z, target_z):
    """The four statistics of (rows, split) into the [4, splits, N] buffer."""
    at = partial_ptr + split.to(tl.int64) * N + rows
    stat = splits.to(tl.int64) * N
    tl.store(at, run_max, mask=row_ok)
    tl.store(at + stat, sum_exp, mask=row_ok)
    tl.store(at + 2 * stat, sum_exp_z, mask=row_ok)
    tl.store(at + 3 * stat, target_z, mask=row_ok)


@triton.jit
def _merge_splits(partial_ptr, rows, row_ok, N, splits, BLOCK_N: tl.constexpr):
    """(log-prob, entropy, lse) per row from the [4, splits, N] partial statistics, split 0 first."""
    run_max, sum_exp, sum_exp_z, target_z = online_softmax_init(BLOCK_N)
    stat = splits.to(tl.int64) * N
    for s in range(0, splits):
        at = partial_ptr + s * N + rows.to(tl.int64)
        run_max, sum_exp, sum_exp_z, target_z = online_softmax_merge(
            run_max, sum_exp, sum_exp_z, target_z,
            tl.load(at, mask=row_ok, other=0.0), tl.load(at + stat, mask=row_ok, other=1.0),
            tl.load(at + 2 * stat, mask=row_ok, other=0.0), tl.load(at + 3 * stat, mask=row_ok, other=0.0))
    return online_softmax_result(run_max, sum_exp, sum_exp_z, target_z)


@triton.jit(do_not_specialize=["N", "splits"])
def _merge_logprobs_kernel(partial_ptr, logps_ptr, entropy_ptr, lse_ptr, N, splits, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    logps, entropy, lse = _merge_splits(partial_ptr, rows, row_ok, N, splits, BLOCK_N)
    tl.store(logps_ptr + rows, logps, mask=row_ok)
    tl.store(entropy_ptr + rows, entropy, mask=row_ok)
    tl.store(lse_ptr + rows, lse, mask=row_ok)


@triton.jit(do_not_specialize=["N", "splits"])
def _merge_grpo_kernel(
    partial_ptr, adv_ptr, token_weight_ptr, entropy_weight_ptr, old_ptr, ref_ptr, rho_ptr, mask_ptr,
    terms_ptr, logps_ptr, entropy_ptr, lse_ptr, grad_ptr, kl_ptr, clip_ptr,
    N, splits, eps_low, eps_high, delta, beta, sapo_pos, sapo_neg,
    LOSS_KIND: tl.constexpr, HAS_OLD: tl.constexpr, HAS_REF: tl.constexpr, HAS_RHO: tl.constexpr,
    HAS_DELTA: tl.constexpr, BIAS_CORRECTION: tl.constexpr, HAS_ENTROPY_BONUS: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The merge, then the token-level objective of the finished rows and every per-token output of the GRPO
    forward: the backward needs only the per-token g this writes (and the entropy weight)."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    logps, entropy, lse = _merge_splits(partial_ptr, rows, row_ok, N, splits, BLOCK_N)
    adv = tl.load(adv_ptr + rows, mask=row_ok, other=0.0)
    token_weight = tl.load(token_weight_ptr + rows, mask=row_ok, other=0.0)
    mask = tl.load(mask_ptr + rows, mask=row_ok, other=0.0)
    old = logps
    if HAS_OLD:
        old = tl.load(old_ptr + rows, mask=row_ok, other=0.0)
    ref = logps
    if HAS_REF:
        ref = tl.load(ref_ptr + rows, mask=row_ok, other=0.0)
    rho = adv
    if HAS_RHO:
        rho = tl.load(rho_ptr + rows, mask=row_ok, other=0.0)
    term, grad, kl, low, high = token_objective(
        logps, old, ref, adv, rho, mask, token_weight, eps_low, eps_high, delta, beta, sapo_pos, sapo_neg,
        LOSS_KIND, HAS_OLD, HAS_REF, HAS_RHO, HAS_DELTA, BIAS_CORRECTION)
    if HAS_ENTROPY_BONUS:
        term -= tl.load(entropy_weight_ptr + rows, mask=row_ok, other=0.0) * entropy
    tl.store(terms_ptr + rows, term, mask=row_ok)
    tl.store(grad_ptr + rows, grad, mask=row_ok)
    tl.store(logps_ptr + rows, logps, mask=row_ok)
    tl.store(entropy_ptr + rows, entropy, mask=row_ok)
    tl.store(lse_ptr + rows, lse, mask=row_ok)
    tl.store(kl_ptr + rows, kl, mask=row_ok)
    tl.store(clip_ptr + rows, low.to(tl.int8) + 2 * high.to(tl.int8), mask=row_ok)


def partial_buffer(hidden, head, config: KernelConfig) -> tuple[torch.Tensor, ForwardPlan]:
    """The [4, splits, N] float32 partial statistics (uninitialised: every element is written once) and the plan."""
    shape = plan(hidden.shape[0], head.weight.shape[0], config)
    return torch.empty(4, shape.splits, hidden.shape[0], dtype=torch.float32, device=hidden.device), shape


def _partial_stats(hidden, head, targets, config: KernelConfig, upcast: bool, precision: str
                   ) -> tuple[torch.Tensor, ForwardPlan]:
    bias = head.bias
    partial, shape = partial_buffer(hidden, head, config)
    inv_tau, cap_scale, capped = head_transform_args(head)
    _partial_stats_kernel[(shape.programs,)](
        hidden, head.weight, bias if bias is not None else hidden, targets, partial,
        hidden.shape[0], head.weight.shape[0], hidden.shape[1], hidden.stride(0), head.weight.stride(0), inv_tau,
        cap_scale, shape.split_width, shape.splits, HAS_BIAS=bias is not None, SOFTCAP=capped, UPCAST=upcast,
        PRECISION=precision, GROUP=GROUP_N, **config.launch_options(upcast),
    )
    return partial, shape


def _merge_options(merge: KernelConfig, interpreted: bool) -> dict:
    options = merge.launch_options(interpreted)
    del options["BLOCK_V"]  # the merge has no vocabulary loop
    return options


def linear_forward(hidden: torch.Tensor, head, targets: torch.Tensor, configs: tuple[KernelConfig, KernelConfig],
                   upcast: bool, precision: str, partial_stats=None):
    """head: a grpo_kernels.head.LMHead; configs: the (forward, merge) table entries; partial_stats: the kernel
    making the [4, splits, N] statistics, `_partial_stats`'s signature (persistent_forward.py's on Hopper)."""
    N = hidden.shape[0]
    config, merge = configs
    logps, entropy, lse = (torch.empty(N, dtype=torch.float32, device=hidden.device) for _ in range(3))
    if N == 0:
        return logps, entropy, lse
    partial, shape = (partial_stats or _partial_stats)(hidden, head, targets, config, upcast, precision)
    _merge_logprobs_kernel[(triton.cdiv(N, merge.block_n),)](
        partial, logps, entropy, lse, N, shape.splits, **_merge_options(merge, upcast))
    return logps, entropy, lse


def linear_grpo_forward(hidden, head, targets, advantages, token_weights, entropy_weights, old_logps,
                        ref_logps, importance_ratio, mask, objective: dict,
                        configs: tuple[KernelConfig, KernelConfig], upcast: bool, precision: str, partial_stats=None):
    """Per token [N]: loss terms (summing to the loss), logps, entropy, lse, g = dterm/dlp, kl, clip code
    (bit 0: low-clipped, bit 1: high-clipped). partial_stats: as linear_forward's."""
    N = hidden.shape[0]
    config, merge = configs
    f32 = dict(dtype=torch.float32, device=hidden.device)
    terms, logps, entropy, lse, grad, kl = (torch.empty(N, **f32) for _ in range(6))
    clip = torch.empty(N, dtype=torch.int8, device=hidden.device)
    if N == 0:
        return terms, logps, entropy, lse, grad, kl, clip
    absent = advantages  # stands in for an optional input that is not given; never read (its flag is off)
    per_token = (advantages, token_weights, entropy_weights if entropy_weights is not None else absent,
                 old_logps if old_logps is not None else absent, ref_logps if ref_logps is not None else absent,
                 importance_ratio if importance_ratio is not None else absent, mask,
                 terms, logps, entropy, lse, grad, kl, clip)
    scalars = (objective["eps_low"], objective["eps_high"],
               objective["delta"] if objective["delta"] is not None else 0.0, objective["beta"],
               objective["sapo_pos"], objective["sapo_neg"])
    flags = dict(LOSS_KIND=objective["loss_kind"], HAS_OLD=old_logps is not None, HAS_REF=ref_logps is not None,
                 HAS_RHO=importance_ratio is not None, HAS_DELTA=objective["delta"] is not None,
                 BIAS_CORRECTION=objective["bias_correction"], HAS_ENTROPY_BONUS=entropy_weights is not None)
    partial, shape = (partial_stats or _partial_stats)(hidden, head, targets, config, upcast, precision)
    _merge_grpo_kernel[(triton.cdiv(N, merge.block_n),)](
        partial, *per_token, N, shape.splits, *scalars, **flags, **_merge_options(merge, upcast))
    return terms, logps, entropy, lse, grad, kl, clip
