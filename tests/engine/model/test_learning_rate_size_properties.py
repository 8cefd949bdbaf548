"""A learning rate larger than most of the trained weights themselves is said once when the run starts
(grpo_engine/model/update_precision.py): hypothesis draws the dtype, the weights' size and the learning rate, and a
real AdamW step says how many weights it moved by more than their own size. The warning comes exactly when most of
them (UNCHANGED_SHARE) are; a weight of 0 (LoRA's B) has no size to lose and is not counted. Before, optim.learning_rate
0.1 to 0.5 for full fine-tuning (a pretrained model's weights are about 0.02) overwrote the model without a word.
A learning rate that float32 itself rounds to 0 (1e-50) is said with float32 copies of the weights too, as 0 is."""

from __future__ import annotations

import logging

import pytest
import torch
from accelerate import Accelerator
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from grpo_engine.model.update_precision import UNCHANGED_SHARE, check_update_precision



def accelerator() -> Accelerator:
    """Made per check: a test elsewhere in the same worker may reset accelerate's shared state, which a module-level
    Accelerator then lacks (AttributeError: no attribute `num_processes`)."""
    return Accelerator(cpu=True)
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
OVERSIZED = "of the trained weights themselves"


def said(caplog, parameters, lr: float, dtype: str, float32_steps: bool = False) -> list[str]:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="grpo_engine"):
        check_update_precision(accelerator(), parameters, lr, 1e-8, dtype, float32_steps=float32_steps)
    return [record.getMessage() for record in caplog.records]


def moved_past_their_size(parameters: list[torch.nn.Parameter], lr: float) -> float:
    """The share of the nonzero weights that one real AdamW step of `lr` (random gradients) changed by more than
    their own magnitude."""
    before = [p.detach().float().clone() for p in parameters]
    for p in parameters:
        p.grad = torch.randn_like(p)
    torch.optim.AdamW(parameters, lr=lr, eps=1e-8, weight_decay=0.0).step()
    nonzero = sum(int((b != 0).sum()) for b in before)
    past = sum(int((((p.detach().float() - b).abs() > b.abs()) & (b != 0)).sum()) for p, b in zip(parameters, before))
    return past / nonzero


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dtype=st.sampled_from(sorted(DTYPES)), scale=st.floats(1e-3, 1.0), lr=st.floats(1e-4, 0.5),
       zeros=st.integers(0, 3), seed=st.integers(0, 2**16))
@example(dtype="float32", scale=0.02, lr=0.1, zeros=0, seed=0)  # full fine-tuning at 0.1: said
@example(dtype="float32", scale=0.02, lr=1e-6, zeros=0, seed=0)  # TRL's default: silent
@example(dtype="float32", scale=0.02, lr=1e-3, zeros=3, seed=0)  # LoRA's B of zeros beside A: silent
def test_the_warning_comes_exactly_when_a_step_outweighs_most_weights(dtype, scale, lr, zeros, seed, caplog):
    generator = torch.Generator().manual_seed(seed)
    parameters = [torch.nn.Parameter((torch.randn(64, 32, generator=generator) * scale).to(DTYPES[dtype]))]
    parameters += [torch.nn.Parameter(torch.zeros(64, 32, dtype=DTYPES[dtype])) for _ in range(zeros)]
    messages = [m for m in said(caplog, parameters, lr, dtype) if OVERSIZED in m]
    past = moved_past_their_size(parameters, lr)
    margin = 0.05  # a weight near the learning rate in size: judged away from the bound
    if past > UNCHANGED_SHARE + margin:
        assert len(messages) == 1 and f"optim.learning_rate {lr:g} is larger than" in messages[0], messages
        assert "\n" not in messages[0]
    elif past < UNCHANGED_SHARE - margin:
        assert messages == [], (past, messages)


@pytest.mark.parametrize("lr", [1e-50, 1e-46])
def test_a_learning_rate_float32_rounds_to_0_is_said_with_float32_copies(lr, caplog):
    parameters = [torch.nn.Parameter(torch.randn(256) * 0.02)]
    (message,) = said(caplog, parameters, lr, "bfloat16", float32_steps=True)
    assert f"optim.learning_rate {lr:g} rounds back to the same weight for 100%" in message, message
    assert said(caplog, parameters, 1e-6, "bfloat16", float32_steps=True) == []
