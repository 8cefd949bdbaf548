"""The policy update: num_iterations optimizer steps, each over the micro-batches of the process's batch.

Micro-batches are padded (per_device_train_batch_size completions, `optim.padding_free: false`) or packs of
whole sequences up to a token budget (grpo_engine.steps.packing). Either way each loss type is normalised over the
process's whole generation batch, so the gradient of a global batch does not depend on how it is split into
processes and micro-batches, nor on how it is packed (DDP averages gradients over processes): each micro-batch's
loss, normalised by the kernels over the micro-batch, is scaled by its share of the batch's normaliser
(`loss_scale`). For equal micro-batches that is TRL's division by the accumulation steps (grpo, dr_grpo, sapo,
luspo); dapo / cispo / vespo are already divided by the token count of the whole generation batch over the
processes (`num_items_in_batch`), as in TRL; bnpo is divided by the completion tokens of the process's batch,
where TRL divides by the micro-batch's (the same when micro-batches hold equal token counts).
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Optional

import torch
from accelerate import Accelerator
from torch import nn

from grpo_kernels import GRPOLossConfig, fused_linear_grpo_loss
from grpo_kernels.losses import GENERATION_TOKENS, TOKENS, TRUST_REGION, get_loss_type
from grpo_kernels.objective import ratio_clip_flags

from ..model.loading import with_lm_head
from ..rollout.base import RolloutBatch
from .logprobs import completion_hidden_states
from .packing import Pack, Packing, pack_hidden_states, plan_micro_batches
# DivergedUpdateError and WEIGHT_LIMIT stay importable from here, with the update's other error
from .update_checks import WEIGHT_LIMIT, DivergedUpdateError  # noqa: F401
from .update_checks import check_update_finite, check_update_size, weight_limit, weight_sizes


class NonFiniteLossError(FloatingPointError):
    pass


@dataclass
class UpdateInputs:
    batch: RolloutBatch  # this process's completions
    advantages: torch.Tensor  # [n_local]
    old_logps: Optional[torch.Tensor]  # [n_local, T] when num_iterations > 1
    ref_logps: Optional[torch.Tensor]  # [n_local, T] when beta != 0
    num_items_in_batch: float  # active completion tokens of the whole generation batch / processes
    importance_ratio: Optional[torch.Tensor] = None  # [n_local, T] the off-policy correction's weights


def num_items_per_process(accelerator: Accelerator, completion_mask: torch.Tensor) -> float:
    """The dapo normaliser: completion tokens over every process's generation batch, divided by processes."""
    local = completion_mask.sum().to(torch.float64).reshape(1)
    return accelerator.gather(local).sum().item() / accelerator.num_processes


def micro_batch_loss(policy: nn.Module, unwrapped_lm: nn.Module, inputs: UpdateInputs, rows: slice,
                     loss_config: GRPOLossConfig, backend: str):
    part = inputs.batch.select(rows)
    hidden = completion_hidden_states(policy, part)
    return with_lm_head(unwrapped_lm, hidden, lambda h, weight, head: fused_linear_grpo_loss(
        h, weight, part.completion_ids, part.completion_mask, inputs.advantages[rows], **head,
        old_logps=None if inputs.old_logps is None else inputs.old_logps[rows],
        ref_logps=None if inputs.ref_logps is None else inputs.ref_logps[rows],
        importance_ratio=None if inputs.importance_ratio is None else inputs.importance_ratio[rows],
        num_items_in_batch=inputs.num_items_in_batch, config=loss_config, backend=backend,
        kept_token_ids=part.kept_token_ids))


def pack_loss(policy: nn.Module, unwrapped_lm: nn.Module, inputs: UpdateInputs, pack: Pack,
              loss_config: GRPOLossConfig, backend: str):
    """The fused loss on the pack's completion rows (its packed form); `logps` comes back [N]."""
    hidden = pack_hidden_states(policy, pack)
    return with_lm_head(unwrapped_lm, hidden, lambda h, weight, head: fused_linear_grpo_loss(
        h, weight, pack.completion_ids, pack.completion_mask, inputs.advantages[pack.rows], **head,
        old_logps=pack.rows_of(inputs.old_logps), ref_logps=pack.rows_of(inputs.ref_logps),
        importance_ratio=pack.rows_of(inputs.importance_ratio),
        num_items_in_batch=inputs.num_items_in_batch, config=loss_config, backend=backend,
        cu_seqlens=pack.cu_seqlens, kept_token_ids=pack.kept_token_ids))


