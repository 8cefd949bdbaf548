"""What an optimizer step is checked for before anything samples from or saves its weights: that every trained
weight is finite and within WEIGHT_LIMIT (check_update_finite), and that the step did not wreck the weights while
leaving them finite (check_update_size). Either stops the run with DivergedUpdateError, so the last checkpoint
stays the one to resume from."""

from __future__ import annotations

import math
from typing import Optional

import torch
from accelerate import Accelerator

# The settings a check names: the RL update's by default, the demo's supervised warm start's (same optimizer, same
# failure) when it runs the checks on its own steps.
# (what a step is called, the learning rate's setting, what became of the weights)
RL_STEP = ("step", "optim.learning_rate",
           "the run stops without saving these weights, so the last checkpoint stays the one to resume from")
WARM_START_STEP = ("warm-start step", "run.warm_start_learning_rate",
                   "the run stops before its first step, with nothing of these weights saved")


class DivergedUpdateError(FloatingPointError):
    """An optimizer step left a trained weight NaN, inf or past WEIGHT_LIMIT, or grew the trained weights past
    MAX_STEP_GROWTH in one step: stopped before anything samples from or saves the weights (the last checkpoint
    stays the one to resume from)."""


# No trained weight comes near this; weights this size overflow float32 within one decoder layer's forward (a
# product of four weights: the sampler then fails with "probability tensor contains either inf, nan"). AdamW
# moves each weight by about the learning rate per step, so a learning rate of this order gets here at once.
WEIGHT_LIMIT = 1e6

# Far below WEIGHT_LIMIT a learning rate still wrecks the policy while every weight stays finite: AdamW moves each
# weight by about the learning rate, so one step at lr far above the weights' typical size (about 0.02 in a
# trained LLM, 0.06 in the demo model) replaces them with noise of size lr. Measured on the demo model: lr 1 grew
# the weights' norm 17-fold in its first step and the policy collapsed to EOS (entropy 0); lr 1e3 and up (1.7e4-
# fold) gave a network whose output is uniform and whose gradient is 0 for every later step. The engine's and the
# tests' learning rates (1e-6 to 0.2, LoRA included) grow it by at most 3.5-fold (measured: 0.2 on LoRA adapters;
# the demo's 600 steps at most 1.0004-fold): a tenfold growth in one step is wreckage, never training.
MAX_STEP_GROWTH = 10.0


def weight_sizes(accelerator: Optional[Accelerator], parameters: list[torch.Tensor]) -> tuple[float, float]:
    """(largest |weight|, L2 norm) of `parameters` over every process; the largest is inf if any weight is NaN or
    inf. One fused reduction per process and, with several processes (FSDP / TP shards, DDP replicas), one
    all-reduce, so every process takes the same branch. DDP replicas count each weight once per process, which
    scales the norm and leaves its ratios (check_update_size) as they are. No accelerator: this process's weights
    only (the warm start, which the main process runs alone)."""
    local = [getattr(p, "to_local", lambda: p)().detach() for p in parameters]  # a DTensor's shard: this rank's
    local = [t for t in local if t.numel()]
    if local:
        peak = torch.stack(torch._foreach_norm(local, math.inf)).max().float()
        squares = torch.stack(torch._foreach_norm(local, 2)).double().square().sum()
    else:
        peak, squares = torch.zeros(()), torch.zeros((), dtype=torch.float64)
    peak = torch.nan_to_num(peak, nan=math.inf)  # an all-reduce max may drop a NaN; inf it keeps
    if accelerator is not None and accelerator.num_processes > 1:
        device = accelerator.device
        peak = accelerator.reduce(peak.reshape(1).to(device), "max")
        squares = accelerator.reduce(squares.reshape(1).to(device), "sum")
    return float(peak.max()), math.sqrt(float(squares.sum()))


def weight_limit(largest: float) -> float:
    """WEIGHT_LIMIT, or for a model that already holds weights near it, a thousand times its `largest`."""
    return max(WEIGHT_LIMIT, 1e3 * largest)


def _gradient_advice(max_grad_norm: float, grad_norm: float, setting: str) -> str:
    """What to change, by what the step saw: a gradient already inf or NaN is an overflow in the forward or the
    backward, which no learning rate causes and clipping turns into NaN; else the learning rate is too large."""
    if not math.isfinite(grad_norm):
        return (f"The gradient itself was {grad_norm} (the loss was finite): an overflow in the forward or the "
                f"backward, not the learning rate; train in float32 (model.dtype) or find what overflows")
    clip = (f" (optim.max_grad_norm {max_grad_norm:g} bounds the gradient, not the step)" if max_grad_norm > 0 else
            ", and set optim.max_grad_norm > 0 (it is 0: the gradient is not clipped)")
    return f"Lower {setting}{clip}" if setting == RL_STEP[1] else f"Lower {setting}"


def check_update_finite(largest: float, limit: float, step: int, lr: float, max_grad_norm: float,
                        grad_norm: float, phase: tuple[str, str, str] = RL_STEP) -> None:
    """Raises DivergedUpdateError when the optimizer step just taken left a trained weight non-finite or past
    `limit` (weight_limit's; `largest` is weight_sizes' after the step), naming the step and the settings that let
    it."""
    if largest <= limit:
        return
    held = "NaN or inf" if not math.isfinite(largest) else f"{largest:.3g}"
    raise DivergedUpdateError(
        f"the optimizer step at {phase[0]} {step} diverged: a trained weight is now {held} (the gradient norm was "
        f"{grad_norm:.3g}, the learning rate {lr:g}); {phase[2]}. "
        f"{_gradient_advice(max_grad_norm, grad_norm, phase[1])}")


def check_update_size(norm_before: float, norm_after: float, step: int, lr: float, grad_norm: float,
                      phase: tuple[str, str, str] = RL_STEP) -> None:
    """Raises DivergedUpdateError when the optimizer step just taken grew the trained weights' L2 norm more than
    MAX_STEP_GROWTH-fold: finite weights, but noise of the learning rate's size (see MAX_STEP_GROWTH). Weights
    whose norm was 0 (nothing to compare with) are not judged."""
    if norm_before <= 0 or norm_after <= MAX_STEP_GROWTH * norm_before:
        return
    raise DivergedUpdateError(
        f"the optimizer step at {phase[0]} {step} wrecked the weights: it grew the trained weights' norm "
        f"{norm_after / norm_before:.3g}-fold in one step (the learning rate {lr:g}, the gradient norm "
        f"{grad_norm:.3g}; AdamW moves every weight by about the learning rate, here far more than the weights' own "
        f"size), so the policy would sample noise from now on; {phase[2]}. Lower {phase[1]}")
