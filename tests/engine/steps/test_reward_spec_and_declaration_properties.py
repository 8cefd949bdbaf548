"""Property tests of how a reward function is named and what it declares of the data.

A spec is a built-in name or `package.module:function` with the module a dotted name of identifiers. A file named
where the module goes (`rewards.py:score`, `./dir/rewards.py:score`) passed the schema, ran the file on import as the
module `rewards` and then failed naming the engine's own file; `a..b:f` and `mod.:f` failed in importlib's words. Now
each is one config line naming rewards.functions (a file: the spec to write instead), before anything is imported.

What a function declares (`dataset_columns`, `dataset_column_types`) is read when the data loads: `dataset_columns
= 5` and a type given by its name failed there with a TypeError traceback, `[1, None]` was "no 1 column". Each is
one line naming the function and the attribute when it is resolved; a declaration of names and types loads."""

from __future__ import annotations

import os
import sys
import types

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_engine.config import ConfigError, load_config
from grpo_engine.steps.rewards import RewardFunctionError, check_reward_columns, load_reward_functions

DERANDOMIZE = bool(os.environ.get("CI"))
# the fixtures (a working directory, a module in sys.modules) are set to the same value for every example
FIXTURES = [HealthCheck.function_scoped_fixture]
IDENTIFIER = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,7}", fullmatch=True)
DIRECTORY = st.lists(st.sampled_from(["..", ".", "dir", "my rewards", "a-b", "C:"]) | IDENTIFIER, max_size=3)


def _functions(spec: str) -> list[str]:
    return load_config(overrides={"rewards.functions": [spec]}).rewards.functions


@settings(max_examples=150, deadline=None, derandomize=DERANDOMIZE, suppress_health_check=FIXTURES)
@given(directory=DIRECTORY, separator=st.sampled_from(["/", "\\"]), leading=st.sampled_from(["", "/", "./"]),
       name=IDENTIFIER, function=IDENTIFIER)
def test_a_file_named_as_the_module_is_one_line_naming_the_spec_to_write(directory, separator, leading, name,
                                                                         function, tmp_path, monkeypatch):
    (tmp_path / f"{name}.py").write_text("raise SystemExit('imported')\n")  # importing it would end the test
    monkeypatch.chdir(tmp_path)
    spec = leading + separator.join([*directory, f"{name}.py"]) + f":{function}"
    with pytest.raises(ConfigError) as caught:
        _functions(spec)
    message = str(caught.value)
    assert message.startswith("rewards.functions[0]: expected 'module:function', not a file"), message
    assert f"write '{name}:{function}'" in message and "\n" not in message


@settings(max_examples=150, deadline=None, derandomize=DERANDOMIZE)
@given(parts=st.lists(IDENTIFIER | st.just(""), min_size=1, max_size=4), function=IDENTIFIER | st.just(""))
def test_a_module_name_is_a_dotted_name_of_identifiers(parts, function):
    spec = ".".join(parts) + ":" + function
    if all(parts) and function and not (len(parts) > 1 and parts[-1] == "py"):
        assert _functions(spec) == [spec]
        return
    with pytest.raises(ConfigError, match=r"^rewards\.functions\[0\]: expected "):
        _functions(spec)


def _a_function():
    def score(prompts, completions, **columns):
        return [0.0] * len(completions)
    return score


VALUES = st.one_of(
    st.none(), st.integers(), st.floats(allow_nan=False), st.booleans(), st.text(max_size=6),
    st.lists(st.one_of(st.text(max_size=4), st.integers(), st.none()), max_size=3),
    st.lists(st.text(max_size=4), max_size=3).map(tuple), st.sets(st.text(max_size=3), max_size=2),
    st.just(iter(["answer"])), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
TYPES = st.one_of(st.sampled_from([str, int, float, type(None), (str, int), (str, type(None)), "str", (), ("str",),
                                   (str, "int"), None, 3, [str]]))
COLUMN_TYPES = st.one_of(st.none(), VALUES, st.dictionaries(st.sampled_from(["answer", "", 1]), TYPES, max_size=2))


def _columns_ok(value) -> bool:
    return value is None or (isinstance(value, str) and value != "") or (
        isinstance(value, (list, tuple)) and all(isinstance(c, str) and c for c in value))


def _types_ok(value) -> bool:
    def kinds(k) -> bool:
        return isinstance(k, type) or (isinstance(k, tuple) and k != () and all(isinstance(t, type) for t in k))
    return value is None or (isinstance(value, dict) and all(isinstance(c, str) and kinds(k) for c, k in value.items()))


@settings(max_examples=200, deadline=None, derandomize=DERANDOMIZE, suppress_health_check=FIXTURES)
@given(columns=VALUES, column_types=COLUMN_TYPES)
def test_what_a_reward_declares_of_the_data_loads_or_is_one_line_naming_it(columns, column_types, monkeypatch):
    fn = _a_function()
    if columns is not None:
        fn.dataset_columns = columns
    if column_types is not None:
        fn.dataset_column_types = column_types
    module = types.ModuleType("eng48_declared_rewards")
    module.score = fn
    monkeypatch.setitem(sys.modules, module.__name__, module)
    config = load_config(overrides={"rewards.functions": [f"{module.__name__}:score"]}).rewards
    if not (_columns_ok(columns) and _types_ok(column_types)):
        with pytest.raises(RewardFunctionError) as caught:
            load_reward_functions(config, 8)
        message = str(caught.value)
        assert "\n" not in message and len(message) < 400, message
        attribute = "dataset_columns" if not _columns_ok(columns) else "dataset_column_types"
        assert message.startswith(f"reward function '{module.__name__}:score': its {attribute} is "), message
        return
    rewards = load_reward_functions(config, 8)
    names = [columns] if isinstance(columns, str) else list(columns or ())
    rows = [{"prompt": "p", **{name: "x" for name in names}, **{name: "x" for name in (column_types or {})}}]
    try:  # a declared type the row's text is not of, or a column the engine names itself: the data's own line
        check_reward_columns(rewards, rows, "d.jsonl")
    except RewardFunctionError as exc:
        assert "\n" not in str(exc) and ("dataset 'd.jsonl'" in str(exc) or "data.prompt_column" in str(exc)), str(exc)