def loss_scale(loss_type: str, sequences: int, tokens: float, all_sequences: int, all_tokens: float) -> float:
    """The factor that turns a micro-batch's loss, normalised over the micro-batch, into its part of the loss
    normalised over the process's batch (see the module's docstring), by what the loss type's aggregation is a
    mean over (losses.Aggregation.mean_over)."""
    aggregation = get_loss_type(loss_type).aggregation
    if aggregation.mean_over == GENERATION_TOKENS:  # already over the whole generation batch's tokens
        return 1.0
    if aggregation.mean_over == TOKENS:  # the kernels divide by max(1, tokens)
        return max(tokens, 1.0) / max(all_tokens, 1.0)
    return sequences / all_sequences  # a mean over sequences


def metric_weight(name: str, config: GRPOLossConfig, sequences: int, tokens: float) -> float:
    """What a micro-batch's metric is a mean over: its sequences for sequence-level ratios' clip fractions, else its
    completion tokens. Weighted so, the micro-batches' metrics average to the batch's, however it is split."""
    if name.startswith("clip_ratio/") and config.importance_sampling_level == "sequence":
        return float(sequences)
    return tokens


def sequence_clip_extremes(accelerator: Accelerator, logps: torch.Tensor, inputs: UpdateInputs, rows: slice,
                           config: GRPOLossConfig) -> dict[str, float]:
    """TRL's clip_ratio/low_min and high_max: per completion, the fraction of its tokens whose ratio was clipped
    low (high); the smallest low and largest high fraction over the micro-batch of every process. Empty
    completions give NaN and are skipped; a micro-batch with none left gives NaN (logged as null)."""
    mask = inputs.batch.completion_mask[rows].float()
    low, high = (flags.expand_as(mask) for flags in ratio_clip_flags(
        logps, mask, inputs.advantages[rows], config, None if inputs.old_logps is None else inputs.old_logps[rows]))
    per_sequence = torch.stack([(low * mask).sum(-1), (high * mask).sum(-1)]) / mask.sum(-1)
    low_all, high_all = accelerator.gather(per_sequence.T.contiguous()).T
    low_all, high_all = low_all[~low_all.isnan()], high_all[~high_all.isnan()]
    return {"clip_ratio/low_min": low_all.min().item() if low_all.numel() else math.nan,
            "clip_ratio/high_max": high_all.max().item() if high_all.numel() else math.nan}


