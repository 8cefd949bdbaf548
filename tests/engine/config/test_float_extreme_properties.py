"""Every float key of the config at the extremes of a float64 (1e308, just past float32's 3.4e38, subnormals, -0.0)
is refused in one line naming the key, or is a value the engine computes with: within float32's range (the
weights, AdamW's step, the sampler's logits and the advantages are float32), a divisor of the logits no smaller
than the smallest temperature, a weight decay that shrinks the weights. Before: optim.learning_rate 3.5e38 failed
inside AdamW (34 lines), loss.epsilon 1e308 inside the loss (53 lines), rollout.repetition_penalty 1e-320 in the
sampler (41 lines), and optim.weight_decay 3.5e38 saved a checkpoint of NaN weights; rollout.temperature 3e38 was
taken, and every logit divided by it rounded to 0 (uniform samples, no gradient)."""

from __future__ import annotations

import typing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_engine.config import ConfigError, leaf_fields, load_config
from grpo_kernels.config import MAX_TEMPERATURE, MIN_TEMPERATURE
from grpo_kernels.losses import FLOAT32_MAX

EXTREMES = [1e308, -1e308, 3.5e38, -3.5e38, FLOAT32_MAX, 3e38, 1e31, 1e-320, 5e-324, -0.0, 1e-45, 2.5]
# keys that divide the logits: a subnormal divisor makes them infinite
DIVISORS = {"rollout.temperature", "rollout.repetition_penalty"}


def _float_keys() -> list[str]:
    def has_float(annotation) -> bool:
        return annotation is float or any(has_float(arg) for arg in typing.get_args(annotation))
    return sorted(key for key, field in leaf_fields().items() if has_float(field.annotation))


FLOAT_KEYS = _float_keys()


def test_the_float_keys_are_found():
    assert {"optim.learning_rate", "loss.epsilon", "rollout.repetition_penalty", "rewards.weights"} <= set(FLOAT_KEYS)


@pytest.mark.filterwarnings("ignore::UserWarning")
@settings(max_examples=60, deadline=None)
@given(key=st.sampled_from(FLOAT_KEYS), value=st.sampled_from(EXTREMES) | st.floats(allow_nan=False,
                                                                                    allow_infinity=False),
       other_learning_rate=st.sampled_from([None, 1e-2, 1.0]))
def test_a_float_key_at_an_extreme_is_refused_naming_it_or_computable(key, value, other_learning_rate):
    overrides = {key: [value, 1.0] if key == "rewards.weights" else value}
    if key == "rewards.weights":
        overrides["rewards.functions"] = ["math_accuracy", "length"]
    if other_learning_rate is not None and key != "optim.learning_rate":
        overrides["optim.learning_rate"] = other_learning_rate
    try:
        config = load_config(overrides=overrides)
    except ConfigError as exc:
        message = str(exc)
        assert "\n" not in message and key in message, message
        return
    assert abs(value) <= FLOAT32_MAX, f"{key}={value!r} accepted past float32's range"
    if key in DIVISORS:
        assert value >= MIN_TEMPERATURE, f"{key}={value!r} accepted: the logits divided by it overflow"
        assert value <= MAX_TEMPERATURE, f"{key}={value!r} accepted: the logits divided by it all round to 0"
    assert config.optim.learning_rate * config.optim.weight_decay <= 1, overrides
