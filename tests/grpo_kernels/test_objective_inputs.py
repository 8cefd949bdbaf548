"""`grpo_objective` called directly (the README lists it as the readable source of the math) is held to the API's
boundary: an input of another shape, kind or dtype, a config that is not a GRPOLossConfig, or beta without
ref_logps is one line naming the argument, before any arithmetic.

Before: it checked nothing. A mask, an entropy or advantages of another shape failed in a broadcast inside torch
("The size of tensor a (4) must match ..."), a dict config and a missing ref_logps as AttributeErrors naming
neither ("'NoneType' object has no attribute 'to'"), a list as "'list' object has no attribute 'dtype'".
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_kernels import GRPOLossConfig, grpo_objective

DERANDOMIZE = bool(os.environ.get("CI"))
ARGUMENTS = ("logps", "entropy", "completion_mask", "advantages", "old_logps", "ref_logps", "importance_ratio")


def _inputs(B: int, T: int) -> dict:
    generator = torch.Generator().manual_seed(B * 31 + T)
    return dict(logps=-torch.rand(B, T, generator=generator), entropy=torch.rand(B, T, generator=generator),
                completion_mask=torch.ones(B, T), advantages=torch.randn(B, generator=generator),
                old_logps=-torch.rand(B, T, generator=generator), ref_logps=-torch.rand(B, T, generator=generator),
                importance_ratio=torch.ones(B, T))


def _faulty(value: torch.Tensor, fault: str, size: int):
    if fault == "longer":  # one more (or several more) positions in the last dimension
        return torch.cat([value, value[..., :1].expand(*value.shape[:-1], size)], -1)
    if fault == "extra_dims":  # two more: never a shape the argument takes ([B] + 1 dim could be [B, T])
        return value[None, None].expand(size, 1, *value.shape)
    if fault == "list":
        return value.tolist()
    if fault == "complex":
        return value.to(torch.complex64)
    raise AssertionError(fault)


@settings(max_examples=80, deadline=None, derandomize=DERANDOMIZE)
@given(argument=st.sampled_from(ARGUMENTS), fault=st.sampled_from(["longer", "extra_dims", "list", "complex"]),
       size=st.integers(1, 4), B=st.integers(1, 4), T=st.integers(2, 6))
def test_an_input_of_another_shape_or_kind_is_refused_naming_it(argument, fault, size, B, T):
    inputs = _inputs(B, T)
    inputs[argument] = _faulty(inputs[argument], fault, size)
    with pytest.raises((TypeError, ValueError)) as refused:
        grpo_objective(**inputs, config=GRPOLossConfig(beta=0.04))
    message = str(refused.value)
    # logps is the anchor: another shape of it is named as the shape the others must have
    named = message.startswith(argument) or (argument == "logps" and "logps' shape" in message)
    assert named and "\n" not in message, message


@pytest.mark.parametrize("config", [{"beta": 0.0}, "dapo", GRPOLossConfig])  # None: the defaults, as the API
def test_a_config_that_is_not_a_grpo_loss_config_is_refused_naming_it(config):
    with pytest.raises(TypeError, match=r"^config must be a GRPOLossConfig, got "):
        grpo_objective(**{**_inputs(2, 3), "ref_logps": None}, config=config)


def test_beta_without_reference_log_probs_is_refused_naming_them():
    with pytest.raises(ValueError, match=r"^config.beta != 0 needs ref_logps"):
        grpo_objective(**{**_inputs(2, 3), "ref_logps": None}, config=GRPOLossConfig(beta=0.04))


def test_the_checked_inputs_give_the_objectives_loss():
    from grpo_kernels.objective import objective_loss

    inputs = _inputs(3, 4)
    config = GRPOLossConfig(beta=0.04)
    torch.testing.assert_close(grpo_objective(**inputs, config=config)[0], objective_loss(**inputs, config=config)[0])
