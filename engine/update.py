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

from .logprobs import completion_hidden_states
from .models import with_lm_head
from .rollout import RolloutBatch

GLOBAL_TOKEN_NORMALISED = ("dapo", "cispo", "vespo")


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
    return with_lm_head(unwrapped_lm, hidden, lambda h, weight, bias: fused_linear_grpo_loss(
        h, weight, part.completion_ids, part.completion_mask, inputs.advantages[rows], bias=bias,
        old_logps=None if inputs.old_logps is None else inputs.old_logps[rows],
        ref_logps=None if inputs.ref_logps is None else inputs.ref_logps[rows],
        num_items_in_batch=inputs.num_items_in_batch, config=loss_config, backend=backend))


def policy_update(accelerator: Accelerator, policy: nn.Module, unwrapped_lm: nn.Module,
                  optimizer: torch.optim.Optimizer, scheduler, inputs: UpdateInputs, loss_config: GRPOLossConfig,
                  micro_batch_size: int, num_iterations: int, max_grad_norm: float, backend: str,
                  step: int) -> dict[str, float]:
    """Runs the optimizer steps of one generation round; returns the round's loss metrics (this process)."""
    n_local = len(inputs.batch.prompts)
    starts = list(range(0, n_local, micro_batch_size))
    scale = 1.0 if loss_config.loss_type in GLOBAL_TOKEN_NORMALISED else 1.0 / len(starts)
    metric_sums: dict[str, float] = {}
    step_losses, grad_norms = [], []
    for _ in range(num_iterations):
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
            step_loss += loss.item()  # the scaled micro-batch losses add up to the optimizer step's loss
            for name, value in out.metrics.items():
                metric_sums[name] = metric_sums.get(name, 0.0) + value.item()
        grad_norm = accelerator.clip_grad_norm_(policy.parameters(), max_grad_norm if max_grad_norm > 0 else math.inf)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step_losses.append(step_loss)
        grad_norms.append(float(grad_norm))
    passes = num_iterations * len(starts)
    metrics = {name: total / passes for name, total in metric_sums.items()}
    metrics["loss"] = sum(step_losses) / num_iterations
    metrics["grad_norm"] = sum(grad_norms) / num_iterations
    return metrics