def policy_update(accelerator: Accelerator, policy: nn.Module, unwrapped_lm: nn.Module,
                  optimizer: torch.optim.Optimizer, scheduler, inputs: UpdateInputs, loss_config: GRPOLossConfig,
                  micro_batch_size: int, num_iterations: int, max_grad_norm: float, backend: str,
                  step: int, packing: Optional[Packing] = None) -> dict[str, float]:
    """Runs the optimizer steps of one generation round; returns the round's loss metrics (the token-weighted ones
    over every process's batch, the loss, grad norm and sampler ratios this process's).

    `packing` None: padded micro-batches of `micro_batch_size` completions; else packs, or padded micro-batches
    where the default budget's packs would cost more (grpo_engine.steps.packing.plan_micro_batches).
    TRL's clip extremes are taken over groups of `micro_batch_size` completions either way."""
    batch = inputs.batch
    parts = plan_micro_batches(batch, packing, micro_batch_size)
    all_sequences, all_tokens = len(batch.prompts), float(batch.completion_mask.sum())
    loss_type = get_loss_type(loss_config.loss_type)
    weighted: dict[str, list[float]] = {}  # name: [sum of weight * value, sum of weight]
    extremes: dict[str, list[float]] = {}
    step_losses, grad_norms = [], []
    mismatch = SamplerMismatch()
    # the optimizer's own parameters, the ones its step writes: under FSDP2 the module's registered parameters
    # are swapped for unsharded ones around a forward (their storage freed after it), so a list taken from
    # policy.parameters() here may hold tensors with no memory behind them by the time the step is checked
    trained = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    largest, norm = weight_sizes(accelerator, trained)
    limit = weight_limit(largest)
    for iteration in range(num_iterations):
        step_loss = 0.0
        logps = torch.zeros(batch.completion_ids.shape, dtype=torch.float32, device=batch.completion_ids.device)
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            packed = isinstance(part, Pack)
            mask = part.completion_mask if packed else batch.completion_mask[part]
            sequences, tokens = (len(part.rows) if packed else mask.shape[0]), float(mask.sum())
            # Gradients are all-reduced once, after the last micro-batch of the optimizer step.
            with nullcontext() if last else accelerator.no_sync(policy):
                out = (pack_loss if packed else micro_batch_loss)(policy, unwrapped_lm, inputs, part, loss_config,
                                                                   backend)
                loss = out.loss * loss_scale(loss_config.loss_type, sequences, tokens, all_sequences, all_tokens)
                if not torch.isfinite(loss.detach()):
                    raise NonFiniteLossError(
                        f"the loss is {loss.item()} at step {step} (micro-batch {i}); stopping before the "
                        f"optimizer step so the last checkpoint stays valid. Lower optim.learning_rate or check "
                        f"the rewards and the model's dtype")
                accelerator.backward(loss)
            if packed:
                part.scatter(out.logps, logps)
            else:
                logps[part] = out.logps
            step_loss += loss.item()  # the scaled micro-batch losses add up to the optimizer step's loss
            for name, value in out.metrics.items():
                weight = metric_weight(name, loss_config, sequences, tokens)
                total = weighted.setdefault(name, [0.0, 0.0])
                total[0] += weight * value.item()
                total[1] += weight
        if iteration == 0:  # before the first optimizer step the policy is the one that sampled
            mismatch.add(logps, batch)
        if loss_type.clip == TRUST_REGION:
            for start in range(0, all_sequences, micro_batch_size):
                rows = slice(start, start + micro_batch_size)
                for name, value in sequence_clip_extremes(accelerator, logps[rows], inputs, rows,
                                                          loss_config).items():
                    extremes.setdefault(name, []).append(value)
        grad_norm = accelerator.clip_grad_norm_(policy.parameters(), max_grad_norm if max_grad_norm > 0 else math.inf)
        lr = optimizer.param_groups[0]["lr"]
        optimizer.step()
        largest, norm_after = weight_sizes(accelerator, trained)
        check_update_finite(largest, limit, step, lr, max_grad_norm, float(grad_norm))
        check_update_size(norm, norm_after, step, lr, float(grad_norm))
        norm = norm_after
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step_losses.append(step_loss)
        grad_norms.append(float(grad_norm))
    # The metrics of the global batch's tokens (or sequences), whatever the micro-batches and processes; the
    # extremes averaged over groups of micro_batch_size completions, as TRL averages its logged values, NaN
    # (nothing to measure) skipped.
    metrics = global_weighted_means(accelerator, weighted)
    metrics.update({name: _nan_mean(values) for name, values in extremes.items()})
    metrics.update(mismatch.metrics())
    metrics["loss"] = sum(step_losses) / num_iterations
    metrics["grad_norm"] = sum(grad_norms) / num_iterations
    return metrics


def global_weighted_means(accelerator: Accelerator, weighted: dict[str, list[float]]) -> dict[str, float]:
    """{name: sum of weight * value / sum of weight} over every process's micro-batches (the same on each)."""
    names = sorted(weighted)  # the same order on every process
    sums = torch.tensor([weighted[n] for n in names], dtype=torch.float64, device=accelerator.device).reshape(-1, 2)
    sums = accelerator.reduce(sums, reduction="sum")
    return {name: total / weight if weight > 0 else math.nan for name, (total, weight) in zip(names, sums.tolist())}


class SamplerMismatch:
    """The trainer's log-probs of the sampled tokens against the sampler's, over this process's completion tokens:
    the mean importance ratio exp(trainer - sampler) and the fraction outside [0.9, 1.1]."""

    def __init__(self):
        self.ratio_sum, self.outside, self.tokens = 0.0, 0.0, 0

    def add(self, trainer_logps: torch.Tensor, part: RolloutBatch) -> None:
        if part.sampler_logps is None:
            return
        valid = part.completion_mask != 0
        ratio = torch.exp(trainer_logps.detach().float() - part.sampler_logps.float())[valid]
        self.ratio_sum += ratio.sum().item()
        self.outside += ((ratio < 0.9) | (ratio > 1.1)).sum().item()
        self.tokens += ratio.numel()

    def metrics(self) -> dict[str, float]:
        if self.tokens == 0:
            return {}
        return {"sampling/trainer_sampler_ratio/mean": self.ratio_sum / self.tokens,
                "sampling/trainer_sampler_ratio/outside_0.9_1.1": self.outside / self.tokens}


def _nan_mean(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else math.nan
