"""Every path setting (the schema's PathSetting keys), the --config file and the tools' path flags refuse a path
with a shell expansion left in it ($NAME, ${NAME}, $(command), `command`) that names nothing as written: a config file or a flag
in single quotes reaches the engine with no shell to expand it. Before, `run.output_dir: $HOME/runs/x` was taken and
the run wrote into a directory named `$HOME` under the working directory (data.path said only "expected an existing
file"). A path with a `$` that exists as written is taken: a file may have one in its name."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.config import ConfigError, load_config
from grpo_engine.config.path_form import path_form_problem
from grpo_engine.config.strict_yaml import read_yaml
from setting_kinds import path_keys

NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True)
# every form a POSIX shell expands: a variable, a braced parameter, a command in $(...) or in backquotes (its older
# spelling, which the first guard missed: `date` made a directory of that name)
COMMANDS = st.from_regex(r"[a-z]{1,6}( [-+%A-Za-z0-9]{1,6}){0,2}", fullmatch=True)
EXPANSIONS = st.one_of(NAMES.map(lambda n: f"${n}"), NAMES.map(lambda n: f"${{{n}}}"),
                       COMMANDS.map(lambda c: f"$({c})"), COMMANDS.map(lambda c: f"`{c}`"),
                       st.sampled_from(["$(date +%F)", "${HOME:-/tmp}", "$(pwd)", "`date +%F`"]))
PARTS = st.from_regex(r"[a-z0-9_.-]{1,8}", fullmatch=True).filter(lambda part: part not in (".", ".."))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(path_keys()), before=st.lists(PARTS, max_size=2), expansion=EXPANSIONS,
       after=st.lists(PARTS, max_size=2), absolute=st.booleans())
def test_a_path_setting_with_an_unexpanded_shell_expansion_is_refused(key, before, expansion, after, absolute,
                                                                        tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a relative path looks here (nothing of these names exists)
    value = ("/tmp/" if absolute else "") + "/".join([*before, expansion, *after])
    with pytest.raises(ConfigError) as refused:
        load_config(overrides={key: value})
    message = str(refused.value)
    assert message.startswith(f"{key}: expected a path with no shell expansion in it") and "\n" not in message
    assert repr(expansion[:2] if expansion.startswith("$(") else expansion) in message, message


def test_a_yaml_run_directory_of_a_variable_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "config.yaml"
    config.write_text("run:\n  output_dir: $HOME/runs/x\n")
    with pytest.raises(ConfigError, match=r"^run.output_dir: expected a path with no shell expansion in it \('\$HOME' "
                                          r"at character 0"):
        load_config(config)
    assert sorted(tmp_path.iterdir()) == [config]


def test_the_config_flag_names_the_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"^config file '\$\{CONFIGS\}/a.yaml': expected a path with no shell "):
        read_yaml("${CONFIGS}/a.yaml")


@pytest.mark.parametrize("name", ["$HOME", "price$5", "a${b}", "$(x)"])
def test_a_path_that_exists_as_written_is_taken(name, tmp_path):
    (tmp_path / name).mkdir()
    assert path_form_problem(str(tmp_path / name / "run")) is None  # within a directory of that name
    assert path_form_problem(str(tmp_path / name)) is None
    assert path_form_problem(str(tmp_path / "price$5.2")) is None  # `$` then a digit: no shell expansion


def test_a_path_without_a_dollar_sign_is_unaffected(tmp_path):
    assert path_form_problem(str(Path(tmp_path) / "runs" / "x")) is None
