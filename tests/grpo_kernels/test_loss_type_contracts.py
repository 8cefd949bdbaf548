"""Property test of what a loss type is given and holds: a registered term or weights function that cannot take the
arguments the objective passes is refused at registration (not by Python's error about a `<lambda>` on the first
loss), a switch of register_loss_type that is not a bool is refused (bool("False") is True), and a config's
loss_params written to after construction are checked again at the call, by their name."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_kernels import GRPOLossConfig, fused_linear_grpo_loss, register_loss_type, unregister_loss_type

DERANDOMIZE = bool(os.environ.get("CI"))
NAME = "contract_probe"


def _loss(config: GRPOLossConfig) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 3, 4, generator=gen, requires_grad=True)
    out = fused_linear_grpo_loss(hidden, torch.randn(5, 4, generator=gen), torch.randint(0, 5, (2, 3), generator=gen),
                                 torch.ones(2, 3), torch.randn(2, generator=gen), config=config, backend="reference")
    out.loss.backward()
    return out.loss


@st.composite
def functions(draw):
    """A function of `required` positional parameters, `optional` defaulted ones and maybe *args, and whether it
    can be called with `count` positional arguments."""
    required, optional, star = draw(st.integers(0, 4)), draw(st.integers(0, 2)), draw(st.booleans())
    names = [f"a{i}" for i in range(required)] + [f"b{i}" for i in range(optional)]
    params = names[:required] + [f"{name}=None" for name in names[required:]] + (["*rest"] if star else [])
    given = "".join(f"{name}, " for name in names + (["*rest"] if star else []))
    namespace: dict = {}
    body = f"return [a for a in ({given}) if a is not None][0].logps"
    exec(f"def f({', '.join(params)}):\n    {body}", namespace)  # noqa: S102
    return namespace["f"], required, optional, star


def _takes(count: int, required: int, optional: int, star: bool) -> bool:
    return required <= count and (star or count <= required + optional)


@settings(max_examples=60, deadline=None, derandomize=DERANDOMIZE)
@given(functions())
def test_a_term_is_refused_at_registration_unless_it_takes_one_argument(drawn):
    term, required, optional, star = drawn
    try:
        registered = register_loss_type(NAME, term, "sequence_mean", replace=True)
    except TypeError as exc:
        assert not _takes(1, required, optional, star)
        assert str(exc).startswith("term must be a callable term(x: TermInputs)") and "\n" not in str(exc)
        return
    try:
        assert _takes(1, required, optional, star)
        assert torch.isfinite(_loss(GRPOLossConfig(loss_type=registered.name)))
    finally:
        unregister_loss_type(NAME)


@settings(max_examples=40, deadline=None, derandomize=DERANDOMIZE)
@given(functions())
def test_a_weights_function_is_refused_at_registration_unless_it_takes_three_arguments(drawn):
    weights, required, optional, star = drawn
    try:
        register_loss_type(NAME, lambda x: x.logps, lambda *a: weights(*a) if False else a[0] / a[0].numel(),
                           replace=True)  # a valid one: registered for every draw below
        register_loss_type(NAME, lambda x: x.logps, weights, replace=True)
    except TypeError as exc:
        assert not _takes(3, required, optional, star)
        assert str(exc).startswith("aggregation must be a callable weights(mask, config, num_items_in_batch)")
        return
    finally:
        unregister_loss_type(NAME)
    assert _takes(3, required, optional, star)


@pytest.mark.parametrize("flag", ["token_level", "ratio_slope_per_sequence", "separable_by_sequence",
                                  "folds_importance_ratio", "replace"])
@pytest.mark.parametrize("value", ["False", 0, 1, None, [True]])
def test_a_switch_of_register_loss_type_that_is_not_a_bool_is_refused(flag, value):
    with pytest.raises(TypeError, match=f"^{flag} must be True or False, got "):
        register_loss_type(NAME, lambda x: x.logps, "sequence_mean", **{flag: value})
    unregister_loss_type(NAME)


@settings(max_examples=40, deadline=None, derandomize=DERANDOMIZE)
@given(st.sampled_from(["temperature_pos", "temperature_neg", "not_declared"]),
       st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=5), st.none(), st.booleans()))
def test_loss_params_written_after_construction_are_refused_and_checked_at_the_call(name, value):
    config = GRPOLossConfig(loss_type="sapo")
    before = dict(config.loss_params)
    with pytest.raises(TypeError, match="read-only"):  # the config is frozen and hashed by its values
        config.loss_params[name] = value
    assert dict(config.loss_params) == before
    # a mapping put past the frozen dataclass (object.__setattr__) is still checked when the loss runs
    object.__setattr__(config, "loss_params", {**before, name: value})
    declared = name != "not_declared"
    valid = declared and isinstance(value, float) and 0 < value <= 3.4028234663852886e38
    if valid:
        torch.testing.assert_close(_loss(config), _loss(GRPOLossConfig(loss_type="sapo", loss_params={name: value})))
        return
    with pytest.raises(ValueError) as caught:
        _loss(config)
    message = str(caught.value)
    assert message.startswith(f"config.loss_params.{name}: loss_type 'sapo' ") and "\n" not in message
