"""Kinds of config input the earlier rounds did not draw: integers past what the libraries behind a key take, keys
that are not names, and sections that are not mappings where the command line looks into the file before the
schema does. Each is refused in one line naming the key (or the file and line), before anything loads."""

from __future__ import annotations

import importlib
import typing

import annotated_types as at
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_engine.cli import main
from grpo_engine.config import ConfigError, leaf_fields, load_config, read_yaml
from grpo_engine.config.schema import MAX_COUNT

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _integer_keys() -> dict[str, list]:
    """Every leaf key whose value may be an integer, with its constraints (Optional and Annotated unwrapped)."""
    found = {}
    for key, field in leaf_fields().items():
        annotation, metadata = field.annotation, list(field.metadata)
        for arg in typing.get_args(annotation) or (annotation,):
            if typing.get_origin(arg) is typing.Annotated:
                arg, *extra = typing.get_args(arg)
                metadata += [part for item in extra for part in getattr(item, "metadata", [item])]
            if arg is int:
                found[key] = metadata
    return found


INTEGER_KEYS = _integer_keys()


def test_every_integer_key_declares_a_ceiling():
    # A key without one took 10**20 and failed inside torch or the tokenizer; a new key must declare its bound.
    assert len(INTEGER_KEYS) > 25
    unbounded = [key for key, metadata in INTEGER_KEYS.items()
                 if not any(isinstance(item, (at.Le, at.Lt)) for item in metadata)]
    assert not unbounded


@SETTINGS
@given(key=st.sampled_from(sorted(INTEGER_KEYS)), value=st.integers(MAX_COUNT + 1, 2**200) | st.integers(-2**200, -1))
def test_an_integer_past_what_its_key_takes_is_refused_naming_the_key(key, value):
    if key == "run.seed" and 0 <= value <= 2**32 - 1:
        return  # NumPy's seed domain, past MAX_COUNT
    with pytest.raises(ConfigError) as refused:
        load_config(overrides={key: value})
    assert str(refused.value).startswith(f"{key}: expected") and "\n" not in str(refused.value), refused.value


@pytest.mark.parametrize("key, value, expected", [
    ("run.num_threads", 10**20, "run.num_threads: expected a value <= 2147483647"),
    ("data.max_prompt_length", 10**20, "data.max_prompt_length: expected a value <= 2147483647"),
    ("data.builtin_max_operand", 10**4, "data.builtin_max_operand: expected a value <= 999"),
])
def test_the_values_that_crashed_or_ran_out_of_memory_are_named(key, value, expected):
    with pytest.raises(ConfigError, match=expected):
        load_config(overrides={key: value})


# ------------------------------------------------------------------------------------------ keys that are not names

NOT_A_NAME = st.one_of(
    st.integers().map(str), st.sampled_from(["~", "null", "true", "False", "1.5", ".inf", ".nan"]),
    st.sampled_from(["[a, b]", "{a: 1}", "[]"]).map(lambda flow: f"? {flow}\n"),
)


@SETTINGS
@given(key=NOT_A_NAME, nested=st.booleans())
def test_a_key_that_is_not_a_name_is_refused_naming_the_line(key, nested, tmp_path_factory):
    path = tmp_path_factory.mktemp("keys") / "c.yaml"
    entry = f"{key}: 1" if not key.startswith("?") else f"{key.rstrip()}\n: 1"
    text = "run:\n" + "".join(f"  {line}\n" for line in entry.splitlines()) if nested else entry + "\n"
    path.write_text(text)
    with pytest.raises(ConfigError) as refused:
        read_yaml(path)
    message = str(refused.value)
    assert f"'{path}' line {2 if nested else 1}: a key must be a name" in message and "\n" not in message, message


# ------------------------------------------------------------------------------------------ sections that are not maps

class WorkStarted(Exception):
    pass


@pytest.fixture()
def no_work(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)

    def started(*args, **kwargs):
        raise WorkStarted

    for module, name in (("grpo_engine.trainer", "train"), ("grpo_engine.tools.evaluate", "run_eval")):
        monkeypatch.setattr(importlib.import_module(module), name, started)


@pytest.mark.parametrize("section", ["model", "data"])
@pytest.mark.parametrize("value", ["5", "[1, 2]", "text", "true"])
@pytest.mark.parametrize("command", [["train"], ["eval", "--model", "org/name"], ["train", "--model", "org/name"]])
def test_a_section_that_is_not_a_mapping_is_one_line_naming_it(section, value, command, no_work, tmp_path, capsys):
    # The command line looks into the file for model.name_or_path and data.path before the schema reads it; that
    # look failed with an AttributeError traceback on `model: 5`.
    (tmp_path / "c.yaml").write_text(f"{section}: {value}\n")
    assert main([*command, "--config", "c.yaml"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and f"{section}: expected a mapping of keys" in err, err
