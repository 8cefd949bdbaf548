"""Advantages [B, 1], one per sequence as a column, at every padded entry point: the loss of the same values as [B].

TRL's `GRPOTrainer._compute_loss` unsqueezes only a 1-d `advantages` and broadcasts a [B, 1] one over the tokens (a
GRPOTrainer subclass may hand either), and Liger's chunked loss takes [B, 1] alike. Before, every entry point here
refused [B, 1] ("advantages must have shape [B] or [B, T]") while both trainers computed the loss."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_kernels import (FusedLinearGRPOLoss, GRPOLossConfig, fused_linear_grpo_loss, grpo_loss_from_logits,
                          grpo_objective)

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")


def _batch(seed: int, B: int, T: int):
    gen = torch.Generator().manual_seed(seed)
    H, V = 4, 7
    mask = (torch.rand(B, T, generator=gen) > 0.3).long()
    return dict(hidden=torch.randn(B, T, H, generator=gen, dtype=torch.float64),
                weight=torch.randn(V, H, generator=gen, dtype=torch.float64),
                ids=torch.randint(0, V, (B, T), generator=gen), mask=mask,
                advantages=torch.randn(B, generator=gen, dtype=torch.float64),
                old=-torch.rand(B, T, generator=gen, dtype=torch.float64) - 0.1,
                ref=-torch.rand(B, T, generator=gen, dtype=torch.float64) - 0.1)


def _entry(entry: str, b: dict, advantages: torch.Tensor, config: GRPOLossConfig) -> tuple[torch.Tensor, ...]:
    """(loss, d loss / d hidden-or-logps) of one entry point."""
    hidden = b["hidden"].clone().requires_grad_()
    if entry == "loss":
        out = fused_linear_grpo_loss(hidden, b["weight"], b["ids"], b["mask"], advantages, old_logps=b["old"],
                                     ref_logps=b["ref"], config=config, backend="torch")
        loss = out.loss
    elif entry == "logits":
        out = grpo_loss_from_logits(hidden @ b["weight"].T, b["ids"], b["mask"], advantages, old_logps=b["old"],
                                    ref_logps=b["ref"], config=config, backend="torch")
        loss = out.loss
    elif entry == "objective":
        logps = torch.log_softmax(hidden @ b["weight"].T, -1).gather(-1, b["ids"][..., None])[..., 0]
        loss, _ = grpo_objective(logps, torch.zeros_like(logps), b["mask"], advantages, config, old_logps=b["old"],
                                 ref_logps=b["ref"])
    else:  # Liger's module, by its names
        module = FusedLinearGRPOLoss(beta=config.beta, loss_type=config.loss_type, max_completion_length=8,
                                     importance_sampling_level=config.importance_sampling_level, backend="torch")
        loss, _ = module(hidden, b["weight"], b["ids"], b["mask"], advantages, ref_per_token_logps=b["ref"],
                         old_per_token_logps=b["old"])
    (grad,) = torch.autograd.grad(loss, hidden, allow_unused=True)
    return loss.detach(), torch.zeros_like(hidden) if grad is None else grad


@settings(max_examples=60, deadline=None)
@given(entry=st.sampled_from(["loss", "logits", "objective", "module"]), loss_type=st.sampled_from(LOSS_TYPES),
       level=st.sampled_from(["token", "sequence"]), beta=st.sampled_from([0.0, 0.04]),
       B=st.integers(1, 4), T=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_advantages_of_one_column_give_the_loss_of_one_value_per_sequence(entry, loss_type, level, beta, B, T, seed):
    if level == "sequence" and loss_type == "vespo":
        return  # a sequence-level vespo is its own setting (refused alike for both shapes)
    b = _batch(seed, B, T)
    with warnings.catch_warnings():  # TRL's warnings for its off-paper combinations
        warnings.simplefilter("ignore")
        config = GRPOLossConfig(loss_type=loss_type, importance_sampling_level=level, beta=beta,
                                max_completion_length=8)
        expected = _entry(entry, b, b["advantages"], config)
        got = _entry(entry, b, b["advantages"][:, None], config)
    for value, want in zip(got, expected):
        torch.testing.assert_close(value, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape", [(3, 1), (2, 2), (1, 2)])
def test_advantages_of_another_column_shape_are_refused_naming_the_accepted_ones(shape):
    b = _batch(0, 2, 3)
    with pytest.raises(ValueError, match=r"^advantages must have shape \[B\]=\[2\], \[B, 1\]=\[2, 1\] or "
                                         r"\[B, T\]=\[2, 3\], got " + repr(list(shape)).replace("[", r"\[")
                                                                                       .replace("]", r"\]")):
        fused_linear_grpo_loss(b["hidden"], b["weight"], b["ids"], b["mask"], torch.ones(shape, dtype=torch.float64),
                               backend="torch")
