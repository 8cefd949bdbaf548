"""A checkpoint's config.yaml with a setting this engine does not have (edited in, or saved by another version) or
without one of its settings (saved by an earlier version) is refused in one line naming the settings, as such.
Before, each was a "changed option" with None on the other side, and the advice to resume with the saved values was
a dead end: `--run.colour red` is an unknown flag, `--optim.padding_free null` a value the setting does not take.
Settings that may change on resume may be missing (data.max_prompt_chars, added later); loss.params' keys are
values, not settings. A setting added since (ADDED_SETTINGS) may be missing too: the run it records trained as the
value that does what the engine did before it, which the resume then compares as the saved value."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.config import config_yaml, leaf_keys, load_config
from grpo_engine.state.checkpoint_error import CheckpointError
from grpo_engine.state.resume import MAY_CHANGE_ON_RESUME, changed_options
from grpo_engine.state.saved_settings import ADDED_SETTINGS

KEYS = st.from_regex(r"[a-z][a-z_]{0,10}", fullmatch=True)
FIXED = sorted(set(leaf_keys()) - set(MAY_CHANGE_ON_RESUME) - set(ADDED_SETTINGS))


def _saved(overrides: dict | None = None) -> tuple[dict, object]:
    config = load_config(overrides={"run.output_dir": "r", **(overrides or {})})
    return yaml.safe_load(config_yaml(config)), config


def _remove(tree: dict, dotted: str) -> None:
    *parents, leaf = dotted.split(".")
    for part in parents:
        tree = tree[part]
    del tree[leaf]


def _refusal(tree: dict, config: object) -> str:
    with pytest.raises(CheckpointError) as refused:
        changed_options(yaml.safe_dump(tree, sort_keys=False), config, "ckpt/config.yaml")
    message = str(refused.value)
    assert "\n" not in message and message.startswith("ckpt/config.yaml has ") and "saved None" not in message
    return message


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(section=st.sampled_from(["model", "data", "rollout", "run", "optim", "model.lora", "new_section"]),
       name=KEYS, value=st.one_of(st.integers(), st.text(max_size=4), st.booleans()))
def test_a_setting_this_engine_does_not_have_is_named(section, name, value):
    tree, config = _saved()
    node = tree
    for part in section.split("."):
        node = node.setdefault(part, {})
    dotted = f"{section}.{name}"
    if dotted in leaf_keys():
        return  # a setting the engine has
    node[name] = value
    message = _refusal(tree, config)
    assert f"settings this version does not have ({dotted})" in message


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(removed=st.lists(st.sampled_from(FIXED), min_size=1, max_size=3, unique=True))
def test_a_setting_missing_from_the_saved_config_is_named(removed):
    tree, config = _saved()
    for key in removed:
        _remove(tree, key)
    message = _refusal(tree, config)
    assert f"no value for settings this version has ({', '.join(k for k in leaf_keys() if k in removed)})" in message


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(removed=st.lists(st.sampled_from(sorted(MAY_CHANGE_ON_RESUME)), max_size=3, unique=True))
def test_settings_that_may_change_may_be_missing_and_loss_params_are_values(removed):
    tree, config = _saved({"loss.loss_type": "sapo"})  # its params: temperature_pos, temperature_neg
    assert tree["loss"]["params"]
    for key in removed:
        _remove(tree, key)
    assert changed_options(yaml.safe_dump(tree, sort_keys=False), config, "ckpt/config.yaml") == {}


@pytest.mark.parametrize("key", sorted(ADDED_SETTINGS))
def test_a_setting_added_since_the_checkpoint_was_saved_resumes_as_the_earlier_engine_ran(key):
    earlier = ADDED_SETTINGS[key]
    tree, config = _saved({key: earlier})
    _remove(tree, key)
    assert changed_options(yaml.safe_dump(tree, sort_keys=False), config, "ckpt/config.yaml") == {}
    tree, default = _saved()
    now = yaml.safe_load(config_yaml(default))
    for part in key.split("."):
        now = now[part]
    assert now != earlier  # the default differs: the resume must say which value the run trained with
    _remove(tree, key)
    assert changed_options(yaml.safe_dump(tree, sort_keys=False), default, "ckpt/config.yaml") == {key: (earlier, now)}
