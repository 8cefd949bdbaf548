"""FusedLinearGRPOLoss's constructor arguments are its attributes, as on Liger's module (which keeps self.beta, ...
and reads them in forward): reading one gives the value the module computes with, and setting one is the
constructor with that value (its checks, its message, the module unchanged on a refusal).

Before: setting `module.beta = 0.0` (a KL coefficient annealed between steps, as code written for Liger does) was a
plain attribute that forward never read, so the loss kept the old coefficient silently; reading one failed
(AttributeError); `module.use_ref_model = "no"` was taken as true; `module.config = {...}` failed inside forward.
A misspelt setting (`module.bta = 0.0`) or GRPOLossConfig's name for one the module calls otherwise
(`module.epsilon` for `epsilon_low`) became a plain attribute that nothing read, silently.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
import warnings

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from grpo_kernels import FusedLinearGRPOLoss, GRPOLossConfig
from grpo_kernels.losses import loss_type_names
from grpo_testing import make_problem

DERANDOMIZE = bool(os.environ.get("CI"))
NAMES = list(inspect.signature(FusedLinearGRPOLoss).parameters)
STARTS = [{}, {"loss_type": "sapo"}, {"loss_type": "vespo", "beta": 0.0}, {"loss_type": "dr_grpo",
                                                                            "max_completion_length": 8}]
VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2, 600), st.floats(-1e40, 1e40),
                   st.sampled_from([float("nan"), float("inf"), 0.5, 1.5, 0.04, 7]),
                   st.sampled_from([*loss_type_names(), "token", "sequence", "auto", "torch", "gem", "GRPO"]),
                   st.sampled_from([{}, {"temperature_pos": 2.0}, {"k_pos": 1.0}, {"unknown": 1}, [1], "text"]))


def _state(module: FusedLinearGRPOLoss) -> tuple:
    return module.config, {name: getattr(module, name) for name in NAMES}


def _built(**arguments) -> FusedLinearGRPOLoss:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # combinations TRL warns about: the same warning either way
        return FusedLinearGRPOLoss(**arguments)


@settings(max_examples=300, deadline=None, derandomize=DERANDOMIZE)
@given(name=st.sampled_from(NAMES), value=VALUES, start=st.sampled_from(STARTS))
def test_setting_an_argument_is_the_constructor_with_that_argument(name, value, start):
    module = _built(**start)
    try:
        expected = _built(**{**start, name: value})
    except (TypeError, ValueError) as exc:
        before = _state(module)
        with pytest.raises(type(exc)) as refused, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            setattr(module, name, value)
        assert str(refused.value) == str(exc)
        assert _state(module) == before  # a refused value changes nothing
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        setattr(module, name, value)
    assert _state(module) == _state(expected)


def test_forward_computes_with_a_setting_changed_after_construction():
    p = make_problem(0, B=2, T=4, H=16, V=40)

    def loss(module):
        return module(p.hidden, p.weight, p.completion_ids, p.completion_mask, p.advantages,
                      ref_per_token_logps=p.ref_logps, old_per_token_logps=p.old_logps)[0]

    module = FusedLinearGRPOLoss(beta=0.04)
    module.beta, module.epsilon_low, module.temperature = 0.5, 0.05, 0.7
    assert module.beta == 0.5 and module.config.epsilon == 0.05
    torch.testing.assert_close(loss(module), loss(FusedLinearGRPOLoss(beta=0.5, epsilon_low=0.05, temperature=0.7)))
    module.config = GRPOLossConfig(loss_type="grpo", beta=0.1)
    assert module.beta == 0.1 and module.loss_type == "grpo"
    with pytest.raises(TypeError, match=r"^config must be a GRPOLossConfig, got dict$"):
        module.config = {"beta": 0.1}
    assert module.beta == 0.1


def test_a_module_pickled_when_its_settings_were_plain_attributes_loads_with_them():
    module = FusedLinearGRPOLoss(beta=0.2, backend="torch")
    state = {key: value for key, value in vars(module).items() if key not in ("_config", "_options")}
    state.update(config=module.config, use_ref_model=False, backend="torch", workspace_bytes=None,
                 process_group=None)  # the instance dict of a module pickled before this release
    loaded = FusedLinearGRPOLoss.__new__(FusedLinearGRPOLoss)
    loaded.__setstate__(state)
    assert loaded.config == module.config and loaded.beta == 0.2 and loaded.use_ref_model is False
    assert loaded.backend == "torch" and loaded.compiled is True and loaded.chunk_size == 1


def _misspelt(name: str, how: str, at: int) -> str:
    """`name` with one slip: a letter dropped or typed twice, at a drawn place."""
    at %= len(name)
    return name[:at] + name[at + 1:] if how == "drop" else name[:at + 1] + name[at:]


@settings(max_examples=80, deadline=None, derandomize=DERANDOMIZE)
@given(name=st.sampled_from(NAMES), how=st.sampled_from(["drop", "double"]), at=st.integers(0, 40),
       start=st.sampled_from(STARTS))
def test_a_misspelt_setting_set_as_an_attribute_is_refused_naming_the_setting(name, how, at, start):
    # Before: a plain attribute no forward read, the loss keeping the old value without a word
    module = _built(**start)
    typo = _misspelt(name, how, at)
    assume(not hasattr(module, typo) and not typo.startswith("_"))
    before = _state(module)
    with pytest.raises(AttributeError) as refused:
        setattr(module, typo, 0.5)
    message = str(refused.value)
    assert message.startswith(f"FusedLinearGRPOLoss has no setting {typo!r}") and "\n" not in message, message
    assert re.search(r"did you mean '(\w+)'\?$", message).group(1) in NAMES, message
    assert _state(module) == before and typo not in vars(module)


@pytest.mark.parametrize("config_name", sorted(set(f.name for f in dataclasses.fields(GRPOLossConfig))
                                                - set(NAMES)))
def test_a_grpo_loss_config_name_the_module_calls_otherwise_is_refused_naming_the_modules(config_name):
    module = FusedLinearGRPOLoss()
    with pytest.raises(AttributeError, match=r"; did you mean '(\w+)'\?$") as refused:
        setattr(module, config_name, 0.3)  # TRL's `epsilon` for Liger's `epsilon_low`: ignored before
    assert re.search(r"'(\w+)'\?$", str(refused.value)).group(1) in NAMES


@pytest.mark.parametrize("own", ["backbone_calls", "step", "history", "logger", "ema_decay", "my_scale"])
def test_an_attribute_of_the_callers_own_is_set_as_on_any_module(own):
    module = FusedLinearGRPOLoss()
    setattr(module, own, [1])
    assert getattr(module, own) == [1] and module.config == FusedLinearGRPOLoss().config
