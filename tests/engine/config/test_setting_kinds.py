"""Two kinds of settings mean the same whichever setting of the kind it is, by their types in the schema:
`~` in every path setting is the home directory (as the shell reads it), and every list setting takes one value
alone as a list of one. Both walk every setting of the kind, found by its type; a setting named like a path must
be typed as one."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest
from setting_kinds import list_keys, path_keys

from grpo_engine.cli import join_flag_values, _overrides, build_parser
from grpo_engine.config import ConfigError, leaf_fields, load_config
from grpo_engine.config.applicability import value_at
from grpo_engine.config.strict_yaml import dump_yaml

PATHS, LISTS = path_keys(), list_keys()
PARSER = build_parser()
# Hub ids stay ids; the rest name files. A setting named like these is a path and must be typed as one.
NAMED_LIKE_A_PATH = re.compile(r"(_dir|path|resume)$")


def _nested(key: str, value) -> dict:
    *sections, leaf = key.split(".")
    tree = {leaf: value}
    for section in reversed(sections):
        tree = {section: tree}
    return tree


def loaded(how: str, key: str, value, tmp_path: Path):
    """The config with `key` set to `value` by an override, a flag or a YAML file."""
    if how == "override":
        return load_config(overrides={key: value})
    if how == "flag":
        args = PARSER.parse_args(join_flag_values(["train", f"--{key}", str(value)]))
        return load_config(overrides=_overrides(args, {}))
    path = tmp_path / "config.yaml"
    path.write_text(dump_yaml(_nested(key, value)))
    return load_config(path)


def test_every_setting_named_like_a_path_is_typed_as_one():
    named = {key for key in leaf_fields() if NAMED_LIKE_A_PATH.search(key)}
    assert named and named <= set(PATHS), named - set(PATHS)


@pytest.mark.parametrize("how", ["override", "flag", "yaml"])
@pytest.mark.parametrize("key", PATHS)
def test_tilde_is_the_home_directory_in_every_path_setting(key, how, tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / "x").mkdir(parents=True)  # a model directory, a data directory, a run directory alike
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    config = loaded(how, key, "~/x", tmp_path)
    assert value_at(config, key) == str(home / "x")


def test_a_run_directory_under_tilde_is_made_in_home_not_in_a_directory_named_tilde(tmp_path, monkeypatch):
    from grpo_engine.state.run_lock import hold_run_directory

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    config = load_config(overrides={"run.output_dir": "~/run"})
    assert config.run.output_dir == str(tmp_path / "home" / "run")
    with hold_run_directory(config.run.output_dir):
        pass
    assert not (tmp_path / "~").exists()


def test_a_user_without_a_home_is_refused_naming_the_key():
    # kept as written, it was refused when the run started, as "cannot be resolved ... a symbolic link that leads
    # back to itself?" (test_path_form_properties.py: the rule for every path setting and argument)
    with pytest.raises(ConfigError, match=r"^run.output_dir: expected a path whose leading ~nosuchuser-here names"):
        load_config(overrides={"run.output_dir": "~nosuchuser-here/x"})


def _one_item(key: str):
    """A valid item of list setting `key`, from its type and default."""
    default = leaf_fields()[key].get_default(call_default_factory=True)
    if isinstance(default, list) and default:
        return default[0]
    annotation = str(leaf_fields()[key].annotation)
    if "Literal" in annotation:
        return typing.get_args(typing.get_args(leaf_fields()[key].annotation)[0])[0]
    return 1.5 if "float" in annotation else "q_proj"


@pytest.mark.parametrize("how", ["override", "flag", "yaml"])
@pytest.mark.parametrize("key", LISTS)
def test_a_list_setting_takes_one_value_as_a_list_of_one(key, how, tmp_path):
    item = _one_item(key)
    config = loaded(how, key, item, tmp_path)
    assert value_at(config, key) == [item]


def test_the_walks_find_the_settings_the_issue_named():
    assert {"run.output_dir", "data.path", "model.name_or_path", "rollout.server.weights_dir"} <= set(PATHS)
    assert {"rollout.server.urls", "rewards.functions", "run.report_to", "rewards.weights"} <= set(LISTS)
