"""Property test: a real number reaches every scalar setting of the loss library in whatever type the caller holds
it (builtin int or float, numpy's float16/32/64 and integers, Fraction, Decimal), and means the same as the builtin
float it reads as: GRPOLossConfig's settings, the Liger-compatible constructor's, a registered loss type's
hyper-parameters, LogitTransform's, linear_logprobs' temperature and the loss's num_items_in_batch. Outside its
bounds, or of a kind that is no number (text, bool, tensor, array), it is refused by one line naming it."""

from __future__ import annotations

import dataclasses
import decimal
import fractions
import os
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_kernels import FusedLinearGRPOLoss, GRPOLossConfig, LogitTransform, fused_linear_grpo_loss, linear_logprobs

DERANDOMIZE = bool(os.environ.get("CI"))
NUMERIC = [f.name for f in dataclasses.fields(GRPOLossConfig)
           if f.name not in ("loss_type", "importance_sampling_level", "use_bias_correction_kl", "loss_params")]
CARRIERS = [float, np.float64, np.float32, fractions.Fraction, decimal.Decimal]
INT_CARRIERS = [int, np.int64, np.int32, np.int16]
NOT_NUMBERS = ["0.5", True, np.bool_(True), torch.tensor(0.5), np.array(0.5), [0.5], 0.5j]


def carried(value: float, carrier: type) -> object:
    """`value` in the type `carrier`, as exactly as that type holds it."""
    if carrier is fractions.Fraction:
        return fractions.Fraction(value)
    if carrier is decimal.Decimal:
        return decimal.Decimal(value)
    return carrier(value)


def _one_line_naming(exc: BaseException, name: str) -> None:
    message = str(exc)
    assert "\n" not in message and name in message and len(message) < 400, message


def _config(**settings_) -> GRPOLossConfig:
    with warnings.catch_warnings():  # TRL's warnings about some combinations: not what is tested here
        warnings.simplefilter("ignore")
        return GRPOLossConfig(**settings_)


@settings(max_examples=120, deadline=None, derandomize=DERANDOMIZE)
@given(st.sampled_from(NUMERIC), st.floats(-4, 600, allow_nan=False), st.sampled_from(CARRIERS + INT_CARRIERS))
def test_a_setting_reads_the_same_in_any_number_type(name, raw, carrier):
    integral = carrier in INT_CARRIERS
    value = carried(round(raw) if integral else raw, carrier)
    builtin = int(value) if integral else float(value)
    try:
        expected = _config(**{name: builtin})
    except (TypeError, ValueError) as builtin_refused:
        with pytest.raises(type(builtin_refused)) as caught:
            _config(**{name: value})
        _one_line_naming(caught.value, name)
        return
    config = _config(**{name: value})
    stored = getattr(config, name)
    assert type(stored) in (int, float), (name, type(stored))  # what asdict, JSON and YAML write
    assert stored == getattr(expected, name) and config == expected and hash(config) == hash(expected)


@settings(max_examples=60, deadline=None, derandomize=DERANDOMIZE)
@given(st.sampled_from(NUMERIC + ["epsilon_low", "sapo_temperature_pos", "temperature"]),
       st.sampled_from(NOT_NUMBERS))
def test_a_value_that_is_no_number_is_refused_naming_the_setting(name, value):
    if name not in ("epsilon_low", "sapo_temperature_pos"):
        with pytest.raises((TypeError, ValueError)) as caught:
            GRPOLossConfig(**{name: value})
        _one_line_naming(caught.value, name)
    with pytest.raises((TypeError, ValueError)) as caught:
        FusedLinearGRPOLoss(**({"loss_type": "sapo"} if name.startswith("sapo") else {}), **{name: value})
    _one_line_naming(caught.value, name)


@settings(max_examples=40, deadline=None, derandomize=DERANDOMIZE)
@given(st.sampled_from(CARRIERS), st.floats(0.25, 4.0))
def test_the_liger_constructor_and_a_loss_types_hyper_parameters_take_any_number_type(carrier, raw):
    value = carried(raw, carrier)
    module = FusedLinearGRPOLoss(loss_type="sapo", epsilon_low=value, sapo_temperature_pos=value, temperature=value)
    assert module.config.epsilon == float(value) and type(module.config.epsilon) is float
    assert module.config.temperature == float(value)
    assert module.config.loss_params["temperature_pos"] == float(value)
    assert type(module.config.loss_params["temperature_pos"]) is float


@settings(max_examples=40, deadline=None, derandomize=DERANDOMIZE,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(CARRIERS + INT_CARRIERS), st.floats(0.5, 40.0), st.integers(0, 100))
def test_call_scalars_in_any_number_type_give_the_builtin_floats_answer(carrier, raw, seed):
    """LogitTransform's scale and softcap, linear_logprobs' temperature and the loss's num_items_in_batch."""
    value = carried(max(1, round(raw)) if carrier in INT_CARRIERS else raw, carrier)
    builtin = float(value)
    gen = torch.Generator().manual_seed(seed)
    hidden, weight = torch.randn(2, 3, 4, generator=gen), torch.randn(7, 4, generator=gen)
    ids, mask, advantages = torch.randint(0, 7, (2, 3), generator=gen), torch.ones(2, 3), torch.randn(2, generator=gen)
    for transform in (dict(scale=value), dict(softcap=value)):
        assert LogitTransform(**transform) == LogitTransform(**{k: builtin for k in transform})
    torch.testing.assert_close(linear_logprobs(hidden, weight, ids, temperature=value, backend="reference"),
                               linear_logprobs(hidden, weight, ids, temperature=builtin, backend="reference"),
                               rtol=0, atol=0)
    loss = fused_linear_grpo_loss(hidden, weight, ids, mask, advantages, num_items_in_batch=value, backend="reference",
                                  config=GRPOLossConfig(loss_type="dapo")).loss
    expected = fused_linear_grpo_loss(hidden, weight, ids, mask, advantages, num_items_in_batch=builtin,
                                      backend="reference", config=GRPOLossConfig(loss_type="dapo")).loss
    torch.testing.assert_close(loss, expected, rtol=0, atol=0)
