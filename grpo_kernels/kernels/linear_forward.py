"""Forward: stream the LM head over vocabulary tiles; per token keep a running max, sum of exp and
sum of exp * z (online log-sum-exp and entropy) and pick out the target logit. Writes only O(tokens).
Two kernels share the stream: one stops at the log-probs, one adds the token-level objective epilogue.

When there are too few token blocks to fill the GPU (small N), the vocabulary is split across programs
instead: grid (token blocks, splits), each program writes its range's four statistics to a
[4, splits, N] float32 buffer, and a merge kernel folds the splits in a fixed order (bitwise reproducible)
before the log-probs or the objective epilogue."""

import torch
import triton
import triton.language as tl

from .configs import KernelConfig
from .tiles import (head_transform_args, logits_tile, online_softmax_init, online_softmax_merge,
                    online_softmax_result, online_softmax_update)
from .token_objective import token_objective

# a split below this many vocabulary tiles would spend more on its statistics than it saves
_MIN_TILES_PER_SPLIT = 8


@triton.jit
def _stream_vocab(hidden_ptr, weight_ptr, bias_ptr, rows, row_ok, targets, v_start, v_end, H, stride_hidden,
                  stride_weight, inv_tau, cap_scale, HAS_BIAS: tl.constexpr, SOFTCAP: tl.constexpr,
                  UPCAST: tl.constexpr, PRECISION: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr,
                  BLOCK_K: tl.constexpr, VOCAB_MAJOR: tl.constexpr):
    """Running (max, sum exp, sum exp * z, target logit) per row over vocabulary [v_start, v_end).
    VOCAB_MAJOR tiles are [BLOCK_V, BLOCK_N] (tensor-core M = vocabulary), so a narrow token block can
    take a wide vocabulary tile: the hidden block is re-read once per tile, so wider tiles read less."""
    run_max, sum_exp, sum_exp_z, target_z = online_softmax_init(BLOCK_N)
    for v0 in range(v_start, v_end, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        col_ok = cols < v_end
        z = logits_tile(hidden_ptr, weight_ptr, bias_ptr, rows, cols, row_ok, col_ok, H, stride_hidden,
                        stride_weight, inv_tau, HAS_BIAS, UPCAST, PRECISION, BLOCK_N, BLOCK_V, BLOCK_K, VOCAB_MAJOR,
                        cap_scale, SOFTCAP)
        if VOCAB_MAJOR:
            run_max, sum_exp, sum_exp_z, target_z = online_softmax_update(
                run_max, sum_exp, sum_exp_z, target_z, z, cols[:, None] == targets[None, :], col_ok[:, None], 0)
        else:
            run_max, sum_exp, sum_exp_z, target_z = online_softmax_update(
                run_max, sum_exp, sum_exp_z, target_z, z, cols[None, :] == targets[:, None], col_ok[None, :], 1)
    return run_max, sum_exp, sum_exp_z, target_z


@triton.jit
def _merge_splits(partial_ptr, rows, row_ok, N, splits, BLOCK_N: tl.constexpr):
    """(log-prob, entropy, lse) per row from the [4, splits, N] partial statistics, split 0 first."""
    run_max, sum_exp, sum_exp_z, target_z = online_softmax_init(BLOCK_N)
    stat = splits * N
    for s in range(0, splits):
        at = partial_ptr + s * N + rows
        run_max, sum_exp, sum_exp_z, target_z = online_softmax_merge(
            run_max, sum_exp, sum_exp_z, target_z,
            tl.load(at, mask=row_ok, other=0.0), tl.load(at + stat, mask=row_ok, other=1.0),
            tl.load(at + 2 * stat, mask=row_ok, other=0.0), tl.load(at + 3 * stat, mask=row_ok, other=0.0))
    return online_softmax_result(run_max, sum_exp, sum_exp_z, target_z)


@triton.jit
def _whole_vocab_stats(hidden_ptr, weight_ptr, bias_ptr, targets_ptr, N, V, H, stride_hidden, stride_weight, inv_tau,
                       cap_scale, HAS_BIAS: tl.constexpr, SOFTCAP: tl.constexpr, UPCAST: tl.constexpr,
                       PRECISION: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
                       VOCAB_MAJOR: tl.constexpr):
    """This program's token block: (rows, row_ok, log-prob, entropy, lse) over the whole vocabulary."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    targets = tl.load(targets_ptr + rows, mask=row_ok, other=0)
    run_max, sum_exp, sum_exp_z, target_z = _stream_vocab(
        hidden_ptr, weight_ptr, bias_ptr, rows, row_ok, targets, 0, V, H, stride_hidden, stride_weight, inv_tau,
        cap_scale, HAS_BIAS, SOFTCAP, UPCAST, PRECISION, BLOCK_N, BLOCK_V, BLOCK_K, VOCAB_MAJOR)
    logps, entropy, lse = online_softmax_result(run_max, sum_exp, sum_exp_z, target_z)
    return rows, row_ok, logps, entropy, lse


@triton.jit
def _linear_logprobs_forward_kernel(
    hidden_ptr, weight_ptr, bias_ptr, targets_ptr, logps_ptr, entropy_ptr, lse_ptr,
    N, V, H, stride_hidden, stride_weight, inv_tau, cap_scale,
    HAS_BIAS: tl.constexpr, SOFTCAP: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, VOCAB_MAJOR: tl.constexpr = False,
):
    rows, row_ok, logps, entropy, lse = _whole_vocab_stats(
        hidden_ptr, weight_ptr, bias_ptr, targets_ptr, N, V, H, stride_hidden, stride_weight, inv_tau, cap_scale,
        HAS_BIAS, SOFTCAP, UPCAST, PRECISION, BLOCK_N, BLOCK_V, BLOCK_K, VOCAB_MAJOR)
    tl.store(logps_ptr + rows, logps, mask=row_ok)
    tl.store(entropy_ptr + rows, entropy, mask=row_ok)
    tl.store(lse_ptr + rows, lse, mask=row_ok)


@triton.jit
def _partial_stats_kernel(
    hidden_ptr, weight_ptr, bias_ptr, targets_ptr, partial_ptr,
    N, V, H, stride_hidden, stride_weight, inv_tau, cap_scale, split_width,
    HAS_BIAS: tl.constexpr, SOFTCAP: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, VOCAB_MAJOR: tl.constexpr = False,
):
    """Program (token block, split): the four running statistics of vocabulary
    [split * split_width, (split + 1) * split_width), written to partial[:, split, rows]."""
    split = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    targets = tl.load(targets_ptr + rows, mask=row_ok, other=0)
    v_start = split * split_width
    run_max, sum_exp, sum_exp_z, target_z = _stream_vocab(
        hidden_ptr, weight_ptr, bias_ptr, rows, row_ok, targets, v_start, tl.minimum(v_start + split_width, V), H,
        stride_hidden, stride_weight, inv_tau, cap_scale, HAS_BIAS, SOFTCAP, UPCAST, PRECISION, BLOCK_N, BLOCK_V,
        BLOCK_K, VOCAB_MAJOR)
    stat = tl.num_programs(1) * N
    at = partial_ptr + split * N + rows
    tl.store(at, run_max, mask=row_ok)
    tl.store(at + stat, sum_exp, mask=row_ok)
    tl.store(at + 2 * stat, sum_exp_z, mask=row_ok)
    tl.store(at + 3 * stat, target_z, mask=row_ok)


@triton.jit
def _merge_logprobs_kernel(partial_ptr, logps_ptr, entropy_ptr, lse_ptr, N, splits, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    logps, entropy, lse = _merge_splits(partial_ptr, rows, row_ok, N, splits, BLOCK_N)
    tl.store(logps_ptr + rows, logps, mask=row_ok)
    tl.store(entropy_ptr + rows, entropy, mask=row_ok)
    tl.store(lse_ptr + rows, lse, mask=row_ok)


def auto_vocab_splits(N: int, V: int, config: KernelConfig, sm_count: int) -> int:
    """Enough vocabulary splits to give every SM a program when the token blocks alone cannot, with at
    least _MIN_TILES_PER_SPLIT vocabulary tiles per split; 1 (no split) when N fills the GPU."""
    token_blocks = triton.cdiv(max(N, 1), config.block_n)
    if token_blocks >= sm_count:
        return 1
    most = max(1, triton.cdiv(V, config.block_v) // _MIN_TILES_PER_SPLIT)
    return max(1, min(triton.cdiv(sm_count, token_blocks), most))


def _split_width(V: int, splits: int, block_v: int) -> tuple[int, int]:
    """(width, splits) with the width a whole number of vocabulary tiles and no split empty (an empty
    split's max would be -inf, and the merge would compute inf - inf)."""
    tiles = triton.cdiv(V, block_v)
    width = triton.cdiv(tiles, min(splits, tiles)) * block_v
    return width, triton.cdiv(V, width)


def _partial_stats(hidden, head, targets, config: KernelConfig, upcast: bool, precision: str,
                   splits: int) -> tuple[torch.Tensor, int]:
    N, H = hidden.shape
    weight, bias = head.weight, head.bias
    V = weight.shape[0]
    width, splits = _split_width(V, splits, config.block_v)
    partial = torch.empty(4, splits, N, dtype=torch.float32, device=hidden.device)
    inv_tau, cap_scale, capped = head_transform_args(head)
    _partial_stats_kernel[(triton.cdiv(N, config.block_n), splits)](
        hidden, weight, bias if bias is not None else hidden, targets, partial,
        N, V, H, hidden.stride(0), weight.stride(0), inv_tau, cap_scale, width,
        HAS_BIAS=bias is not None, SOFTCAP=capped, UPCAST=upcast, PRECISION=precision,
        **config.launch_options(upcast),
    )
    return partial, splits


def linear_forward(hidden: torch.Tensor, head, targets: torch.Tensor, configs: tuple[KernelConfig, KernelConfig],
                   upcast: bool, precision: str, vocab_splits: int = 1):
    """head: a grpo_kernels.head.LMHead; configs: (forward, merge) table entries; vocab_splits 1 streams each
    token block over the whole vocabulary in one program."""
    N, H = hidden.shape
    weight, bias = head.weight, head.bias
    V = weight.shape[0]
    config, merge = configs
    logps = torch.empty(N, dtype=torch.float32, device=hidden.device)
    entropy = torch.empty_like(logps)
    lse = torch.empty_like(logps)
    if N == 0:
        return logps, entropy, lse
    if vocab_splits > 1:
        partial, splits = _partial_stats(hidden, head, targets, config, upcast, precision, vocab_splits)
        _merge_logprobs_kernel[(triton.cdiv(N, merge.block_n),)](
            partial, logps, entropy, lse, N, splits, **_merge_options(merge, upcast))
        return logps, entropy, lse
    inv_tau, cap_scale, capped = head_transform_args(head)
    _linear_logprobs_forward_kernel[(triton.cdiv(N, config.block_n),)](
        hidden, weight, bias if bias is not None else hidden, targets, logps, entropy, lse,
        N, V, H, hidden.stride(0), weight.stride(0), inv_tau, cap_scale,
        HAS_BIAS=bias is not None, SOFTCAP=capped, UPCAST=upcast, PRECISION=precision,
        **config.launch_options(upcast),
    )
    return logps, entropy, lse


def _merge_options(merge: KernelConfig, interpreted: bool) -> dict:
    options = merge.launch_options(interpreted)
    del options["BLOCK_V"]  # the merge has no vocabulary loop
    return options


@triton.jit
def _grpo_epilogue(
    rows, row_ok, logps, entropy, lse,
    adv_ptr, token_weight_ptr, entropy_weight_ptr, old_ptr, ref_ptr, rho_ptr, mask_ptr,
    terms_ptr, logps_ptr, entropy_ptr, lse_ptr, grad_ptr, kl_ptr, clip_ptr,
    eps_low, eps_high, delta, beta, sapo_pos, sapo_neg,
    LOSS_KIND: tl.constexpr, HAS_OLD: tl.constexpr, HAS_REF: tl.constexpr, HAS_RHO: tl.constexpr,
    HAS_DELTA: tl.constexpr, BIAS_CORRECTION: tl.constexpr, HAS_ENTROPY_BONUS: tl.constexpr,
):
    """The token-level objective of finished rows, and every per-token output of the GRPO forward."""
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


@triton.jit
def _linear_grpo_forward_kernel(
    hidden_ptr, weight_ptr, bias_ptr, targets_ptr,
    adv_ptr, token_weight_ptr, entropy_weight_ptr, old_ptr, ref_ptr, rho_ptr, mask_ptr,
    terms_ptr, logps_ptr, entropy_ptr, lse_ptr, grad_ptr, kl_ptr, clip_ptr,
    N, V, H, stride_hidden, stride_weight, inv_tau, cap_scale,
    eps_low, eps_high, delta, beta, sapo_pos, sapo_neg,
    HAS_BIAS: tl.constexpr, SOFTCAP: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    LOSS_KIND: tl.constexpr, HAS_OLD: tl.constexpr, HAS_REF: tl.constexpr, HAS_RHO: tl.constexpr,
    HAS_DELTA: tl.constexpr, BIAS_CORRECTION: tl.constexpr, HAS_ENTROPY_BONUS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, VOCAB_MAJOR: tl.constexpr = False,
):
    """The same vocabulary stream, then the token-level objective in the epilogue: the backward needs only
    the per-token g this writes (and the entropy weight)."""
    rows, row_ok, logps, entropy, lse = _whole_vocab_stats(
        hidden_ptr, weight_ptr, bias_ptr, targets_ptr, N, V, H, stride_hidden, stride_weight, inv_tau, cap_scale,
        HAS_BIAS, SOFTCAP, UPCAST, PRECISION, BLOCK_N, BLOCK_V, BLOCK_K, VOCAB_MAJOR)
    _grpo_epilogue(rows, row_ok, logps, entropy, lse, adv_ptr, token_weight_ptr, entropy_weight_ptr, old_ptr,
                   ref_ptr, rho_ptr, mask_ptr, terms_ptr, logps_ptr, entropy_ptr, lse_ptr, grad_ptr, kl_ptr, clip_ptr,
                   eps_low, eps_high, delta, beta, sapo_pos, sapo_neg, LOSS_KIND, HAS_OLD, HAS_REF, HAS_RHO,
                   HAS_DELTA, BIAS_CORRECTION, HAS_ENTROPY_BONUS)


@triton.jit
def _merge_grpo_kernel(
    partial_ptr, adv_ptr, token_weight_ptr, entropy_weight_ptr, old_ptr, ref_ptr, rho_ptr, mask_ptr,
    terms_ptr, logps_ptr, entropy_ptr, lse_ptr, grad_ptr, kl_ptr, clip_ptr,
    N, splits, eps_low, eps_high, delta, beta, sapo_pos, sapo_neg,
    LOSS_KIND: tl.constexpr, HAS_OLD: tl.constexpr, HAS_REF: tl.constexpr, HAS_RHO: tl.constexpr,
    HAS_DELTA: tl.constexpr, BIAS_CORRECTION: tl.constexpr, HAS_ENTROPY_BONUS: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Split-vocabulary forward, second step: merge the partial statistics, then the same epilogue."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    logps, entropy, lse = _merge_splits(partial_ptr, rows, row_ok, N, splits, BLOCK_N)
    _grpo_epilogue(rows, row_ok, logps, entropy, lse, adv_ptr, token_weight_ptr, entropy_weight_ptr, old_ptr,
                   ref_ptr, rho_ptr, mask_ptr, terms_ptr, logps_ptr, entropy_ptr, lse_ptr, grad_ptr, kl_ptr, clip_ptr,
                   eps_low, eps_high, delta, beta, sapo_pos, sapo_neg, LOSS_KIND, HAS_OLD, HAS_REF, HAS_RHO,
                   HAS_DELTA, BIAS_CORRECTION, HAS_ENTROPY_BONUS)


def linear_grpo_forward(hidden, head, targets, advantages, token_weights, entropy_weights, old_logps,
                        ref_logps, importance_ratio, mask, objective: dict,
                        configs: tuple[KernelConfig, KernelConfig], upcast: bool, precision: str,
                        vocab_splits: int = 1):
    """Per token [N]: loss terms (summing to the loss), logps, entropy, lse, g = dterm/dlp, kl, clip code
    (bit 0: low-clipped, bit 1: high-clipped)."""
    N, H = hidden.shape
    weight, bias = head.weight, head.bias
    V = weight.shape[0]
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
    if vocab_splits > 1:
        partial, splits = _partial_stats(hidden, head, targets, config, upcast, precision, vocab_splits)
        _merge_grpo_kernel[(triton.cdiv(N, merge.block_n),)](
            partial, *per_token, N, splits, *scalars, **flags, **_merge_options(merge, upcast))
        return terms, logps, entropy, lse, grad, kl, clip
    inv_tau, cap_scale, capped = head_transform_args(head)
    _linear_grpo_forward_kernel[(triton.cdiv(N, config.block_n),)](
        hidden, weight, bias if bias is not None else hidden, targets, *per_token,
        N, V, H, hidden.stride(0), weight.stride(0), inv_tau, cap_scale, *scalars,
        HAS_BIAS=bias is not None, SOFTCAP=capped, UPCAST=upcast, PRECISION=precision, **flags,
        **config.launch_options(upcast),
    )
    return terms, logps, entropy, lse, grad, kl, clip
