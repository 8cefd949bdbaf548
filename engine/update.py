"""The policy update: num_iterations optimizer steps, each over gradient_accumulation_steps micro-batches.

Loss scaling (as TRL's `_compute_loss`): the per-micro-batch means (grpo, bnpo, dr_grpo, sapo, luspo) are
divided by the accumulation steps; dapo / cispo / vespo are already divided by the token count of the whole
generation batch over the processes (`num_items_in_batch`), so they are not. Either way the gradient of a
global batch does not depend on how it is split into processes and micro-batches (DDP averages gradients
over processes).
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
from grpo_kernels.losses import TRUST_REGION, get_loss_type
from grpo_kernels.objective import ratio_clip_flags

from .logprobs import completion_hidden_states
from .models import with_lm_head
from .rollout import RolloutBatch


class NonFiniteLossError(FloatingPointError):
    pass


@dataclass
class UpdateInputs:
    batch: RolloutBatch  # this process's completions
    advantages: torch.Tensor  # [n_local]
    old_logps: Optional[torch.Tensor]  # [n_local, T] when num_iterations > 1
    ref_logps: Optional[torch.Tensor]  # [n_local, T] when beta != 0
    num_items_in_batch: float  # active completion tokens of the whole generation batch / processes


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
        num_items_in_batch=inputs.num_items_in_batch, config=loss_config, backend=backend,
        kept_token_ids=part.kept_token_ids))


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
                  step: int) -> dict[str, float]:
    """Runs the optimizer steps of one generation round; returns the round's loss metrics (this process)."""
    n_local = len(inputs.batch.prompts)
    starts = list(range(0, n_local, micro_batch_size))
    loss_type = get_loss_type(loss_config.loss_type)
    # a loss divided by the generation batch's token count is not divided again by the micro-batch count
    scale = 1.0 if loss_type.aggregation.token_normalised else 1.0 / len(starts)
    metric_values: dict[str, list[float]] = {}
    step_losses, grad_norms = [], []
    mismatch = SamplerMismatch()
    for iteration in range(num_iterations):
        step_loss = 0.0
        for i, start in enumerate(starts):
            last = i == len(starts) - 1
            # Gradients are all-reduced once, after the last micro-batch of the optimizer step.
            with nullcontext() if last else accelerator.no_sync(policy):
                out = micro_batch_loss(policy, unwrapped_lm, inputs, slice(start, start + micro_batch_size),
                                       loss_config, backend)
                loss = out.loss * scale
                if not torch.isfinite(loss.detach()):
                    raise NonFiniteLossError(
                        f"the loss is {loss.item()} at step {step} (micro-batch {i}); stopping before the "
                        f"optimizer step so the last checkpoint stays valid. Lower optim.learning_rate or check "
                        f"the rewards and the model's dtype")
                accelerator.backward(loss)
            if iteration == 0:  # before the first optimizer step the policy is the one that sampled
                mismatch.add(out.logps, inputs.batch.select(slice(start, start + micro_batch_size)))
            step_loss += loss.item()  # the scaled micro-batch losses add up to the optimizer step's loss
            values = {name: value.item() for name, value in out.metrics.items()}
            if loss_type.clip == TRUST_REGION:
                values.update(sequence_clip_extremes(accelerator, out.logps, inputs,
                                                     slice(start, start + micro_batch_size), loss_config))
            for name, value in values.items():
                metric_values.setdefault(name, []).append(value)
        grad_norm = accelerator.clip_grad_norm_(policy.parameters(), max_grad_norm if max_grad_norm > 0 else math.inf)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step_losses.append(step_loss)
        grad_norms.append(float(grad_norm))
    # Averaged over micro-batches as TRL averages its logged values, NaN (nothing to measure) skipped.
    metrics = {name: _nan_mean(values) for name, values in metric_values.items()}
    metrics.update(mismatch.metrics())
    metrics["loss"] = sum(step_losses) / num_iterations
    metrics["grad_norm"] = sum(grad_norms) / num_iterations
    return metrics


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
