"""A flag naming a setting the schema holds by another key gets that key, not the nearest spelling: a setting the
rollout and the loss share (`--loss.max_completion_length` was told "did you mean --data.max_prompt_length?"),
TRL's name of a loss type's hyper-parameter (`--loss.sapo_temperature_pos`, which docs/engine.md says is refused
naming its loss.params entry, was told "did you mean --rollout.temperature?"), and an entry of a mapping-valued key
written as a flag of its own (`--loss.params.temperature_pos`, the name loss.params' own refusals use). The advice
given is then followed: the setting it names loads."""

from __future__ import annotations

import re

from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.cli import build_parser, main
from grpo_engine.config import SHARED_SETTINGS, flag_value, leaf_fields, load_config
from grpo_engine.config.value_kinds import value_kinds
from grpo_kernels.losses import get_loss_type, loss_param_aliases

ALIASES = loss_param_aliases()
MAPPINGS = [key for key, field in leaf_fields().items() if dict in value_kinds(field.annotation)]
TRAIN_FLAGS = {option for action in build_parser()._subparsers._group_actions[0].choices["train"]._actions
               for option in action.option_strings}


def _refusal(flag: str, capsys) -> str:
    capsys.readouterr()
    assert main(["train", flag, "1"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def _named_flags(line: str) -> list[str]:
    """The flags the advice names (after "grpo-engine train: unknown flag --x: ")."""
    advice = line.split(": ", 2)[2].split(" (grpo-engine")[0]
    return re.findall(r"(?<![\w-])--[a-z][\w.]*[a-z0-9_]", advice)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(sorted(SHARED_SETTINGS)))
def test_a_shared_setting_names_the_key_that_holds_it(key, capsys):
    line = _refusal(f"--{key}", capsys)
    assert f"unknown flag --{key}: {SHARED_SETTINGS[key]}" in line and "did you mean" not in line
    home = re.search(r"set ([a-z_.]+)$", SHARED_SETTINGS[key]).group(1)
    assert f"--{home}" in TRAIN_FLAGS


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(alias=st.sampled_from(sorted(ALIASES)))
def test_trls_name_of_a_hyper_parameter_names_its_loss_params_entry(alias, capsys):
    owner, param = ALIASES[alias]
    line = _refusal(f"--loss.{alias}", capsys)
    assert f"loss.params.{param}" in line and f"loss.loss_type {owner}" in line and "did you mean" not in line
    assert set(_named_flags(line)) <= TRAIN_FLAGS and "--loss.params" in _named_flags(line)
    value = get_loss_type(owner).params[param].default  # the advice, followed: its value loads as that entry
    text = re.search(r"--loss\.params '(.*)'", line).group(1).replace("VALUE", repr(value))
    config = load_config(overrides={"loss.loss_type": owner, "loss.params": flag_value("loss.params", text)})
    assert config.loss.params[param] == value


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(MAPPINGS), entry=st.from_regex(r"[a-z][a-z0-9_]{0,15}", fullmatch=True))
def test_an_entry_of_a_mapping_key_names_that_keys_flag(key, entry, capsys):
    line = _refusal(f"--{key}.{entry}", capsys)
    assert f"--{key} '{{{entry}: VALUE}}'" in line and "did you mean" not in line
    assert set(_named_flags(line)) <= TRAIN_FLAGS
