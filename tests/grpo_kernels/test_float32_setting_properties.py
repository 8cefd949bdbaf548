"""Every float setting of GRPOLossConfig, at the extremes of a float64 (1e308, just past float32's 3.4e38,
subnormals, -0.0): either accepted, with a finite loss and gradients, or refused in one line naming the setting.
Past float32's range an epsilon or delta failed inside torch ("value cannot be converted to type float without
overflow"), and a beta or entropy_coef made the loss inf silently."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_kernels import GRPOLossConfig, fused_linear_grpo_loss
from grpo_kernels.losses import FLOAT32_MAX

FLOAT_SETTINGS = [f.name for f in dataclasses.fields(GRPOLossConfig)
                  if "setting" in f.metadata and "float" in str(f.type)]
EXTREMES = [1e308, -1e308, 3.5e38, -3.5e38, FLOAT32_MAX, 1e38, 1e-320, 5e-324, -0.0, 1e-45, 2.0]


def test_the_float_settings_are_found():
    assert {"beta", "epsilon", "epsilon_high", "delta", "entropy_coef", "temperature"} <= set(FLOAT_SETTINGS)


@pytest.mark.filterwarnings("ignore::UserWarning")
@settings(max_examples=25, deadline=None)
@given(name=st.sampled_from(FLOAT_SETTINGS), value=st.sampled_from(EXTREMES) | st.floats(allow_nan=False),
       loss_type=st.sampled_from(["dapo", "grpo", "cispo", "sapo"]))
def test_a_float_setting_at_an_extreme_is_taken_or_named(name, value, loss_type):
    try:
        config = GRPOLossConfig(loss_type=loss_type, **{name: value})
    except (TypeError, ValueError) as exc:
        message = str(exc)
        assert message.startswith(name) and "\n" not in message, message
        return
    assert abs(value) <= FLOAT32_MAX, f"{name}={value!r} accepted past float32's range"
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 3, 4, generator=gen, requires_grad=True)
    weight = torch.randn(5, 4, generator=gen, requires_grad=True)
    # a beta or entropy coefficient near float32's end may overflow the loss's sum: that is the product's, not
    # the setting's; a value a tenth of it is the check here
    if name in ("beta", "entropy_coef") and abs(value) > 1e37:
        return
    out = fused_linear_grpo_loss(hidden, weight, torch.randint(0, 5, (2, 3), generator=gen), torch.ones(2, 3),
                                 torch.randn(2, generator=gen), config=config, backend="torch",
                                 old_logps=torch.full((2, 3), -1.2), ref_logps=torch.full((2, 3), -1.0))
    out.loss.backward()
    assert math.isfinite(float(out.loss)) and torch.isfinite(hidden.grad).all() and torch.isfinite(weight.grad).all()
