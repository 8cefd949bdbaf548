"""The trained weights' dtype against the optimizer's step (grpo_engine/model/update_precision.py), checked when
the run starts: hypothesis draws the dtype, the weights' sizes and the learning rate, and a real AdamW step says
which weights it moved. The warning comes exactly when most of them cannot move; an epsilon that rounds to 0 in
the dtype is refused. Before, bfloat16 at the default learning rate 1e-6 (model.dtype auto on CUDA) trained 2% of
the demo model's weights without a word, and float16 wrote NaN at step 1 with the advice to lower the learning
rate."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from accelerate import Accelerator
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from grpo_engine.config import ConfigError
from grpo_engine.model.update_precision import UNCHANGED_SHARE, check_update_precision



def accelerator() -> Accelerator:
    """Made per check: a test elsewhere in the same worker may reset accelerate's shared state, which a module-level
    Accelerator then lacks (AttributeError: no attribute `num_processes`)."""
    return Accelerator(cpu=True)
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def warnings_of(caplog, parameters, lr: float, eps: float, dtype: str) -> list[str]:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="grpo_engine"):
        check_update_precision(accelerator(), parameters, lr, eps, dtype)
    # a step larger than the weights is its own warning (test_learning_rate_size_properties.py)
    return [record.getMessage() for record in caplog.records if "than the trained weights" not in record.getMessage()
            and "of the trained weights themselves" not in record.getMessage()]


def moved_by_one_adamw_step(parameters: list[torch.nn.Parameter], lr: float, eps: float) -> float:
    """The share of weights a real AdamW step of `lr` changed (every gradient 1: the first step moves each weight
    by lr / (1 + eps))."""
    before = [p.detach().clone() for p in parameters]
    for p in parameters:
        p.grad = torch.ones_like(p)
    torch.optim.AdamW(parameters, lr=lr, eps=eps, weight_decay=0.0).step()
    moved = sum(int((p.detach() != b).sum()) for p, b in zip(parameters, before))
    return moved / sum(b.numel() for b in before)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dtype=st.sampled_from(sorted(DTYPES)), scale=st.floats(1e-3, 10.0), lr_exponent=st.floats(-12, -1),
       seed=st.integers(0, 2**16))
@example(dtype="bfloat16", scale=0.02, lr_exponent=-6, seed=0)  # the default on CUDA: warned
@example(dtype="float32", scale=0.02, lr_exponent=-6, seed=0)  # the default on a CPU: silent
@example(dtype="float16", scale=0.001, lr_exponent=-6.625, seed=0)  # a step that float16 alone rounds to a tie
def test_the_warning_comes_exactly_when_a_step_cannot_move_most_weights(dtype, scale, lr_exponent, seed, caplog):
    generator = torch.Generator().manual_seed(seed)
    parameters = [torch.nn.Parameter((torch.randn(64, 32, generator=generator) * scale).to(DTYPES[dtype])),
                  torch.nn.Parameter(torch.ones(32, dtype=DTYPES[dtype]))]  # a norm's weights
    lr, eps = 10.0 ** lr_exponent, 1e-4  # an epsilon every drawn dtype holds
    said = warnings_of(caplog, parameters, lr, eps, dtype)
    unchanged = 1.0 - moved_by_one_adamw_step(parameters, lr, eps)
    margin = 0.05  # rounding to nearest differs in one direction at powers of 2: judged away from the bound
    if unchanged > UNCHANGED_SHARE + margin:
        assert len(said) == 1 and f"optim.learning_rate {lr:g}" in said[0] and "\n" not in said[0], said
        assert f"model.dtype {dtype}" in said[0] and ("float32" in said[0] or dtype == "float32"), said
    elif unchanged < UNCHANGED_SHARE - margin:
        assert said == [], (unchanged, said)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_an_epsilon_that_rounds_to_0_in_the_weights_dtype_is_refused(dtype):
    """float16 cannot hold AdamW's default epsilon 1e-8: the step divides by 0 (NaN at once, measured below);
    bfloat16 and float32 hold it."""
    parameter = torch.nn.Parameter(torch.full((8,), 0.02, dtype=DTYPES[dtype]))
    rounds_to_0 = float(torch.tensor(1e-8, dtype=DTYPES[dtype])) == 0.0
    if rounds_to_0:
        with pytest.raises(ConfigError, match=rf"optim.adam_epsilon 1e-08 rounds to 0 in {dtype}.*model.dtype "
                                              rf"{dtype}.*LoRA"):
            check_update_precision(accelerator(), [parameter], 1e-3, 1e-8, dtype)
        parameter.grad = torch.zeros_like(parameter)  # a weight the batch did not reach: 0 / 0
        torch.optim.AdamW([parameter], lr=1e-3, eps=1e-8).step()
        assert not bool(parameter.isfinite().all())
    else:
        check_update_precision(accelerator(), [parameter], 1e-3, 1e-8, dtype)
    assert rounds_to_0 == (dtype == "float16")


def test_a_learning_rate_of_0_is_said_once_as_training_nothing(caplog):
    parameters = [torch.nn.Parameter(torch.randn(16))]
    (said,) = warnings_of(caplog, parameters, 0.0, 1e-8, "float32")
    assert said == ("warning: optim.learning_rate is 0: no trained weight can change, so the run samples and scores "
                    "without training")
    assert math.isclose(moved_by_one_adamw_step(parameters, 0.0, 1e-8), 0.0)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(scale=st.floats(1e-3, 1.0), lr_exponent=st.floats(-40, -2), rank=st.integers(1, 8), seed=st.integers(0, 2**16))
@example(scale=0.1, lr_exponent=-30, rank=4, seed=0)  # LoRA at a learning rate of 1e-30: A never moves
def test_weights_at_0_do_not_hide_a_step_that_moves_none_of_the_others(scale, lr_exponent, rank, seed, caplog):
    """LoRA's B starts at 0, where any step moves it, but what B moves is its product with A, whose own size decides:
    judged on the weights that are not 0 (counting B, half of a LoRA run's weights, hid a 1e-30 learning rate)."""
    generator = torch.Generator().manual_seed(seed)
    a = torch.nn.Parameter(torch.randn(rank, 64, generator=generator) * scale)  # LoRA's A
    b = torch.nn.Parameter(torch.zeros(64, rank))  # LoRA's B
    lr, eps = 10.0 ** lr_exponent, 1e-8
    said = warnings_of(caplog, [a, b], lr, eps, "float32")
    unchanged_a = 1.0 - moved_by_one_adamw_step([a], lr, eps)
    if unchanged_a > UNCHANGED_SHARE + 0.05:
        assert len(said) == 1 and "of the trained weights that are not 0" in said[0], said
    elif unchanged_a < UNCHANGED_SHARE - 0.05:
        assert said == [], (unchanged_a, said)
