"""A temperature past 1e30 (1 / the smallest one) is refused in one line, by GRPOLossConfig and by the functions
that take a temperature themselves: the kernels multiply the logits by 1 / temperature, and below 1e-30 every logit
up to 1e8 in magnitude rounds to a value exp takes to exactly 1 in float32 (uniform log-probs, no gradient).
Before, 3e38 was taken and the loss trained nothing, silently. Every temperature within the bounds is taken."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from grpo_kernels import GRPOLossConfig
from grpo_kernels.config import MAX_TEMPERATURE, MIN_TEMPERATURE
from grpo_kernels.losses import FLOAT32_MAX
from grpo_kernels.validation import check_temperature

PAST = st.floats(min_value=math.nextafter(MAX_TEMPERATURE, math.inf), max_value=FLOAT32_MAX)
WITHIN = st.floats(min_value=MIN_TEMPERATURE, max_value=MAX_TEMPERATURE)


def test_the_ceiling_is_where_float32_logits_stop_mattering():
    logits = torch.tensor([1e8, -1e8, 0.0]) * (1 / MAX_TEMPERATURE)
    assert torch.equal(torch.exp(logits), torch.ones(3))  # exactly uniform at the ceiling already


@settings(max_examples=40, deadline=None)
@given(temperature=PAST)
def test_a_temperature_past_the_ceiling_is_one_line(temperature):
    for refuse in (lambda: GRPOLossConfig(temperature=temperature), lambda: check_temperature(temperature)):
        with pytest.raises(ValueError) as raised:
            refuse()
        message = str(raised.value)
        assert message.startswith("temperature must") and "1e+30" in message and "\n" not in message, message


@settings(max_examples=40, deadline=None)
@given(temperature=WITHIN)
def test_a_temperature_within_the_bounds_is_taken(temperature):
    assert GRPOLossConfig(temperature=temperature).temperature == temperature
    assert check_temperature(temperature) == temperature
