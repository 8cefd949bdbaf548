"""Advantages as trainers hand them, at every padded entry point: [B, 1] (one per sequence as a column) gives the
loss of the same values as [B], integer advantages the loss of their float values.

TRL's `GRPOTrainer._compute_loss` unsqueezes only a 1-d `advantages` and broadcasts a [B, 1] one over the tokens (a
GRPOTrainer subclass may hand either), and Liger's chunked loss takes [B, 1] alike. Before, every entry point here
refused [B, 1] ("advantages must have shape [B] or [B, T]") and integer advantages ("must be a floating tensor")
while both trainers computed the loss."""

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


@settings(max_examples=40, deadline=None)
@given(entry=st.sampled_from(["loss", "logits", "objective", "module"]), loss_type=st.sampled_from(LOSS_TYPES),
       dtype=st.sampled_from([torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]),
       per_token=st.booleans(), B=st.integers(1, 4), T=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_integer_advantages_give_the_loss_of_their_float_values(entry, loss_type, dtype, per_token, B, T, seed):
    """+1 / -1 rewards used as advantages as they are: TRL's and Liger's arithmetic makes the loss float."""
    b = _batch(seed, B, T)
    low = 0 if dtype == torch.uint8 else -3
    shape = (B, T) if per_token and entry != "module" else (B,)
    integers = torch.randint(low, 4, shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = GRPOLossConfig(loss_type=loss_type, max_completion_length=8)
        expected = _entry(entry, b, integers.to(torch.float32), config)
        got = _entry(entry, b, integers, config)
    for value, want in zip(got, expected):
        torch.testing.assert_close(value, want, rtol=0, atol=0)
